"""The LM Challenge games as pipeline metrics: the split, sharded processes of a saved n-gram model against the
plain in-process game, the plan (one DAG with every other metric), and the metric stage's files."""
import json
from pathlib import Path

import pandas as pd
import pytest

from biasflow.data.lmchallenge_text import load_lmchallenge_text, split_lines
from biasflow.lmchallenge import pipeline
from biasflow.lmchallenge.games import run_game
from biasflow.lmchallenge.ngram import NgramModel
from biasflow.lmchallenge.stats import stats
from biasflow.lmchallenge.text import Message
from biasflow.lmchallenge.tracking import metrics_of


@pytest.fixture()
def items(tmp_path):
    doc = {"g": {"A": [f"Alpha number {i} is here.\nSecond line {i}." for i in range(10)],
                 "B": [f"The cat {i} sat on the mat." for i in range(10)]}}
    (tmp_path / "x_wiki.json").write_text(json.dumps(doc))
    return load_lmchallenge_text({"x": tmp_path / "x_wiki.json"}, {"test_every": 4, "test_limit": 6})


def test_order_based_split():
    assert split_lines(list("abcdefghij"), 4, None) == ["train"] * 3 + ["test"] + ["train"] * 3 + ["test"] + \
        ["train"] * 2
    # a test line beyond the limit neither trains nor is played
    assert split_lines(list("abcdefgh"), 4, 1) == ["train"] * 3 + ["test"] + ["train"] * 3 + [""]


def test_items_hold_train_and_test_lines(items):
    assert items.role.value_counts().to_dict() == {"train": 23, "test": 6}  # 30 lines: 7 test, 1 beyond the limit
    assert items.item_id.is_unique and set(items.category) == {"x"}


@pytest.mark.parametrize("game", ["we", "wc", "wr"])
def test_sharded_saved_model_processes_equal_the_plain_game(items, tmp_path, game):
    """Two processes serving the saved model, logs merged by position == one in-process model fitted directly."""
    cfg = {"shards": 2, "timeout": 60, "num_candidates": 10, "seed": 42, "p_anykey": 0.1}
    model_cfg = {"name": "ngram2", "kind": "ngram", "order": 2, "level": "word", "predictions": 20}
    got = pipeline.play(game, items, model_cfg, cfg, tmp_path / "cache")
    train = items[items.role == "train"].text.tolist()
    messages = [Message(None, t) for t in items[items.role == "test"].text]
    direct = NgramModel(order=2, level="word").fit(train)
    want = list(run_game(direct, messages, game,
                         reranking=pipeline.reranking(cfg, train) if game == "wr" else None))
    assert got == json.loads(json.dumps(want))  # the protocol's float text round-trips exactly
    assert len(list((tmp_path / "cache" / "lmchallenge").glob("ngram-*.json"))) == 1  # trained once, saved


def test_metric_stage_writes_the_original_files(items, tmp_path):
    from biasflow.registry import get_metric

    spec = get_metric("lmc_we")
    model_cfg = {"name": "ngram3", "kind": "ngram", "order": 3, "level": "word"}
    table = pipeline.log_table(pipeline.play("we", items, model_cfg, {"shards": 1}, tmp_path / "c"), items)
    per_item = spec.compute(items, table, {})
    agg = spec.aggregate(per_item, {})
    overall = dict(zip(agg[agg.category == "overall"].metric, agg[agg.category == "overall"].value))
    s = stats(pipeline.data_of(table))
    assert overall["entropy.mean"] == pytest.approx(s["entropy"]["mean"]) and overall["tokens"] == s["tokens"]
    spec.write_extras(per_item, {}, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "stats.json").read_text()) == json.loads(json.dumps(s))
    assert (tmp_path / "out" / "we.html").read_text().startswith("<!")
    assert len((tmp_path / "out" / "we.log").read_text().splitlines()) == len(table)


def test_games_are_planned_with_every_other_metric():
    from biasflow.plan import build_plan

    plan = build_plan(["+experiment=lmchallenge_bold", "model=ngram2,char3"], multirun=True)
    jobs = sorted((j.model["name"], j.metric) for j in plan.jobs)
    assert jobs == [("char3", "lmc_ce"), ("ngram2", "lmc_wc"), ("ngram2", "lmc_we"), ("ngram2", "lmc_wr")]
    assert any("lmc_ce skipped for model ngram2" in s for s in plan.skipped)
    # sweeping an option of the model trains a separate model, never reuses the other's scores
    a, b = (build_plan(["metric=[lmc_we]", "model=ngram3", f"model.order={o}"]).jobs[0] for o in (3, 4))
    assert a.scores_path(("shards",)) != b.scores_path(("shards",))


def test_metrics_for_mlflow_are_flat_numbers():
    m = metrics_of({"fingerprint": "abc", "tokens": 5, "skipped": None,
                    "prediction": {"hit1": 0.5, "mrr": 0.25}, "entropy": {"fingerprint": "f", "mean": 2.0}})
    assert m == {"tokens": 5.0, "prediction.hit1": 0.5, "prediction.mrr": 0.25, "entropy.mean": 2.0}
