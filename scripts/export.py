"""Snakemake stage: a file the user asked a metric to export (e.g. StereoSet's predictions file)."""
from biasflow.stages import export, start_stage

sm = snakemake  # noqa: F821 (injected by Snakemake)
start_stage(sm.log[0], sm)
export(sm.params.job, sm.params.option, sm.input.get("items_file"), sm.input.scores, sm.output[0])
