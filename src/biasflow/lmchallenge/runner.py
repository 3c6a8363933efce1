"""Glue for running a game from files: read test text, drive the game, show progress."""
from __future__ import annotations

import itertools
import sys

from .games import run_game
from .text import Message, read_messages


def read_input(path: str, fmt: str = "auto", limit: int | None = None) -> list[Message]:
    name = "<stdin>" if path == "-" else path
    try:
        fh = sys.stdin if path == "-" else open(path, encoding="utf-8")
    except OSError as e:
        raise ValueError(f"--input {path}: {e.strerror}") from None
    try:
        return list(itertools.islice(read_messages(fh, fmt, source=name), limit))
    finally:
        if fh is not sys.stdin:
            fh.close()


def progress_bar(total: int, desc: str):
    """A tqdm wrapper over messages; silent when stderr is not a terminal (logs of batch jobs stay clean)."""
    def wrap(it):
        from biasflow.bars import progress_bar as tqdm

        return tqdm(it, total=total, desc=desc, unit="line", disable=None, file=sys.stderr)
    return wrap


def run_to_log(model, messages, game, **kw):
    return run_game(model, messages, game, **kw)
