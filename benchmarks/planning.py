"""Planning time vs number of jobs: composing a sweep (biasflow plan), and what a re-parse costs with the saved plan.

Builds a scratch conf/ with N masked-LM model configs (hub ids that are never downloaded: planning reads configs
only), plans `-m model=m0,...,mN-1 metric=[14 metrics] metric.crows_pairs.diff_threshold=0.05,0.1,0.2`, and times:
  compose  build_plan() (Hydra composition of every sweep job, validation, job dedup)
  read     Plan.read() of the saved plan.json (what a Snakemake re-parse / cluster job does)
  parse    a full `snakemake --dry-run --config plan=...` of the saved plan in a fresh process
Prints one row per N and the machine load; run from the project root:

    python benchmarks/planning.py [--models 5 20 50] [--no-parse]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, nargs="+", default=[5, 20, 50])
    ap.add_argument("--no-parse", action="store_true", help="skip the Snakemake dry-run parse")
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'models':>6} {'sweep jobs':>10} {'jobs':>6} {'compose s':>9} {'read s':>7} {'parse s':>8}")
    for n in a.models:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            conf = scratch_conf(root, n)
            env = dict(os.environ, BIASFLOW_CONF=str(conf))
            code = ("import time, sys\nt=time.perf_counter()\nfrom biasflow.plan import build_plan, Plan\n"
                    "t0=time.perf_counter()\n"
                    f"p=build_plan(['model={','.join(f'm{i}' for i in range(n))}', 'metric=[{METRICS}]', "
                    "'metric.crows_pairs.diff_threshold=0.05,0.1,0.2'], multirun=True)\n"
                    "t1=time.perf_counter(); path=p.write(); t2=time.perf_counter(); Plan.read(path)\n"
                    "t3=time.perf_counter()\n"
                    "print(len(p.sweep), len(p.jobs), t1-t0, t3-t2, path)\n")
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            sweep, jobs, compose_s, read_s, path = out.stdout.split()
            parse_s = float("nan")
            if not a.no_parse:
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(Path("Snakefile").resolve()),
                                "--cores", "1", "--dry-run", "--quiet", "all", "--config", f"plan={path}"],
                               env=env, capture_output=True, text=True, cwd=root, check=True)
                parse_s = time.perf_counter() - t
            print(f"{n:>6} {sweep:>10} {jobs:>6} {float(compose_s):>9.1f} {float(read_s):>7.2f} {parse_s:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
