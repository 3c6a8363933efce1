"""Snakemake stage: run the model for one (model, metric, score options); cached per request."""
from biasflow.stages import score, start_stage, set_threads

sm = snakemake  # noqa: F821 (injected by Snakemake)
start_stage(sm.log[0], sm)
set_threads(sm.threads)
score(sm.params.job, sm.input.get("items_file"), sm.output[0], sm.params.cache_dir)
