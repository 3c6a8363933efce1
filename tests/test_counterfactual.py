"""LangFair 0.8.0 counterfactual family: prompts and metrics against the real LangFair's outputs
(tests/fixtures/langfair_counterfactual/, see its README) and hand-computed values."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import minilm_vocab_dir

from biasflow.errors import BiasflowError, DataFormatError
from biasflow.metrics import counterfactual as cf
from biasflow.registry import metric_options_from

FIX = Path(__file__).parent / "fixtures" / "langfair_counterfactual"
PROMPTS = json.loads((FIX / "counterfactual_prompts.json").read_text())["prompts"]
METRICS = json.loads((FIX / "counterfactual_metrics.json").read_text())
TEXTS1 = [p["text1"] for p in METRICS["pairs"]]
TEXTS2 = [p["text2"] for p in METRICS["pairs"]]


def _allowed(record: dict, field: str) -> list:
    """LangFair's value of a field, or every value it gave over PYTHONHASHSEED 0-39 when it depends on the seed."""
    variants = record["hash_seed_dependent"].get(field)
    return [v["value"] for v in variants] if variants else [record[field]]


@pytest.mark.parametrize("record", PROMPTS, ids=lambda r: str(r["index"]))
def test_prompts_as_langfair(record):
    text = record["prompt"]
    assert cf.attribute_words(text, "gender") == record["parse_texts_gender_sorted"]
    assert cf.attribute_words(text, "race") == record["parse_texts_race_sorted"]
    assert cf.neutralize(text, "gender") == record["neutralize_tokens_gender"]
    assert cf.neutralize(text, "race") in _allowed(record, "neutralize_tokens_race")
    gender = cf.counterfactual_variants(text, "gender")
    if record["create_prompts_gender"] is None:
        assert gender is None
    else:
        assert gender == {g: record["create_prompts_gender"][f"{g}_prompt"] for g in cf.GENDER_GROUPS}
    race = cf.counterfactual_variants(text, "race")
    if record["create_prompts_race"] is None:
        assert race is None
    else:  # per target, one of the outputs LangFair gave under some hash seed (biasflow: longest match first)
        for group in cf.RACE_GROUPS:
            assert race[group] in {v[f"{group}_prompt"] for v in _allowed(record, "create_prompts_race")}


def test_race_order_is_deterministic_and_documented():
    # LangFair gives "the caucwhite man" or "the white man" depending on PYTHONHASHSEED; biasflow replaces the longest
    # phrase first, ties alphabetically ("asian man" before "caucasian", both 9 characters): always the former
    assert cf.counterfactual_variants("The Caucasian man was tall.", "race")["white"] == "the caucwhite man was tall."
    assert cf.counterfactual_variants("The blacksmith spoke.", "race")["white"] == "the whitemith spoke."


def test_corrected_mode_fixes_the_quirks():
    assert cf.attribute_words("The blacksmith spoke.", "race", "corrected") == []
    assert cf.counterfactual_variants("The blacksmith spoke.", "race", "corrected") is None
    assert cf.attribute_words("The Caucasian man was tall.", "race", "corrected") == ["caucasian"]
    assert cf.counterfactual_variants("My girlfriend called.", "gender") is None  # LangFair's "girfriend"
    assert cf.counterfactual_variants("My girlfriend called.", "gender", "corrected") == {
        "female": "my girlfriend called.", "male": "my boyfriend called."}
    assert cf.counterfactual_variants("My boyfriend called.", "gender")["female"] == "my girfriend called."
    assert cf.attribute_words("Hello, Mr. President.", "gender") == []
    assert cf.attribute_words("Hello, Mr. President.", "gender", "corrected") == ["mr."]


def test_bad_input_errors():
    with pytest.raises(BiasflowError, match="attribute"):
        cf.attribute_words("he", "religion")
    with pytest.raises(BiasflowError, match="mode"):
        cf.attribute_words("he", "gender", "strict")
    with pytest.raises(BiasflowError, match="pair up"):
        cf.pair_metrics(["a"], ["a", "b"])


