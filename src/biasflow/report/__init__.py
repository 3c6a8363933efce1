"""Run-level tables, plots and the report.

The files each stage writes are declared here once: the Snakemake rules declare them as outputs (and the stages that
read them as inputs), so Snakemake rebuilds any that is deleted and ``--summary`` lists them all.
"""

# what the metric stage writes into a job's folder, besides its metric's own ``MetricSpec.extra_outputs``
METRIC_FILES = ("per_item.parquet", "aggregate.parquet", "config.yaml", "score_meta.json", "metric_meta.json")

# what the aggregate stage writes into the run folder (besides the plots/ folder), every one on every run: a table
# with nothing to show (one model: no paired tests) is written with its header and the report says why it is empty
RUN_FILES = ("aggregate.parquet", "aggregate.csv", "per_item.parquet", "leaderboard.csv", "leaderboard.md",
             "leaderboard.tex", "paired_tests.csv", "paired_tests.md", "curves.csv", "comparison.csv",
             "paper_tables.md", "paper_tables.tex", "stage_times.csv", "report.md", "report.html",
             "run_times.json")  # run_times.json: the aggregate job's start and end (the MLflow parent run's end)
RUN_DIRS = ("plots",)
