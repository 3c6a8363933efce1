# Run level: one table across every job of the plan (a sweep included), then MLflow.

rule aggregate:
    input:
        plan=W.plan_path,
        aggregates=W.metric_aggregates(),
    output:
        table=RESULTS + "/runs/{plan_hash}/aggregate.parquet",
        csv=RESULTS + "/runs/{plan_hash}/aggregate.csv",
        per_item=RESULTS + "/runs/{plan_hash}/per_item.parquet",
        report=RESULTS + "/runs/{plan_hash}/report.md",
    log:
        RESULTS + "/logs/aggregate/{plan_hash}.log",
    benchmark:
        benchmark_file(RESULTS, "aggregate", "{plan_hash}")
    script:
        "../../scripts/aggregate.py"


rule log_mlflow:
    input:
        plan=W.plan_path,
        table=RESULTS + "/runs/{plan_hash}/aggregate.parquet",
    output:
        RESULTS + "/runs/{plan_hash}/mlflow.json",
    log:
        RESULTS + "/logs/mlflow/{plan_hash}.log",
    benchmark:
        benchmark_file(RESULTS, "log_mlflow", "{plan_hash}")
    script:
        "../../scripts/log_mlflow.py"
