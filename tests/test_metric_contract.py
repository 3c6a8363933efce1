"""The contract every registered metric keeps (docs/adding_a_benchmark.md): its configs exist, its score keys are
real options and are all the score stage needs, it declares requests its model kinds can answer, and it runs
through prepare -> score -> metric on a tiny model with the tables the reports read. A new metric is checked here
without any edit."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from biasflow.registry import METRICS, load_all
from biasflow.report.explain import meaning_of
from conftest import ROOT, TEST_CACHE
from biasflow.registry import metric_options_from

load_all()
NAMES = sorted(METRICS)

# a small model of each kind, built in the test or shipped by a PyPI package (no hub download)
MODEL_KINDS_TESTED = ("masked_lm", "causal_lm", "word_vectors", "sentence_encoder", "ngram", "text_classifier",
                      "question_answering")
# a metric that runs on several kinds is run on the first of these it accepts, unless listed here (StereoSet on a
# masked LM also needs the checkpoint's next-sentence head, which the tiny BERT lacks)
KIND_FOR = {"stereoset": "causal_lm", **{f"lmc_{g}": "ngram" for g in ("wc", "we", "ce", "wr")}}
# the model of that kind, where the metric needs a particular one (the character game needs a character model)
MODEL_FOR = {"lmc_ce": ["model=char3"]}
# small slices and few, short generations: the contract, not the numbers
EXTRA = {
    "langfair_stereotype": ["metric.langfair_stereotype.generation.count=1",
                            "metric.langfair_stereotype.generation.max_tokens=6"],
    "helm_representation": ["metric.helm_representation.generation.max_tokens=6"],
    "honest": ["metric.honest.generation.max_tokens=4"],
    # no encoder follow-ups here (the score stage answers only the metric's own requests in this check)
    "counterfactual": ["metric.counterfactual.generation.count=1", "metric.counterfactual.generation.max_tokens=6",
                       "metric.counterfactual.encoder=false"],
    # GAP's snippets (up to 355 word pieces) exceed the tiny models' 128 positions: a window of words around them
    "gap": ["metric.gap.context_words=40"],
    "gap_mc": ["metric.gap_mc.context_words=30", "metric.gap_mc.generation.max_tokens=6"],
    "classification_fairness": ["metric.classification_fairness.predictions_file=example"],
    "recommendation_fairness": ["metric.recommendation_fairness.recommendations_file=example"],
}
# metrics on the user's own outputs (a predictions file): they ask the model nothing, its config only names it
ASKS_NOTHING = {"classification_fairness", "recommendation_fairness"}
# options that need a model built in the test (a classifier): name -> request -> overrides
EXTRA_FROM_FIXTURES = {
    "toxicity": lambda request: [
        f"metric.toxicity.classifier.model={request.getfixturevalue('tiny_toxicity_classifier_dir')}",
        "metric.toxicity.generation.count=1", "metric.toxicity.generation.max_tokens=6"],
    "bold_sentiment": lambda request: ["metric.bold_sentiment.generation.max_tokens=6"],
}
ITEM_LIMIT = 16
REQUIRED_AGGREGATE = ["model", "model_key", "benchmark", "metric_family", "config_hash", "metric", "category",
                      "value", "n", "ci_low", "ci_high"]


def spec(name):
    return METRICS[name]


def kind_under_test(name: str) -> str:
    kinds = spec(name).model_kinds
    if name in KIND_FOR:
        return KIND_FOR[name]
    usable = [k for k in MODEL_KINDS_TESTED if k in kinds]
    assert usable, f"metric {name}: none of its model kinds {kinds} has a tiny model in this test"
    return usable[0]


@pytest.mark.parametrize("name", NAMES)
def test_configs_exist_and_score_keys_are_options(name):
    from biasflow.plan import compose

    path = ROOT / "conf" / "metric" / f"{name}.yaml"
    assert path.exists(), f"metric {name} has no conf/metric/{name}.yaml"
    assert list(yaml.safe_load(path.read_text())) == [name], f"{path} must nest its options under {name!r}"
    s = spec(name)
    if s.benchmark:
        assert (ROOT / "conf" / "benchmark" / f"{s.benchmark}.yaml").exists(), f"{name}: no benchmark config"
    cfg = compose([f"metric=[{name}]"])["metric"][name]
    unknown = [k for k in s.score_keys if k not in cfg]
    assert not unknown, f"metric {name}: score_keys {unknown} are not options of conf/metric/{name}.yaml"
    assert callable(s.requests) and not hasattr(s, "score"), f"metric {name} must declare requests"
    assert s.headline, f"metric {name} names no headline metric"


def fetch_raw_files(job, project: Path) -> dict[str, str]:
    """The benchmark's files from their PyPI mirror (cached per machine), as the download rule fetches them."""
    from biasflow.data.download import fetch_verified

    raw = {}
    for key, file_spec in (job.benchmark_cfg.get("files") or {}).items():
        sources = [s for s in file_spec["sources"] if "pypi" in s] or file_spec["sources"]
        dest = TEST_CACHE / "contract" / job.benchmark / file_spec["filename"]
        fetch_verified(sources, dest, wheel_dir=TEST_CACHE / "wheels")
        raw[key] = str(dest)
    return raw


