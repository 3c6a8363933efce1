"""What every Snakemake job and every parse of the Snakefile pay before doing any work.

    python benchmarks/job_overhead.py                       # this checkout
    python benchmarks/job_overhead.py --before /work/main   # and another checkout (e.g. before a change), same run

Each checkout is copied (git's files, no results/) into a temporary folder and timed there, in fresh processes:

* import floor: ``import biasflow.stages`` + ``registry.load_all()``, what every stage script does first;
* trivial metric job: what ``scripts/metric.py`` runs (``start_stage`` + ``stages.metric``) on four hand-made
  CrowS-Pairs pairs with no bootstrap: the per-job floor of the cheap stages;
* ``biasflow plan`` of the default config, and the Snakefile parse (``snakemake -n``: planning + the DAG);
* the heavy modules the metric job's process ends up with, and (``-X importtime``) its costliest imports.

Medians of ``--repeat`` runs; the load average (``os.getloadavg``) beside every figure, as the machine may be
shared. Results: ``benchmarks/out/job_overhead.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_stages import copy_project, environment  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "mlflow", "matplotlib", "hydra", "snakemake", "pyarrow.dataset", "scipy")

IMPORTS = "import biasflow.stages\nfrom biasflow.registry import load_all\nload_all()\n"

METRIC_JOB = textwrap.dedent("""
    import json, sys
    import numpy as np, pandas as pd
    from biasflow.stages import metric, start_stage

    tmp = sys.argv[1]
    start_stage(tmp + "/metric.log")
    params = {"metric": "crows_pairs", "model": {"name": "x"}, "metric_cfg": {"variants": ["pll"]},
              "benchmark": "crows_pairs", "stats": {"n_boot": 0}, "model_key": "x", "cfg_hash": "y", "mode": "parity"}
    metric(params, tmp + "/items.parquet", tmp + "/scores.parquet", tmp + "/out")
    print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
""").replace("HEAVY", repr(HEAVY))


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def write_job_inputs(tmp: Path) -> None:
    import numpy as np
    import pandas as pd

    nan = float("nan")
    pairs = [("a", "stereo", "gender"), ("b", "stereo", "gender"), ("c", "antistereo", "race-color"),
             ("d", "stereo", "race-color")]
    items = pd.DataFrame([{"item_id": i, "direction": d, "category": c, "sent_more": f"m{i}", "sent_less": f"l{i}"}
                          for i, d, c in pairs])
    from biasflow.registry import get_metric

    rows = []  # the answers to the metric's own PLL requests (their keys are what the metric looks up)
    for request in get_metric("crows_pairs").requests(items, {"variants": ["pll"]}, "masked_lm"):
        middle = 6 if request.text.startswith("m") else 8
        lp = [nan, -1.0, -float(middle) / 4, -2.0, nan]
        rows.append({"key": request.key, "kind": "pll", "text": request.text, "token_ids": [101, 5, middle, 7, 102],
                     "logprobs": lp, "total": float(np.nansum(lp))})
    items.to_parquet(tmp / "items.parquet")
    pd.DataFrame(rows).to_parquet(tmp / "scores.parquet")


def run(cmd: list[str], project: Path, check_output: bool = False) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=project, env=environment(project), capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return took, proc.stdout + (proc.stderr if check_output else "")


def median_of(n: int, cmd: list[str], project: Path) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(n):
        took, out = run(cmd, project)
        times.append(took)
    return statistics.median(times), out


def measure(label: str, project: Path, repeat: int) -> dict:
    py = sys.executable
    job = project / "job"
    job.mkdir()
    write_job_inputs(job)
    rec: dict = {"checkout": label}
    rec["import_floor_s"], _ = median_of(repeat, [py, "-c", IMPORTS], project)
    rec["load_import"] = load()
    rec["metric_job_s"], out = median_of(repeat, [py, "-c", METRIC_JOB, str(job)], project)
    rec["metric_job_heavy_modules"] = json.loads(out.strip().splitlines()[-1])
    rec["load_metric"] = load()
    rec["plan_s"], _ = median_of(max(1, repeat // 2), [py, "-m", "biasflow.cli", "plan"], project)
    rec["parse_s"], _ = median_of(max(1, repeat // 2), [py, "-m", "snakemake", "--cores", "1", "-n", "--quiet"],
                                  project)
    rec["load_parse"] = load()
    _, err = run([py, "-X", "importtime", "-c", IMPORTS], project, check_output=True)
    costly = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = (p.strip() for p in line[len("import time:"):].split("|"))
            if cumulative.isdigit():
                costly.append((int(cumulative) / 1e6, name))
    rec["costliest_imports"] = [f"{name} {s:.2f}s" for s, name in sorted(costly, reverse=True)[:8]]
    print(f"{label}: import floor {rec['import_floor_s']:.2f} s, trivial metric job {rec['metric_job_s']:.2f} s "
          f"(heavy modules: {', '.join(rec['metric_job_heavy_modules']) or 'none'}), biasflow plan "
          f"{rec['plan_s']:.2f} s, Snakefile parse {rec['parse_s']:.2f} s; load {rec['load_parse']}", flush=True)
    print(f"  costliest imports: {'; '.join(rec['costliest_imports'])}", flush=True)
    return rec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="another checkout to time in the same run (e.g. /work/main)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="biasflow-overhead-"))
    try:
        checkouts = ([("before", args.before.resolve())] if args.before else []) + [("this", ROOT)]
        records = []
        for label, src in checkouts:
            records.append(measure(label, copy_project(src, tmp / label, resources=False), args.repeat))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys = [("import floor (stages + load_all), s", "import_floor_s"), ("trivial metric job, s", "metric_job_s"),
            ("biasflow plan (default config), s", "plan_s"), ("Snakefile parse (snakemake -n), s", "parse_s")]
    lines = ["| measurement | " + " | ".join(r["checkout"] for r in records) + " |",
             "|---|" + "---|" * len(records)]
    for title, key in keys:
        lines.append(f"| {title} | " + " | ".join(f"{r[key]:.2f}" for r in records) + " |")
    lines.append("| heavy modules in a metric job | " + " | ".join(
        ", ".join(r["metric_job_heavy_modules"]) or "none" for r in records) + " |")
    lines.append("| load (1/5/15 min) | " + " | ".join(r["load_parse"] for r in records) + " |")
    print("\n" + "\n".join(lines))
    out = ROOT / "benchmarks" / "out" / "job_overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"records": records, "table": "\n".join(lines)}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
