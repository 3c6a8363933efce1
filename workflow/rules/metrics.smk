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
    # What the scheduler gives one job comes from the model config (model.resources, defaults per kind), so one
    # profile serves GloVe and a 7B LM alike; on one machine at most half of --cores (W.score_threads). A retry
    # (attempt 2) asks for more memory and time (biasflow.scheduling: x retry_growth per attempt, capped).
    threads: lambda w: W.score_threads(w, workflow)
    resources:
        gpu=lambda w: W.score_resources(w)["gpus"],
        mem_mb=lambda w, attempt: score_resources(W.score_job(w.model_key, w.metric, w.shash).model, attempt)["mem_mb"],
        runtime=lambda w, attempt: score_resources(W.score_job(w.model_key, w.metric, w.shash).model,
                                                   attempt)["runtime_min"],
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
