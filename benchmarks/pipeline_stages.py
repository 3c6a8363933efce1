"""Wall time of the pipeline per stage, from a clean ``results/`` and again with a warm cache.

    python benchmarks/pipeline_stages.py --quick     # a slice of the default pipeline (a few minutes)
    python benchmarks/pipeline_stages.py             # the default pipeline (~10 min on 2 busy cores)
    ... --reuse-resources      # copy this project's resources/ (downloads, built demo model) instead of none
    ... --project /work/main   # time another checkout (e.g. before a change); -- overrides... adds Hydra overrides

Copies the project (its git-tracked and untracked-but-not-ignored files, no results/) into a temporary folder and
runs ``biasflow run`` there twice:

  cold  from an empty results/ (and no resources/ unless --reuse-resources: downloads and the demo model included);
  warm  after deleting results/scores, results/metrics and results/runs only: the model-output cache
        (results/cache), the items and resources/ stay, so the score jobs re-run from the cache.

Per stage it reads Snakemake's ``benchmark:`` records (``results/benchmarks/<rule>/...``, see
``biasflow.report.timing``): jobs, summed and longest job wall time, largest peak RSS. Jobs run in parallel on
``--cores``, so the per-stage sums add up to more than the run's wall time, printed as ``total``. It also times the
Snakefile parse (planning + DAG, a dry run). The load average (``os.getloadavg``) is printed before and after every
run: the machine may be shared. Results: ``benchmarks/out/pipeline_stages.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The --quick slice: every rule of the default pipeline runs (downloads, demo model, prepare, score, metric,
# aggregate, MLflow), on fewer items, a shorter demo-model training and four of the nine metrics.
QUICK = ["metric=[crows_pairs,stereoset,winobias,weat]", "benchmark.crows_pairs.limit=150",
         "benchmark.stereoset.limit=450", "benchmark.winobias.limit=200", "model.train.steps=10"]


def load() -> tuple[float, float, float]:
    return tuple(round(x, 2) for x in os.getloadavg())


def copy_project(src: Path, dest: Path, resources: bool) -> Path:
    """The project's files as git sees them (tracked + untracked not ignored), without results/."""
    listed = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        if rel.startswith("results/") or not (src / rel).is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)
    (dest / "results").mkdir(exist_ok=True)
    if resources and (src / "resources").is_dir():
        shutil.copytree(src / "resources", dest / "resources", symlinks=True)
    return dest


