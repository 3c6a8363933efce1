#!/usr/bin/env bash
# Re-resolve the locked environment: requirements.lock pins every dependency of biasflow and of the extras the
# README's two commands install (test, offline-models, server, cluster), each with its sha256 hashes, for Linux
# x86-64 and Python 3.11 (what CI runs). scripts/bootstrap.sh installs exactly this file (pip --require-hashes),
# then torch itself from TORCH_SPEC, which picks the build for the hardware (CPU / CUDA); the lock holds torch's own
# dependencies as the pinned CPU build needs them.
#
#   bash scripts/lock.sh            # newest versions pyproject.toml allows
#   bash scripts/lock.sh --upgrade-package pandas   # any extra uv pip compile option
#
# tests/test_lock.py fails when the lock no longer satisfies pyproject.toml. Commit the new lock with the test
# suite's result on it: an upgrade of torch, transformers, tokenizers or numpy re-scores every model once
# (docs/architecture.md, "Fingerprints in two steps").
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION="0.13.9"
TORCH_LOCKED="${TORCH_LOCKED:-torch==2.13.0+cpu}"   # the torch build the lock is resolved against
# where that build lies: a local wheel folder (PIP_FIND_LINKS), else pytorch.org's CPU wheels
TORCH_WHEELS="${PIP_FIND_LINKS:-https://download.pytorch.org/whl/cpu/torch/}"

python3 -m uv --version 2>/dev/null | grep -q "$UV_VERSION" || python3 -m pip install -q "uv==$UV_VERSION"
python3 -m uv pip compile pyproject.toml \
  --extra test --extra offline-models --extra server --extra cluster \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --generate-hashes --constraint <(echo "$TORCH_LOCKED") --find-links "$TORCH_WHEELS" \
  --no-emit-package torch --no-header --annotation-style line \
  -o requirements.lock.new "$@"
{
  echo "# Locked dependencies of biasflow (Linux x86-64, Python 3.11), made by: bash scripts/lock.sh"
  echo "# Resolved against $TORCH_LOCKED (torch itself is installed by scripts/bootstrap.sh from TORCH_SPEC)."
  cat requirements.lock.new
} > requirements.lock
rm -f requirements.lock.new
echo "wrote requirements.lock ($(grep -c '^[A-Za-z0-9]' requirements.lock) packages)"
