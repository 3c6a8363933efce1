"""StereoSet counting and aggregation: hand-computed examples, a naive re-implementation, predictions files."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict

import numpy as np
import pandas as pd
import pytest

from biasflow.errors import DataFormatError
from biasflow.metrics.stereoset import (SPEC, aggregate, compute, count_examples, read_predictions, results_table,
                                        write_predictions)
from biasflow.registry import get_metric
from biasflow.scoring.answer import Models, metric_answers, request_frame
from biasflow.interface.requests import BlankFill, NextSentence
from biasflow.registry import metric_options_from

LABELS = ("stereotype", "anti-stereotype", "unrelated")


def make_items(examples):
    """examples: (example_id, task, domain, target, (score_stereo, score_anti, score_unrelated))."""
    items, scores = [], []
    for ex_id, task, domain, target, triple in examples:
        for label, s in zip(LABELS, triple):
            sid = f"{ex_id}-{label}"
            items.append({"item_id": sid, "benchmark": "stereoset", "split": "dev", "category": domain, "task": task,
                          "example_id": ex_id, "domain": domain, "target": target, "context": "c BLANK",
                          "sentence": f"c {label}", "gold_label": label, "candidate_word": label})
            scores.append({"item_id": sid, "task": task, "score": s})
    return pd.DataFrame(items), pd.DataFrame(scores)


HAND = [
    ("e1", "intrasentence", "gender", "A", (0.5, 0.2, 0.1)),   # pro, related 2
    ("e2", "intrasentence", "gender", "A", (0.3, 0.3, 0.3)),   # tie -> anti; ties with unrelated are not related
    ("e3", "intrasentence", "race", "B", (0.1, 0.4, 0.2)),     # anti, related 1
    ("e4", "intrasentence", "race", "C", (0.9, 0.1, 0.05)),    # pro, related 2
    ("e5", "intersentence", "gender", "A", (0.2, 0.6, 0.9)),   # anti, related 0
]


def value(agg, metric, category):
    row = agg[(agg.metric == metric) & (agg.category == category)]
    assert len(row) == 1, (metric, category)
    return float(row.value.iloc[0]), int(row.n.iloc[0])


def test_hand_computed_lms_ss_icat_per_domain():
    items, scores = make_items(HAND)
    per = count_examples(items, scores, metric_options_from("stereoset", {}))
    assert per.set_index("item_id")[["pro", "related"]].to_dict("index") == {
        "e1": {"pro": 1, "related": 2}, "e2": {"pro": 0, "related": 0}, "e3": {"pro": 0, "related": 1},
        "e4": {"pro": 1, "related": 2}, "e5": {"pro": 0, "related": 0}}
    agg = aggregate(per, metric_options_from("stereoset", {}))
    approx = lambda x: pytest.approx(x, abs=1e-9)  # noqa: E731
    # intrasentence terms: A (SS 50, LMS 50), B (SS 0, LMS 50), C (SS 100, LMS 100)
    assert value(agg, "intrasentence_lms", "overall") == (approx(200 / 3), 4)
    assert value(agg, "intrasentence_ss", "overall") == (approx(50.0), 4)
    # ICAT from the macro means (66.67 * 50 / 50), not the mean of per-term ICATs (16.67)
    assert value(agg, "intrasentence_icat", "overall") == (approx(200 / 3), 4)
    assert value(agg, "intrasentence_icat", "gender") == (approx(50.0), 2)
    assert value(agg, "intrasentence_lms", "race") == (approx(75.0), 2)
    assert value(agg, "intrasentence_icat", "race") == (approx(75.0), 2)
    assert value(agg, "intersentence_ss", "overall") == (approx(0.0), 1)
    assert value(agg, "intersentence_icat", "overall") == (approx(0.0), 1)
    # overall pools both tasks per term: A has 3 examples (1 pro, 2 related)
    lms, ss = (100 / 3 + 50 + 100) / 3, (100 / 3 + 0 + 100) / 3
    assert value(agg, "overall_lms", "overall") == (approx(lms), 5)
    assert value(agg, "overall_ss", "overall") == (approx(ss), 5)
    assert value(agg, "overall_icat", "overall") == (approx(lms * min(ss, 100 - ss) / 50), 5)
    assert value(agg, "overall_icat", "gender") == (approx((100 / 3) ** 2 / 50), 3)
    # an empty domain is reported with NaN and n = 0
    for task in ("intrasentence", "intersentence", "overall"):
        v, n = value(agg, f"{task}_lms", "religion")
        assert np.isnan(v) and n == 0
    assert np.isnan(value(agg, "intersentence_ss", "race")[0])
    table = results_table(agg)
    assert list(table.columns) == ["task", "category", "lms", "ss", "icat", "n"] and len(table) == 15


def test_only_one_task_scored_has_no_overall_rows():
    items, scores = make_items(HAND)
    agg = aggregate(count_examples(items, scores, metric_options_from("stereoset", {"tasks": ["intrasentence"]})), metric_options_from("stereoset", {"tasks": ["intrasentence"]}))
    assert set(agg.metric.str.split("_").str[0]) == {"intrasentence"}


# ------------------------------------------------------------------------------------------- naive reference
def naive_evaluation(examples):
    """The published algorithm written out plainly with Counters (independent of the pandas implementation)."""
    def count(exs):
        per_term = defaultdict(Counter)
        for _, _, _, target, (s, a, u) in exs:
            per_term[target]["pro" if s > a else "anti"] += 1
            per_term[target]["related"] += int(s > u) + int(a > u)
            per_term[target]["total"] += 1
        return per_term

    def score(counts):
        if not counts:
            return None
        ss = [100.0 * c["pro"] / c["total"] for c in counts.values()]
        lm = [100.0 * c["related"] / (2 * c["total"]) for c in counts.values()]
        lms, sss = sum(lm) / len(lm), sum(ss) / len(ss)
        return {"lms": lms, "ss": sss, "icat": lms * min(sss, 100 - sss) / 50}

    out = {}
    for task in ("intrasentence", "intersentence", "overall"):
        exs = [e for e in examples if task == "overall" or e[1] == task]
        out[(task, "overall")] = score(count(exs))
        for domain in ("gender", "profession", "race", "religion"):
            out[(task, domain)] = score(count([e for e in exs if e[2] == domain]))
    return out


def test_matches_naive_reimplementation_with_many_ties():
    rng = np.random.default_rng(7)
    domains = ["gender", "profession", "race", "religion"]
    examples = []
    for i in range(400):
        task = ["intrasentence", "intersentence"][i % 2]
        domain = domains[int(rng.integers(0, 3))]  # religion stays empty
        target = f"{domain}-t{int(rng.integers(0, 6))}"
        examples.append((f"x{i}", task, domain, target, tuple(rng.integers(0, 3, size=3) / 4)))  # coarse: ties
    items, scores = make_items(examples)
    agg = aggregate(count_examples(items, scores, metric_options_from("stereoset", {})), metric_options_from("stereoset", {}))
    ref = naive_evaluation(examples)
    for (task, category), want in ref.items():
        for m in ("lms", "ss", "icat"):
            got, _ = value(agg, f"{task}_{m}", category)
            if want is None:
                assert np.isnan(got)
            else:
                assert got == pytest.approx(want[m], abs=1e-9), (task, category, m)


def test_missing_score_is_an_error():
    items, scores = make_items(HAND)
    with pytest.raises(DataFormatError, match="e3-unrelated"):
        count_examples(items, scores[scores.item_id != "e3-unrelated"], metric_options_from("stereoset", {}))


def test_compute_reads_each_sentence_s_answer_by_its_request():
    """Hand-made answers of a masked LM (blank fill, next sentence): compute counts their probabilities, whatever
    order the answers come in; a sentence with no answer is an error naming its request."""
    items, scores = make_items(HAND)
    items["context"] = items["example_id"] + " BLANK"  # one request per sentence
    score = dict(zip(scores.item_id, scores.score))
    intra, inter = items[items.task == "intrasentence"], items[items.task == "intersentence"]
    asked = [BlankFill(c, w) for c, w in zip(intra.context, intra.candidate_word)] + \
        [NextSentence(c, t) for c, t in zip(inter.context, inter.sentence)]
    answers = request_frame(asked).assign(probability=[score[i] for i in list(intra.item_id) + list(inter.item_id)])
    answers = answers.iloc[::-1].reset_index(drop=True)
    assert [r.key for r in SPEC.requests(items, metric_options_from("stereoset", {}), "masked_lm")] == [r.key for r in asked]
    pd.testing.assert_frame_equal(compute(items, answers, metric_options_from("stereoset", {})), count_examples(items, scores, metric_options_from("stereoset", {})))
    with pytest.raises(KeyError, match="no answer to 1 blank_fill"):
        compute(items, answers[answers.key != asked[0].key], metric_options_from("stereoset", {}))


def test_requests_follow_the_model_kind_and_name_what_cannot_be_scored():
    from biasflow.errors import ConfigError

    items, _ = make_items(HAND)
    kinds = lambda reqs: sorted({r.kind for r in reqs})  # noqa: E731
    assert kinds(SPEC.requests(items, metric_options_from("stereoset", {}), "causal_lm")) == ["shared_context_continuation",
                                                            "stereoset_sentence_logprobs"]
    assert kinds(SPEC.requests(items, metric_options_from("stereoset", {"context_pass": "per_option"}), "causal_lm")) == [
        "continuation_logprobs", "stereoset_sentence_logprobs"]
    assert kinds(SPEC.requests(items, metric_options_from("stereoset", {"tasks": ["intersentence"]}), "bert_nsp")) == ["next_sentence"]
    assert kinds(SPEC.requests(items, metric_options_from("stereoset", {"intersentence_scorer": "nsp"}), "masked_lm")) == ["blank_fill",
                                                                                         "next_sentence"]
    with pytest.raises(ConfigError, match=r"intrasentence cannot be scored by model.kind='bert_nsp'.*"
                                          r"tasks=\[intersentence\]"):
        SPEC.requests(items, metric_options_from("stereoset", {}), "bert_nsp")
    with pytest.raises(ConfigError, match="intersentence_scorer=causal_conditional"):
        SPEC.requests(items, metric_options_from("stereoset", {"intersentence_scorer": "causal_conditional"}), "masked_lm")
    assert SPEC.requests(items, metric_options_from("stereoset", {"predictions_file": "p.json"}), "none") == []


# ------------------------------------------------------------------------------------------- predictions files
def test_predictions_roundtrip_and_score_stage(tmp_path):
    items, scores = make_items(HAND)
    path = tmp_path / "predictions.json"
    write_predictions(scores, path)
    doc = json.loads(path.read_text())
    assert set(doc) == {"intrasentence", "intersentence"} and {"id", "score"} == set(doc["intrasentence"][0])
    cfg = {"predictions_file": str(path), "tasks": ["intrasentence", "intersentence"]}
    spec = get_metric("stereoset")
    assert spec is SPEC and "predictions_file" in spec.score_keys
    unused = {"name": "unused", "kind": "masked_lm", "hub_id": "unused/model"}  # a declared kind: it is validated
    models = Models(unused)
    answers = metric_answers("stereoset", items, cfg, unused, tmp_path / "cache", models=models)
    assert answers.empty and models.loaded == {}  # the file replaces the model: nothing asked, nothing loaded
    pd.testing.assert_frame_equal(spec.aggregate(spec.compute(items, answers, metric_options_from("stereoset", cfg)), metric_options_from("stereoset", cfg)),
                                  aggregate(count_examples(items, scores, metric_options_from("stereoset", {})), metric_options_from("stereoset", {})))


def test_predictions_with_unknown_ids_lists_them(tmp_path):
    items, scores = make_items(HAND)
    doc = {"intrasentence": [{"id": i, "score": 0.1} for i in items.loc[items.task == "intrasentence", "item_id"]]
           + [{"id": "nope-1", "score": 0.2}, {"id": "e5-stereotype", "score": 0.3}]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DataFormatError, match=r"p\.json: 2 intrasentence id\(s\).*\['e5-stereotype', 'nope-1'\]"):
        read_predictions(path, items)
    doc["intrasentence"] = doc["intrasentence"][1:-2]
    path.write_text(json.dumps(doc))
    with pytest.raises(DataFormatError, match="1 intrasentence sentence.*no score.*e1-stereotype"):
        read_predictions(path, items)
    path.write_text('{"foo": []}')
    with pytest.raises(DataFormatError, match="expected"):
        read_predictions(path, items)


def test_stages_export_predictions_with_the_params_the_pipeline_passes(tmp_path):
    """The score stage gets only the score options (export_predictions is not one of them); the export stage (a
    rule of its own, whose output is the file), which has the full config, writes the file, readable by others;
    the metric stage does not."""
    import os
    import stat

    from biasflow import stages
    from biasflow.plan import Job

    items, scores = make_items(HAND)
    items_path = tmp_path / "items.parquet"
    items.to_parquet(items_path)
    given = tmp_path / "given.json"
    write_predictions(scores, given)
    out = tmp_path / "export" / "predictions_x.json"
    job = Job(metric="stereoset", model={"name": "unused", "kind": "masked_lm", "hub_id": "unused/model"}, benchmark="stereoset",
              benchmark_cfg={}, metric_cfg={"tasks": ["intrasentence", "intersentence"], "predictions_file": str(given),
                                            "export_predictions": str(out)},
              stats={"n_boot": 0}, mode="parity", results=str(tmp_path / "results"))
    scores_path = tmp_path / "scores.parquet"
    old_mask = os.umask(0o022)
    try:
        stages.score(job.score_params(SPEC.score_keys), str(items_path), str(scores_path), str(tmp_path / "cache"))
        assert not out.exists()
        stages.metric(job.params(), str(items_path), str(scores_path), str(tmp_path / "metric"))
        assert not out.exists()
        assert job.exports == {} and dataclasses.replace(job, exports={"export_predictions": str(out)}).exports
        stages.export(job.params(), "export_predictions", str(items_path), str(scores_path), str(out))
    finally:
        os.umask(old_mask)
    assert json.loads(out.read_text()) == json.loads(given.read_text())
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
