"""Snakemake stage: raw files -> items Parquet."""
from biasflow.stages import prepare, start_stage

sm = snakemake  # noqa: F821 (injected by Snakemake)
start_stage(sm.log[0], sm)
benchmark = sm.wildcards.benchmark
prepare(benchmark, sm.params.benchmark_cfg, {k: v for k, v in sm.input.items()}, sm.output[0])
