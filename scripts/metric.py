"""Snakemake stage: per-item results and aggregates with bootstrap CIs (cheap, pure)."""
from pathlib import Path

from biasflow.stages import metric, start_stage

sm = snakemake  # noqa: F821 (injected by Snakemake)
start_stage(sm.log[0], sm)
metric(sm.params.job, sm.input.get("items_file"), sm.input.scores, str(Path(sm.output.aggregate).parent))
