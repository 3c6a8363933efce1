"""The pipeline's own outputs checked before a run: a damaged one counts as missing, so its job runs again.

Snakemake decides what to run from files' presence and times, not their content: a truncated or overwritten
Parquet table under ``results/`` (items, scores, metric or run tables; their JSON records) made every re-run fail
reading it (``ArrowInvalid: Parquet magic bytes not found``) without saying what to do. Before Snakemake starts,
each Parquet file's footer and each JSON file is read; a damaged one is moved to ``results/.damaged/`` (kept for a
look, never deleted) and named in one line, and Snakemake then recomputes it and what depends on it. Files found
sound are remembered by size and modification time (``results/.checked.json``), so a re-run reads only new or
changed files: the check stays cheap at thousands of jobs. The answer cache has its own per-part checks
(``part_store``).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from biasflow.io import write_json

CHECKED_FOLDERS = ("items", "scores", "metrics", "runs")
DAMAGED = ".damaged"
INDEX = ".checked.json"


def damage(path: Path) -> str | None:
    """Why ``path`` cannot be read as what its name says (None: it can)."""
    try:
        if path.stat().st_size == 0:
            return "empty file"
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.read_metadata(path)
        else:
            json.loads(path.read_text(encoding="utf-8"))
    except Exception as exc:  # OSError, ArrowInvalid (a ValueError), pyarrow's other errors on a damaged footer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    return None


def quarantine_damaged(results: str | Path) -> list[str]:
    """Move every damaged output under ``results`` aside; one line per file, naming it, why, and where it went."""
    results = Path(results)
    index_path = results / INDEX
    try:
        known = json.loads(index_path.read_text())
    except (OSError, ValueError):
        known = {}
    sound: dict[str, list[int]] = {}
    lines = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for folder in CHECKED_FOLDERS:
        base = results / folder
        if not base.is_dir():
            continue
        for root, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if d not in (".last-complete", ".last-complete.tmp")]
            for name in files:
                if not name.endswith((".parquet", ".json")):
                    continue
                path = Path(root) / name
                try:
                    st = path.stat()
                except OSError:
                    continue
                key = str(path.relative_to(results))
                signature = [st.st_size, st.st_mtime_ns]
                if known.get(key) == signature:
                    sound[key] = signature
                    continue
                why = damage(path)
                if why is None:
                    sound[key] = signature
                    continue
                dest = results / DAMAGED / f"{key}.{stamp}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, dest)
                lines.append(f"{path} was damaged ({why}): moved to {dest}; the job that writes it runs again")
    if sound != known:
        try:
            write_json(sound, index_path)
        except OSError:
            pass  # the index only saves time
    return lines


__all__ = ["quarantine_damaged", "damage", "DAMAGED"]
