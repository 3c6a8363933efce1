"""The one cache of model answers: append-only, content-addressed Parquet parts.

Layout: ``<root>/<model fingerprint>/<request kind>/part-<time>-<pid>-<rand>-sha256-<hex>.parquet``, a ``PartStore``
(``biasflow.part_store``): every write is a new part file written atomically under a unique name, so concurrent jobs
(threads, processes, cluster nodes on a shared file system) never corrupt each other and appending never rewrites
old results; every part is checked against its sha256 before it is read, and a damaged one is quarantined (with a
warning) so its rows are computed again. A row is one answer: ``key`` (``Request.key``: request kind and fields),
``kind``, the request's fields and the answer's columns. Reads push a ``key in (...)`` filter down to the Parquet
files and load only the rows asked for.

Duplicate keys (two jobs that raced on the same request) are harmless: the first row wins. Answers that can fail
(a generation request to a server) carry ``status``; a lookup prefers an ``ok`` row and otherwise returns the latest
failure, so a later successful retry supersedes a failure without deleting anything.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from biasflow.part_store import PartStore

log = logging.getLogger(__name__)


class AnswerCache:
    def __init__(self, root: str | os.PathLike, fingerprint: str, kind: str):
        self.fingerprint = fingerprint
        self.kind = kind
        self.dir = Path(root) / fingerprint / kind
        self.store = PartStore(self.dir)
        self.writes = 0  # number of part files this instance wrote (tests count model work with it)

    def get(self, keys: Iterable[str], columns: list[str] | None = None) -> pd.DataFrame:
        """The best row per key among ``keys`` (those never answered are absent)."""
        keys = list(dict.fromkeys(keys))
        table = self.store.read(columns=columns, filter=ds.field("key").isin(pa.array(keys, type=pa.string()))) \
            if keys else None
        if table is None or table.num_rows == 0:
            return pd.DataFrame({"key": pd.Series([], dtype=str)})
        df = table.to_pandas()
        if "status" not in df:
            return df.drop_duplicates("key", keep="first").reset_index(drop=True)
        ok = df["status"] == "ok"
        first_ok = df[ok].drop_duplicates("key", keep="first")
        # parts are read in name order, which starts with the write time: the last failure is the latest
        last_failure = df[~ok & ~df["key"].isin(first_ok["key"])].drop_duplicates("key", keep="last")
        return pd.concat([first_ok, last_failure], ignore_index=True)

    def put(self, df: pd.DataFrame) -> Path | None:
        if df.empty:
            return None
        if "key" not in df.columns:
            raise ValueError("cache rows need a 'key' column")
        path = self.store.write(df)
        self.writes += 1
        return path

    def claim(self, unit: int, wait: bool = False):
        """The claim on work unit ``unit`` of this model and request kind (see ``answer.WORK_UNITS``): a held
        ``filelock.FileLock`` to release when its answers are written, or None when another job holds it (unless
        ``wait``: then block until it is released). One lock file per unit under ``.claims/`` (``flock``: released
        when its process dies, so a killed job never blocks the next)."""
        from filelock import FileLock, Timeout

        claims = self.dir / ".claims"
        claims.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(claims / f"unit-{unit:03d}.lock"), thread_local=False)
        try:
            lock.acquire(timeout=-1 if wait else 0)
        except Timeout:
            return None
        return lock

    def keys(self) -> set[str]:
        table = self.store.read(columns=["key"])
        return set() if table is None else set(table.column("key").to_pylist())

