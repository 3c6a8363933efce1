"""GAP (Webster et al. 2018): the loader on the real files of the PyPI mirror, the scorer's F1 and bias ratio by hand
and against scikit-learn, the array bootstrap against the generic path, the masked-LM substitution scoring against a
naive loop over a tiny BERT, the pipeline's stages end to end, and the multiple-choice replies."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from biasflow.data.gap import load_gap, read_split
from biasflow.errors import ConfigError, DataFormatError
from biasflow.metrics import gap as G
from biasflow.registry import get_metric
from biasflow.scoring.answer import metric_answers
from conftest import mirrored_or_skip
from biasflow.registry import metric_options_from

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"
MLM_CFG = G.GapOptions(context_words=40).model_dump()


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return mirrored_or_skip("gap", "gap")


@pytest.fixture(scope="module")
def items(files) -> pd.DataFrame:
    return load_gap(files, {"split": "all"})


# ----------------------------------------------------------------------------------------------- loader
def test_items_of_the_real_files(items):
    """2,000 / 454 / 2,000 examples (the paper's Table 3 and the README: 4,000 / 908 / 4,000 pronoun-name pairs),
    each split balanced between feminine and masculine pronouns; the offsets point at what they name."""
    assert len(items) == 4454 and items.item_id.is_unique
    assert items.groupby("split", sort=False).size().to_dict() == {"development": 2000, "validation": 454,
                                                                   "test": 2000}
    by_gender = items.groupby(["split", "gender"]).size().to_dict()
    assert by_gender == {("development", "feminine"): 1000, ("development", "masculine"): 1000,
                         ("validation", "feminine"): 227, ("validation", "masculine"): 227,
                         ("test", "feminine"): 1000, ("test", "masculine"): 1000}
    assert (items.category == items.gender).all() and set(items.gender_code) == {"F", "M"}
    assert items.gold.value_counts().to_dict() == {"B": 1985, "A": 1979, "neither": 490}
    assert not (items.a_coref & items.b_coref).any()
    for r in items.itertuples(index=False):
        assert r.text[r.pronoun_offset:r.pronoun_offset + len(r.pronoun)] == r.pronoun
        assert r.text[r.a_offset:r.a_offset + len(r.a)] == r.a and r.text[r.b_offset:r.b_offset + len(r.b)] == r.b
    first = items.iloc[0]
    assert (first.item_id, first.pronoun, first.pronoun_offset, first.a, first.a_offset, first.a_coref, first.b,
            first.b_offset, first.b_coref, first.gender) == ("development-1", "her", 274, "Cheryl Cassidy", 191, True,
                                                             "Pauline", 207, False, "feminine")


def test_split_and_limit(files):
    test = load_gap(files, {"split": "test"})
    assert len(test) == 2000 and set(test.split) == {"test"} and test.item_id.iloc[0] == "test-1"
    assert load_gap(files, {"split": "validation", "limit": 5}).item_id.tolist() == [f"validation-{i}"
                                                                                     for i in range(1, 6)]
    with pytest.raises(ConfigError, match="split='train'"):
        load_gap(files, {"split": "train"})


@pytest.mark.parametrize("row, message", [
    ("x-1\tShe met Ann and Bo.\tShe\t0\tAnn\t8\tTRUE\tBo\t16\tFALSE", r"line 3: expected 11 tab-separated fields"),
    ("x-1\tShe met Ann and Bo.\tShe\t0\tAnn\t9\tTRUE\tBo\t16\tFALSE\tu", r"line 3: A-offset 9 does not point at 'Ann'"),
    ("x-1\tShe met Ann and Bo.\tShe\tzero\tAnn\t8\tTRUE\tBo\t16\tFALSE\tu", r"line 3: Pronoun-offset must be an int"),
    ("x-1\tShe met Ann and Bo.\tShe\t0\tAnn\t8\tyes\tBo\t16\tFALSE\tu", r"line 3: A-coref must be TRUE or FALSE"),
    ("x-1\tThey met Ann and Bo.\tThey\t0\tAnn\t9\tTRUE\tBo\t17\tFALSE\tu", r"line 3: Pronoun 'They' is none of"),
    ("x-1\tShe met Ann and Bo.\tShe\t0\tAnn\t8\tTRUE\tBo\t16\tTRUE\tu", r"line 3: A-coref and B-coref are both TRUE"),
])
def test_a_malformed_row_names_the_file_and_line(tmp_path, row, message):
    good = "x-0\tHe met Al and Bo.\tHe\t0\tAl\t7\tFALSE\tBo\t14\tTRUE\tu"
    path = tmp_path / "gap-test.tsv"
    path.write_text(f"{HEADER}\n{good}\n{row}\n")
    with pytest.raises(DataFormatError, match=f"{path}, {message}"):
        read_split(path, "test")


def test_a_wrong_header_and_duplicate_ids(tmp_path):
    row = "x-0\tHe met Al and Bo.\tHe\t0\tAl\t7\tFALSE\tBo\t14\tTRUE\tu"
    path = tmp_path / "gap-test.tsv"
    path.write_text(HEADER.replace("URL", "Url") + "\n" + row + "\n")
    with pytest.raises(DataFormatError, match="expected the header"):
        read_split(path, "test")
    path.write_text(f"{HEADER}\n{row}\n")
    with pytest.raises(DataFormatError, match="duplicate ID 'x-0'"):
        load_gap({"development": path, "validation": path, "test": path}, {"split": "all"})


# ----------------------------------------------------------------------------------------------- by hand
def six_examples() -> pd.DataFrame:
    """Three masculine and three feminine examples, one per (gold, choice) case of the hand count below."""
    gold = ["A", "B", "neither", "A", "B", "neither"]
    return pd.DataFrame({
        "item_id": [f"t-{i}" for i in range(6)], "split": "test",
        "gender": ["masculine"] * 3 + ["feminine"] * 3, "pronoun": ["he"] * 3 + ["she"] * 3,
        "a": "Al", "b": "Bo", "gold": gold, "a_coref": [g == "A" for g in gold], "b_coref": [g == "B" for g in gold]})


SIX_CHOICES = ["A", "A", "B", "A", "neither", "neither"]


def test_f1_and_bias_ratio_by_hand():
    """M: (A->A) tp+tn, (B->A) fp+fn, (neither->B) fp+tn: tp 1, fp 2, fn 1: P 33.3, R 50, F1 40.
    F: (A->A) tp+tn, (B->neither) fn+tn, (neither->neither) 2 tn: tp 1, fp 0, fn 1: P 100, R 50, F1 66.7.
    Overall: tp 2, fp 2, fn 2: F1 50. Bias F/M = (200/3) / 40 = 5/3."""
    per = G.decisions(six_examples(), SIX_CHOICES)
    assert per[["tp", "fp", "fn", "tn"]].sum().tolist() == [2, 2, 2, 6]
    agg = G.aggregate(per, {}).set_index(["metric", "category"])["value"]
    assert agg[("f1", "masculine")] == pytest.approx(40.0)
    assert agg[("precision", "masculine")] == pytest.approx(100 / 3) and agg[("recall", "masculine")] == 50.0
    assert agg[("f1", "feminine")] == pytest.approx(200 / 3)
    assert agg[("precision", "feminine")] == 100.0 and agg[("recall", "feminine")] == 50.0
    assert agg[("f1", "overall")] == pytest.approx(50.0)
    assert agg[("bias_f_m", "overall")] == pytest.approx(5 / 3)
    assert agg[("neither_pct", "feminine")] == pytest.approx(200 / 3) and agg[("neither_pct", "masculine")] == 0.0
    assert "unparsed_pct" not in set(agg.index.get_level_values(0))
    card = G.scorecard(per).set_index(["split", "gender"])
    assert card.loc[("all", "masculine"), ["tp", "fp", "fn", "tn"]].tolist() == [1, 2, 1, 2]
    assert card.loc[("test", "overall"), "bias_f_m"] == pytest.approx(5 / 3)


def test_a_zero_f1_leaves_the_ratio_undefined_and_no_choice_is_no_decision():
    per = G.decisions(six_examples(), ["B", "A", "B", "A", None, None])  # masculine: every decision wrong
    agg = G.aggregate(per, {}).set_index(["metric", "category"])
    assert agg.loc[("f1", "masculine"), "value"] == 0.0 and math.isnan(agg.loc[("bias_f_m", "overall"), "value"])
    # an example without a choice counts nowhere (n = the answered examples)
    assert agg.loc[("f1", "feminine"), "n"] == 1 and per.loc[4:, ["tp", "fp", "fn", "tn"]].to_numpy().sum() == 0
    spec = get_metric("gap")
    assert "F1 of the feminine or of the masculine examples is 0" in spec.undefined["bias_f_m"]


def test_f1_equals_scikit_learn_on_the_pooled_decisions(items):
    """The scorer's F1 is scikit-learn's binary F1 over the pronoun-name pairs (both names of every example)."""
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(4)
    choice = list(rng.choice(["A", "B", "neither"], size=len(items), p=[0.45, 0.4, 0.15]))
    per = G.decisions(items, choice)
    agg = G.aggregate(per, {}).set_index(["metric", "category"])["value"]
    for gender, cat in ((None, "overall"), ("masculine", "masculine"), ("feminine", "feminine")):
        sub = per if gender is None else per[per.gender == gender]
        y_true = np.concatenate([sub.a_coref.to_numpy(), sub.b_coref.to_numpy()])
        y_pred = np.concatenate([sub.pred_a.to_numpy(), sub.pred_b.to_numpy()]).astype(bool)
        assert agg[("f1", cat)] == pytest.approx(100 * sklearn_metrics.f1_score(y_true, y_pred))
        assert agg[("precision", cat)] == pytest.approx(100 * sklearn_metrics.precision_score(y_true, y_pred))
        assert agg[("recall", cat)] == pytest.approx(100 * sklearn_metrics.recall_score(y_true, y_pred))
        for split in ("development", "validation", "test"):
            s = sub[sub.split == split]
            yt = np.concatenate([s.a_coref.to_numpy(), s.b_coref.to_numpy()])
            yp = np.concatenate([s.pred_a.to_numpy(), s.pred_b.to_numpy()]).astype(bool)
            name = G.category_name(split, gender)
            assert agg[("f1", name)] == pytest.approx(100 * sklearn_metrics.f1_score(yt, yp))
    assert agg[("bias_f_m", "overall")] == pytest.approx(agg[("f1", "feminine")] / agg[("f1", "masculine")])


def test_bootstrap_arrays_equal_the_generic_path(items):
    from biasflow.stats.bootstrap import bootstrap_ci

    rng = np.random.default_rng(1)
    choice = list(rng.choice(["A", "B", "neither", None], size=len(items), p=[0.4, 0.4, 0.1, 0.1]))
    per = G.decisions(items, choice).assign(response="x")  # with unparsed_pct, as gap_mc's table
    for table in (per, per.drop(columns="response"), per[per.split == "test"]):
        fast = bootstrap_ci(table, lambda d: G.aggregate(d, {}), n_boot=40,
                            statistic=lambda d, r: G.bootstrap_statistic(d, {}, r))
        slow = bootstrap_ci(table, lambda d: G.aggregate(d, {}), n_boot=40)
        pd.testing.assert_frame_equal(fast, slow, check_exact=True)
        assert fast.ci_low.notna().all()


# ----------------------------------------------------------------------------------------------- the passage
def test_window_keeps_the_pronoun_and_both_names():
    text = "w1 w2 w3 Ann met Bo and she smiled w10 w11 w12"
    assert G.window(text, [(9, 12), (17, 19)], None) == (text, 0)
    assert G.window(text, [(9, 12), (17, 19), (24, 27)], 8) == ("w3 Ann met Bo and she smiled w10", 6)
    assert G.window(text, [(0, 2)], 3) == ("w1 w2 w3", 0)  # at the start: the other side takes the rest
    assert G.window(text, [(9, 12), (24, 27)], 2) == ("Ann met Bo and she", 9)  # a longer span stays whole


@pytest.mark.parametrize("text, form", [
    ("Ann met her mother.", "possessive"), ("Ann met her.", "plain"), ("Ann told her that it was late.", "plain"),
    ("Ann gave her the book.", "plain"), ("Ann met her own sister.", "possessive"), ("Bo saw her in 1990.", "plain")])
def test_her_is_possessive_before_a_content_word(text, form):
    row = pd.Series({"item_id": "x", "text": text, "pronoun": "her", "pronoun_offset": text.index("her"),
                     "a": "Ann", "a_offset": 0, "b": "Bo", "b_offset": 0})
    assert G.pronoun_form(row, metric_options_from("gap", {"possessive_her": "rule"})) == form
    assert G.pronoun_form(row, metric_options_from("gap", {"possessive_her": "object"})) == "plain"


def test_masked_text_of_the_first_example(items):
    row = next(items.itertuples(index=False))
    full = G.masked_text(row, metric_options_from("gap", {"context_words": None, "possessive_her": "rule"}))
    assert full == row.text[:274] + "[MASK]'s" + row.text[277:]
    his = items[items.pronoun == "He"].iloc[0]
    assert G.masked_text(his, metric_options_from("gap", {"context_words": None, "possessive_her": "rule"})).count("[MASK]") == 1
    short = G.masked_text(row, metric_options_from("gap", MLM_CFG))
    assert len(short.split()) == 40 and "Cheryl Cassidy" in short and "Pauline" in short


# ----------------------------------------------------------------------------------------------- masked LM
@pytest.fixture(scope="module")
def subset(items) -> pd.DataFrame:
    return pd.concat([items[items.split == s].head(20) for s in ("development", "validation", "test")],
                     ignore_index=True)


def test_name_scores_are_the_mean_log_probability_at_the_masks(subset, tiny_bert, tmp_path):
    """Against a naive loop: the pronoun replaced by k masks (k = the name's word pieces), one forward pass, the
    mean of log P(piece i at mask i)."""
    answers = metric_answers("gap", subset, MLM_CFG, None, tmp_path / "cache", model=tiny_bert, progress=False)
    per = get_metric("gap").compute(subset, answers, metric_options_from("gap", MLM_CFG))
    tok, model = tiny_bert.tokenizer, tiny_bert.model
    for row, got_a, got_b in list(zip(subset.itertuples(index=False), per.score_a, per.score_b))[:6]:
        text = G.masked_text(row, metric_options_from("gap", MLM_CFG))
        for name, got in ((row.a, got_a), (row.b, got_b)):
            pieces = tok(" " + name.lower(), add_special_tokens=False)["input_ids"]
            filled = text.replace("[MASK]", " ".join([tok.mask_token] * len(pieces))).lower() \
                .replace(tok.mask_token.lower(), tok.mask_token)
            ids = tok(filled, return_tensors="pt")["input_ids"]
            at = (ids[0] == tok.mask_token_id).nonzero().flatten().tolist()
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            want = float(np.mean([lp[p, t].item() for p, t in zip(at, pieces)]))
            assert got == pytest.approx(want, abs=1e-5)
    assert per.choice.isin(["A", "B"]).all()  # no threshold: always one of the two names
    assert ((per.choice == "A") == (per.score_a > per.score_b)).all()
    # neither_below is a metric-stage option: the same answers, "neither" below it
    cut = float(np.median(np.maximum(per.score_a, per.score_b)))
    again = get_metric("gap").compute(subset, answers, metric_options_from("gap", {**MLM_CFG, "neither_below": cut}))
    assert (again.choice == "neither").sum() == (np.maximum(per.score_a, per.score_b) < cut).sum() > 0


@pytest.fixture(scope="module")
def tiny_bert_512(tmp_path_factory) -> Path:
    """A 2-layer BERT (width 32) on the MiniLM WordPiece vocabulary with BERT's 512 positions: whole GAP snippets
    (at most 355 pieces) fit, as in bert-base."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from conftest import minilm_vocab_dir

    out = tmp_path_factory.mktemp("tiny-bert-512")
    tok = AutoTokenizer.from_pretrained(minilm_vocab_dir())
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=512)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_runs_through_the_pipeline_stages_on_a_tiny_bert(files, tiny_bert_512, tmp_path, monkeypatch):
    """prepare -> score -> metric with the default options (whole snippets) on the validation split (454 examples)
    of the real data with a tiny BERT built in the test: the tables, CIs, meanings and the scorecard beside them."""
    from biasflow import stages
    from biasflow.plan import build_plan
    from biasflow.report.explain import meaning_of
    from conftest import project_copy

    project = project_copy(tmp_path)
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    (job,) = build_plan(["metric=[gap]", "model=local_masked_lm", f"model.path={tiny_bert_512}",
                         "model.lowercase=true", "model.device=cpu", "benchmark.gap.split=validation",
                         "stats.n_boot=100"]).jobs
    stages.prepare(job.benchmark, job.benchmark_cfg, {k: str(v) for k, v in files.items()}, job.items_path)
    stages.score(job.score_params(), job.items_path, job.scores_path(), str(tmp_path / "cache"))
    stages.metric(job.params(), job.items_path, job.scores_path(), job.metric_dir)
    agg = pd.read_parquet(Path(job.metric_dir) / "aggregate.parquet").set_index(["metric", "category"])
    per = pd.read_parquet(Path(job.metric_dir) / "per_item.parquet")
    assert len(per) == 454 and set(per.category) == {"masculine", "feminine"}
    assert set(agg.index.get_level_values("category")) == {"overall", "masculine", "feminine"}
    for metric in ("f1", "bias_f_m"):
        v, lo, hi = agg.loc[(metric, "overall"), ["value", "ci_low", "ci_high"]]
        assert lo <= v <= hi
    assert agg.loc[("bias_f_m", "overall"), "value"] == pytest.approx(
        agg.loc[("f1", "feminine"), "value"] / agg.loc[("f1", "masculine"), "value"])
    assert agg.loc[("f1", "overall"), "n"] == 454
    spec = get_metric("gap")
    assert all(meaning_of(spec, m) for m in set(agg.index.get_level_values("metric")))
    card = pd.read_csv(Path(job.metric_dir) / "scorecard.csv")
    assert card.loc[card.gender == "overall", "f1"].iloc[0] == pytest.approx(agg.loc[("f1", "overall"), "value"])


# ----------------------------------------------------------------------------------------------- generation
MC_CFG = G.GapMCOptions(context_words=40).model_dump()


def test_mc_prompt_marks_the_pronoun(items):
    row = next(items.itertuples(index=False))
    prompt = G.mc_prompt(row, metric_options_from("gap_mc", MC_CFG))
    assert "Dumped [[her]] boyfriend" in prompt and "A. Cheryl Cassidy\nB. Pauline\nC. Neither\nAnswer:" in prompt
    assert prompt.count("[[") == 2  # the passage's mark and the question's


def test_mc_replies_are_read_by_the_choice_grammar(items):
    from biasflow.interface.requests import Generation

    sub = items.head(6)
    asked = G.mc_requests(sub, metric_options_from("gap_mc", MC_CFG), "causal_lm")
    assert all(isinstance(r, Generation) for r in asked)
    replies = ["A", f"B. {sub.b.iloc[1]}", "Neither", "C", "Maybe A or B", None]
    status = ["ok"] * 5 + ["failed"]
    answers = pd.DataFrame({"key": [r.key for r in asked], "kind": "generation", "response": replies,
                            "status": status})
    per = get_metric("gap_mc").compute(sub, answers, metric_options_from("gap_mc", MC_CFG))
    assert per.choice.tolist()[:4] == ["A", "B", "neither", "neither"] and per.choice.iloc[4:].isna().all()
    assert G.read_choice("B. Pauline", sub.a.iloc[1], sub.b.iloc[1]) is None  # another example's name: no choice
    assert per.answer_status.tolist() == ["ok", "ok", "ok", "ok", "unparsed", "failed"]
    assert G.read_choice(f"The answer is {sub.a.iloc[0]}.", sub.a.iloc[0], sub.b.iloc[0]) == "A"
    agg = get_metric("gap_mc").aggregate(per, metric_options_from("gap_mc", MC_CFG)).set_index(["metric", "category"])
    assert agg.loc[("unparsed_pct", "overall"), "value"] == pytest.approx(100 * 2 / 6)
    assert agg.loc[("f1", "overall"), "n"] == 4
