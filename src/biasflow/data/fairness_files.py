"""A user's own tables for LangFair's classification and recommendation fairness metrics.

* :func:`read_predictions_table`: a classifier's predictions with group labels (``classification_fairness``):
  CSV / JSONL / Parquet with columns ``y_pred`` (0/1), ``group`` and, for every rate but the predicted prevalence,
  ``y_true`` (0/1); an ``id`` column names the rows (else ``row-<n>``, the data row counted from 1).
* :func:`read_recommendations_table`: recommendation lists (``recommendation_fairness``): columns ``prompt`` (what
  the list answers, LangFair's dict key: "TS"), ``group`` (the sensitive attribute value the prompt mentioned, or the
  neutral group) and ``recommendations`` (a list of strings; in a CSV a JSON array).

The name ``example`` reads the small example shipped with biasflow (``biasflow/resources/examples/``). Bad input
is an error naming the file, and the row (counted from the first data row) or column.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasflow.errors import DataFormatError

EXAMPLES = "biasflow.resources.examples"
EXAMPLE_FILES = {"classification": "classification_predictions.csv",
                 "recommendation": "recommendation_lists.jsonl"}


def resolve(path: str | Path, what: str) -> Path:
    """``path``, or the shipped example of ``what`` (``classification`` / ``recommendation``) for ``example``."""
    if str(path) == "example":
        return Path(str(resources.files(EXAMPLES).joinpath(EXAMPLE_FILES[what])))
    return Path(path).expanduser()


def read_table(path: str | Path, what: str) -> pd.DataFrame:
    """A CSV (``.csv``, ``.csv.gz``), JSON Lines (``.jsonl``, ``.ndjson``) or Parquet file, rows in order."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{what} {path}: no such file")
    name = path.name.lower()
    try:
        if name.endswith((".csv", ".csv.gz")):
            df = pd.read_csv(path, dtype=str, keep_default_na=False)
        elif name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
            df = pd.read_json(path, lines=True, dtype=False)
        elif name.endswith(".parquet"):
            df = pd.read_parquet(path)
        else:
            raise DataFormatError(f"{what} {path}: unknown format {path.suffix!r} (use .csv, .jsonl or .parquet)")
    except DataFormatError:
        raise
    except Exception as exc:  # a parser's own message, with the file named
        raise DataFormatError(f"{what} {path} could not be read: {exc}") from exc
    if df.empty:
        raise DataFormatError(f"{what} {path} has no rows")
    return df.reset_index(drop=True)


def _require(df: pd.DataFrame, columns: list[str], path: Path, what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataFormatError(f"{what} {path} has no column {', '.join(map(repr, missing))} "
                              f"(columns: {list(df.columns)})")


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


_BINARY = {"0": 0, "1": 1, "0.0": 0, "1.0": 1, "false": 0, "true": 1}


def _binary(df: pd.DataFrame, column: str, path: Path, what: str) -> np.ndarray:
    out = np.empty(len(df), dtype=np.int64)
    for i, value in enumerate(df[column].tolist()):
        key = str(value).strip().lower() if not isinstance(value, bool) else str(value).lower()
        if key not in _BINARY:
            raise DataFormatError(f"{what} {path}, row {i + 1}: {column}={value!r} is not 0 or 1 (positive = 1, "
                                  f"negative = 0; true/false are read as 1/0)")
        out[i] = _BINARY[key]
    return out


def _ids(df: pd.DataFrame, path: Path, what: str) -> list[str]:
    if "id" not in df.columns:
        return [f"row-{i + 1}" for i in range(len(df))]
    ids = [_text(v) for v in df["id"].tolist()]
    for i, v in enumerate(ids):
        if v is None:
            raise DataFormatError(f"{what} {path}, row {i + 1}: empty id")
    seen: dict[str, int] = {}
    for i, v in enumerate(ids):
        if v in seen:
            raise DataFormatError(f"{what} {path}, row {i + 1}: id {v!r} repeats row {seen[v] + 1}")
        seen[v] = i
    return ids


def read_predictions_table(path: str | Path, need_labels: bool = True) -> pd.DataFrame:
    """``item_id``, ``row`` (from 1), ``category`` (= ``group``), ``group``, ``y_pred`` and ``y_true`` (-1 where the
    file has no ``y_true`` column; ``need_labels``: the column is required)."""
    what = "predictions file"
    path = resolve(path, "classification")
    df = read_table(path, what)
    _require(df, ["y_pred", "group", *(["y_true"] if need_labels else [])], path, what)
    groups = [_text(v) for v in df["group"].tolist()]
    for i, g in enumerate(groups):
        if g is None:
            raise DataFormatError(f"{what} {path}, row {i + 1}: empty group")
    y_pred = _binary(df, "y_pred", path, what)
    y_true = _binary(df, "y_true", path, what) if "y_true" in df.columns else np.full(len(df), -1, dtype=np.int64)
    return pd.DataFrame({"item_id": _ids(df, path, what), "row": np.arange(1, len(df) + 1), "category": groups,
                         "group": groups, "y_true": y_true, "y_pred": y_pred})


def _as_list(value: Any, row: int, path: Path, what: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{what} {path}, row {row}: recommendations is not a JSON array of strings "
                                  f"({exc})") from None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise DataFormatError(f"{what} {path}, row {row}: recommendations must be a list of strings, got "
                              f"{type(value).__name__} {str(value)[:80]!r}")
    if not value:
        raise DataFormatError(f"{what} {path}, row {row}: empty recommendation list")
    return [str(v) for v in value]


def read_recommendations_table(path: str | Path) -> pd.DataFrame:
    """``row`` (from 1), ``prompt``, ``group``, ``recommendations`` (a list of strings), in file order; one row per
    (prompt, group)."""
    what = "recommendations file"
    path = resolve(path, "recommendation")
    df = read_table(path, what)
    _require(df, ["prompt", "group", "recommendations"], path, what)
    rows, seen = [], {}
    for i, rec in enumerate(df[["prompt", "group", "recommendations"]].itertuples(index=False), start=1):
        prompt, group = _text(rec.prompt), _text(rec.group)
        if prompt is None or group is None:
            raise DataFormatError(f"{what} {path}, row {i}: empty {'prompt' if prompt is None else 'group'}")
        if (prompt, group) in seen:
            raise DataFormatError(f"{what} {path}, row {i}: a second list for prompt {prompt!r} and group {group!r} "
                                  f"(first in row {seen[prompt, group]})")
        seen[prompt, group] = i
        rows.append({"row": i, "prompt": prompt, "group": group,
                     "recommendations": _as_list(rec.recommendations, i, path, what)})
    return pd.DataFrame(rows, columns=["row", "prompt", "group", "recommendations"])


@lru_cache(maxsize=16)
def checked(what: str, path: str, mtime_ns: int, size: int) -> None:
    """The file of ``what`` (``classification``: labels not required here, the metric's ``metric_type`` decides;
    ``recommendation``) reads without error; once per file version (``mtime_ns``, ``size``) in a process."""
    if what == "classification":
        read_predictions_table(path, need_labels=False)
    else:
        read_recommendations_table(path)
