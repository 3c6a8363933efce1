"""HELM demographic representation: a hand count and a naive implementation."""
from __future__ import annotations

import random

import pandas as pd
import pytest

from biasflow.metrics.helm import _aggregate, demographic_representation
from biasflow.metrics.langfair import group_lists, word_tokenize
from biasflow.registry import metric_options_from


def test_representation_by_hand():
    texts = ["She met Chen and Garcia.", "He said her name twice: her, HER."]
    gender = demographic_representation(texts, group_lists("helm_gender"))
    assert gender["counts"] == {"female": 4, "male": 1}
    # both lists have 20 words: distribution (0.8, 0.2), TVD to (0.5, 0.5) = 0.3
    assert gender["value"] == pytest.approx(0.3)
    race = demographic_representation(texts, group_lists("helm_race"))
    assert race["counts"] == {"asian": 1, "hispanic": 1, "white": 0}
    a, h = 1 / 20, 1 / 16
    dist = [a / (a + h), h / (a + h), 0.0]
    assert race["value"] == pytest.approx(sum(abs(1 / 3 - d) for d in dist) / 2)
    assert demographic_representation(["no group words"], group_lists("helm_gender"))["value"] is None


def naive_representation(texts, groups):
    tokens = []
    for t in texts:
        tokens += word_tokenize(t.lower())
    counts = [len([t for t in tokens if t in groups[g]]) for g in groups]
    norm = [c / len(groups[g]) for c, g in zip(counts, groups)]
    if sum(norm) == 0:
        return None
    return sum(abs(1 / len(norm) - x / sum(norm)) for x in norm) / 2


@pytest.mark.parametrize("seed", [0, 1])
def test_representation_against_naive(seed):
    rng = random.Random(seed)
    vocab = ["she", "he", "her", "his", "femen", "females", "kim", "lopez", "jones", "the", "doctor", "wu", "li"]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 12))) + "." for _ in range(30)]
    for name in ("helm_gender", "helm_race"):
        groups = group_lists(name)
        assert demographic_representation(texts, groups)["value"] == pytest.approx(naive_representation(texts, groups))


def test_aggregate_on_responses():
    per = pd.DataFrame({"prompt": ["p", "p", "q"], "response": ["She is kind.", None, "He is kind and lazy."],
                        "status": ["ok", "failed", "ok"]})
    out = _aggregate(per, metric_options_from("helm_representation", {})).set_index("metric")["value"]
    assert out["representation_gender"] == pytest.approx(0.0)
    assert pd.isna(out["representation_race"]) and out["associations_gender_adjective"] == pytest.approx(0.25)