def model_overrides(kind: str, request) -> list[str]:
    if kind == "masked_lm":
        return ["model=local_masked_lm", f"model.path={request.getfixturevalue('tiny_bert_dir')}",
                "model.lowercase=true", "model.device=cpu"]
    if kind == "causal_lm":
        return ["model=gpt2", f"+model.path={request.getfixturevalue('tiny_gpt2').source}", "model.device=cpu"]
    if kind == "text_classifier":  # a tiny NLI sentence-pair classifier (Bias-NLI), built here
        from conftest import build_tiny_toxicity_classifier

        path = build_tiny_toxicity_classifier(request.getfixturevalue("tmp_path") / "tiny-nli",
                                              labels=("entailment", "neutral", "contradiction"))
        return ["model=local_masked_lm", "model.kind=text_classifier", f"model.path={path}", "model.device=cpu"]
    if kind == "question_answering":  # a tiny BERT with a SQuAD-style span head, built here
        from conftest import build_tiny_bert

        path = build_tiny_bert(request.getfixturevalue("tmp_path") / "tiny-qa", question_answering=True)
        return ["model=local_masked_lm", "model.kind=question_answering", f"model.path={path}", "model.device=cpu"]
    return {"word_vectors": ["model=glove_6b_50d"], "sentence_encoder": ["model=all_minilm_l6_v2", "model.device=cpu"],
            "ngram": ["model=ngram2"]}[kind]


@pytest.mark.parametrize("name", NAMES)
def test_runs_end_to_end_on_a_tiny_model(name, request, tmp_path, monkeypatch):
    from biasflow import stages
    from biasflow.plan import build_plan
    from biasflow.scoring.answer import can_answer
    from conftest import project_copy

    project = project_copy(tmp_path)
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    s = spec(name)
    kind = kind_under_test(name)
    model = MODEL_FOR.get(name) or model_overrides(kind, request)
    overrides = [f"metric=[{name}]", "stats.n_boot=20", *model, *EXTRA.get(name, []),
                 *(EXTRA_FROM_FIXTURES[name](request) if name in EXTRA_FROM_FIXTURES else [])]
    bench_cfg = yaml.safe_load((ROOT / "conf" / "benchmark" / f"{s.benchmark}.yaml").read_text()) if s.benchmark \
        else {}
    if "limit" in (bench_cfg or {}).get(s.benchmark, {}):
        overrides.append(f"benchmark.{s.benchmark}.limit={ITEM_LIMIT}")
    (job,) = build_plan(overrides).jobs
    items = None
    if job.benchmark:
        stages.prepare(job.benchmark, job.benchmark_cfg, fetch_raw_files(job, project), job.items_path)
        items = pd.read_parquet(job.items_path)
        assert {"item_id", "category"} <= set(items.columns)
    # the score stage gets only the score keys: the requests must not depend on anything else
    full = dict(job.metric_cfg, run_mode=job.mode)
    score_cfg = dict(job.score_params()["metric_cfg"], run_mode=job.mode)
    requests = s.requests(items if items is not None else pd.DataFrame(), metric_options_from(name, full), kind)
    assert [r.key for r in requests] == [r.key for r in s.requests(
        items if items is not None else pd.DataFrame(), metric_options_from(name, score_cfg), kind)], f"{name}: requests read a non-score key"
    assert requests or name in ASKS_NOTHING, f"metric {name} asks nothing of the model"
    for request_kind in {r.kind for r in requests}:
        assert can_answer(job.model["kind"], request_kind), f"{name}: {kind} cannot answer {request_kind}"

    scores = job.scores_path()
    stages.score(job.score_params(), job.items_path, scores, str(tmp_path / "cache"))
    answers = pd.read_parquet(scores)
    followups = {r.key for _, asked in (s.followup_requests(items if items is not None else pd.DataFrame(), answers,
                                                            metric_options_from(name, full)) if s.followup_requests else []) for r in asked}
    assert set(answers.key) == {r.key for r in requests} | followups and answers.key.is_unique
    stages.metric(job.params(), job.items_path, scores, job.metric_dir)
    per_item = pd.read_parquet(Path(job.metric_dir) / "per_item.parquet")
    aggregate = pd.read_parquet(Path(job.metric_dir) / "aggregate.parquet")
    assert {"item_id", "category", "model", "metric_family"} <= set(per_item.columns)
    assert set(REQUIRED_AGGREGATE) <= set(aggregate.columns)
    assert "overall" in set(aggregate.category)
    missing = [m for m in s.headline if m not in set(aggregate.metric)]
    assert len(missing) < len(s.headline), f"{name}: none of its headline metrics {s.headline} in the aggregate"
    # every row the report shows says what it measures (report.explain.meaning_of)
    unexplained = sorted(m for m in set(aggregate.metric) if meaning_of(s, m) is None)
    assert not unexplained, f"{name}: rows without a meaning in MetricSpec.meanings: {unexplained}"


def test_every_headline_metric_has_one_goal_declared_by_its_family():
    """The leaderboard's goals come from the metrics' declarations: every headline metric of a family is covered by
    the family's own ``goals`` (exact name or pattern), and two families that share a metric name give it one goal."""
    import fnmatch

    from biasflow.report.leaderboard import goal

    load_all()
    declared: dict[str, tuple[str, object]] = {}
    for name, family in METRICS.items():
        for key, value in family.goals.items():
            other = declared.setdefault(key, (name, value))
            assert other[1] == value, f"goal of {key!r}: {other[0]} says {other[1]!r}, {name} says {value!r}"
        for metric in family.headline:
            own = [k for k in family.goals if k == metric or fnmatch.fnmatchcase(metric, k)]
            assert own, f"{name}: headline metric {metric!r} has no goal in its MetricSpec.goals"
            assert goal(metric) == family.goals[own[0]], (name, metric)
