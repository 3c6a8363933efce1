"""A benchmark twice on one machine: with the CPU's own instruction sets, then restricted to AVX2 (what a CPU
without AVX-512 runs), figures side by side.

    python benchmarks/cpu_isa.py scoring -- --quick --sections tiny,gpt2      # scoring_speed.py both ways
    python benchmarks/cpu_isa.py pipeline                                     # pipeline_stages.py both ways

The restriction is ``biasflow.provenance.WITHOUT_AVX512`` (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``,
``MKL_ENABLE_INSTRUCTIONS=AVX2``): ATen's vectorised kernels, oneDNN's matmuls (and its bf16, which needs AVX-512)
and MKL take their AVX2 code paths, as on an AVX2-only CPU of the same clock. The two runs are sequential; the load
average is in each run's output. Each run writes its own folder (``benchmarks/out/isa-native``,
``benchmarks/out/isa-avx2``); the side-by-side table goes to ``benchmarks/out/cpu_isa_<benchmark>.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
sys.path.insert(0, str(ROOT / "src"))

from biasflow.provenance import WITHOUT_AVX512, cpu_description  # noqa: E402


def run(script: str, args: list[str], out: Path, restricted: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k not in WITHOUT_AVX512}
    if restricted:
        env.update(WITHOUT_AVX512)
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    print(f"\n$ {' '.join(f'{k}={v}' for k, v in WITHOUT_AVX512.items()) + ' ' if restricted else ''}"
          f"{' '.join(cmd)}", flush=True)
    subprocess.run(cmd, env=env, check=True, cwd=ROOT)


def scoring_table(native: dict, avx2: dict) -> str:
    key = ("section", "model", "method", "dtype", "threads")
    a = {tuple(r.get(k) for k in key): r for r in native["records"]}
    b = {tuple(r.get(k) for k in key): r for r in avx2["records"]}
    lines = ["| section | model | method | dtype | tok/s native | tok/s AVX2 | AVX2 / native | share of bound native "
             "| share of bound AVX2 | speed-up vs naive native | speed-up vs naive AVX2 |", "|" + "---|" * 11]
    fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
    for k, r in a.items():
        s = b.get(k)
        if s is None:
            continue
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {r['tok_per_s']:.0f} | {s['tok_per_s']:.0f} | "
                     f"{s['tok_per_s'] / r['tok_per_s']:.2f} | {fmt(r.get('frac_of_bound'), '.0%')} | "
                     f"{fmt(s.get('frac_of_bound'), '.0%')} | {fmt(r.get('speedup_vs_naive'), '.1f')} | "
                     f"{fmt(s.get('speedup_vs_naive'), '.1f')} |")
    return "\n".join(lines)


def pipeline_table(native: dict, avx2: dict) -> str:
    lines = ["| run | stage | jobs | wall s native | wall s AVX2 | AVX2 / native |", "|---|---|---|---|---|---|"]
    for n, a in zip(native["runs"], avx2["runs"]):
        for rule, s in n["stages"].items():
            t = a["stages"].get(rule)
            if t is None:
                continue
            ratio = t["wall_s"] / s["wall_s"] if s["wall_s"] else float("nan")
            lines.append(f"| {n['run']} | {rule} | {s['jobs']} | {s['wall_s']:.1f} | {t['wall_s']:.1f} | "
                         f"{ratio:.2f} |")
        lines.append(f"| {n['run']} | **total (wall)** | | {n['total_s']:.1f} | {a['total_s']:.1f} | "
                     f"{a['total_s'] / n['total_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("benchmark", choices=["scoring", "pipeline"])
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the benchmark's own options")
    args = ap.parse_args()
    rest = [a for a in args.rest if a != "--"]
    results = {}
    for name, restricted in (("native", False), ("avx2", True)):
        folder = OUT / f"isa-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        if args.benchmark == "scoring":
            run("scoring_speed.py", [*rest, "--out", str(folder)], folder, restricted)
            results[name] = json.loads((folder / "scoring_speed.json").read_text())
        else:
            run("pipeline_stages.py", [*rest, "--out", str(folder / "pipeline_stages.json")], folder, restricted)
            results[name] = json.loads((folder / "pipeline_stages.json").read_text())
    table = (scoring_table if args.benchmark == "scoring" else pipeline_table)(results["native"], results["avx2"])
    text = f"CPU: {cpu_description()}\n\n{table}\n"
    (OUT / f"cpu_isa_{args.benchmark}.md").write_text(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
