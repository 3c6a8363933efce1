"""The LM Challenge games as pipeline stages (metrics ``lmc_wc``, ``lmc_we``, ``lmc_ce``, ``lmc_wr``).

The score stage plays one game with one model over the benchmark's test lines and returns its log (one row per
datum, the original JSON in ``datum``); the metric stage computes the original ``stats`` from it and writes the log,
the stats and the HTML page beside its tables. Models: ``ngram`` (biasflow's sample n-gram model, trained once per
training text and saved, then loaded by every game process), ``lmc_process`` (any command speaking the protocol),
and the in-process Hugging Face wrappers for ``masked_lm`` / ``causal_lm``.
"""
from __future__ import annotations

import json
import logging
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pandas as pd

from biasflow.errors import ConfigError
from biasflow.io import sha256_bytes, stable_hash, write_text

from .logs import read_log, write_log
from .text import Message

log = logging.getLogger(__name__)

PROCESS_KINDS = ("ngram", "lmc_process")
HF_KINDS = ("masked_lm", "causal_lm")


def training_file(lines: Sequence[str], cache_dir: Path) -> Path:
    """The training text as a file named by its content (shared by every game and model that trains on it)."""
    text = "".join(line + "\n" for line in lines)
    path = Path(cache_dir) / "lmchallenge" / f"train-{sha256_bytes(text.encode())[:16]}.txt"
    if not path.exists():
        write_text(text, path)
    return path


def trained_ngram(model_cfg: Mapping[str, Any], train: Path, cache_dir: Path) -> Path:
    """Train the n-gram model once per (order, level, training text) and save it; later games load it."""
    from filelock import FileLock

    from .ngram import NgramModel, load_training_lines

    key = stable_hash({"order": model_cfg.get("order", 3), "level": model_cfg.get("level", "word"),
                       "train": train.name}, 16)
    path = Path(cache_dir) / "lmchallenge" / f"ngram-{key}.json"
    with FileLock(f"{path}.lock"):  # the games of one model run in parallel: one of them trains
        if not path.exists():
            log.info("training the %s-level %s-gram model on %s", model_cfg.get("level", "word"),
                     model_cfg.get("order", 3), train)
            model = NgramModel(order=int(model_cfg.get("order", 3)), level=model_cfg.get("level", "word"))
            model.fit(load_training_lines(str(train), "text")).save(str(path))
    return path


def model_command(model_cfg: Mapping[str, Any], train: Path, cache_dir: Path) -> str:
    python = shlex.quote(sys.executable)
    if model_cfg["kind"] == "ngram":
        saved = trained_ngram(model_cfg, train, cache_dir)
        return (f"{python} -m biasflow.lmchallenge.ngram --load {shlex.quote(str(saved))} "
                f"--predictions {int(model_cfg.get('predictions', 20))}")
    command = model_cfg.get("command")
    if not command:
        raise ConfigError(f"model {model_cfg.get('name')!r} (kind lmc_process) needs model.command")
    return command.replace("{train}", shlex.quote(str(train))).replace("{python}", python)


def hf_model(adapter, model_cfg: Mapping[str, Any]):
    from .hf import HFCausalLM, HFMaskedLM

    cls = HFMaskedLM if model_cfg["kind"] == "masked_lm" else HFCausalLM
    return cls(adapter.model, adapter.tokenizer, n_predictions=int(model_cfg.get("predictions", 20)))


def reranking(cfg: Mapping[str, Any], train_lines: Sequence[str]):
    """The ``wr`` settings; candidates are the alphabetic words of the training text."""
    import re

    from .errors import ErrorModel
    from .games import Reranking

    words = sorted({w for line in train_lines for w in re.findall(r"[^\W\d_]+", line)})
    return Reranking(words, num_candidates=int(cfg.get("num_candidates", 50)), seed=int(cfg.get("seed", 42)),
                     error_model=ErrorModel(p_anykey=float(cfg.get("p_anykey", 0.1))))


def play(game: str, items: pd.DataFrame, model_cfg: Mapping[str, Any], cfg: Mapping[str, Any], cache_dir: Path,
         load_adapter=None) -> list[dict]:
    """Play ``game`` over the test lines of ``items``; return the log (the data of a single unsharded run)."""
    from .games import run_game
    from .process import ProcessModel

    train_lines = items.loc[items["role"] == "train", "text"].tolist()
    messages = [Message(None, t) for t in items.loc[items["role"] == "test", "text"]]
    kwargs = {"next_word_only": bool(cfg.get("next_word_only", False)),
              "reranking": reranking(cfg, train_lines) if game == "wr" else None}
    if model_cfg["kind"] in HF_KINDS:
        return list(run_game(hf_model(load_adapter(), model_cfg), messages, game, **kwargs))
    if model_cfg["kind"] not in PROCESS_KINDS:
        raise ConfigError(f"model kind {model_cfg['kind']!r} cannot play the LM Challenge games")
    command = model_command(model_cfg, training_file(train_lines, cache_dir), cache_dir)
    shards = max(1, int(cfg.get("shards", 1)))
    timeout = float(cfg.get("timeout", 120))

    def shard(k: int) -> list[dict]:  # each shard its own model process; indices stay those of the full run
        with ProcessModel(command, timeout=timeout) as model:
            return list(run_game(model, messages, game, shard=(k, shards), **kwargs))

    with ThreadPoolExecutor(max_workers=shards) as pool:
        parts = list(pool.map(shard, range(shards)))
    return sorted((d for part in parts for d in part), key=lambda d: (d["message"], d["token"]))


def log_table(data: Sequence[dict], items: pd.DataFrame) -> pd.DataFrame:
    """One row per datum: its position, the category of its test line, and the original JSON."""
    test = items[items["role"] == "test"].reset_index(drop=True)
    return pd.DataFrame({"item_id": [test.item_id[d["message"]] for d in data],
                         "category": [test.category[d["message"]] for d in data],
                         "message": [d["message"] for d in data], "token": [d["token"] for d in data],
                         "target": [d["target"] for d in data],
                         "datum": [json.dumps(d, ensure_ascii=False, separators=(",", ":")) for d in data]})


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


__all__ = ["play", "log_table", "data_of", "write_outputs", "trained_ngram", "training_file", "read_log"]
