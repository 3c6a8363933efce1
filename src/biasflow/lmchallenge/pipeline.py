"""The LM Challenge games as pipeline stages (metrics ``lmc_wc``, ``lmc_we``, ``lmc_ce``, ``lmc_wr``).

A game asks the model one question per token of a test line (wc: one per typed prefix), and each question depends
only on that line, its index and the game's options (the pipeline plays without adaptation: no ``train`` between
lines), so the request is a line (``interface.requests.LMChallengeLine``) and its answer is the line's log: the
datums ``run_game`` would write for it, in order. The score stage answers the lines behind the one answer cache
(``answer_lmc_line``); the metric stage joins the answers into the game's log, computes the original ``stats`` and
writes the log, the stats and the HTML page beside its tables.

Models: ``ngram`` (biasflow's sample n-gram model, trained on the training text the requests carry, saved, and
served by ``model.shards`` protocol processes), ``lmc_process`` (any command speaking the protocol, ``{train}`` =
the training text file), and the in-process Hugging Face wrappers for ``masked_lm`` / ``causal_lm``.
"""
from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pandas as pd

from biasflow.io import sha256_bytes, write_text
from biasflow.interface.requests import LMChallengeLine

from .logs import read_log, write_log

log = logging.getLogger(__name__)

PROCESS_KINDS = ("ngram", "lmc_process")
HF_KINDS = ("masked_lm", "causal_lm")


def training_text(lines: Sequence[str]) -> str:
    """The training text as the models read it: one line per training sentence."""
    return "".join(line + "\n" for line in lines)


def game_requests(game: str, items: pd.DataFrame, cfg: Mapping[str, Any]) -> list[LMChallengeLine]:
    """One request per test line of ``items``, in order; only the options of ``game`` are set (the others keep
    their defaults, so they never split the cache). ``cfg`` is the metric's options model (the ``lmc_<game>``
    options model in biasflow.metrics.lmchallenge holds the defaults)."""
    train_lines = tuple(items.loc[items["role"] == "train", "text"])
    digest = sha256_bytes(training_text(train_lines).encode())
    options: dict[str, Any] = {}
    if game == "wc":
        options["next_word_only"] = bool(cfg.next_word_only)
    if game == "wr":
        options.update(num_candidates=cfg.num_candidates, seed=cfg.seed, p_anykey=cfg.p_anykey)
    test = items.loc[items["role"] == "test", "text"]
    return [LMChallengeLine(game=game, text=str(text), message=i, train=digest, training_lines=train_lines, **options)
            for i, text in enumerate(test)]


def reranking(train_lines: Sequence[str], num_candidates: int, seed: int, p_anykey: float):
    """The ``wr`` settings; candidates are the alphabetic words of the training text."""
    import re

    from .errors import ErrorModel
    from .games import Reranking

    words = sorted({w for line in train_lines for w in re.findall(r"[^\W\d_]+", line)})
    return Reranking(words, num_candidates=num_candidates, seed=seed, error_model=ErrorModel(p_anykey=p_anykey))


def hf_model(adapter):
    """The LM Challenge wrapper of a loaded masked or causal LM adapter (``model.predictions`` predictions)."""
    from .hf import HFCausalLM, HFMaskedLM

    from biasflow.scoring.answer import can_answer
    from biasflow.interface.requests import PseudoLogLikelihood

    # by what the kind answers, not by its name (a kind declared like masked_lm is a masked LM)
    cls = HFMaskedLM if can_answer(adapter.kind, PseudoLogLikelihood.kind) else HFCausalLM
    return cls(adapter.model, adapter.tokenizer, n_predictions=int(adapter.cfg.get("predictions") or 20))


def play_line(model, request: LMChallengeLine, rerank) -> list[dict]:
    """The log of one test line (what ``run_game`` yields for it in a run over every test line)."""
    from .games import play_message

    return list(play_message(model, request.text, request.game, message_index=request.message,
                             next_word_only=request.next_word_only, reranking=rerank))


