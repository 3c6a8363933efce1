"""LangFair's classification and recommendation fairness metrics (docs/langfair_fairness.md): hand-computed examples,
parity with LangFair 0.8.0 run for real (tests/fixtures/langfair_fairness/reference.json, made by
make_reference.py there; its provenance is inside), bad input named by file, row and column, and the pipeline."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasflow.errors import DataFormatError
from biasflow.registry import get_metric
from conftest import ROOT
from biasflow.registry import metric_options_from

REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "langfair_fairness" / "reference.json").read_text())
# LangFair's parity class name -> our rate
RATE_OF = {"PredictedPrevalenceRateParity": "predicted_prevalence_rate", "FalsePositiveRateParity": "false_positive_rate",
           "FalseNegativeRateParity": "false_negative_rate", "FalseOmissionRateParity": "false_omission_rate",
           "FalseDiscoveryRateParity": "false_discovery_rate"}
# Both compute the same ratios of integer counts in float64, in the same order (a count over a count, then one
# subtraction or division; numpy's mean of 0/1 for the prevalence): the values agree to the last bits. The tolerance
# allows a few ulps of a different summation order (pandas' mean of group means against numpy's).
TOL = 1e-12


def classification(tmp_path: Path, rows: dict[str, list], **options) -> pd.DataFrame:
    path = tmp_path / "predictions.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    spec = get_metric("classification_fairness")
    cfg = {"predictions_file": str(path), **options}
    per_item = spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("classification_fairness", cfg))
    return spec.aggregate(per_item, metric_options_from("classification_fairness", cfg))


def value(agg: pd.DataFrame, metric: str, category: str = "overall") -> float:
    rows = agg[(agg.metric == metric) & (agg.category == category)]
    assert len(rows) == 1, (metric, category, agg)
    return float(rows.value.iloc[0])


# --------------------------------------------------------------------------------------- hand-computed examples
def test_classification_hand_computed(tmp_path):
    # group a: TP 1, FN 1, FP 1, TN 1; group b: TP 1, FN 0, FP 1, TN 2
    agg = classification(tmp_path, {"group": ["a"] * 4 + ["b"] * 4, "y_true": [1, 1, 0, 0, 1, 0, 0, 0],
                                    "y_pred": [1, 0, 1, 0, 1, 1, 0, 0]})
    expected_rates = {"a": {"predicted_prevalence_rate": 0.5, "false_positive_rate": 0.5, "false_negative_rate": 0.5,
                            "false_omission_rate": 0.5, "false_discovery_rate": 0.5},
                      "b": {"predicted_prevalence_rate": 0.5, "false_positive_rate": 1 / 3, "false_negative_rate": 0.0,
                            "false_omission_rate": 0.0, "false_discovery_rate": 0.5}}
    for group, rates in expected_rates.items():
        for rate, v in rates.items():
            assert value(agg, rate, group) == pytest.approx(v, abs=1e-15), (group, rate)
    assert value(agg, "false_positive_rate", "b") == pytest.approx(1 / 3)
    assert agg[(agg.metric == "false_positive_rate") & (agg.category == "b")].n.iloc[0] == 3  # the negatives
    diffs = {"predicted_prevalence_rate": 0.0, "false_positive_rate": 1 / 6, "false_negative_rate": 0.5,
             "false_omission_rate": 0.5, "false_discovery_rate": 0.0}
    ratios = {"predicted_prevalence_rate": 1.0, "false_positive_rate": 1.5, "false_negative_rate": math.nan,
              "false_omission_rate": math.nan, "false_discovery_rate": 1.0}
    for rate in diffs:
        assert value(agg, f"{rate}_difference") == pytest.approx(diffs[rate], abs=1e-15), rate
        assert value(agg, f"{rate}_ratio") == pytest.approx(ratios[rate], nan_ok=True), rate
    assert value(agg, "predicted_prevalence_rate") == 0.5  # overall: 4 of 8


def test_classification_group_order_metric_type_and_no_labels(tmp_path):
    rows = {"group": ["a"] * 4 + ["b"] * 4, "y_true": [1, 1, 0, 0, 1, 0, 0, 0], "y_pred": [1, 0, 1, 0, 1, 1, 0, 0]}
    swapped = classification(tmp_path, rows, groups=["b", "a"])
    assert value(swapped, "false_positive_rate_ratio") == pytest.approx(2 / 3)  # (1/3) / (1/2)
    assistive = classification(tmp_path, rows, metric_type="assistive")
    assert {m.rsplit("_", 1)[0] for m in assistive.metric if m.endswith("_difference")} == {
        "false_negative_rate", "false_omission_rate"}
    no_labels = classification(tmp_path, {"group": rows["group"], "y_pred": rows["y_pred"]},
                               metric_type="representation")
    assert set(no_labels.metric) == {"predicted_prevalence_rate", "predicted_prevalence_rate_difference",
                                     "predicted_prevalence_rate_ratio"}


def test_recommendation_hand_computed(tmp_path):
    path = tmp_path / "lists.jsonl"
    rows = [{"prompt": "p", "group": "neutral", "recommendations": ["A", "B", "C"]},
            {"prompt": "p", "group": "g1", "recommendations": ["A", "B", "C"]},
            {"prompt": "p", "group": "g2", "recommendations": ["C", "D", "A"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = get_metric("recommendation_fairness")
    cfg = {"recommendations_file": str(path)}
    agg = spec.aggregate(spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("recommendation_fairness", cfg)), metric_options_from("recommendation_fairness", cfg))
    # g1 = neutral: Jaccard 1; SERP (4 + 3 + 2) * 0.5 / (3 * 4) = 0.375; PRAG 3 ordered pairs / (3 * 4) = 0.25
    # g2: Jaccard |{A, C}| / |{A, B, C, D}| = 0.5; SERP (4 + 2) * 0.5 / 12 = 0.25; PRAG only (C, D): 1 / 12
    expected = {"g1": {"jaccard": 1.0, "serp": 0.375, "prag": 0.25}, "g2": {"jaccard": 0.5, "serp": 0.25,
                                                                             "prag": 1 / 12}}
    for group, sims in expected.items():
        for name, v in sims.items():
            assert value(agg, name, group) == pytest.approx(v, abs=1e-15), (group, name)
    assert value(agg, "jaccard_range") == pytest.approx(0.5)
    assert value(agg, "jaccard_std") == pytest.approx(0.25)  # population std of (1, 0.5)
    assert value(agg, "serp_max") == pytest.approx(0.375) and value(agg, "serp_min") == pytest.approx(0.25)
    assert value(agg, "prag_range") == pytest.approx(0.25 - 1 / 12)
    pairs = spec.aggregate(spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("recommendation_fairness", {**cfg, "pairwise": True})),
                           metric_options_from("recommendation_fairness", {**cfg, "pairwise": True}))
    # g1 [A, B, C] against g2 [C, D, A]: the g2 comparison above with the lists' roles swapped: Jaccard 0.5;
    # SERP: A (i = 0) scores 4, C (i = 2) scores 2: 6 * 0.5 / 12 = 0.25; PRAG: (A, B) (B absent) and none other
    # ((A, C): A ranks after C in g2): 1 / 12
    assert value(pairs, "pairwise_jaccard", "g1-g2") == pytest.approx(0.5)
    assert value(pairs, "pairwise_serp", "g1-g2") == pytest.approx(0.25)
    assert value(pairs, "pairwise_prag", "g1-g2") == pytest.approx(1 / 12)
    assert value(pairs, "jaccard_range") == value(agg, "jaccard_range")


# ------------------------------------------------------------------------------------ parity with LangFair 0.8.0
def _langfair_failure_is_a_zero_or_missing_rate(case, agg) -> bool:
    """LangFair asserts every group's rate is truthy (so a rate of 0 fails) and y_pred / y_true hold both 0 and 1;
    its false negative rate divides by group 2's positives after checking group 1's (ZeroDivisionError)."""
    both_classes = set(case["y_pred"]) == {0, 1} and set(case["y_true"]) == {0, 1}
    group_rates = agg[agg.category != "overall"]
    return not both_classes or bool(((group_rates.value == 0) | group_rates.value.isna()).any())


def test_classification_parity_with_langfair(tmp_path):
    compared, largest, failures = 0, 0.0, 0
    for case in REFERENCE["classification"]:
        if len(set(case["groups"])) != 2:  # LangFair asserts two groups; biasflow names the file and its groups
            assert all("error" in case[k][n] for k in ("difference", "ratio") for n in RATE_OF)
            with pytest.raises(DataFormatError, match="compare exactly two"):
                classification(tmp_path, {"group": case["groups"], "y_true": case["y_true"], "y_pred": case["y_pred"]})
            failures += 10
            continue
        agg = classification(tmp_path, {"group": case["groups"], "y_true": case["y_true"], "y_pred": case["y_pred"]})
        for key, suffix in (("difference", "_difference"), ("ratio", "_ratio")):
            for name, rate in RATE_OF.items():
                ref, ours = case[key][name], value(agg, rate + suffix)
                if "error" in ref:
                    failures += 1
                    assert _langfair_failure_is_a_zero_or_missing_rate(case, agg), (case["name"], key, name, ref)
                    continue
                if math.isinf(ref["value"]):  # LangFair's numpy division by a prevalence of 0; ours: undefined
                    assert math.isnan(ours), (case["name"], name)
                    continue
                assert ours == pytest.approx(ref["value"], abs=TOL, rel=TOL), (case["name"], key, name)
                largest = max(largest, abs(ours - ref["value"]))
                compared += 1
            for metric_type in ("all", "assistive", "punitive", "representation"):
                ref = case[key][f"ClassificationMetrics({metric_type})"]
                if "values" in ref:  # the family selects the same rates, with the same values as each class
                    sub = classification(tmp_path, {"group": case["groups"], "y_true": case["y_true"],
                                                    "y_pred": case["y_pred"]}, metric_type=metric_type)
                    assert {RATE_OF[n] + suffix for n in ref["values"]} == {
                        m for m in sub.metric if m.endswith(suffix)}, (case["name"], metric_type)
    assert compared >= 400 and failures >= 50 and largest <= TOL, (compared, failures, largest)


def _recommendation(tmp_path, rows, fmt="jsonl", **options) -> pd.DataFrame:
    path = tmp_path / f"lists.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pd.DataFrame([{**r, "recommendations": json.dumps(r["recommendations"])} for r in rows]).to_csv(path,
                                                                                                       index=False)
    spec = get_metric("recommendation_fairness")
    cfg = {"recommendations_file": str(path), **options}
    return spec.aggregate(spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("recommendation_fairness", cfg)), metric_options_from("recommendation_fairness", cfg))


def test_recommendation_parity_with_langfair(tmp_path):
    stat = {"max": "max", "min": "min", "SNSR": "range", "SNSV": "std"}
    compared, largest = 0, 0.0
    for i, case in enumerate(REFERENCE["recommendation"]):
        agg = _recommendation(tmp_path, case["rows"], fmt="csv" if i % 2 else "jsonl")
        for name, stats in case["against_neutral"].items():
            for key, v in stats.items():
                ours = value(agg, f"{name.lower()}_{stat[key]}")
                assert ours == pytest.approx(v, abs=TOL), (case["name"], name, key)
                largest, compared = max(largest, abs(ours - v)), compared + 1
    assert compared == 12 * len(REFERENCE["recommendation"]) and largest <= TOL


def test_pairwise_parity_with_langfair(tmp_path):
    compared, largest = 0, 0.0
    for case in REFERENCE["recommendation"]:
        agg = _recommendation(tmp_path, case["rows"], pairwise=True)
        for pair, values in case["pairwise"].items():
            for name, v in values.items():  # LangFair's evaluate_pairwise(lists of group 1, lists of group 2)
                ours = value(agg, f"pairwise_{name.lower()}", pair)
                assert ours == pytest.approx(v, abs=TOL), (case["name"], pair, name)
                largest, compared = max(largest, abs(ours - v)), compared + 1
        # the against-neutral numbers do not move with the pairwise rows beside them
        for name, stats in case["against_neutral"].items():
            assert value(agg, f"{name.lower()}_range") == pytest.approx(stats["SNSR"], abs=TOL)
    assert compared == 3 * sum(len(c["pairwise"]) for c in REFERENCE["recommendation"]) >= 500 and largest <= TOL


def test_similarities_equal_langfair_on_every_recorded_pair():
    from biasflow.metrics.recommendation_fairness import jaccard, prag, serp

    for pair in REFERENCE["similarity_pairs"]:  # unequal lengths and repeated items included
        for name, fn in (("Jaccard", jaccard), ("SERP", serp), ("PRAG", prag)):
            assert fn(pair["list1"], pair["list2"]) == pytest.approx(pair[name]["value"], abs=1e-15), (pair, name)


def test_reference_provenance():
    prov = REFERENCE["provenance"]
    assert prov["langfair"] == "0.8.0" and "make_reference.py" in prov["command"] and prov["made"]


# ------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("content, message", [
    ("group,y_pred\na,1\nb,0\n", "has no column 'y_true'"),
    ("group,y_true,y_pred\na,1,1\nb,0,2\n", "row 2: y_pred='2' is not 0 or 1"),
    ("group,y_true,y_pred\na,1,1\n,0,1\n", "row 2: empty group"),
    ("group,y_true,y_pred\na,1,1\nb,0,1\nc,1,0\n", "has 3 group(s) ['a', 'b', 'c']"),
    ("id,group,y_true,y_pred\nx,a,1,1\nx,b,0,1\n", "row 2: id 'x' repeats row 1"),
])
def test_bad_predictions_file_is_named(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    spec = get_metric("classification_fairness")
    with pytest.raises(DataFormatError) as err:
        spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("classification_fairness", {"predictions_file": str(path)}))
    assert message in str(err.value) and str(path) in str(err.value)


def test_missing_groups_and_files_are_named(tmp_path):
    spec = get_metric("classification_fairness")
    with pytest.raises(DataFormatError, match="groups=.*has no row of group"):
        spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("classification_fairness", {"predictions_file": "example", "groups": ["female", "other"]}))
    with pytest.raises(DataFormatError, match="set metric.classification_fairness.predictions_file"):
        spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("classification_fairness", {}))
    with pytest.raises(DataFormatError, match="no such file"):
        spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("classification_fairness", {"predictions_file": str(tmp_path / "nope.csv")}))


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "p", "group": "g", "recommendations": ["a"]}], "no list of the neutral group 'neutral'"),
    ([{"prompt": "p", "group": "neutral", "recommendations": ["a"]},
      {"prompt": "q", "group": "g", "recommendations": ["a"]}], "row 2: prompt 'q' (group 'g') has no list of the"),
    ([{"prompt": "p", "group": "neutral", "recommendations": ["a"]},
      {"prompt": "p", "group": "neutral", "recommendations": ["b"]}], "row 2: a second list for prompt 'p'"),
    ([{"prompt": "p", "group": "neutral", "recommendations": "a, b"}], "row 1: recommendations is not a JSON array"),
    ([{"prompt": "p", "group": "neutral", "recommendations": [1, 2]}], "row 1: recommendations must be a list of"),
    ([{"prompt": "p", "group": "neutral", "recommendations": []}], "row 1: empty recommendation list"),
])
def test_bad_recommendations_file_is_named(tmp_path, rows, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = get_metric("recommendation_fairness")
    with pytest.raises(DataFormatError) as err:
        spec.compute(pd.DataFrame(), pd.DataFrame(), metric_options_from("recommendation_fairness", {"recommendations_file": str(path)}))
    assert message in str(err.value) and str(path) in str(err.value)


# --------------------------------------------------------------------------------------------------- pipeline
@pytest.mark.parametrize("metric, option", [("classification_fairness", "predictions_file"),
                                            ("recommendation_fairness", "recommendations_file")])
def test_runs_through_the_stages_with_cis(metric, option, tmp_path, monkeypatch):
    """Plan, score (nothing asked, nothing loaded) and metric stages on the shipped example, named by the model."""
    from biasflow import stages
    from biasflow.plan import build_plan

    monkeypatch.chdir(tmp_path)
    (job,) = build_plan([f"metric=[{metric}]", f"metric.{metric}.{option}=example", "model=glove_6b_50d",
                         "model.name=my_system", "stats.n_boot=200"]).jobs
    assert job.benchmark is None and job.model["name"] == "my_system"
    stages.score(job.score_params(), None, job.scores_path(), str(tmp_path / "cache"))
    assert pd.read_parquet(job.scores_path()).empty
    agg = stages.metric(job.params(), None, job.scores_path(), job.metric_dir)
    headline = get_metric(metric).headline[0]
    row = agg[(agg.metric == headline) & (agg.category == "overall")].iloc[0]
    assert row.ci_low <= row.value <= row.ci_high and row.ci_low < row.ci_high and row.model == "my_system"


def test_a_changed_file_is_a_changed_job(tmp_path, monkeypatch):
    from biasflow.plan import build_plan

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "p.csv"
    path.write_text("group,y_true,y_pred\na,1,1\nb,0,1\n")
    first = build_plan(["metric=[classification_fairness]", f"metric.classification_fairness.predictions_file={path}",
                        "model=glove_6b_50d"]).jobs[0].metric_dir
    path.write_text("group,y_true,y_pred\na,1,0\nb,0,1\n")
    assert build_plan(["metric=[classification_fairness]", f"metric.classification_fairness.predictions_file={path}",
                       "model=glove_6b_50d"]).jobs[0].metric_dir != first


@pytest.mark.parametrize("metric, option, name, content, message", [
    ("classification_fairness", "predictions_file", "p.csv", "group,y_true,y_pred\na,1,yes\n", "row 1: y_pred='yes'"),
    ("recommendation_fairness", "recommendations_file", "r.jsonl", '{"prompt": "p", "group": "g"}\n',
     "has no column 'recommendations'"),
])
def test_a_bad_file_fails_the_plan_naming_the_option(metric, option, name, content, message, tmp_path, monkeypatch):
    from biasflow.errors import ConfigError
    from biasflow.plan import build_plan

    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError) as err:
        build_plan([f"metric=[{metric}]", f"metric.{metric}.{option}={tmp_path / name}", "model=glove_6b_50d"])
    assert f"metric.{metric}.{option}" in str(err.value) and message in str(err.value)


def test_the_api_evaluates_a_table_of_the_users_outputs(tmp_path, monkeypatch):
    """``biasflow.api.evaluate`` takes a DataFrame of predictions or recommendation lists (as it takes responses):
    the same numbers as by hand and as from the same table's file, with CIs, named by ``name``; a table without a
    column the metric reads is named."""
    import biasflow.api as bf

    monkeypatch.chdir(tmp_path)
    assert bf.user_table_metrics() == {"classification_fairness": "predictions_file",
                                       "recommendation_fairness": "recommendations_file"}
    table = pd.DataFrame({"y_true": [1, 0, 1, 0, 1, 0, 1, 1], "y_pred": [1, 0, 0, 0, 1, 1, 1, 0],
                          "group": list("aaaabbbb")})
    got = bf.evaluate("classification_fairness", table, "stats.n_boot=100", name="mine").aggregate
    overall = got[got.category == "overall"].set_index("metric")
    # by hand: prevalence a 1/4, b 3/4; FPR a 0/2, b 1/1; FNR a 1/2, b 1/3
    assert overall.loc["predicted_prevalence_rate_difference", "value"] == pytest.approx(0.5)
    assert overall.loc["false_positive_rate_difference", "value"] == pytest.approx(1.0)
    assert overall.loc["false_negative_rate_ratio", "value"] == pytest.approx(1.5)
    assert set(got.model) == {"mine"} and got.ci_low.notna().any()
    path = tmp_path / "predictions.csv"
    table.to_csv(path, index=False)
    from_file = bf.evaluate("classification_fairness", path, "stats.n_boot=100", name="mine").aggregate
    pd.testing.assert_frame_equal(got[["metric", "category", "value", "ci_low", "ci_high", "n"]].reset_index(drop=True),
                                  from_file[["metric", "category", "value", "ci_low", "ci_high", "n"]]
                                  .reset_index(drop=True))

    lists = pd.DataFrame({"prompt": ["p1"] * 3 + ["p2"] * 3, "group": ["neutral", "female", "male"] * 2,
                          "recommendations": [["a", "b", "c"], ["a", "b", "d"], ["x", "b", "c"], ["q", "r"],
                                              ["q", "s"], ["r", "q"]]})
    rec = bf.evaluate("recommendation_fairness", lists, "stats.n_boot=100", name="my_recommender").aggregate
    jaccard = rec[rec.category == "overall"].set_index("metric").loc["jaccard_max", "value"]
    # Jaccard with the neutral list, averaged over prompts: female (2/4 + 1/3) / 2, male (2/4 + 2/2) / 2
    assert jaccard == pytest.approx(max((2 / 4 + 1 / 3) / 2, (2 / 4 + 2 / 2) / 2))
    from biasflow.errors import ConfigError

    with pytest.raises(ConfigError,
                       match=r"metric\.classification_fairness\.predictions_file: .* has no column 'group'"):
        bf.evaluate("classification_fairness", table.drop(columns="group"), "stats.n_boot=0")
