# Run level: the plan in the run folder, one table and report across every job of the plan (a sweep included),
# then MLflow. Every file these stages write is a declared output (biasflow.report.RUN_FILES), every file they read a
# declared input: deleting any of them and running again rebuilds it.

rule plan:
    input:
        W.staged_plan,
    output:
        W.plan_path,
    log:
        f"{RESULTS}/logs/plan/{PLAN.plan_hash}.log",
    benchmark:
        benchmark_file(RESULTS, "plan", PLAN.plan_hash)
    script:
        "../../scripts/plan.py"


rule aggregate:
    input:
        **W.run_inputs(),
    output:
        **W.run_files(),
        plots=directory(f"{PLAN.run_dir}/plots"),
    log:
        f"{RESULTS}/logs/aggregate/{PLAN.plan_hash}.log",
    benchmark:
        benchmark_file(RESULTS, "aggregate", PLAN.plan_hash)
    script:
        "../../scripts/aggregate.py"


rule log_mlflow:
    input:
        **W.mlflow_inputs(),
    output:
        f"{PLAN.run_dir}/mlflow.json",
    log:
        f"{RESULTS}/logs/mlflow/{PLAN.plan_hash}.log",
    benchmark:
        benchmark_file(RESULTS, "log_mlflow", PLAN.plan_hash)
    script:
        "../../scripts/log_mlflow.py"
