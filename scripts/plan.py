"""Snakemake stage: the run folder's plan.json, from the plan this workflow was parsed with (staged by biasflow)."""
from biasflow.stages import start_stage, write_plan

sm = snakemake  # noqa: F821 (injected by Snakemake)
start_stage(sm.log[0], sm)
write_plan(sm.input[0], sm.output[0])
