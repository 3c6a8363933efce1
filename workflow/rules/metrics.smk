# The expensive stage (score: runs the model, cached per request) and the cheap one (metric: pure functions).
# A score file depends on the model, the items and the metric options that change model outputs only, so sweeping
# thresholds re-runs `metric` and never `score`.

rule score:
    input:
        unpack(lambda w: W.score_inputs(W.score_job(w.model_key, w.metric, w.shash))),
    output:
        scores=RESULTS + "/scores/{model_key}/{metric}-{shash}.parquet",
        meta=RESULTS + "/scores/{model_key}/{metric}-{shash}.parquet.meta.json",
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


def _metric_rule_outputs(family: str, extras=()) -> dict:
    """Every file the metric stage writes into a job's folder (biasflow.report.METRIC_FILES and the metric's own
    MetricSpec.extra_outputs), so Snakemake rebuilds any that is deleted."""
    return metric_output_paths(RESULTS + "/metrics/{model_key}/" + family + "/{chash}", extras)


# Metrics that write files beside their tables (LM Challenge's logs and pages, Winogender's occupations) each get a
# rule of their own that declares them; the generic rule takes the others.
EXTRAS = W.families_with_extras()


rule metric:
    input:
        unpack(lambda w: W.metric_inputs(W.metric_job(w.model_key, w.metric, w.chash))),
    output:
        **_metric_rule_outputs("{metric}"),
    params:
        job=lambda w: W.metric_job(w.model_key, w.metric, w.chash).params(),
    log:
        RESULTS + "/logs/metric/{model_key}/{metric}/{chash}.log",
    benchmark:
        benchmark_file(RESULTS, "metric", "{model_key}/{metric}/{chash}")
    wildcard_constraints:
        metric=("(?!(?:" + "|".join(map(re.escape, EXTRAS)) + ")/)[^/]+") if EXTRAS else "[^/]+",
    script:
        "../../scripts/metric.py"


for _family, _extras in EXTRAS.items():
    rule:
        name: f"metric_{_family}"
        input:
            unpack(lambda w, family=_family: W.metric_inputs(W.metric_job(w.model_key, family, w.chash))),
        output:
            **_metric_rule_outputs(_family, _extras),
        params:
            job=lambda w, family=_family: W.metric_job(w.model_key, family, w.chash).params(),
        log:
            RESULTS + "/logs/metric/{model_key}/" + _family + "/{chash}.log",
        benchmark:
            benchmark_file(RESULTS, "metric", "{model_key}/" + _family + "/{chash}")
        script:
            "../../scripts/metric.py"


# A file the user asked a metric to export (metric.stereoset.export_predictions=PATH): a rule per file, whose
# output is that file.
for _n, (_job, _option, _path) in enumerate(W.exports()):
    rule:
        name: f"export_{_n}"
        input:
            **W.export_inputs(_job),
        output:
            _path,
        params:
            job=_job.params(),
            option=_option,
        log:
            f"{RESULTS}/logs/export/{_job.model_key}/{_job.metric}/{_job.cfg_hash}-{_option}.log",
        benchmark:
            benchmark_file(RESULTS, "export", f"{_job.model_key}/{_job.metric}/{_job.cfg_hash}-{_option}")
        script:
            "../../scripts/export.py"