def answer_lmc_line(model, requests: Sequence[LMChallengeLine], budget) -> pd.DataFrame:
    """Answerer of ``LMChallengeLine`` requests for every model kind that plays: ``data``, the JSON list of the
    line's log datums. Protocol models play in ``model.shards`` processes, each a share of the lines."""
    data: list[list[dict] | None] = [None] * len(requests)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(r.train, []).append(i)
    for digest, rows in groups.items():
        train_lines = requests[rows[0]].training_lines
        if not train_lines and (model.kind in PROCESS_KINDS or any(requests[i].game == "wr" for i in rows)):
            raise ValueError(f"LM Challenge line requests with training text {digest[:12]} carry no training lines "
                             f"(build them with biasflow.lmchallenge.pipeline.game_requests)")
        reranks: dict[tuple, Any] = {}

        def rerank_of(r: LMChallengeLine):
            if r.game != "wr":
                return None
            key = (r.num_candidates, r.seed, r.p_anykey)
            if key not in reranks:
                reranks[key] = reranking(train_lines, *key)
            return reranks[key]

        if model.kind in HF_KINDS:
            player = hf_model(model)
            for i in rows:
                data[i] = play_line(player, requests[i], rerank_of(requests[i]))
            continue
        from .process import ProcessModel

        command = model.command(train_lines, digest)
        for i in rows:
            rerank_of(requests[i])  # built before the threads share it
        shards = max(1, min(model.shards, len(rows)))

        def shard(k: int) -> None:  # each shard its own model process, every shards-th line
            with ProcessModel(command, timeout=model.timeout) as process:
                for i in rows[k::shards]:
                    data[i] = play_line(process, requests[i], rerank_of(requests[i]))

        with ThreadPoolExecutor(max_workers=shards) as pool:
            list(pool.map(shard, range(shards)))
    return pd.DataFrame({"data": [json.dumps(d, ensure_ascii=False, separators=(",", ":")) for d in data]})


def trained_ngram(model_cfg: Mapping[str, Any], train_lines: Sequence[str], folder: Path) -> Path:
    """Train the n-gram model on ``train_lines`` (read back from their file, as a protocol model would) and save
    it in ``folder``; the shard processes load it."""
    from .ngram import NgramModel, load_training_lines

    train = training_file(train_lines, folder)
    path = folder / f"ngram-{train.stem}.json"
    if not path.exists():
        log.info("training the %s-level %s-gram model on %s", model_cfg.get("level", "word"),
                 model_cfg.get("order", 3), train)
        model = NgramModel(order=int(model_cfg.get("order", 3)), level=model_cfg.get("level", "word"))
        model.fit(load_training_lines(str(train), "text")).save(str(path))
    return path


def training_file(lines: Sequence[str], folder: Path) -> Path:
    """The training text as a file named by its content."""
    text = training_text(lines)
    path = Path(folder) / f"train-{sha256_bytes(text.encode())[:16]}.txt"
    if not path.exists():
        write_text(text, path)
    return path


def log_table(answers: pd.DataFrame, items: pd.DataFrame, requests: Sequence[LMChallengeLine]) -> pd.DataFrame:
    """The game's log, one row per datum: its position, the category of its test line, and the original JSON."""
    from biasflow.scoring.answer import lookup

    test = items[items["role"] == "test"].reset_index(drop=True)
    rows = []
    for r, answer in zip(requests, lookup(answers, requests, "data")):
        for d in json.loads(answer):
            rows.append({"item_id": test.item_id[r.message], "category": test.category[r.message],
                         "message": d["message"], "token": d["token"], "target": d["target"],
                         "datum": json.dumps(d, ensure_ascii=False, separators=(",", ":"))})
    return pd.DataFrame(rows, columns=["item_id", "category", "message", "token", "target", "datum"])


def data_of(table: pd.DataFrame) -> Iterator[dict]:
    return (json.loads(s) for s in table["datum"])


def write_outputs(table: pd.DataFrame, game: str, out_dir: Path, title: str) -> dict:
    """The original tools' files beside the tables: ``<game>.log`` (JSON lines), ``stats.json``, ``<game>.html``."""
    from biasflow.io import write_json

    from .pretty import render_lines, to_html
    from .stats import stats

    data = list(data_of(table))
    write_log(data, out_dir / f"{game}.log")
    s = stats(data)
    write_json(s, out_dir / "stats.json")
    write_text(to_html(render_lines(data), title=title, summary=s), out_dir / f"{game}.html")
    return s


__all__ = ["game_requests", "answer_lmc_line", "log_table", "data_of", "write_outputs", "trained_ngram",
           "training_file", "read_log"]
