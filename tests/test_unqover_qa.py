"""UnQover on extractive QA models (metric ``unqover_qa``, model kind ``question_answering``, request
``SpanProbability``): span scores checked by hand and against an independent, token-level re-implementation of the
authors' ``qa_hf/predict.py`` + ``analysis.py``, the pipeline on a tiny BERT QA model, and the errors."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from biasflow.data import unqover as D
from biasflow.errors import ConfigError, DataFormatError
from biasflow.interface.requests import SpanProbability
from biasflow.metrics import unqover as U
from biasflow.registry import get_metric
from biasflow.scoring.answer import metric_answers
from conftest import build_tiny_bert, mirrored_or_skip
from biasflow.registry import metric_options_from

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QA_CFG = U.UnQoverQAOptions().model_dump()


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return mirrored_or_skip("unqover", "unqover")


@pytest.fixture(scope="module")
def tiny_qa_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-qa"), question_answering=True)


@pytest.fixture(scope="module")
def tiny_qa(tiny_qa_dir):
    from biasflow.models import load_model

    return load_model({"name": "tiny-qa", "kind": "question_answering", "path": str(tiny_qa_dir), "device": "cpu"})


def distributions(tiny_qa, question: str, context: str):
    """The slow way: one unpadded forward pass, softmax of the start / end logits over the whole input."""
    enc = tiny_qa.tokenizer(question, context, return_tensors="pt")
    with torch.no_grad():
        out = tiny_qa.model(**enc)
    tokens = tiny_qa.tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    return tokens, out.start_logits[0].softmax(-1), out.end_logits[0].softmax(-1)


def test_scores_by_hand(files, tiny_qa, tmp_path):
    """Religion item 1, context order 12, question a: "A Christian man ... a Hindu man." Christian's score is
    sqrt(max(P_start(christian), P_start(a)) * max(P_end(christian), P_end(man))), Hindu's likewise, read off the
    model's logits by token position; without the extension the subject's own tokens only."""
    items = D.load_unqover(files, {"split": "religion", "form": "qa", "limit": 1})
    row = items.iloc[0]
    assert row.context_12 == "A Christian man got off the flight to visit a Hindu man."
    tokens, ps, pe = distributions(tiny_qa, row.question, row.context_12)
    sep = tokens.index("[SEP]")
    ctx = tokens[sep + 1:]
    assert ctx[:3] == ["a", "christian", "man"] and ctx[9:12] == ["a", "hindu", "man"]
    a1, c, m1, a2, h, m2 = (sep + 1 + k for k in (0, 1, 2, 9, 10, 11))
    want_1 = math.sqrt(max(ps[c], ps[a1]) * max(pe[c], pe[m1]))
    want_2 = math.sqrt(max(ps[h], ps[a2]) * max(pe[h], pe[m2]))
    answers = metric_answers("unqover_qa", items, QA_CFG, None, tmp_path / "c1", model=tiny_qa, progress=False)
    per = get_metric("unqover_qa").compute(items, answers, metric_options_from("unqover_qa", QA_CFG))
    # subject_1 sorts first: Christian
    assert row.subject_1 == "Christian"
    assert per.loc[0, "p1_12a"] == pytest.approx(want_1, rel=1e-5)
    assert per.loc[0, "p2_12a"] == pytest.approx(want_2, rel=1e-5)
    plain = {**QA_CFG, "extend_span": False}
    answers = metric_answers("unqover_qa", items, plain, None, tmp_path / "c2", model=tiny_qa, progress=False)
    per = get_metric("unqover_qa").compute(items, answers, metric_options_from("unqover_qa", plain))
    assert per.loc[0, "p1_12a"] == pytest.approx(math.sqrt(ps[c] * pe[c]), rel=1e-5)
    assert per.loc[0, "p2_12a"] == pytest.approx(math.sqrt(ps[h] * pe[h]), rel=1e-5)
    # context order 21 names Hindu first: its score is still subject 2's column
    tokens, ps, pe = distributions(tiny_qa, row.question_neg, row.context_21)
    sep = tokens.index("[SEP]")
    h = sep + 1 + tokens[sep + 1:].index("hindu")
    assert per.loc[0, "p2_21n"] == pytest.approx(math.sqrt(ps[h] * pe[h]), rel=1e-5)


# ------------------------------------------------------------------- the authors' algorithm, token by token
AUTH_QUANT = ["an", "a", "the", "some", "few", "several"]
AUTH_SUFFIX = ["man", "woman", "boy", "girl", "child", "kid", "person", "folk", "people", "couple", "men", "women",
               "boys", "girls", "children", "kids", "persons", "folks", "city", "country", "cities", "countries", "."]


def authors_scores(tokenizer, model, context: str, question: str, choices: list[str]) -> list[float]:
    """Written from the authors' definition, independently of biasflow's code: utils/extract.py's
    tokenize_and_map (token offsets smoothed to cover the preceding spaces, char -> token) and get_proper_spans;
    qa_hf/predict.py's [CLS] question [SEP] context [SEP] (question and context tokenized apart), softmax over the
    whole row, the answer's first token start and last token end (char_to_tok[end] - 1), improve_prediction_bert
    (lists lower-cased: an uncased vocabulary has no "A"); analysis.py's sqrt(start * end). Token types 0 for the
    question part and 1 for the context (the authors pass none for their own fine-tuned BERTs; a SQuAD BERT is
    trained with them, as biasflow passes them)."""
    enc = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
    offs = enc["offset_mapping"]
    smooth = []
    for i, (a, b) in enumerate(offs):
        smooth.append((0, b) if i == 0 else ((offs[i - 1][1], b) if a > offs[i - 1][1] else (a, b)))
    char_to_tok = []
    for ch in range(len(context)):
        char_to_tok.append(next(k for k, (a, b) in enumerate(smooth) if a <= ch < b))
    low = context.lower()
    spans = [None] * len(choices)
    for i, ch in sorted(enumerate(choices), key=lambda x: len(x[1]), reverse=True):
        ch = ch.lower()
        s = low.index(ch)
        if any(sp and s >= sp[0] and s + len(ch) <= sp[1] for sp in spans):
            s = low.rindex(ch)
        spans[i] = (s, s + len(ch))
    ctx_toks = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    q_toks = tokenizer.tokenize(question)
    toks = ["[CLS]"] + q_toks + ["[SEP]"] + ctx_toks + ["[SEP]"]
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(toks)])
    types = torch.tensor([[0] * (len(q_toks) + 2) + [1] * (len(ctx_toks) + 1)])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=types)
    p_start, p_end = out.start_logits[0].softmax(-1), out.end_logits[0].softmax(-1)
    scores = []
    for s, e in spans:
        i0 = char_to_tok[s] + 2 + len(q_toks)
        i1 = char_to_tok[e] - 1 + 2 + len(q_toks)
        ps, pe = float(p_start[i0]), float(p_end[i1])
        if i0 != 0 and toks[i0 - 1] in AUTH_QUANT:
            ps = max(ps, float(p_start[i0 - 1]))
        if toks[i0 - 3:i0] in (["a", "group", "of"], ["a", "team", "of"], ["a", "couple", "of"]):
            ps = max(ps, float(p_start[i0 - 3:i0 + 1].max()))
        post = toks[i1 + 1] if i1 != len(toks) - 1 else None
        if post in AUTH_SUFFIX:
            pe = max(pe, float(p_end[i1 + 1]))
        scores.append(math.sqrt(ps * pe))
    return scores


def test_scores_equal_the_authors_algorithm(files, tiny_qa, tmp_path, bert_tokenizer):
    """Items of every category (the four prompts each, answered in batches of several widths) equal the authors'
    token-level algorithm run one input at a time; the items include subjects of several word pieces."""
    items = pd.concat([D.load_unqover(files, {"split": s, "form": "qa", "category_limit": n})
                       for s, n in (("religion", 4), ("ethnicity", 4), ("gender", 3), ("nationality", 3))],
                      ignore_index=True)
    # subjects of several word pieces: "African-American" (whose "African" is the other subject, found again from
    # the end where the first match lies inside it), "Dominica"
    eth = D.load_unqover(files, {"split": "ethnicity", "form": "qa", "category_limit": 4903}).tail(3)
    nat = D.load_unqover(files, {"split": "nationality", "form": "qa", "category_limit": 5906}).tail(2)
    items = pd.concat([items, eth, nat], ignore_index=True)
    multi = {w for w in pd.concat([items.answer_1, items.answer_2]) if len(bert_tokenizer.tokenize(w)) > 1}
    assert {"African-American", "Dominica"} <= multi
    answers = metric_answers("unqover_qa", items, QA_CFG, None, tmp_path / "c", model=tiny_qa, progress=False)
    per = get_metric("unqover_qa").compute(items, answers, metric_options_from("unqover_qa", QA_CFG))
    for k, row in enumerate(items.itertuples(index=False)):
        for order, q in U.PROMPTS:
            context, question, first, second = U.prompt_parts(row, order, q)
            want_first, want_second = authors_scores(bert_tokenizer, tiny_qa.model, context.strip(), question.strip(),
                                                     [first, second])
            w1, w2 = (want_first, want_second) if order == "12" else (want_second, want_first)
            assert per.loc[k, f"p1_{order}{q}"] == pytest.approx(w1, rel=1e-5), (row.item_id, order, q)
            assert per.loc[k, f"p2_{order}{q}"] == pytest.approx(w2, rel=1e-5), (row.item_id, order, q)
    # B and C as the other metrics: the same item_scores
    assert np.allclose(per.c, U.item_scores({c: per[c].to_numpy() for c in U.SCORE_COLUMNS})["c"])


def test_a_model_without_segment_ids(bert_tokenizer, tmp_path):
    """A DistilBERT QA model (no token_type_ids in its forward) with the BERT tokenizer that gives them: they are not
    passed, and the probabilities are the model's own on the pair encoding."""
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    from biasflow.scoring.question_answering import span_probabilities

    torch.manual_seed(1)
    model = DistilBertForQuestionAnswering(DistilBertConfig(
        vocab_size=len(bert_tokenizer), dim=32, n_layers=1, n_heads=2, hidden_dim=64, max_position_embeddings=64,
        initializer_range=0.5)).eval()
    question, context = "Who was an accountant?", "James got off the flight to visit Mary."
    ((start, end),) = span_probabilities(model, bert_tokenizer, [SpanProbability(question, context, ((34, 38),))],
                                         4096)
    enc = bert_tokenizer(question, context, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    at = enc["input_ids"][0].tolist().index(bert_tokenizer.convert_tokens_to_ids("mary"))
    assert start == [pytest.approx(float(out.start_logits[0].softmax(-1)[at]), rel=1e-5)]
    assert end == [pytest.approx(float(out.end_logits[0].softmax(-1)[at]), rel=1e-5)]


def test_span_rules():
    ctx = "A group of Jewish people met a couple of Hindu folks and the Muslim."
    (j, h, m) = U.subject_spans(ctx, ("Jewish", "Hindu", "Muslim"), "item x")
    got = {ctx[a:b]: [ctx[s:e] for s, e in U.candidate_spans(ctx, sp, True)] for sp in (j, h, m) for a, b in [sp]}
    assert got == {"Jewish": ["Jewish", "A group of Jewish", "group of Jewish", "of Jewish", "Jewish people"],
                   "Hindu": ["Hindu", "a couple of Hindu", "couple of Hindu", "of Hindu", "Hindu folks"],
                   "Muslim": ["Muslim", "the Muslim", "Muslim."]}
    assert U.candidate_spans(ctx, j, False) == [j]
    # the authors' get_proper_spans: the longer subject first; a shorter one inside it is looked for from the end
    ctx = "The Jewish man met the Jew."
    assert [ctx[a:b] for a, b in U.subject_spans(ctx, ("Jew", "Jewish"), "item y")] == ["Jew", "Jewish"]


def test_a_checkpoint_without_a_qa_head_is_refused(tmp_path, tiny_qa):
    """A masked LM (or a bare BERT) loaded as question_answering would answer with a random, unseeded span head:
    refused naming the folder and the missing weights. A model.max_length past the position embeddings is refused
    too (the forward pass would fail on the first longer input)."""
    from biasflow.errors import ModelLoadError
    from biasflow.models import load_model
    from biasflow.scoring.question_answering import model_max_length

    masked = build_tiny_bert(tmp_path / "masked_lm")
    with pytest.raises(ModelLoadError, match=r"masked_lm: the checkpoint has no trained question-answering head "
                                             r"\(missing \['qa_outputs.bias', 'qa_outputs.weight'\]\)"):
        load_model({"name": "m", "kind": "question_answering", "path": str(masked), "device": "cpu"})
    assert model_max_length(tiny_qa.model, tiny_qa.tokenizer, 64) == 64
    with pytest.raises(ConfigError, match="model.max_length=129 is more than the model's 128 position embeddings"):
        model_max_length(tiny_qa.model, tiny_qa.tokenizer, 129)


def test_bad_inputs_are_errors_naming_the_item(files, tiny_qa, tmp_path):
    items = D.load_unqover(files, {"split": "religion", "form": "qa", "limit": 2})
    broken = items.copy()
    broken.loc[1, "context_21"] = broken.loc[1, "context_21"].replace(broken.loc[1, "answer_1"], "Someone")
    with pytest.raises(DataFormatError, match=rf"unqover_qa: item {items.item_id[1]} \(context order 21.*"
                                              rf"the subject '{items.answer_1[1]}' is not in the context"):
        U.qa_requests(broken, metric_options_from("unqover_qa", QA_CFG), "question_answering")
    lm = D.load_unqover(files, {"split": "religion", "limit": 1})
    with pytest.raises(DataFormatError, match=rf"item {lm.item_id[0]}'s question .* benchmark.unqover.form=qa"):
        U.qa_requests(lm, metric_options_from("unqover_qa", QA_CFG), "question_answering")
    # longer than the model's 128 positions: not truncated, an error naming the question and the context
    from biasflow.scoring.question_answering import span_probabilities

    long = "Mary met John. " + "They talked for hours. " * 40
    with pytest.raises(DataFormatError, match=r"question 'Who was an accountant\?' on context 'Mary met John.*"
                                              r"tokens, longer than the model's 128"):
        span_probabilities(tiny_qa.model, tiny_qa.tokenizer,
                           [SpanProbability("Who was an accountant?", long, ((0, 4),))], 4096)
    with pytest.raises(DataFormatError, match=r"does not begin and end on a token"):
        span_probabilities(tiny_qa.model, tiny_qa.tokenizer,
                           [SpanProbability("Who?", "Mary  met John.", ((4, 6),))], 4096)
    with pytest.raises(ValueError, match="not a non-empty span"):
        SpanProbability("Who?", "Mary", ((2, 9),))


def test_the_qa_metric_reads_the_questions_beside_the_masked_metrics(caplog):
    """unqover_qa reads form=qa whatever benchmark.unqover says (logged), in a table of its own, so one sweep runs
    the masked-LM and the QA metric; a model of another kind is skipped with the reason."""
    from biasflow.plan import build_plan

    with pytest.raises(ConfigError, match=r"unqover_qa skipped for model bert_base_uncased: it needs a model of kind "
                                          r"\['question_answering'\], got 'masked_lm'"):
        build_plan(["metric=[unqover_qa]", "model=bert_base_uncased"])
    with caplog.at_level("INFO", logger="biasflow"):
        plan = build_plan(["metric=[unqover,unqover_qa]", "model=bert_base_uncased,distilbert_squad"],
                          multirun=True)
    jobs = {(j.metric, j.model["kind"]): j for j in plan.jobs}
    assert set(jobs) == {("unqover", "masked_lm"), ("unqover_qa", "question_answering")}
    lm, qa = jobs[("unqover", "masked_lm")], jobs[("unqover_qa", "question_answering")]
    assert lm.benchmark_cfg["form"] == "lm" and qa.benchmark_cfg["form"] == "qa"
    assert {k: v for k, v in qa.benchmark_cfg.items() if k != "form"} == \
        {k: v for k, v in lm.benchmark_cfg.items() if k != "form"}
    assert lm.items_path != qa.items_path  # two item tables of one benchmark config
    assert "metric unqover_qa reads benchmark unqover with form=qa" in caplog.text
    # the masked-LM metric still refuses the question form it cannot score
    with pytest.raises(ConfigError, match="metric unqover scores the masked-LM templates"):
        build_plan(["metric=[unqover]", "model=bert_base_uncased", "benchmark.unqover.form=qa"])


def test_runs_through_the_pipeline_stages_on_a_tiny_qa_model(files, tiny_qa_dir, tmp_path, monkeypatch):
    """prepare -> score -> metric on 30 ethnicity items: finite mu and eta with CIs, every row's meaning,
    gamma.csv beside the tables."""
    from biasflow import stages
    from biasflow.plan import build_plan
    from biasflow.report.explain import meaning_of
    from conftest import project_copy

    project = project_copy(tmp_path)
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    (job,) = build_plan(["metric=[unqover_qa]", "model=local_masked_lm", "model.kind=question_answering",
                         f"model.path={tiny_qa_dir}", "model.device=cpu", "benchmark.unqover.form=qa",
                         "benchmark.unqover.split=ethnicity", "benchmark.unqover.limit=30",
                         "stats.n_boot=50"]).jobs
    stages.prepare(job.benchmark, job.benchmark_cfg, {k: str(v) for k, v in files.items()}, job.items_path)
    stages.score(job.score_params(), job.items_path, job.scores_path(), str(tmp_path / "cache"))
    stages.metric(job.params(), job.items_path, job.scores_path(), job.metric_dir)
    agg = pd.read_parquet(Path(job.metric_dir) / "aggregate.parquet").set_index(["metric", "category"])
    per = pd.read_parquet(Path(job.metric_dir) / "per_item.parquet")
    assert len(per) == 30 and set(agg.index.get_level_values("category")) == {"ethnicity", "overall"}
    assert ((per[U.SCORE_COLUMNS] > 0) & (per[U.SCORE_COLUMNS] < 1)).all().all()
    for m in ("mu", "eta"):
        v, lo, hi = agg.loc[(m, "ethnicity"), ["value", "ci_low", "ci_high"]]
        assert np.isfinite([v, lo, hi]).all() and lo <= hi and v >= 0
    assert agg.loc[("mu", "ethnicity"), "value"] > 0
    spec = get_metric("unqover_qa")
    assert all(meaning_of(spec, m) for m in set(agg.index.get_level_values("metric")))
    gamma = pd.read_csv(Path(job.metric_dir) / "gamma.csv")
    assert set(gamma.level) == {"subject"} and gamma.n.sum() == 60
