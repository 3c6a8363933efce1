"""Experiment configs: every published table parses, and the comparison joins it to our aggregate table."""
from __future__ import annotations

import pandas as pd
import pytest

from biasflow.errors import ConfigError
from biasflow.plan import compose
from biasflow.report.published import compare, published_rows
from conftest import ROOT

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_its_published_values_parse(name):
    cfg = compose([f"+experiment={name}"])
    exp = cfg["experiment"]
    rows = published_rows(exp)
    if not exp.get("published"):  # a preset of metrics without a published table (lmchallenge_bold)
        assert rows.empty
        return
    assert (rows.metric_family == exp["metric_family"]).all()
    assert exp["metric_family"] in cfg["metric"]  # the experiment selects the metric it publishes
    assert rows.published.notna().all()


def test_the_three_value_shapes_and_the_comparison():
    exp = {"name": "e", "metric_family": "fam", "metric": "d", "value_columns": ["lms", "ss"],
           "published": [{"model": "m", "values": {"t1": 1.5}},
                         {"model": "m", "values": {"score": {"overall": 60.5}}},
                         {"model": "m", "values": {"intra": {"overall": [80.0, 55.0]}}}]}
    rows = published_rows(exp)
    assert set(zip(rows.metric, rows.category, rows.published)) == {
        ("d", "t1", 1.5), ("score", "overall", 60.5), ("intra_lms", "overall", 80.0), ("intra_ss", "overall", 55.0)}
    agg = pd.DataFrame([{"model": "m", "metric_family": "fam", "metric": "score", "category": "overall",
                         "value": 61.0, "ci_low": 58.0, "ci_high": 63.0, "n": 10}])
    cmp = compare(agg, [exp]).set_index("metric")
    assert cmp.loc["score", "delta"] == pytest.approx(0.5) and bool(cmp.loc["score", "published_in_ci"])
    assert pd.isna(cmp.loc["d", "ours"])  # published values without a counterpart stay visible
    with pytest.raises(ConfigError, match="value_columns"):
        published_rows(dict(exp, value_columns=None))


def _agg(rows):
    blank = {"ci_low": float("nan"), "ci_high": float("nan"), "n": 1, "config_hash": "h"}
    return pd.DataFrame([{**blank, **r} for r in rows])


def test_models_without_a_config_keep_their_published_rows():
    # three `model: null` entries (bert-large-cased, gpt2-medium, gpt2-large) used to collapse into one
    exp = compose(["+experiment=nadeem2021_stereoset"])["experiment"]
    rows = published_rows(exp)
    assert len(rows) == 7 * 11 * 3 == 231
    agg = _agg([{"model": "gpt2", "metric_family": "stereoset", "metric": "intrasentence_ss",
                 "category": "overall", "value": 62.0}])
    cmp = compare(agg, [exp, exp])  # the experiment once per sweep job
    assert len(cmp) == 231
    assert set(cmp.hub_id) == {"gpt2", "bert-large-cased", "gpt2-medium", "roberta-large", "gpt2-large",
                               "roberta-base", "bert-base-cased"}
    medium = cmp[(cmp.hub_id == "gpt2-medium") & (cmp.metric == "intrasentence_ss") & (cmp.category == "overall")]
    assert medium.published.tolist() == [62.74] and medium.ours.isna().all()
    assert cmp.loc[(cmp.hub_id == "gpt2") & (cmp.metric == "intrasentence_ss") & (cmp.category == "overall"),
                   "ours"].tolist() == [62.0]


def test_published_values_are_matched_on_their_split_only():
    dev = compose(["+experiment=nadeem2021_stereoset"])["experiment"]      # split dev
    test = compose(["+experiment=meade2022_bias_bench"])["experiment"]     # split test
    agg = _agg([{"model": "gpt2", "metric_family": "stereoset", "metric": "intrasentence_ss", "category": "overall",
                 "value": 60.0, "config_hash": "run_on_test"}])
    jobs = [{"cfg_hash": "run_on_test", "benchmark_cfg": {"name": "stereoset", "split": "test"}}]
    from biasflow.report.published import job_splits

    cmp = compare(agg, [dev, test], splits=job_splits(jobs))
    hit = cmp[(cmp.hub_id == "gpt2") & (cmp.metric == "intrasentence_ss") & (cmp.category == "overall")]
    by_split = hit.set_index("split")
    assert by_split.published.to_dict() == {"dev": 61.93, "test": 59.90}
    assert by_split.loc["test", "ours"] == 60.0 and pd.isna(by_split.loc["dev", "ours"])  # a test run is no dev run


def test_a_value_published_twice_in_one_experiment_is_an_error():
    exp = {"name": "e", "metric_family": "fam", "split": "all",
           "published": [{"model": None, "hub_id": "x", "values": {"score": {"overall": 1.0}}},
                         {"model": None, "hub_id": "x", "values": {"score": {"overall": 2.0}}}]}
    with pytest.raises(ConfigError, match="e: x .* score/overall more than once"):
        published_rows(exp)
    with pytest.raises(ConfigError, match="needs a hub_id or a model"):
        published_rows({"name": "e", "published": [{"values": {"score": {"overall": 1.0}}}]})


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_says_where_its_values_come_from(name):
    text = (ROOT / "conf" / "experiment" / f"{name}.yaml").read_text()
    if published_rows(compose([f"+experiment={name}"])["experiment"]).empty:
        return
    assert "PRIMARY source" in text or "SECONDARY cop" in text
