"""Snakemake stage: log the plan's results to MLflow (idempotent)."""
from pathlib import Path

from biasflow.stages import log_mlflow, start_stage

sm = snakemake  # noqa: F821 (injected by Snakemake)
start_stage(sm.log[0], sm)
log_mlflow(sm.input.plan, str(Path(sm.input.report_md).parent), sm.output[0])
