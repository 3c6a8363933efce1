"""Append-only Parquet cache of generated responses.

One row per (backend fingerprint, model, system prompt, temperature, max tokens, seed, prompt, sample index), the
``key`` being the sha256 of those fields. Every flush writes a new part file atomically under a unique name, so
an interrupted run keeps what it flushed, concurrent runs never corrupt each other, and old rows are never
rewritten; every part is checked against its sha256 before it is read and a damaged one is quarantined, so its
requests are sent again (``biasflow.part_store``). A failed request is stored too (status ``failed`` with its error) so a run can report it; lookups
prefer an ``ok`` row, so a later successful retry supersedes the failure without deleting anything.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from biasflow.part_store import PartStore

KEY_FIELDS = ("fingerprint", "model", "system_prompt", "temperature", "max_tokens", "seed", "prompt", "sample_index")

COLUMNS = {
    "key": "string", "fingerprint": "string", "model": "string", "system_prompt": "string",
    "temperature": "float64", "max_tokens": "Int64", "seed": "Int64", "prompt": "string",
    "sample_index": "int64", "response": "string", "status": "string", "error": "string",
    "latency_s": "float64", "created_at": "float64",
}


def generation_key(fields: Mapping[str, Any]) -> str:
    """sha256 of the fields that determine a response (see ``KEY_FIELDS``)."""
    missing = [f for f in KEY_FIELDS if f not in fields]
    if missing:
        raise KeyError(f"generation key needs {missing}")
    blob = json.dumps([fields[f] for f in KEY_FIELDS], separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class GenerationCache:
    """Rows live in ``<root>/part-*.parquet``; ``root`` is usually ``results/cache/generations``."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.store = PartStore(self.root)
        self.parts_written = 0
        self._lock = threading.Lock()

    def get(self, keys: Iterable[str]) -> pd.DataFrame:
        """Best row per key among ``keys``: the first ``ok`` row, else the latest failure."""
        keys = list(dict.fromkeys(keys))
        table = self.store.read(filter=ds.field("key").isin(pa.array(keys, type=pa.string()))) if keys else None
        if table is None:
            return empty_cache_frame()
        df = table.to_pandas()
        if df.empty:
            return empty_cache_frame()
        df = df.assign(_ok=(df["status"] == "ok")).sort_values(
            ["key", "_ok", "created_at"], ascending=[True, False, True], kind="stable")
        ok = df[df["_ok"]].drop_duplicates("key", keep="first")
        failed = df[~df["_ok"] & ~df["key"].isin(ok["key"])].drop_duplicates("key", keep="last")
        return pd.concat([ok, failed], ignore_index=True).drop(columns="_ok")

    def put(self, rows: list[Mapping[str, Any]]) -> Path | None:
        """Append rows as one new part file (atomic); returns its path."""
        if not rows:
            return None
        df = pd.DataFrame(list(rows))
        for col, dtype in COLUMNS.items():
            if col not in df:
                df[col] = None
            df[col] = df[col].astype(dtype)
        with self._lock:
            path = self.store.write(df[list(COLUMNS)])
            self.parts_written += 1
        return path


def empty_cache_frame() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in COLUMNS.items()})
