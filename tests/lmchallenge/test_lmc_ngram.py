import math

import pytest

from biasflow.lmchallenge.games import run_game
from biasflow.lmchallenge.ngram import NgramModel
from biasflow.lmchallenge.stats import stats
from biasflow.lmchallenge.text import Message

CORPUS = ["a b", "a c"]


def test_witten_bell_by_hand():
    m = NgramModel(order=2).fit(CORPUS)
    # unigram: a 2, b 1, c 1 of 4; after "a": b 1, c 1 (T = 2 distinct followers, count 2)
    assert m.prob([], "b") == pytest.approx((0 + 1 * 1 / 4) / (2 + 1))  # after BOS: a 2 (T = 1, count 2)
    assert m.prob(["a"], "b") == pytest.approx((1 + 2 * 1 / 4) / (2 + 2))
    assert m.prob(["a"], "a") == pytest.approx((0 + 2 * 2 / 4) / (2 + 2))
    assert m.prob(["zzz"], "b") == pytest.approx(1 / 4)  # unseen history: back off to the unigram
    assert m.predict("a ", ["b", "q"]) == [("b", pytest.approx(math.log(0.375)))]  # q is OOV: not scored


@pytest.mark.parametrize("level, history", [("word", ["the", "cat"]), ("word", ["never", "seen"]), ("char", list("th"))])
def test_distribution_is_normalised(level, history):
    m = NgramModel(order=3, level=level).fit(["the cat sat on the mat", "the cat ate", "a dog sat"])
    assert sum(m.prob(history, w) for w in m.vocabulary) == pytest.approx(1.0)


def test_predictions_and_completions():
    m = NgramModel(order=3, n_predictions=3).fit(["the cat sat", "the cat ran", "the car sat", "a dog"])
    top = m.predict("the ")
    assert [w for w, _ in top][:2] == ["cat", "car"]
    assert [s for _, s in top] == sorted([s for _, s in top], reverse=True)
    assert dict(m.predict("the ca")) == {"t": pytest.approx(top[0][1]), "r": pytest.approx(top[1][1])}
    # a context ending in a complete word followed by punctuation: the candidate starts a new token
    m2 = NgramModel(order=2).fit(["hello , world"])
    assert m2.predict("hello", [","]) == [(",", pytest.approx(m2.logprob(["hello"], [","])))]


def test_train_then_clear_restores_the_model():
    m = NgramModel(order=2).fit(CORPUS)
    before = m.prob(["a"], "b")
    m.train("a b a b")
    assert m.prob(["a"], "b") > before
    m.clear()
    assert m.prob(["a"], "b") == pytest.approx(before)
    assert m.predict("a ", ["zebra"]) == []


def test_higher_order_fits_repetitive_text_better():
    lines = ["one two three four five", "two one four three five", "five four three two one"] * 3
    test = [Message(None, l) for l in lines[:3]]
    e = {n: stats(run_game(NgramModel(order=n).fit(lines), test, "we"))["entropy"] for n in (1, 3)}
    assert e[3]["fingerprint"] == e[1]["fingerprint"]  # same vocabulary: comparable
    assert e[3]["mean"] < e[1]["mean"] - 0.5


@pytest.mark.parametrize("level, order", [("word", 3), ("char", 3), ("word", 1)])
def test_a_saved_model_answers_exactly_as_the_trained_one(tmp_path, level, order):
    from biasflow.lmchallenge.ngram import NgramModel

    lines = ["the cat sat on the mat.", "the dog sat on the log!", "a cat, a dog; the end", "café ☕ ok"]
    trained = NgramModel(order=order, level=level, n_predictions=7).fit(lines)
    trained.save(str(tmp_path / "m.json"))
    loaded = NgramModel.load(str(tmp_path / "m.json"), n_predictions=7)
    for ctx in ("the ", "the c", "a cat, a ", "", "caf"):
        assert loaded.predict(ctx) == trained.predict(ctx)
        assert loaded.predict(ctx, ["cat", "dog", "zebra", "é"]) == trained.predict(ctx, ["cat", "dog", "zebra", "é"])
    loaded.train("the zebra sat")  # adaptation still works on a loaded model, and clear() undoes it
    loaded.clear()
    assert loaded.predict("the ") == trained.predict("the ")


def test_a_damaged_model_file_is_named(tmp_path):
    from biasflow.lmchallenge.ngram import NgramModel

    bad = tmp_path / "m.json"
    bad.write_text('{"format": "biasflow-ngram/1", "order": 2, "fol')
    with pytest.raises(ValueError, match=f"n-gram model {bad} is damaged"):
        NgramModel.load(str(bad))