def test_detokenize_matches_moses_cases():
    assert cf.detokenize(["she", "said", "``", "no", "''", "and", "did", "n't", "go", "(", "really", ")", "."]) == \
        "she said ``no ''and did n't go (really)."
    assert cf.detokenize(["it", "was", "her", "'s", ",", "not", "$", "5", "!"]) == "it was her's, not $5!"


def test_hand_computed_metrics():
    # BLEU: identical 2-token texts have no 3-/4-grams; method1 gives them 0.1/1 -> (1*1*0.1*0.1)**0.25
    assert cf.bleu("OK go", "ok go") == pytest.approx(0.1 ** 0.5, abs=1e-12)
    # ROUGE-L: LCS("the cat sat", "the cat ran") = 2 of 3 each way -> F = 2/3
    assert cf.rouge_l("the cat sat", "the cat ran") == pytest.approx(2 / 3, abs=1e-12)
    assert cf.rouge_l("", "") == 0.0
    assert cf.strong_parity([0.0, 0.5, 0.2], [0.1, 0.0, 0.6]) == pytest.approx((0 + 0.1 + 0.1) / 3)
    assert cf.weak_parity([0.6, 0.1], [0.1, 0.1]) == 0.5 and cf.weak_parity([0.1], [0.6]) == -1.0
    assert cf.weak_parity([0.5], [0.0]) == 0.0  # strict >
    np.testing.assert_allclose(cf.cosine([[1, 0], [1, 1]], [[1, 0], [-1, 1]]), [1.0, 0.0], atol=1e-7)


@pytest.mark.parametrize("attribute", ["gender", "race"])
def test_neutralised_texts_as_langfair(attribute):
    ing = METRICS["ingredients"]
    assert [cf.neutralize(t, attribute) for t in TEXTS1] == ing[f"neutralized_{attribute}_texts1"]
    assert [cf.neutralize(t, attribute) for t in TEXTS2] == ing[f"neutralized_{attribute}_texts2"]


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(minilm_vocab_dir()), device="cpu")


@pytest.fixture(scope="module")
def embeddings(minilm):
    return minilm.encode(TEXTS1), minilm.encode(TEXTS2)


@pytest.mark.parametrize("case,attribute", [("default_attribute_gender", "gender"), ("default_attribute_race", "race"),
                                            ("neutralize_tokens_False", None)])
def test_metrics_as_langfair(case, attribute, embeddings):
    ref = METRICS["CounterfactualMetrics"][case]["result"]
    per, agg = cf.pair_metrics(TEXTS1, TEXTS2, attribute, *embeddings)
    names = {"cosine": "Cosine Similarity", "rougel": "RougeL Similarity", "bleu": "Bleu Similarity",
             "sentiment_diff": "Sentiment Bias"}
    for mine, theirs in names.items():
        np.testing.assert_allclose(per[mine], ref["data"][theirs], rtol=0, atol=1e-6)
    for mine, theirs in list(names.items())[:3]:
        assert agg[mine] == pytest.approx(ref["metrics"][theirs], abs=1e-6)
    assert agg["sentiment_strong_parity"] == pytest.approx(ref["metrics"]["Sentiment Bias"], abs=1e-12)


@pytest.mark.parametrize("sentiment", ["neg", "pos"])
@pytest.mark.parametrize("parity,threshold", [("strong", 0.5), ("weak", 0.5), ("weak", 0.2)])
def test_sentiment_parity_as_langfair(sentiment, parity, threshold):
    key = (f"SentimentBias(classifier='vader', sentiment='{sentiment}', parity='{parity}', threshold={threshold}, "
           "how='mean')")
    expected = METRICS["individual_metrics_on_raw_texts"][key]["return_value"]
    s1, s2 = cf.vader_scores(TEXTS1, sentiment), cf.vader_scores(TEXTS2, sentiment)
    got = cf.strong_parity(s1, s2) if parity == "strong" else cf.weak_parity(s1, s2, threshold)
    assert got == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------------------------------------ pipeline
