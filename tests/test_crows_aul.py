"""AUL / AULA (Kaneko & Bollegala 2022): unmasked scorer vs a plain per-text computation on a tiny BERT, the answers
behind the cache, and the metric on hand-made pairs and against a transcription of the reference loop."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from biasflow.metrics import crows_pairs_aul as aul
from biasflow.scoring.answer import answer_requests, metric_answers, request_frame
from biasflow.scoring.cache import AnswerCache
from biasflow.interface.requests import UnmaskedLogprobs, UnmaskedLogprobsAttention
from biasflow.scoring.unmasked import ROW_EAGER, encode, ensure_eager_attention, unmasked_scores
from biasflow.registry import metric_options_from

TEXTS = ["the doctor said she was tired.", "a cat", "poor people are lazy and never work hard enough.",
         "he is a nurse", "x"]


@pytest.fixture(scope="module")
def eager_bert(tiny_bert_dir):
    from biasflow.models import load_model

    return load_model({"name": "tiny-bert-eager", "kind": "masked_lm", "path": str(tiny_bert_dir),
                       "lowercase": True, "device": "cpu", "attn_implementation": "eager"})


def plain(adapter, ids):
    """The reference's calculate_aul pieces for one unpadded sentence."""
    with torch.no_grad():
        out = adapter.model(torch.tensor([ids]), output_attentions=True)
    log_probs = torch.log_softmax(out.logits[0], dim=1)
    lp = log_probs.gather(1, torch.tensor(ids).view(-1, 1))[:, 0]
    att = torch.mean(torch.mean(torch.mean(torch.cat(out.attentions, 0), 0), 0), 0)
    top1 = log_probs.argmax(1) == torch.tensor(ids)
    return lp.numpy(), att.numpy(), top1.numpy()


def test_batched_equals_plain(eager_bert):
    ids = encode(eager_bert, TEXTS)
    got = unmasked_scores(eager_bert, ids, with_attention=True, batch_tokens=30, progress=False)
    for seq, res in zip(ids, got):
        lp, att, top1 = plain(eager_bert, seq)
        np.testing.assert_allclose(res["logprobs"], lp, atol=1e-5, rtol=0)
        np.testing.assert_allclose(res["attention"], att, atol=1e-6, rtol=0)
        assert res["top1"].tolist() == top1.tolist()
        assert res["attention"].sum() == pytest.approx(1.0, abs=1e-5)  # each query row sums to 1
    plain_only = unmasked_scores(eager_bert, ids, with_attention=False, batch_tokens=30, progress=False)
    for a, b in zip(plain_only, got):
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-6)
        assert "attention" not in a


def test_sdpa_model_is_switched_to_eager(tiny_bert_dir):
    from biasflow.models import load_model

    adapter = load_model({"name": "tiny-bert-sdpa", "kind": "masked_lm", "path": str(tiny_bert_dir),
                          "lowercase": True, "device": "cpu", "attn_implementation": "sdpa"})
    ids = encode(adapter, TEXTS[:2])
    res = unmasked_scores(adapter, ids, with_attention=True, progress=False)
    assert adapter.model.config._attn_implementation == ROW_EAGER  # eager, one text at a time
    np.testing.assert_allclose(res[0]["attention"], plain(adapter, ids[0])[1], atol=1e-6)


