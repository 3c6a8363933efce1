"""Category order and labels for tables and plots.

Order is natural (``weat2`` before ``weat10``, ``overall`` first). Labels explain themselves: a category that names a
template (CBS, LPBS: ``t0``) shows the template text, a WEAT test shows its word sets; everything else keeps its name.
The labels come from the per-item table, so a user's own templates or word lists are labelled the same way.
"""
from __future__ import annotations

import re
from typing import Iterable

import pandas as pd

OVERALL = "overall"
_DIGITS = re.compile(r"(\d+)")


def natural_key(text: object) -> tuple:
    """Sort key: ``overall`` first, then digit runs compared as numbers (weat1, weat2, ..., weat10)."""
    s = str(text)
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p.lower()) for p in _DIGITS.split(s) if p != "")
    return (s != OVERALL, parts)


def natural_sorted(values: Iterable[object]) -> list:
    return sorted(values, key=natural_key)


def sort_by_category(df: pd.DataFrame, column: str = "category", then: Iterable[str] = ()) -> pd.DataFrame:
    """``df`` in natural category order (a stable sort: rows of one category keep their order)."""
    if df.empty:
        return df
    rank = {c: i for i, c in enumerate(natural_sorted(df[column].unique()))}
    order = df[column].map(rank)
    return df.assign(_order=order).sort_values(["_order", *then], kind="stable").drop(columns="_order")


def _one(values: pd.Series) -> str | None:
    v = values.dropna().astype(str).unique()
    return v[0] if len(v) == 1 else None


def category_labels(per_item: pd.DataFrame) -> dict[str, str]:
    """``{category: label}`` for the categories of one metric's per-item table (label = category when nothing
    better is known)."""
    labels: dict[str, str] = {}
    if per_item.empty or "category" not in per_item:
        return labels
    for category, df in per_item.groupby("category", sort=False):
        label = str(category)
        if "template" in df and "variant" not in df:  # CBS / LPBS: one template per category
            text = _one(df["template"])
            if text:
                label = f"{category}: {text}"
        elif {"set", "set_category"} <= set(df.columns):  # WEAT: the four word sets of the test
            sets = df.drop_duplicates("set").set_index("set")["set_category"].astype(str)
            if {"targ1", "targ2", "attr1", "attr2"} <= set(sets.index):
                label = (f"{category}: {sets['targ1']} vs {sets['targ2']}, "
                         f"{sets['attr1']} vs {sets['attr2']}")
        labels[str(category)] = label
    return labels


def label(category: object, labels: dict[str, str]) -> str:
    return labels.get(str(category), str(category))
