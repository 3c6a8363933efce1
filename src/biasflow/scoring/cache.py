"""Append-only, content-addressed Parquet cache of model outputs.

Layout: ``<root>/<fingerprint>/<kind>/part-<time>-<pid>-<rand>-sha256-<hex>.parquet``, a ``PartStore``
(``biasflow.part_store``): every write is a new part file written atomically under a unique name, so concurrent jobs
(threads, processes, cluster nodes on a shared file system) never corrupt each other and appending never rewrites
old results; every part is checked against its sha256 before it is read, and a damaged one is quarantined (with a
warning) so its rows are computed again. Reads push a ``key in (...)`` filter down to the Parquet files and load
only the rows asked for. Duplicate keys (two jobs that raced on the same request) are harmless: the first row wins.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from biasflow.part_store import PartStore


def request_key(fingerprint: str, kind: str, inputs: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> str:
    """sha256 of (model fingerprint, request kind, normalised inputs, options that change the numbers)."""
    blob = json.dumps([fingerprint, kind, inputs, options or {}], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class ScoreCache:
    def __init__(self, root: str | os.PathLike, fingerprint: str, kind: str):
        self.fingerprint = fingerprint
        self.kind = kind
        self.dir = Path(root) / fingerprint / kind
        self.store = PartStore(self.dir)
        self.writes = 0  # number of part files this instance wrote (tests count model work with it)

    def get(self, keys: Iterable[str], columns: list[str] | None = None) -> pd.DataFrame:
        keys = list(dict.fromkeys(keys))
        table = self.store.read(columns=columns, filter=ds.field("key").isin(pa.array(keys, type=pa.string()))) \
            if keys else None
        if table is None:
            return pd.DataFrame({"key": pd.Series([], dtype=str)})
        return table.to_pandas().drop_duplicates("key", keep="first").reset_index(drop=True)

    def put(self, df: pd.DataFrame) -> Path | None:
        if df.empty:
            return None
        if "key" not in df.columns:
            raise ValueError("cache rows need a 'key' column")
        path = self.store.write(df)
        self.writes += 1
        return path

    def keys(self) -> set[str]:
        table = self.store.read(columns=["key"])
        return set() if table is None else set(table.column("key").to_pylist())

    def fetch_or_compute(self, requests: pd.DataFrame, compute: Callable[[pd.DataFrame], pd.DataFrame],
                         chunk_size: int = 512) -> pd.DataFrame:
        """Rows for every request (one per distinct ``key``), computing only the missing ones.

        Missing requests are computed in chunks and each chunk is written as it finishes, so an interrupted run
        keeps its progress and a restart computes only what is still missing.
        """
        requests = requests.drop_duplicates("key").reset_index(drop=True)
        hits = self.get(requests["key"])
        have = set(hits["key"]) if not hits.empty else set()
        missing = requests[~requests["key"].isin(have)]
        frames = [hits] if not hits.empty else []
        for start in range(0, len(missing), chunk_size):
            chunk = missing.iloc[start:start + chunk_size]
            out = compute(chunk)
            self.put(out)
            frames.append(out)
        if not frames:
            return pd.DataFrame(columns=["key"])
        result = pd.concat(frames, ignore_index=True).drop_duplicates("key", keep="first")
        order = {k: i for i, k in enumerate(requests["key"])}
        return result.sort_values("key", key=lambda s: s.map(order)).reset_index(drop=True)
