"""Planning cost vs the size of a sweep: composing it, parsing its DAG, and what each cluster job pays to parse.

Builds a scratch conf/ with N model configs (hub ids that are never downloaded: planning reads configs only; every
fifth a causal LM, as real sweeps mix), plans `-m model=m0,...,mN-1 metric=[14 metrics]
metric.crows_pairs.diff_threshold=0.05,0.1,0.2` and stages it as `biasflow run` does, then times:
  compose    build_plan() in a fresh process (Hydra composition of every sweep job, validation, job dedup), with
             that process's peak memory
  stage      writing the plan and its job store (stage_plan)
  read       Plan.read() of the whole plan: what every cluster job paid before the job store
  job parse  a cluster job's parse: `snakemake --mode remote --target-jobs metric:...` (Snakemake's remote mode, what
             a SLURM job runs), dry run, one metric job, in a fresh process; Snakemake's own start-up included
  whole plan the same parse with the job store removed: it reads the whole plan (what every cluster job did before)
  dag build  the main process's DAG of the whole plan (every job and file, what must run), what a run builds
             before its first job starts: `snakemake all --rulegraph` (builds it, prints only the rules' graph)
  dry run    the main process's `snakemake --dry-run all`: the DAG built, then every job's execution simulated and
             printed (a real run does that part as its jobs run, not before the first)
Prints one row per N, the machine's load before and after, and the per-job cost of composing. From the project root:

    python benchmarks/planning.py [--models 10 100 1000] [--no-dag]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METRICS = ("crows_pairs,crows_pairs_aul,crows_pairs_biasbench,stereoset,winobias,lpbs,cbs,weat,seat,"
           "langfair_stereotype,helm_representation,honest,winobias_mc,crows_pairs_causal")


def scratch_conf(root: Path, n: int) -> Path:
    conf = root / "conf"
    shutil.copytree("conf", conf)
    for i in range(n):
        kind = "causal_lm" if i % 5 == 4 else "masked_lm"  # a mix, as real sweeps have
        (conf / "model" / f"m{i}.yaml").write_text(
            f"name: m{i}\nkind: {kind}\nhub_id: org/m{i}\nrevision: main\nlowercase: true\ndtype: float32\n"
            f"device: auto\nbatch_tokens: 8192\n")
    text = (conf / "config.yaml").read_text()
    (conf / "config.yaml").write_text(text.replace("results: results", f"results: {root / 'results'}").replace(
        "cache: results/cache", f"cache: {root / 'results' / 'cache'}"))
    return conf


COMPOSE = """
import json, resource, sys, time
from biasflow.plan import Plan, build_plan
from biasflow.workflow import stage_plan
n = int(sys.argv[1])
t0 = time.perf_counter()
p = build_plan([f"model={','.join(f'm{i}' for i in range(n))}", "metric=[%s]",
                "metric.crows_pairs.diff_threshold=0.05,0.1,0.2"], multirun=True)
t1 = time.perf_counter()
path = stage_plan(p)
t2 = time.perf_counter()
Plan.read(path)
t3 = time.perf_counter()
job = next(j for j in p.jobs if j.metric == "crows_pairs")
print(json.dumps({"sweep": len(p.sweep), "jobs": len(p.jobs), "compose": t1 - t0, "stage": t2 - t1, "read": t3 - t2,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "path": path,
                  "target": f"metric:model_key={job.model_key},metric=crows_pairs,chash={job.cfg_hash}"}))
""" % METRICS


def snakemake(args: list[str], root: Path, env: dict[str, str], dry_run: bool = True) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", *args, "--snakefile", str(Path("Snakefile").resolve()),
                    "--cores", "1", *(["--dry-run", "--quiet"] if dry_run else [])], env=env, capture_output=True,
                   text=True, cwd=root, check=True)
    return time.perf_counter() - t


def main() -> int:
    import json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--no-dag", action="store_true", help="skip the main process's parses of the whole DAG")
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'models':>6} {'sweep jobs':>10} {'jobs':>6} {'compose s':>9} {'ms/sweep job':>12} {'peak MB':>7} "
          f"{'stage s':>7} {'read s':>7} {'job parse s':>11} {'whole plan s':>12} {'dag build s':>11} "
          f"{'dry run s':>9} {'to first job s':>14}")
    for n in a.models:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            conf = scratch_conf(root, n)
            env = dict(os.environ, BIASFLOW_CONF=str(conf))
            out = subprocess.run([sys.executable, "-c", COMPOSE, str(n)], env=env, capture_output=True, text=True,
                                 check=True, cwd=root)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            remote = ["--mode", "remote", "--target-jobs", r["target"], "--config", f"plan={r['path']}"]
            job_parse = snakemake(remote, root, env)
            shutil.rmtree(Path(r["path"]).with_suffix(".jobs"))  # the baseline: a parse that reads the whole plan
            whole_parse = snakemake(remote, root, env)
            whole = ["all", "--config", f"plan={r['path']}"]
            build = float("nan") if a.no_dag else snakemake([*whole, "--rulegraph", "dot"], root, env, dry_run=False)
            dry = float("nan") if a.no_dag else snakemake(whole, root, env)
            print(f"{n:>6} {r['sweep']:>10} {r['jobs']:>6} {r['compose']:>9.1f} "
                  f"{1000 * r['compose'] / r['sweep']:>12.1f} {r['peak_mb']:>7.0f} {r['stage']:>7.1f} "
                  f"{r['read']:>7.2f} {job_parse:>11.1f} {whole_parse:>12.1f} {build:>11.1f} {dry:>9.1f} "
                  f"{r['compose'] + r['stage'] + build:>14.1f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