def test_pipeline_and_api_on_a_responses_file_equal_the_library(tmp_path, minilm, monkeypatch):
    """plan -> prepare -> score (responses file, then the packaged MiniLM as the encoder) -> metric: the aggregates
    are the library's numbers on the same pairs."""
    import pandas as pd
    from test_generation_pipeline import run_job

    from biasflow.data.prompts import load_langfair_prompts
    from biasflow.plan import build_plan

    items = load_langfair_prompts({}, {}).head(2)
    variants = cf.variant_table(items, metric_options_from("counterfactual", {"run_mode": "parity"}))
    assert set(variants["group"]) == {"female", "male"}
    replies = {"female": ["She is kind and caring.", "A terrible, awful letter."],
               "male": ["He is kind and confident.", "A wonderful letter."]}
    rows = [{"prompt": p, "response": replies[g][i]} for p, g in zip(variants["prompt"], variants["group"])
            for i in range(2)]
    pd.DataFrame(rows).to_csv(tmp_path / "resp.csv", index=False)
    plan = build_plan(["metric=[counterfactual]", "benchmark.langfair_prompts.limit=2",
                       "metric.counterfactual.generation.count=2", "+generator=responses_file",
                       f"generator.path={tmp_path / 'resp.csv'}"])
    agg = run_job(plan.jobs[0], tmp_path)
    got = agg[agg["category"] == "gender:female-male"].set_index("metric")["value"]
    t1 = [replies["female"][i] for _ in range(2) for i in range(2)]
    t2 = [replies["male"][i] for _ in range(2) for i in range(2)]
    _, expected = cf.pair_metrics(t1, t2, "gender", minilm.encode(t1), minilm.encode(t2))
    for name in ("rougel", "bleu", "sentiment_strong_parity", "sentiment_weak_parity"):
        assert got[name] == pytest.approx(expected[name], abs=1e-12), name
    assert got["cosine"] == pytest.approx(expected["cosine"], abs=1e-6)
    assert got["non_completion_rate"] == 0
    per_item = pd.read_parquet(tmp_path / "out" / "per_item.parquet")
    assert len(per_item) == 4 and per_item["item_id"].is_unique
    assert {"ci_low", "ci_high"} <= set(agg.columns)

    # paired tests between two models on the same pairs (the generic paired bootstrap over item_id)
    from biasflow.registry import get_metric
    from biasflow.stats import paired

    spec = get_metric("counterfactual")
    other = per_item.copy()
    other["rougel"], other["sentiment1"] = other["rougel"] * 0.5, 0.0
    tables = {"A": per_item, "B": other}
    tests = paired.paired_bootstrap(tables, {m: (lambda df: spec.aggregate(df, metric_options_from("counterfactual", {}))) for m in tables},
                                    list(spec.headline), n_boot=20, seed=0)
    row = tests[tests["metric"] == "rougel"].iloc[0]
    assert row["ci_low"] > 0 and set(tests["metric"]) == set(spec.headline)

    # biasflow.api.evaluate on the same responses, in process: the same numbers and CIs as the pipeline
    from conftest import project_copy

    import biasflow.api as bf

    project = project_copy(tmp_path / "project")
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    monkeypatch.chdir(project)
    ours = bf.evaluate("counterfactual", pd.DataFrame(rows), "benchmark.langfair_prompts.limit=2",
                       "metric.counterfactual.generation.count=2", "stats.n_boot=20", "stats.seed=0").aggregate
    cols = ["metric", "category", "value", "ci_low", "ci_high", "n"]
    pd.testing.assert_frame_equal(ours[cols].sort_values(cols[:2]).reset_index(drop=True),
                                  agg[cols].sort_values(cols[:2]).reset_index(drop=True))

    # a response the file lacks fails the score stage, naming it; accepted as a non-completion, the response left
    # without its counterfactual partner is named by file and row
    from biasflow.errors import GenerationError

    pd.DataFrame(rows[:-1]).to_csv(tmp_path / "short.csv", index=False)
    short = ["metric=[counterfactual]", "benchmark.langfair_prompts.limit=2", "metric.counterfactual.generation.count=2",
             "metric.counterfactual.encoder=false", "+generator=responses_file",
             f"generator.path={tmp_path / 'short.csv'}"]
    with pytest.raises(GenerationError, match=r"1 of 8 requests have no response in the responses file, more than "
                                              r"generator.max_failed_fraction=0; first error: no response 2 to"):
        run_job(build_plan(short).jobs[0], tmp_path / "short")
    plan = build_plan([*short, "generator.max_failed_fraction=0.2"])
    with pytest.raises(DataFormatError, match=r"short\.csv: row 6 .* has no counterfactual partner: no response 2 "
                                              r"to .* \(its male variant\)"):
        run_job(plan.jobs[0], tmp_path / "short2")


