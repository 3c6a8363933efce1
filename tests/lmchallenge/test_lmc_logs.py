"""Logs: schema validation, grep, shards, pretty/diff, and the CLI over files."""
import html as html_lib
import json
import re

import pytest

from biasflow.lmchallenge.cli import main
from biasflow.lmchallenge.errors import ErrorModel
from biasflow.lmchallenge.games import Reranking, run_game
from biasflow.lmchallenge.grep import select
from biasflow.lmchallenge.logs import LogError, read_log, validate_data, validate_file, write_log
from biasflow.lmchallenge.ngram import NgramModel
from biasflow.lmchallenge.pretty import diff, render_lines, to_html
from biasflow.lmchallenge.stats import stats
from biasflow.lmchallenge.text import Message

TRAIN = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog ran", "the mat was red"] * 2
TEST = [Message(None, t) for t in ["the cat ran on the log", "a dog sat", "the red cat", "a mat, a log."]]
VOCAB = sorted({w for line in TRAIN for w in line.split()} | {"cot", "dot", "mud", "rat"})


def model(order=2):
    return NgramModel(order=order).fit(TRAIN)


def test_validate_names_line_and_field(tmp_path, capsys):
    log = list(run_game(model(), TEST[:1], "we"))
    validate_data(log)
    del log[1]["target"]
    path = tmp_path / "bad.log"
    write_log(log, path)
    with pytest.raises(LogError, match=r"bad\.log:2: missing field 'target'"):
        validate_file(str(path))
    assert main(["validate", str(path)]) == 2
    assert "bad.log:2: missing field 'target'" in capsys.readouterr().err
    log[1]["target"] = "cat"
    log[2]["logp"] = "high"
    write_log(log, path)
    with pytest.raises(LogError, match=r":3: field 'logp'"):
        validate_file(str(path))


def test_every_game_writes_valid_logs():
    rer = Reranking(VOCAB, num_candidates=5, seed=1)
    for game in ("wc", "we", "ce", "wr"):
        assert validate_data(run_game(model(), TEST, game, reranking=rer)) > 0


@pytest.mark.parametrize("game", ["wc", "we", "wr"])
def test_shards_concatenate_to_the_single_run(tmp_path, game):
    rer = Reranking(VOCAB, num_candidates=5, seed=7, error_model=ErrorModel(p_anykey=0.3))
    single = list(run_game(model(), TEST, game, reranking=rer))
    parts = []
    for k in range(3):
        p = tmp_path / f"{game}.{k}.log"
        write_log(run_game(model(), TEST, game, reranking=rer, shard=(k, 3)), p)
        parts.append(p.read_text())
    cat = tmp_path / "all.log"
    cat.write_text("".join(parts))
    merged = list(read_log(str(cat)))
    assert len(merged) == len(single)
    assert stats(merged) == stats(single)
    assert sorted(map(json.dumps, merged)) == sorted(map(json.dumps, single))


def test_wr_corrupts_and_keeps_target_and_typed_word():
    rer = Reranking(VOCAB, num_candidates=4, seed=3, error_model=ErrorModel(p_anykey=0.5))
    log = list(run_game(model(), TEST, "wr", reranking=rer))
    assert any(d["verbatim"] != d["target"] for d in log)  # p = 0.5 corrupts some words
    for d in log:
        cands = [r[0] for r in d["results"]]
        assert d["target"] in cands and d["verbatim"] in cands and len(cands) <= 4
        assert all(len(c) == len(d["target"]) for c in cands)
    again = list(run_game(model(), TEST, "wr", reranking=rer))
    assert again == log  # seeded


def test_grep_selects_and_stats_report_skipped():
    log = list(run_game(model(), TEST, "wc", next_word_only=True))
    caps = list(select(log, [r"^[a-z]+$", "~^a$"]))
    n_sel = sum(1 for d in log if re.fullmatch(r"[a-z]+", d["target"]) and d["target"] != "a")
    s = stats(caps)
    assert s["tokens"] == n_sel and s["skipped_tokens"] == len(log) - n_sel
    assert s["skipped"] == pytest.approx((len(log) - n_sel) / len(log))
    assert stats(select(log, [r"^[a-z]+$", "~^a$"], keep="token"))["prediction"] == s["prediction"]
    assert len(list(select(log, ["$message=1"], keep="token"))) == 3
    with pytest.raises(ValueError, match="bad grep pattern"):
        list(select(log, ["("]))


