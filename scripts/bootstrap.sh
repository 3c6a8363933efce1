#!/usr/bin/env bash
# One-command set-up, then the main job or the tests:
#   bash scripts/bootstrap.sh run  [biasflow run arguments...]   # install + the default pipeline (offline)
#   bash scripts/bootstrap.sh test [pytest arguments...]         # install + the test suite
# Creates .venv beside this repository (reused when it is up to date). TORCH_SPEC picks the torch build:
# the default pins the CPU wheel this project is tested with; on a GPU box use e.g. TORCH_SPEC="torch==2.13.0"
# with the CUDA index of pytorch.org (PIP_EXTRA_INDEX_URL).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-}"
[ -n "$what" ] && shift || true
case "$what" in run|test) ;; *) echo "usage: bash scripts/bootstrap.sh run|test [args...]" >&2; exit 2;; esac

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=".venv/.biasflow-installed"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16) $TORCH_SPEC"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing biasflow and its dependencies into .venv ..."
  python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "is ignored" || true
  python -m pip install -q --disable-pip-version-check "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
  # server: the PostgreSQL driver (tracking on a PostgreSQL-backed MLflow; the team-server test)
  # cluster: the SLURM executor plugin (workflow/profiles/slurm; tests/test_slurm.py runs it on a local cluster)
  python -m pip install -q --disable-pip-version-check -e ".[test,offline-models,server,cluster]" 2>&1 | grep -v "is ignored" || true
  python -c "import biasflow, torch, transformers, snakemake, mlflow, snakemake_executor_plugin_slurm" || { echo "installation failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
export TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

if [ "$what" = run ]; then
  exec biasflow run "$@"
else
  exec python -m pytest "$@"
fi
