"""Snakemake stage: one table, report and plots for every job of the plan."""
from pathlib import Path

from biasflow.stages import aggregate_run, start_stage

sm = snakemake  # noqa: F821 (injected by Snakemake)
start_stage(sm.log[0], sm)
aggregate_run(sm.input.plan, str(Path(sm.output.report_md).parent))
