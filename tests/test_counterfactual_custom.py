"""Counterfactual fairness on attributes of your own (LangFair's ``custom_dict`` / ``custom_list``;
docs/counterfactual.md): word detection and variants equal to LangFair 0.8.0 run for real
(tests/fixtures/langfair_counterfactual/custom_dict_reference.json, made by custom_dict_reference.py beside it),
a hand-made example, the option's checks, and the prompts table the metric asks a model for."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from biasflow.errors import ConfigError
from biasflow.metrics.counterfactual import (check_custom_dict, custom_variants, custom_words, groups_of,
                                             variant_table)
from conftest import ROOT
from biasflow.registry import metric_options_from

REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "langfair_counterfactual" / "custom_dict_reference.json")
                       .read_text(encoding="utf-8"))


def test_detection_and_variants_equal_langfair():
    compared = 0
    for case in REFERENCE["cases"]:
        custom = case["custom_dict"]
        for entry in case["prompts"]:
            # LangFair's parse_texts(custom_list) and create_prompts(custom_dict), text for text
            assert custom_words(entry["prompt"], custom) == entry["words"], (case["attribute"], entry["prompt"])
            assert custom_variants(entry["prompt"], custom) == entry.get("variants"), (case["attribute"],
                                                                                       entry["prompt"])
            compared += 1
    assert compared == 66 and REFERENCE["provenance"]["langfair"] == "0.8.0"


def test_hand_made_example_and_corrected_mode():
    custom = {"christian": ["church", "Bible"], "muslim": ["mosque", "Quran"]}
    # parity: "Bible" as written never matches a lowercased token (LangFair compares them as given), but the
    # substitution lowercases the lists, so a prompt found by "church" swaps "bible" too
    assert custom_words("The Bible.", custom) == []
    assert custom_variants("The Bible.", custom) is None
    assert custom_variants("The church and the Bible.", custom) == {
        "christian": "the church and the bible.", "muslim": "the mosque and the quran."}
    assert custom_words("The Bible.", custom, mode="corrected") == ["bible"]


@pytest.mark.parametrize("custom, message", [
    ({"a": ["x"]}, "two or more groups"),
    ({"a": ["x", "y"], "b": ["z"]}, "same number of words"),
    ({"a": ["x"], "b": ["X"]}, "in the lists of both 'a' and 'b'"),
    ({"a": [" "], "b": ["y"]}, "an empty word"),
])
def test_bad_custom_dicts_are_refused(custom, message):
    with pytest.raises(Exception, match=message):
        check_custom_dict(custom)


def test_the_option_is_checked_at_plan_time_and_feeds_the_variants(tmp_path, monkeypatch):
    from biasflow.plan import build_plan

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="built-in attribute"):
        build_plan(["metric=[counterfactual]", "model=gpt2", "+metric.counterfactual.custom_attributes={gender: "
                    "{a: [x], b: [y]}}"])
    with pytest.raises(ConfigError, match="same number of words"):
        build_plan(["metric=[counterfactual]", "model=gpt2",
                    "+metric.counterfactual.custom_attributes.religion={christian: [church, bible], muslim: [mosque]}"])
    (job,) = build_plan(["metric=[counterfactual]", "model=gpt2", "metric.counterfactual.attributes=[]",
                         "+metric.counterfactual.custom_attributes.religion={muslim: [mosque, imam], "
                         "christian: [church, priest]}"]).jobs
    cfg = dict(job.metric_cfg)
    assert groups_of("religion", metric_options_from("counterfactual", cfg)) == ("christian", "muslim")  # sorted: the plan keeps mappings sorted
    items = pd.DataFrame({"item_id": ["p1", "p2"], "prompt": ["The imam spoke.", "No religion here."]})
    table = variant_table(items, metric_options_from("counterfactual", cfg))
    assert table[["attribute", "group", "prompt"]].values.tolist() == [
        ["religion", "christian", "the priest spoke."], ["religion", "muslim", "the imam spoke."]]
    assert "custom_attributes" in job.score_params()["metric_cfg"]  # the variants asked of the model depend on it
