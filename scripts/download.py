"""Snakemake stage: fetch one raw dataset file, verified by sha256."""
from biasflow.stages import download_file, start_stage

start_stage(snakemake.log[0], snakemake)  # noqa: F821 (snakemake injects this object)
download_file(snakemake.params.spec["sources"], snakemake.output[0], snakemake.params.wheel_dir)  # noqa: F821
