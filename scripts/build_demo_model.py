"""Snakemake stage: build the offline demo masked LM."""
from biasflow.stages import build_demo_model, start_stage

sm = snakemake  # noqa: F821 (injected by Snakemake)
start_stage(sm.log[0], sm)
build_demo_model(sm.params.model, list(sm.input.texts), sm.output[0])  # its threads: model.train.threads