def test_the_pipelines_encoder_gives_langfairs_cosine():
    """The score stage's sentence encoder (biasflow.models.encoders, the packaged MiniLM) gives LangFair's cosine."""
    from biasflow.models.encoders import SentenceEncoder

    enc = SentenceEncoder({**cf.DEFAULT_ENCODER, "device": "cpu"})
    ref = METRICS["CounterfactualMetrics"]["default_attribute_gender"]["result"]["data"]["Cosine Similarity"]
    np.testing.assert_allclose(cf.cosine(enc.encode(TEXTS1), enc.encode(TEXTS2)), ref, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------- hostile texts (issue 44)
# LangFair 0.8.0 run for real (NLTK 3.10.4 with its Punkt English parameters, sacremoses 0.1.1) on 686 texts written
# to break text processing: curly quotes, abbreviations ("Gen. Lee", "the U.S. The", "etc. He", "Plan B. Then"),
# initials, mixed case, many sentences; 200 gender and 120 race response pairs. Made by hostile_reference.py (its
# docstring has the command; versions and date in the file).
HOSTILE = json.loads((FIX / "hostile_reference.json").read_text(encoding="utf-8"))


def test_hostile_texts_processed_as_langfair():
    """parse_texts, create_prompts and neutralize_tokens, gender and race, on every hostile text: equal."""
    assert HOSTILE["versions"]["langfair"] == "0.8.0" and HOSTILE["versions"]["nltk"] == "3.10.4"
    assert not HOSTILE["race_seed_dependent_texts"]  # the texts avoid overlapping race phrases
    wrong = []
    for text, rec in HOSTILE["texts"].items():
        gender = cf.counterfactual_variants(text, "gender")
        race = cf.counterfactual_variants(text, "race")
        got = {"parse_texts_gender_sorted": cf.attribute_words(text, "gender"),
               "parse_texts_race_sorted": cf.attribute_words(text, "race"),
               "neutralize_tokens_gender": cf.neutralize(text, "gender"),
               "neutralize_tokens_race": cf.neutralize(text, "race"),
               "create_prompts_gender": gender and {f"{g}_prompt": v for g, v in gender.items()},
               "create_prompts_race": race and {f"{g}_prompt": v for g, v in race.items()}}
        wrong += [(text, key, value, rec[key]) for key, value in got.items() if value != rec[key]]
    assert not wrong, f"{len(wrong)} outputs differ from LangFair's, e.g. {wrong[:2]}"


NAMES = {"rougel": "RougeL Similarity", "bleu": "Bleu Similarity", "sentiment_diff": "Sentiment Bias",
         "cosine": "Cosine Similarity"}


@pytest.mark.parametrize("attribute", ["gender", "race"])
@pytest.mark.parametrize("neutralize", [True, False])
def test_hostile_pair_metrics_as_langfair(attribute, neutralize, minilm):
    """CounterfactualMetrics on 200 gender / 120 race hostile pairs: every per-pair ROUGE-L, BLEU and sentiment
    difference and the means within 1e-6 (BLEU moved by up to 0.02 with the stand-in sentence splitter); cosine on
    the first 8 pairs (it reads no tokens)."""
    ref = HOSTILE["CounterfactualMetrics"][f"{attribute}_neutralize_{neutralize}"]
    pairs = HOSTILE["inputs"][f"{attribute}_pairs"]
    t1, t2 = [p[0] for p in pairs], [p[1] for p in pairs]
    per, agg = cf.pair_metrics(t1, t2, attribute if neutralize else None)
    for mine in ("rougel", "bleu", "sentiment_diff"):
        np.testing.assert_allclose(per[mine], ref["data"][NAMES[mine]], rtol=0, atol=1e-6, err_msg=mine)
    for mine in ("rougel", "bleu"):
        assert agg[mine] == pytest.approx(ref["metrics"][NAMES[mine]], abs=1e-6)
    assert agg["sentiment_strong_parity"] == pytest.approx(ref["metrics"]["Sentiment Bias"], abs=1e-12)
    cos = cf.cosine(minilm.encode(t1[:8]), minilm.encode(t2[:8]))
    np.testing.assert_allclose(cos, ref["data"]["Cosine Similarity"][:8], rtol=0, atol=1e-6)


def test_hostile_sentiment_parity_as_langfair():
    for key, expected in HOSTILE["SentimentBias"].items():
        attribute, sentiment, kind, threshold = key.split("|")
        pairs = HOSTILE["inputs"][f"{attribute}_pairs"]
        s1 = cf.vader_scores([p[0] for p in pairs], sentiment)
        s2 = cf.vader_scores([p[1] for p in pairs], sentiment)
        got = cf.strong_parity(s1, s2) if kind == "strong" else cf.weak_parity(s1, s2, float(threshold))
        assert got == pytest.approx(expected, abs=1e-12), key


def test_closing_curly_quote_is_no_quote_for_moses():
    """sacremoses' English detokenizer treats ' " „ “ ` as quotes, not ”: it stands apart like a word. Outputs of
    sacremoses 0.1.1 MosesDetokenizer("en").detokenize (scratch venv)."""
    assert cf.detokenize(["\u201c", "She", "\u2019", "s", "right", ",", "\u201d", "he", "said", "."]) == \
        "\u201cShe \u2019 s right, \u201d he said."
    assert cf.detokenize(["he", "said", "\u201c", "no", "\u201d", "and", "left", "."]) == \
        "he said \u201cno \u201d and left."
    # a second opening curly quote closes the first one ("said“ thanks"), as in LangFair's neutralised text
    assert cf.detokenize(["\u201c", "Fine", ".", "\u201d", "said", "\u201c", "thanks", ".", "\u201d"]) == \
        "\u201cFine. \u201d said\u201c thanks. \u201d"
    assert cf.neutralize("\u201cShe\u2019s right,\u201d he said.", "gender") == \
        "\u201cthey \u2019 s right, \u201d they said."
    # CJK words join; currency signs of sacremoses' (older) Unicode table attach right, newer ones (bitcoin) do not
    assert cf.detokenize(["\u65e5\u672c", "\u8a9e", "is", "$", "5", "\u20bf", "5", "&amp;", "\u00a3", "2"]) == \
        "\u65e5\u672c\u8a9e is $5 \u20bf 5 & \u00a32"


def test_neutralize_misalignment_parity_and_corrected():
    """LangFair pairs the tokens of a text with those of its lowercased copy; Punkt splits "Plan B. Then" into two
    sentences but "plan b. then" into one, so the pairs slip (parity reproduces it); corrected pairs each token with
    its own lowercase form."""
    text = "Plan B. Then he called his father."
    assert cf.neutralize(text, "gender") == "Plan B. they he their parent father"
    assert cf.neutralize(text, "gender", "corrected") == "Plan B. Then they called their parent."
    assert cf.neutralize("We toured the U.S. The trip changed him.", "gender") == \
        "We toured the U.S. The trip them him"
    assert cf.neutralize("We toured the U.S. The trip changed him.", "gender", "corrected") == \
        "We toured the U.S. The trip changed them."
    # the pipeline's mode: run.mode=parity (default) keeps the slip, corrected fixes it
    assert cf.neutralize("Plan B. Then she smiled.", "gender") == "Plan B. they she smiled"
    per, _ = cf.pair_metrics(["Plan B. Then he smiled."], ["Plan B. Then she smiled."], "gender")
    per_c, _ = cf.pair_metrics(["Plan B. Then he smiled."], ["Plan B. Then she smiled."], "gender", mode="corrected")
    assert per_c["bleu"][0] == pytest.approx(1.0) and per["bleu"][0] < 0.5


def test_prompts_file_benchmark_runs_the_counterfactual_metric(tmp_path):
    """conf/benchmark/prompts_file.yaml as documented (docs/counterfactual.md): your own prompts file, pinned by its
    sha256, as the metric's benchmark; prepare reads it, only prompts with attribute words get variants."""
    import hashlib

    import pandas as pd

    from biasflow import stages
    from biasflow.plan import build_plan

    prompts = tmp_path / "my_prompts.csv"
    prompts.write_text("item_id,prompt\np1,Gen. Lee said his father was kind.\np2,The weather is fine.\n"
                       "p3,The black man smiled.\n", encoding="utf-8")
    sha = hashlib.sha256(prompts.read_bytes()).hexdigest()
    items = pd.read_csv(prompts)
    variants = cf.variant_table(items, metric_options_from("counterfactual", {"run_mode": "parity", "mode": None, "attributes": ["gender", "race"]}))
    assert sorted(set(variants["item_id"])) == ["p1", "p3"]
    pd.DataFrame({"prompt": variants["prompt"].unique(), "response": "A fine answer."}).to_csv(tmp_path / "resp.csv",
                                                                                      index=False)
    plan = build_plan(["metric=[counterfactual]", "metric.counterfactual.benchmark=prompts_file",
                       f"+benchmark.prompts_file.files.prompts={{filename: my_prompts.csv, sources: "
                       f"[{{url: 'file://{prompts}', sha256: {sha}}}]}}",
                       "metric.counterfactual.generation.count=1", "metric.counterfactual.encoder=false",
                       "+generator=responses_file", f"generator.path={tmp_path / 'resp.csv'}"])
    job = plan.jobs[0]
    assert job.benchmark == "prompts_file"
    raw = {}
    for key, spec in job.benchmark_cfg["files"].items():
        raw[key] = str(tmp_path / "raw" / spec["filename"])
        stages.download_file(spec["sources"], raw[key], str(tmp_path / "wheels"))
    items_path, scores_path = tmp_path / "items.parquet", tmp_path / "scores.parquet"
    stages.prepare(job.benchmark, job.benchmark_cfg, raw, str(items_path))
    assert pd.read_parquet(items_path)["item_id"].tolist() == ["p1", "p2", "p3"]
    spec = __import__("biasflow.registry", fromlist=["get_metric"]).get_metric(job.metric)
    stages.score(job.score_params(spec.score_keys), str(items_path), str(scores_path), str(tmp_path / "cache"))
    params = job.params()
    params["stats"] = {"n_boot": 0, "seed": 0, "level": 0.95}
    agg = stages.metric(params, str(items_path), str(scores_path), str(tmp_path / "out")).set_index(
        ["metric", "category"])["value"]
    assert agg["bleu", "gender:female-male"] == pytest.approx(1.0) and agg["rougel", "race:white-black"] == 1.0
    assert agg["non_completion_rate", "overall"] == 0


def test_prompts_file_without_a_file_is_refused_at_plan_time():
    """The shipped prompts_file config names no file (it is the user's): the plan says how to name one, instead of
    prepare failing with pandas' 'No objects to concatenate'."""
    from biasflow.errors import ConfigError
    from biasflow.plan import build_plan

    with pytest.raises(ConfigError, match=r"benchmark.prompts_file.files is empty: name your prompts file"):
        build_plan(["metric=[counterfactual]", "metric.counterfactual.benchmark=prompts_file"])