def environment(project: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(project / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def timed(cmd: list[str], project: Path, log: Path) -> float:
    start = time.perf_counter()
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=project, env=environment(project), stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}; see {log}")
    return time.perf_counter() - start


def stage_table(project: Path) -> dict[str, dict]:
    """Per rule, from every benchmark record under results/benchmarks/: jobs, summed/longest wall s, summed CPU s,
    peak RSS."""
    sys.path.insert(0, str(ROOT / "src"))  # this checkout's reader: the timed one may predate it
    from biasflow.report.timing import read_benchmark

    out: dict[str, dict] = {}
    for tsv in sorted((project / "results" / "benchmarks").glob("*/**/*.tsv")):
        rule = tsv.relative_to(project / "results" / "benchmarks").parts[0]
        rec = read_benchmark(tsv)
        if rec is None:
            continue
        row = out.setdefault(rule, {"jobs": 0, "wall_s": 0.0, "longest_s": 0.0, "cpu_s": 0.0, "max_rss_mb": 0.0})
        row["jobs"] += 1
        row["wall_s"] += rec["wall_s"]
        row["cpu_s"] += rec["cpu_s"] if rec["cpu_s"] == rec["cpu_s"] else 0.0
        row["longest_s"] = max(row["longest_s"], rec["wall_s"])
        if rec["max_rss_mb"] == rec["max_rss_mb"]:
            row["max_rss_mb"] = max(row["max_rss_mb"], rec["max_rss_mb"])
    return out


_STAMP = re.compile(r"\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def timeline(log_text: str) -> list[dict]:
    """Start and end (s after the first job started; Snakemake logs whole seconds) of every job of a run, from
    Snakemake's log: which jobs ran side by side and what waited."""
    jobs: dict[str, dict] = {}
    stamp, current = None, None
    for line in log_text.splitlines():
        if m := _STAMP.search(line):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := re.match(r"^(?:local)?rule (\w+):$", line):
            current = {"rule": m.group(1), "start": stamp, "end": None, "job": ""}
        elif current is not None and (m := re.match(r"^\s+jobid: (\d+)$", line)):
            jobs[m.group(1)] = current
        elif current is not None and (m := re.match(r"^\s+wildcards: (.*)$", line)):
            current["job"] = m.group(1)
            current = None
        elif m := re.search(r"Finished jobid: (\d+)", line):
            if m.group(1) in jobs:
                jobs[m.group(1)]["end"] = stamp
    done = [j for j in jobs.values() if j["start"] is not None and j["end"] is not None]
    if not done:
        return []
    t0 = min(j["start"] for j in done)
    return sorted(({"rule": j["rule"], "job": j["job"], "start_s": (j["start"] - t0).total_seconds(),
                    "end_s": (j["end"] - t0).total_seconds()} for j in done), key=lambda j: (j["start_s"], j["end_s"]))


def print_timeline(jobs: list[dict], min_s: float = 5.0, width: int = 60) -> None:
    """The jobs of at least ``min_s`` seconds as bars on one time axis."""
    if not jobs:
        return
    end = max(j["end_s"] for j in jobs) or 1.0
    print(f"jobs of >= {min_s:g} s, on a {end:.0f} s axis:")
    for j in jobs:
        if j["end_s"] - j["start_s"] < min_s:
            continue
        a = round(j["start_s"] / end * width)
        b = max(round(j["end_s"] / end * width), a + 1)
        name = f"{j['rule']} {j['job']}"
        print(f"  {' ' * a}{'#' * (b - a)}{' ' * (width - b)} {j['start_s']:5.0f}-{j['end_s']:4.0f} s  {name[:70]}")


def run_once(label: str, project: Path, overrides: list[str], cores: int, log: Path) -> dict:
    py = sys.executable
    before = load()
    parse_s = timed([py, "-m", "snakemake", "--snakefile", "Snakefile", "--cores", str(cores), "-n", "--quiet",
                     "--config", f"overrides={json.dumps(overrides)}"], project, log)
    offset = log.stat().st_size
    total_s = timed([py, "-m", "biasflow.cli", "run", "--cores", str(cores), *overrides], project, log)
    with open(log) as fh:
        fh.seek(offset)
        jobs = timeline(fh.read())
    rec = {"run": label, "parse_s": parse_s, "total_s": total_s, "load_before": before, "load_after": load(),
           "stages": stage_table(project), "timeline": jobs}
    print_timeline(jobs)
    print(f"{label}: total {total_s:.1f} s (Snakefile parse, dry run: {parse_s:.1f} s), load {before} -> "
          f"{rec['load_after']}", flush=True)
    return rec


RULE_ORDER = ("download", "build_demo_model", "prepare", "score", "metric", "aggregate", "log_mlflow")


def print_table(cold: dict, warm: dict) -> str:
    lines = ["| stage | cold: jobs | cold: wall s (sum) | cold: longest s | cold: CPU s | cold: max RSS MB | "
             "warm: jobs | warm: wall s (sum) | warm: longest s | warm: CPU s |", "|---|" + "---|" * 9]
    for rule in RULE_ORDER:
        c, w = cold["stages"].get(rule, {}), warm["stages"].get(rule, {})
        cell = lambda d, k, f: format(d[k], f) if k in d else "-"  # noqa: E731
        lines.append(f"| {rule} | {cell(c, 'jobs', 'd')} | {cell(c, 'wall_s', '.1f')} | {cell(c, 'longest_s', '.1f')}"
                     f" | {cell(c, 'cpu_s', '.1f')} | {cell(c, 'max_rss_mb', '.0f')} | {cell(w, 'jobs', 'd')} | "
                     f"{cell(w, 'wall_s', '.1f')} | {cell(w, 'longest_s', '.1f')} | {cell(w, 'cpu_s', '.1f')} |")
    lines.append(f"| **total (wall)** | | **{cold['total_s']:.1f}** | | | | | **{warm['total_s']:.1f}** | | |")
    lines.append(f"| Snakefile parse (dry run) | | {cold['parse_s']:.1f} | | | | | {warm['parse_s']:.1f} | | |")
    table = "\n".join(lines)
    print(table)
    return table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a slice of the default pipeline (every rule runs)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--project", type=Path, default=ROOT, help="the checkout to time (default: this one)")
    ap.add_argument("--reuse-resources", action="store_true",
                    help="copy the project's resources/ (downloaded files, built demo model) into the copy")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "pipeline_stages.json")
    args, extra = ap.parse_known_args(argv)
    overrides = (QUICK if args.quick else []) + [x for x in extra if x != "--"]
    tmp = Path(tempfile.mkdtemp(prefix="biasflow-stages-"))
    project = copy_project(args.project.resolve(), tmp / "project", args.reuse_resources)
    log = tmp / "runs.log"
    print(f"project copy {project} (log {log}); overrides {overrides or '(defaults)'}; {args.cores} cores; "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}", flush=True)
    try:
        cold = run_once("cold", project, overrides, args.cores, log)
        for sub in ("scores", "metrics", "runs", "benchmarks"):  # benchmarks: only the warm run's records remain
            shutil.rmtree(project / "results" / sub, ignore_errors=True)
        warm = run_once("warm", project, overrides, args.cores, log)
        table = print_table(cold, warm)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"quick": args.quick, "overrides": overrides, "cores": args.cores,
                                        "project": str(args.project), "cpus": os.cpu_count(),
                                        "machine": platform.machine(), "runs": [cold, warm], "table": table},
                                       indent=2) + "\n")
        print(f"written {args.out}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
