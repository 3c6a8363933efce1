"""Run-level tables, plots and the report.

The files each stage writes are declared here once: the Snakemake rules declare them as outputs (and the stages that
read them as inputs), so Snakemake rebuilds any that is deleted and ``--summary`` lists them all.
"""
import os

# what the metric stage writes into a job's folder, by the metric rule's output names, besides its metric's own
# ``MetricSpec.extra_outputs``
METRIC_OUTPUTS = {"per_item": "per_item.parquet", "aggregate": "aggregate.parquet", "config": "config.yaml",
                  "score_meta": "score_meta.json", "metric_meta": "metric_meta.json"}
METRIC_FILES = tuple(METRIC_OUTPUTS.values())

# what the aggregate stage writes into the run folder (besides the plots/ folder), every one on every run: a table
# with nothing to show (one model: no paired tests) is written with its header and the report says why it is empty
RUN_FILES = ("aggregate.parquet", "aggregate.csv", "per_item.parquet", "leaderboard.csv", "leaderboard.md",
             "leaderboard.tex", "paired_tests.csv", "paired_tests.md", "curves.csv", "comparison.csv",
             "paper_tables.md", "paper_tables.tex", "stage_times.csv", "report.md", "report.html",
             "run_times.json")  # run_times.json: the aggregate job's start and end (the MLflow parent run's end)
RUN_DIRS = ("plots",)


def metric_output_paths(folder: str | os.PathLike, extras=()) -> dict[str, str]:
    """The metric rule's outputs in ``folder`` (a Snakemake pattern too); a metric's extra outputs as extra0, ..."""
    names = {**METRIC_OUTPUTS, **{f"extra{i}": name for i, name in enumerate(extras)}}
    return {key: os.path.join(folder, name) for key, name in names.items()}


def raw_file_paths(resources: str | os.PathLike, benchmark: str, benchmark_cfg) -> dict[str, str]:
    """Where the download rule puts a benchmark's raw files, by file key."""
    return {k: f"{resources}/datasets/{benchmark}/{f['filename']}" for k, f in benchmark_cfg["files"].items()}
