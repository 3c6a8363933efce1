# The expensive stage (score: runs the model, cached per request) and the cheap one (metric: pure functions).
# A score file depends on the model, the items and the metric options that change model outputs only, so sweeping
# thresholds re-runs `metric` and never `score`.

rule score:
    input:
        unpack(lambda w: W.score_inputs(W.score_job(w.model_key, w.metric, w.shash))),
    output:
        RESULTS + "/scores/{model_key}/{metric}-{shash}.parquet",
    params:
        job=lambda w: W.score_job(w.model_key, w.metric, w.shash).score_params(),
        cache_dir=PLAN.paths["cache"],
    log:
        RESULTS + "/logs/score/{model_key}/{metric}-{shash}.log",
    benchmark:
        benchmark_file(RESULTS, "score", "{model_key}/{metric}-{shash}")
    threads: workflow.cores
    resources:
        gpu=lambda w: 1 if str(W.score_job(w.model_key, w.metric, w.shash).model.get("device")) == "cuda" else 0,
        mem_mb=lambda w: int(W.score_job(w.model_key, w.metric, w.shash).model.get("mem_mb", 8000)),
    script:
        "../../scripts/score.py"


rule metric:
    input:
        unpack(lambda w: W.metric_inputs(W.metric_job(w.model_key, w.metric, w.chash))),
    output:
        per_item=RESULTS + "/metrics/{model_key}/{metric}/{chash}/per_item.parquet",
        aggregate=RESULTS + "/metrics/{model_key}/{metric}/{chash}/aggregate.parquet",
        config=RESULTS + "/metrics/{model_key}/{metric}/{chash}/config.yaml",
    params:
        job=lambda w: W.metric_job(w.model_key, w.metric, w.chash).params(),
    log:
        RESULTS + "/logs/metric/{model_key}/{metric}/{chash}.log",
    benchmark:
        benchmark_file(RESULTS, "metric", "{model_key}/{metric}/{chash}")
    script:
        "../../scripts/metric.py"