def test_pretty_html_is_self_contained_and_diff_counts():
    w2 = list(run_game(model(2), TEST, "wc"))
    w1 = list(run_game(model(1), TEST, "wc"))
    page = to_html(render_lines(w2), "w2", summary=stats(w2))
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert not re.search(r"(src|href)\s*=|https?://|@import", page)  # opens offline
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", page.split("</pre>")[-1]))
    for m in TEST:
        assert m.text in text  # every message readable, in order, with its spacing
    tricky = list(run_game(model(2), [Message(None, "x <script> y")], "we"))
    assert "<script>" not in to_html(render_lines(tricky), "t") and "&lt;" in to_html(render_lines(tricky), "t")
    _, counts = diff(w2, w1)
    assert counts["better"] + counts["worse"] + counts["same"] == len(w2) and counts["unmatched"] == 0
    _, same = diff(w2, w2)
    assert same["same"] == len(w2)


def test_cli_end_to_end(tmp_path, capsys):
    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    train.write_text("\n".join(TRAIN) + "\n")
    test.write_text("\n".join(m.text for m in TEST) + "\n")
    logs = {}
    for order in (2, 3):
        logs[order] = str(tmp_path / f"w{order}.wc.log")
        assert main(["run", f"model=ngram{order}", "--training-text", str(train), "wc", "-i", str(test),
                     "-o", logs[order]]) == 0
    assert main(["stats", "-o", "csv", logs[2], logs[3]]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 3 and rows[1].startswith(logs[2]) and "prediction.hit1" in rows[0]
    assert main(["stats", logs[2]]) == 0
    assert json.loads(capsys.readouterr().out)["prediction"] == stats(read_log(logs[2]))["prediction"]
    assert main(["grep", "^cat$", logs[2], "-o", str(tmp_path / "g.log")]) == 0
    assert stats(read_log(str(tmp_path / "g.log")))["tokens"] == 2
    html = tmp_path / "p.html"
    assert main(["pretty", logs[3], "--html", str(html)]) == 0 and "<html" in html.read_text()
    assert main(["pretty", logs[3], "--color", "never"]) == 0
    assert "the cat ran on the log" in capsys.readouterr().out
    assert main(["diff", logs[3], logs[2], "--color", "never"]) == 0
    assert "better=" in capsys.readouterr().err
    we = str(tmp_path / "w.we.log")
    assert main(["run", "model=ngram2", "--training-text", str(train), "wc", "-i", str(test), "-n", "2",
                 "-o", we]) == 0
    capsys.readouterr()
    assert main(["diff", we, logs[2]]) == 2  # other text: refused, since token-by-token comparison is meaningless
    assert "different text" in capsys.readouterr().err
    assert main(["diff", we, logs[2], "--force", "--color", "never"]) == 0
    assert main(["run", "model=ngram2", "--training-text", str(train), "wr", "-i", str(test)]) == 2
    assert "--vocab" in capsys.readouterr().err
    assert main(["run", "model=ngram2", "--training-text", str(tmp_path / "missing.txt"), "we", "-i", str(test)]) == 2
    assert "missing.txt: No such file" in capsys.readouterr().err
    assert main(["run", "model=ngram2", "we", "-i", str(test)]) == 2
    assert "give --training-text FILE" in capsys.readouterr().err
    assert main(["run", "model=ngram2", "--training-text", str(train), "--set", "model.order=0", "we",
                 "-i", str(test)]) == 2
    assert "model.order=0" in capsys.readouterr().err  # the pipeline's validation
    assert main(["run", "model=glove_6b_50d", "we", "-i", str(test)]) == 2
    assert "cannot play the games" in capsys.readouterr().err


def test_the_command_line_and_the_pipeline_share_the_wr_defaults():
    """One default per option: the command line's wr flags take the pipeline's (metric lmc_wr) values."""
    from biasflow.lmchallenge.cli import build_parser
    from biasflow.plan import build_plan

    args = build_parser().parse_args(["run", "cmd", "wr"])
    job = next(j for j in build_plan(["model=ngram2", "metric=[lmc_wr]"]).jobs if j.metric == "lmc_wr")
    from biasflow.lmchallenge.pipeline import game_requests
    import pandas as pd

    items = pd.DataFrame({"role": ["train", "test"], "text": ["a b", "a"], "item_id": ["t", "x"],
                          "category": ["c", "c"]})
    from biasflow.registry import get_metric
    from biasflow.stages import metric_options

    request = game_requests("wr", items, metric_options(get_metric("lmc_wr"), job.params()))[0]
    assert (args.num_candidates, args.seed, args.p_anykey) == (request.num_candidates, request.seed,
                                                               request.p_anykey)