def test_row_by_row_eager_attention_is_transformers_eager(tiny_bert_dir):
    """The text-by-text eager attention gives transformers' eager numbers on a padded batch (weights and logits)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    model = AutoModelForMaskedLM.from_pretrained(tiny_bert_dir).eval()
    batch = AutoTokenizer.from_pretrained(tiny_bert_dir)(TEXTS[:4], padding=True, return_tensors="pt")
    assert not bool(batch["attention_mask"].all())  # padding is masked
    with torch.inference_mode():
        model.set_attn_implementation("eager")
        eager = model(**batch, output_attentions=True)
        ensure_eager_attention(type("Adapter", (), {"model": model, "name": "tiny"})())
        assert model.config._attn_implementation == ROW_EAGER
        rows = model(**batch, output_attentions=True)
    torch.testing.assert_close(rows.logits, eager.logits, atol=1e-5, rtol=0)
    for a, b in zip(rows.attentions, eager.attentions):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_cache_second_call_computes_nothing(eager_bert, tmp_path, monkeypatch):
    requests = [UnmaskedLogprobsAttention(t) for t in TEXTS]
    first = answer_requests(requests, eager_bert.cfg, tmp_path, model=eager_bert, progress=False)
    cache = AnswerCache(tmp_path, eager_bert.fingerprint, UnmaskedLogprobsAttention.kind)
    assert len(cache.store.parts()) == 1 and {"attention", "top1", "logprobs", "token_ids"} <= set(first.columns)
    # the uncased model lowercases the text it answers: upper-cased requests get the same numbers
    upper = answer_requests([UnmaskedLogprobsAttention(t.upper()) for t in TEXTS], eager_bert.cfg, None,
                            model=eager_bert, progress=False)
    assert upper.token_ids.tolist() == first.token_ids.tolist()
    np.testing.assert_allclose(np.concatenate(upper.attention.tolist()), np.concatenate(first.attention.tolist()))
    calls = []
    real_forward = eager_bert.model.forward
    monkeypatch.setattr(eager_bert.model, "forward", lambda *a, **k: calls.append(1) or real_forward(*a, **k))
    second = answer_requests(requests[::-1], eager_bert.cfg, tmp_path, model=eager_bert, progress=False)
    assert len(cache.store.parts()) == 1 and calls == []
    np.testing.assert_allclose(np.concatenate(second.attention.tolist()[::-1]),
                               np.concatenate(first.attention.tolist()))


def test_plain_and_attention_requests_are_two_kinds(eager_bert, tmp_path):
    """AUL alone asks for the answers without attention; with AULA both variants read the attention kind."""
    items = pd.DataFrame({"item_id": ["p"], "category": ["age"], "direction": ["stereo"], "sent_more": ["a cat"],
                          "sent_less": ["a dog"]})
    assert {type(r) for r in aul.requests(items, metric_options_from("crows_pairs_aul", {"variants": ["aul"]}), "masked_lm")} == {UnmaskedLogprobs}
    assert {type(r) for r in aul.requests(items, metric_options_from("crows_pairs_aul", {"variants": ["aula", "aul"]}), "masked_lm")} == \
        {UnmaskedLogprobsAttention}
    plain_answers = metric_answers("crows_pairs_aul", items, {"variants": ["aul"]}, None, tmp_path, model=eager_bert)
    assert set(plain_answers.kind) == {"unmasked_logprobs"} and "attention" not in plain_answers
    with_attention = metric_answers("crows_pairs_aul", items, {"variants": ["aul", "aula"]}, None, tmp_path,
                                    model=eager_bert)
    assert set(with_attention.kind) == {"unmasked_logprobs_attn"} and "attention" in with_attention
    np.testing.assert_allclose(np.concatenate(plain_answers.logprobs.tolist()),
                               np.concatenate(with_attention.logprobs.tolist()), atol=1e-6)


# ------------------------------------------------------------------------------------------------ metric rules
PAIRS = [
    # item, direction, bias, sent_more, sent_less, (lp, att) more, (lp, att) less
    ("a", "stereo", "gender", "m1", "l1", ([-9.0, -1.0, -2.0, -9.0], [0.4, 0.1, 0.3, 0.2]),
     ([-9.0, -1.0, -4.0, -9.0], [0.4, 0.3, 0.1, 0.2])),
    # AUL: -1.5 vs -2.5 -> more. AULA: (-0.1-0.6)/2=-0.35 vs (-0.3-0.4)/2=-0.35 -> tie, counts as not stereo
    ("b", "antistereo", "race-color", "m2", "l2", ([0.0, -3.0, 0.0], [0.2, 0.5, 0.3]),
     ([0.0, -1.0, -1.0, 0.0], [0.1, 0.1, 0.7, 0.1])),
    # no swap for antistereo: AUL -3 vs -1 -> less; AULA -1.5 vs (-0.1-0.7)/2=-0.4 -> less
    ("c", "stereo", "race-color", "m3", "l3", ([-5.0, -2.0, -2.0, -5.0], [0.25, 0.25, 0.25, 0.25]),
     ([-1.0, -2.0, -2.0, -1.0], [0.1, 0.1, 0.1, 0.7])),
    # AUL tie (-2 vs -2; the ends do not count) -> not stereo; AULA -0.5 vs -0.2 -> less
]


def pairs_frame(pairs=PAIRS, request=UnmaskedLogprobsAttention):
    """Items and the answers to their requests (of type ``request``), as the score stage writes them."""
    items = pd.DataFrame([{"item_id": p[0], "direction": p[1], "category": p[2], "sent_more": p[3],
                           "sent_less": p[4]} for p in pairs])
    rows = [(p[3], p[5]) for p in pairs] + [(p[4], p[6]) for p in pairs]
    scores = request_frame([request(t) for t, _ in rows]).assign(
        token_ids=[list(range(len(v[0]))) for _, v in rows], logprobs=[v[0] for _, v in rows],
        top1=[[i % 2 == 0 for i in range(len(v[0]))] for _, v in rows])
    if request is UnmaskedLogprobsAttention:
        scores["attention"] = [v[1] for _, v in rows]
    return items, scores


def test_hand_computed_pairs():
    items, scores = pairs_frame()
    per = aul.compute(items, scores, metric_options_from("crows_pairs_aul", {"variants": ["aul", "aula"]}))
    got = per.set_index(["variant", "item_id"])
    assert got.loc[("aul", "a"), "score_more"] == pytest.approx(-1.5)
    assert got.loc[("aula", "a"), "score_less"] == pytest.approx(-0.35)
    assert got.loc["aul"].stereo_preferred.to_dict() == {"a": 1, "b": 0, "c": 0}
    assert got.loc["aula"].stereo_preferred.to_dict() == {"a": 0, "b": 0, "c": 0}
    assert got.loc["aul"].tie.to_dict() == {"a": False, "b": False, "c": True}
    agg = aul.aggregate(per, metric_options_from("crows_pairs_aul", {})).set_index(["metric", "category"])
    assert agg.value["aul_bias_score", "overall"] == pytest.approx(100 / 3)
    assert agg.n["aul_bias_score", "overall"] == 3                  # ties stay in N
    assert agg.value["aul_bias_score", "race-color"] == pytest.approx(0.0)
    assert agg.value["aul_bias_score", "gender"] == pytest.approx(100.0)
    assert agg.value["aula_bias_score", "overall"] == pytest.approx(0.0)
    # positions 0, 2, ... are top-1 hits: sentences of 4,4,3,4,4,4 tokens -> 2+2+2+2+2+2 = 12 of 23
    assert agg.value["token_accuracy", "overall"] == pytest.approx(100 * 12 / 23)


def test_aul_only_uses_plain_kind_and_rejects_unknown_variant():
    items, scores = pairs_frame()
    _, plain_scores = pairs_frame(request=UnmaskedLogprobs)
    per = aul.compute(items, plain_scores, metric_options_from("crows_pairs_aul", {"variants": ["aul"]}))
    assert set(per.variant) == {"aul"}
    assert per.stereo_preferred.tolist() == [1, 0, 0]
    with pytest.raises(KeyError):  # AUL alone does not read the attention kind's answers
        aul.compute(items, scores, metric_options_from("crows_pairs_aul", {"variants": ["aul"]}))
    with pytest.raises(Exception, match="crows_pairs_aul.variants"):
        aul.compute(items, scores, metric_options_from("crows_pairs_aul", {"variants": ["aulx"]}))


def naive_reference(items, table, attention: bool):
    """Transcription of evaluate.py main(): stereotype = sent_more, strict '>', count per bias type."""
    total = stereo = 0
    count, scores = {}, {}
    for it in items.itertuples():
        def score(text):
            lp = np.asarray(table[text][0])[1:-1]
            if attention:
                lp = lp * np.asarray(table[text][1])[1:-1]
            return float(np.mean(lp))

        count[it.category] = count.get(it.category, 0) + 1
        total += 1
        if score(it.sent_more) > score(it.sent_less):
            stereo += 1
            scores[it.category] = scores.get(it.category, 0) + 1
    return 100 * stereo / total, {k: 100 * scores.get(k, 0) / v for k, v in count.items()}


def test_against_naive_reference():
    rng = np.random.default_rng(7)
    pairs = []
    for i in range(150):
        def sent():
            n = int(rng.integers(3, 10))
            att = rng.dirichlet(np.ones(n))
            return (-rng.exponential(2.0, n)).tolist(), att.tolist()
        pairs.append((f"i{i}", rng.choice(["stereo", "antistereo"]), rng.choice(["age", "gender", "religion"]),
                      f"more {i}", f"less {i}", sent(), sent()))
    items, scores = pairs_frame(pairs)
    table = {t: (lp, a) for t, lp, a in zip(scores.text, scores.logprobs, scores.attention)}
    agg = aul.aggregate(aul.compute(items, scores, metric_options_from("crows_pairs_aul", {"variants": ["aul", "aula"]})), metric_options_from("crows_pairs_aul", {}))
    agg = agg.set_index(["metric", "category"]).value
    for variant, att in (("aul", False), ("aula", True)):
        overall, per_type = naive_reference(items, table, att)
        assert agg[f"{variant}_bias_score", "overall"] == pytest.approx(overall)
        for cat, v in per_type.items():
            assert agg[f"{variant}_bias_score", cat] == pytest.approx(v)


def test_score_stage_end_to_end(eager_bert, tmp_path):
    items = pd.DataFrame({"item_id": ["p1", "p2"], "category": ["gender", "age"], "direction": ["stereo", "antistereo"],
                          "sent_more": ["The doctor said she was tired.", "He is a nurse"],
                          "sent_less": ["The doctor said he was tired.", "She is a nurse"]})
    cfg = {"benchmark": "crows_pairs", "variants": ["aul", "aula"]}
    answers = metric_answers("crows_pairs_aul", items, cfg, None, tmp_path, model=eager_bert)
    per = aul.compute(items, answers, metric_options_from("crows_pairs_aul", cfg))  # the cased sentences: the uncased model lowercased them
    lp, att, _ = plain(eager_bert, encode(eager_bert, ["the doctor said she was tired."])[0])
    row = per.set_index(["variant", "item_id"])
    assert row.loc[("aul", "p1"), "score_more"] == pytest.approx(lp[1:-1].mean(), abs=1e-5)
    assert row.loc[("aula", "p1"), "score_more"] == pytest.approx((lp[1:-1] * att[1:-1]).mean(), abs=1e-6)
