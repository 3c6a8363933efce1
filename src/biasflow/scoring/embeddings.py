"""Append-only Parquet cache of sentence-encoder outputs, keyed by (encoder fingerprint, pooling, text).

Layout: ``<root>/<fingerprint>/<pooling>/part-<time_ns>-<pid>-<rand>-sha256-<hex>.parquet`` with columns ``key``
(sha256 of the three), ``text`` and ``vector`` (list<float32>), a ``PartStore`` (``biasflow.part_store``). Every
write is a new part file, written to a temp name and renamed, so concurrent jobs never corrupt each other and an
interrupted run keeps the chunks it finished; a rerun encodes only texts not cached yet. Every part is checked
against its sha256 before it is read; a damaged one is quarantined, so its texts are encoded again. Duplicate keys (two jobs racing) are harmless: the first row read wins.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from biasflow.part_store import PartStore


def embedding_key(fingerprint: str, pooling: str, text: str) -> str:
    blob = json.dumps([fingerprint, pooling, text], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class EmbeddingCache:
    def __init__(self, root: str | os.PathLike, fingerprint: str, pooling: str):
        self.fingerprint = fingerprint
        self.pooling = pooling
        self.dir = Path(root) / fingerprint / pooling
        self.store = PartStore(self.dir)

    @property
    def parts_written(self) -> int:
        return self.store.parts_written

    def get(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        table = self.store.read(columns=["key", "vector"],
                                filter=ds.field("key").isin(pa.array(list(set(keys)), type=pa.string()))) \
            if len(keys) else None
        if table is None:
            return {}
        out: dict[str, np.ndarray] = {}
        for key, vec in zip(table.column("key").to_pylist(), table.column("vector").to_numpy(zero_copy_only=False)):
            out.setdefault(key, np.asarray(vec, dtype=np.float32))
        return out

    def put(self, keys: Sequence[str], texts: Sequence[str], vectors: np.ndarray) -> Path | None:
        if not len(keys):
            return None
        vectors = np.asarray(vectors, dtype=np.float32)
        table = pa.table({"key": pa.array(list(keys), pa.string()), "text": pa.array(list(texts), pa.string()),
                          "vector": pa.array(list(vectors), type=pa.list_(pa.float32()))})
        return self.store.write(table)


def encode_cached(encoder, texts: Sequence[str], cache_root: str | os.PathLike | None, pooling: str | None = None,
                  batch_size: int | None = None, chunk_size: int = 1024, progress: bool = False) -> np.ndarray:
    """Vectors of ``texts`` (rows in the given order) from the cache, encoding and appending only the missing.

    ``encoder`` needs ``fingerprint``, ``pooling`` (default) and ``encode(texts, pooling, batch_size, progress)``.
    Missing texts are encoded in chunks of ``chunk_size``, each written as its own part when it finishes.
    ``cache_root=None`` encodes everything without caching.
    """
    pooling = pooling or encoder.pooling
    texts = list(texts)
    unique = list(dict.fromkeys(texts))
    if cache_root is None:
        vecs = encoder.encode(unique, pooling=pooling, batch_size=batch_size, progress=progress)
        lookup = dict(zip(unique, vecs))
        return np.stack([lookup[t] for t in texts]) if texts else vecs
    cache = EmbeddingCache(cache_root, encoder.fingerprint, pooling)
    keys = {t: embedding_key(encoder.fingerprint, pooling, t) for t in unique}
    have = cache.get(list(keys.values()))
    missing = [t for t in unique if keys[t] not in have]
    for start in range(0, len(missing), chunk_size):
        chunk = missing[start:start + chunk_size]
        vecs = encoder.encode(chunk, pooling=pooling, batch_size=batch_size, progress=progress)
        cache.put([keys[t] for t in chunk], chunk, vecs)
        have.update({keys[t]: v for t, v in zip(chunk, vecs)})
    if not texts:
        return np.zeros((0, 0), np.float32)
    return np.stack([have[keys[t]] for t in texts])


def cached_frame(encoder, texts: Sequence[str], cache_root, pooling: str | None = None, **kw) -> pd.DataFrame:
    """``text``, ``vector`` (list of float32) for each text: the cached encodings as a table."""
    vecs = encode_cached(encoder, texts, cache_root, pooling, **kw)
    return pd.DataFrame({"text": list(texts), "vector": [v.tolist() for v in vecs]})
