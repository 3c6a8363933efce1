"""The pipeline's speed in one run: time per stage (cold and warm, and before/after a change), the bootstrap, and
causal scoring against its naive path.

    python benchmarks/summary.py --quick                    # a slice of the pipeline; a few minutes
    python benchmarks/summary.py                            # the default pipeline (~15 min on 2 cores)
    python benchmarks/summary.py --quick --before f4c7661   # also the same slice on an older commit (git worktree)

Runs, one after the other, with the machine's load printed before each:

1. ``pipeline_stages.py`` on this checkout (and, with ``--before REF``, on REF checked out into a temporary git
   worktree): per-stage wall / CPU time from Snakemake's benchmark records, cold (empty results/) and warm;
2. ``bootstrap_speed.py``: 1,000 stratified replicates per metric, array path against the replicate loop;
3. ``scoring_speed.py --sections gpt2``: the causal scorer against one text per forward pass (tok/s, x naive,
   share of the measured matmul bound, max difference).

Each script keeps its own full output in ``benchmarks/out/``; this prints their tables together.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"


def run(args: list[str]) -> None:
    print(f"\n$ {' '.join(args)}   (load {os.getloadavg()[0]:.2f})", flush=True)
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True)


def stage_table(path: Path, label: str) -> None:
    data = json.loads(path.read_text())
    cold, warm = data["runs"]
    print(f"\n## time per stage, {label}: {'the --quick slice' if data['quick'] else 'the default pipeline'}, "
          f"{data['cores']} cores (load cold {cold['load_before']} -> {cold['load_after']}, warm "
          f"{warm['load_before']} -> {warm['load_after']})\n")
    print(data["table"])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a slice of the pipeline, fewer bootstrap loop replicates")
    ap.add_argument("--before", help="a git commit to time the same way (checked out into a temporary worktree)")
    ap.add_argument("--gpt2-sentences", type=int, default=200)
    args = ap.parse_args(argv)
    quick = ["--quick"] if args.quick else []
    after = OUT / "pipeline_stages.json"
    run(["benchmarks/pipeline_stages.py", *quick, "--out", str(after)])
    before = None
    if args.before:
        tmp = Path(tempfile.mkdtemp(prefix="biasflow-before-"))
        subprocess.run(["git", "worktree", "add", "--detach", str(tmp / "checkout"), args.before], cwd=ROOT,
                       check=True)
        try:
            before = OUT / "pipeline_stages_before.json"
            run(["benchmarks/pipeline_stages.py", *quick, "--project", str(tmp / "checkout"), "--out", str(before)])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "checkout")], cwd=ROOT, check=False)
    run(["benchmarks/bootstrap_speed.py", *quick])
    run(["benchmarks/scoring_speed.py", "--sections", "gpt2", "--gpt2-sentences", str(args.gpt2_sentences)])

    print("\n\n==================== summary ====================")
    stage_table(after, "this checkout")
    if before is not None:
        stage_table(before, f"before ({args.before})")
    print("\n## bootstrap: 1,000 stratified replicates per metric, array path vs the replicate loop\n")
    print(json.loads((OUT / "bootstrap_speed.json").read_text())["table"])
    scoring = json.loads((OUT / "scoring_speed.json").read_text())
    print("\n## causal scoring (GPT-2-small shape, fp32)")
    for rec in scoring if isinstance(scoring, list) else scoring.get("records", []):
        if rec.get("section") == "gpt2":
            print(f"    {rec['method']:<36} threads {rec.get('threads')}  {rec['tok_per_s']:8.0f} tok/s  "
                  f"x naive {rec.get('speedup_vs_naive', float('nan')):.2f}  "
                  f"{100 * rec.get('frac_of_bound', float('nan')):.0f}% of bound  load {rec.get('load1')}")


if __name__ == "__main__":
    main()
