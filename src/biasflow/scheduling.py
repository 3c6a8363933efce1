"""What one scoring job asks the scheduler for: memory, GPUs, CPUs and a time limit, from the model config.

The score rule's ``resources:``/``threads:`` read these, so one Snakemake profile (local, GPU box or SLURM)
serves every model: a 7B causal LM's config asks for a GPU and 32 GB, GloVe's for one CPU and a little memory.
A model config sets any of them under ``resources:``; the rest come from defaults per model kind. None of them
changes a number, so none is in a cache key or a results folder name (none carries an identity marker: ``schema.IDENTITY``).

Snakemake maps them as: ``mem_mb`` -> ``sbatch --mem``, ``gpu`` -> ``--gpus``, ``runtime`` (minutes) -> ``-t``,
threads -> ``--cpus-per-task``; on one machine ``threads`` is at most half of ``--cores``
(``workflow.Lookups.score_threads``: two scoring jobs share it), and ``gpu`` counts against a ``--resources gpu=N``
limit (``workflow/profiles/gpu``); a job that asks for a GPU then takes a free one of its own (``biasflow.gpus``:
locked for the job's life, ``CUDA_VISIBLE_DEVICES`` set to it), or uses the GPUs SLURM gave it.

A retry asks for more: Snakemake's ``attempt`` (1 for the first try, 2 for the retry of ``--retries 1``) multiplies
memory and time limit by ``resources.retry_growth`` (default 2) per attempt, capped at ``resources.max_mem_mb`` and
``resources.max_runtime_min`` (default: 4 times the first request), so a job SLURM stopped for its time limit
(``TIMEOUT``) or killed for its memory (``OUT_OF_MEMORY``, or SIGKILL from the kernel) is not sent again as it was.
"""
from __future__ import annotations

from typing import Any, Mapping

from biasflow import model_kinds

# Per model kind, what a typical model of the kind needs to score a benchmark is declared with the kind
# (``biasflow.model_kinds``: ``ModelKindSpec.resources``). Kinds that never run on a GPU (vector tables, n-gram
# models, external processes, HTTP clients) ask for none even when model.device says cuda.
# what a config of no declared kind would get (the plan refuses such a config; a hand-made one may still ask)
FALLBACK = {"mem_mb": 8000, "cpus": 2, "runtime_min": 120, "gpu_capable": False}
RETRY_GROWTH = 2.0  # per attempt, for memory and time limit
RETRY_CAP = 4       # the default cap: at most this many times the first request


def grown(first: int, attempt: int, growth: float, cap: int | None) -> int:
    """What attempt ``attempt`` asks for when the first asked for ``first``: ``first * growth ** (attempt - 1)``,
    at most ``cap`` (default ``RETRY_CAP`` times ``first``) and never less than ``first``."""
    cap = int(cap) if cap else first * RETRY_CAP
    value = int(round(first * float(growth) ** max(0, int(attempt) - 1)))
    return max(first, min(value, cap))


def score_resources(model: Mapping[str, Any], attempt: int = 1) -> dict[str, int]:
    """``{"mem_mb", "gpus", "cpus", "runtime_min"}`` for scoring with ``model`` (a composed model config) on its
    ``attempt``-th try (Snakemake's ``attempt``: memory and time limit grow, see the module's docstring).

    GPUs: ``resources.gpus`` if set, else one when ``model.device`` names a CUDA device and the kind can use it.
    """
    spec = model_kinds.KINDS.get(str(model.get("kind")))
    base = spec.resources.as_dict() if spec is not None else FALLBACK
    given = dict(model.get("resources") or {})
    device = str(model.get("device") or "")
    default_gpus = 1 if base["gpu_capable"] and device.startswith("cuda") else 0
    growth = float(given.get("retry_growth") or RETRY_GROWTH)
    return {
        "mem_mb": grown(int(given.get("mem_mb") or base["mem_mb"]), attempt, growth, given.get("max_mem_mb")),
        "gpus": int(given["gpus"] if given.get("gpus") is not None else default_gpus),
        "cpus": int(given.get("cpus") or base["cpus"]),
        "runtime_min": grown(int(given.get("runtime_min") or base["runtime_min"]), attempt, growth,
                             given.get("max_runtime_min")),
    }


__all__ = ["score_resources", "grown", "FALLBACK", "RETRY_GROWTH", "RETRY_CAP"]
