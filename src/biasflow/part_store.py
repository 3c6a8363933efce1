"""Immutable, checksummed Parquet part files: the storage layer under every append-only cache.

A store is one folder of ``part-<time_ns>-<pid>-<rand>-sha256-<hex>.parquet`` files. A write serialises its rows in
memory, hashes the bytes, writes them to a hidden temporary file (``.part-...tmp``), fsyncs it and renames it to a
name that carries the sha256. So a reader never sees a half-written part (a writer killed mid-write leaves only the
hidden temporary file), concurrent writers never touch each other's files, and old rows are never rewritten.

Before any read every part's bytes are checked against the sha256 in its name (once per process while the file is
unchanged). A part that is truncated, altered or unreadable is moved to ``quarantine/`` beside the parts with a
warning naming it and the reason; it is then simply absent, so the caller computes its rows again. Parts written
before checksums existed (no ``-sha256-`` in the name) are read whole once, then renamed to carry their checksum.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time
import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from biasflow.io import atomic_write, sha256_file

log = logging.getLogger(__name__)

PART_GLOB = "part-*.parquet"
QUARANTINE = "quarantine"
_NAME = re.compile(r"^part-(?P<stem>.+?)(?:-sha256-(?P<sha>[0-9a-f]{64}))?\.parquet$")
_PARQUET_MAGIC = b"PAR1"

# parts that passed their check in this process, with the (size, mtime, inode) they had then
_verified: dict[str, tuple[int, int, int]] = {}


def _signature(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def _damage(path: Path, expected: str, actual: str) -> str:
    """Why a part's bytes do not match its name, in words."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - len(_PARQUET_MAGIC)))
        tail = fh.read()
    if tail != _PARQUET_MAGIC:
        return f"truncated or incomplete ({size} bytes, no Parquet footer)"
    return f"content altered (sha256 {actual[:16]}... but its name records {expected[:16]}...)"


class PartStore:
    """Append-only folder of checksummed Parquet parts; see the module doc."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.parts_written = 0

    # ------------------------------------------------------------------------------------------------ writing
    def write(self, data: pd.DataFrame | pa.Table) -> Path:
        """Write ``data`` as one new part (atomically, under a name carrying its sha256); returns its path."""
        table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        payload = sink.getvalue()
        digest = hashlib.sha256(memoryview(payload)).hexdigest()
        path = self.dir / f"part-{time.time_ns()}-{os.getpid()}-{uuid.uuid4().hex[:8]}-sha256-{digest}.parquet"
        with atomic_write(path) as fh:  # hidden temporary file, fsynced, then renamed
            fh.write(memoryview(payload))
        _verified[str(path)] = _signature(path)
        self.parts_written += 1
        return path

    # ------------------------------------------------------------------------------------------------ reading
    def parts(self) -> list[Path]:
        """Parts that pass their check, oldest first; a part that fails is quarantined on the way."""
        if not self.dir.is_dir():
            return []
        good = []
        for path in sorted(self.dir.glob(PART_GLOB)):
            checked = self._check(path)
            if checked is not None:
                good.append(checked)
        return good

    def read(self, columns: list[str] | None = None, filter: ds.Expression | None = None) -> pa.Table | None:
        """Rows of every good part (``columns`` and ``filter`` pushed down to the files); None without parts."""
        for _ in range(5):
            parts = self.parts()
            if not parts:
                return None
            try:
                # parts may differ in columns (an answer column all-null in one chunk): read them under one schema
                schema = pa.unify_schemas([pq.read_schema(p) for p in parts], promote_options="permissive")
                return ds.dataset([str(p) for p in parts], schema=schema, format="parquet").to_table(
                    columns=[c for c in columns if c in schema.names] if columns else None, filter=filter)
            except FileNotFoundError:
                continue  # another process quarantined or renamed a part meanwhile: list again
            except pa.ArrowException:
                if not self._quarantine_unreadable(parts):
                    raise
        raise RuntimeError(f"cache folder {self.dir}: parts kept changing while being read")

    # ------------------------------------------------------------------------------------------------ checks
    def _check(self, path: Path) -> Path | None:
        """``path`` if its bytes match the sha256 in its name (a checksum-less part gets one); else None."""
        match = _NAME.match(path.name)
        try:
            if _verified.get(str(path)) == _signature(path):
                return path
            if match is None or match["sha"] is None:
                return self._adopt(path, match["stem"] if match else path.stem.removeprefix("part-"))
            actual = sha256_file(path)
            if actual != match["sha"]:
                self._quarantine(path, _damage(path, match["sha"], actual))
                return None
            _verified[str(path)] = _signature(path)
            return path
        except FileNotFoundError:
            return None  # quarantined or renamed by another process since it was listed

    def _adopt(self, path: Path, stem: str) -> Path | None:
        """Check a part written before checksums by reading it whole, then rename it to carry its sha256."""
        try:
            pq.read_table(path)
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError, ValueError) as exc:
            self._quarantine(path, f"unreadable Parquet ({exc})")
            return None
        named = path.with_name(f"part-{stem}-sha256-{sha256_file(path)}.parquet")
        try:
            os.replace(path, named)
        except FileNotFoundError:  # another process adopted it first
            if not named.exists():
                return None
        _verified[str(named)] = _signature(named)
        return named

    def _quarantine_unreadable(self, parts: list[Path]) -> bool:
        """Quarantine the parts pyarrow cannot read (checksum right, content not Parquet); True if any."""
        found = False
        for path in parts:
            try:
                pq.read_table(path)
            except FileNotFoundError:
                found = True
            except (pa.ArrowException, OSError, ValueError) as exc:
                self._quarantine(path, f"unreadable Parquet ({exc})")
                found = True
        return found

    def _quarantine(self, path: Path, reason: str) -> None:
        qdir = self.dir / QUARANTINE
        qdir.mkdir(exist_ok=True)
        dest = qdir / path.name
        if dest.exists():
            dest = qdir / f"{path.stem}-{uuid.uuid4().hex[:8]}{path.suffix}"
        try:
            os.replace(path, dest)
        except FileNotFoundError:
            return  # another reader moved it first and warned
        _verified.pop(str(path), None)
        log.warning("cache part %s failed its integrity check: %s; moved to %s, its rows will be computed again",
                    path, reason, dest)
