"""Paired comparisons of models measured on the same items.

* ``paired_bootstrap``: the difference of an aggregate between models with a percentile CI, where each replicate
  resamples the items ONCE (with replacement, within each category as ``bootstrap_ci`` does) and recomputes the
  aggregate of every model on that same resample; the per-item correlation between models therefore narrows the
  interval of the difference, which two independent CIs cannot show.
* ``mcnemar_exact``: the exact McNemar test for a per-item binary outcome of two models: under H0 the discordant
  items split 50/50, so the two-sided p-value is the binomial test of b successes in b + c trials.
* ``holm``: Holm's step-down adjustment of the p-values of a family of comparisons (statsmodels ``multipletests``).
"""
from __future__ import annotations

from itertools import combinations
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from biasflow.stats.bootstrap import ReplicateValues, Resamples


def binary_outcome(column: str, where: Callable[[pd.DataFrame], pd.Series] | None = None
                   ) -> Callable[[pd.DataFrame], pd.Series]:
    """A metric's per-item binary outcome (``MetricSpec.binary_outcomes``): ``column`` as bool by ``item_id``, on
    the rows ``where`` selects (e.g. one variant's), for McNemar's test between two models' per-item tables."""
    def outcome(per_item: pd.DataFrame) -> pd.Series:
        df = per_item[where(per_item)] if where is not None else per_item
        return df.drop_duplicates("item_id").set_index("item_id")[column].astype(bool)
    return outcome

Aggregate = Callable[[pd.DataFrame], pd.DataFrame]
Statistic = Callable[[pd.DataFrame, Resamples], ReplicateValues | None]


def mcnemar_exact(outcome_a: Sequence[int | bool], outcome_b: Sequence[int | bool]) -> dict[str, float]:
    """Exact two-sided McNemar test of paired binary outcomes (same items, same order).

    Returns n (items), b (A=1, B=0), c (A=0, B=1) and p_value (1.0 when no item is discordant)."""
    from scipy.stats import binomtest

    a = np.asarray(outcome_a, dtype=bool)
    b_ = np.asarray(outcome_b, dtype=bool)
    if a.shape != b_.shape:
        raise ValueError(f"McNemar needs paired outcomes: {a.shape} vs {b_.shape}")
    b = int(np.sum(a & ~b_))
    c = int(np.sum(~a & b_))
    p = binomtest(b, b + c, 0.5, alternative="two-sided").pvalue if b + c else 1.0
    return {"n": int(a.size), "b": b, "c": c, "p_value": float(p)}


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-adjusted p-values (NaN entries stay NaN and are not counted in the family)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


def bootstrap_p_value(replicates: np.ndarray) -> float:
    """Two-sided bootstrap p-value of "difference = 0": twice the smaller tail of the replicates at 0 (replicates
    exactly 0, common for rates of few items, count half to each tail), with the +1 correction so a finite number
    of replicates never gives 0."""
    r = np.asarray(replicates, dtype=float)
    r = r[~np.isnan(r)]
    if r.size == 0:
        return float("nan")
    zero = 0.5 * np.sum(r == 0)
    below = (np.sum(r < 0) + zero + 1) / (r.size + 1)
    above = (np.sum(r > 0) + zero + 1) / (r.size + 1)
    return float(min(1.0, 2 * min(below, above)))


def _values(agg: pd.DataFrame, metrics: Sequence[str], category: str) -> np.ndarray:
    v = agg[agg["category"] == category].drop_duplicates("metric").set_index("metric")["value"]
    return np.array([float(v.get(m, np.nan)) for m in metrics])


def _model_resamples(table: pd.DataFrame, order: Sequence[Any], picked: np.ndarray, strata: dict[Any, slice],
                     item_stratum: Mapping[Any, Any]) -> Resamples:
    """The shared draws (``picked``: (n_boot, n_drawn) positions into ``order``, the common item ids, stratum by
    stratum) as one model's ``Resamples``: the same items in the same order, as positions into that model's own
    table, so its ``bootstrap_statistic`` sees exactly the resampled tables the generic path builds."""
    row_item, item_ids = pd.factorize(table["item_id"])
    position = pd.Series(np.arange(len(item_ids)), index=item_ids).loc[list(order)].to_numpy()
    count = np.bincount(row_item, minlength=len(item_ids))
    stratum = np.array([item_stratum.get(i) for i in item_ids], dtype=object)
    return Resamples(item_ids=np.asarray(item_ids), row_item=row_item, index=position[picked], strata=dict(strata),
                     item_stratum=stratum, _row_order=np.argsort(row_item, kind="stable"),
                     _row_start=np.cumsum(count) - count, _row_count=count)


def _same_rows(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two per-item tables list the same items in the same rows (their Resamples are the same)."""
    return len(a) == len(b) and bool(np.array_equal(a["item_id"].to_numpy(), b["item_id"].to_numpy()))


def paired_bootstrap(per_item: Mapping[str, pd.DataFrame], aggregate: Mapping[str, Aggregate],
                     metrics: Sequence[str], n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                     strata: str = "category", category: str = "overall",
                     statistic: Mapping[str, Statistic | None] | None = None,
                     pairs: Sequence[tuple[str, str, str]] | None = None) -> pd.DataFrame:
    """Differences ``value(model_a) - value(model_b)`` of ``metrics`` (rows of ``category``) for every pair of the
    models in ``per_item`` (a per-item table per model; a model's ``aggregate`` maps its per-item rows to rows
    ``metric, category, value``), or for the ``(model_a, model_b, metric)`` of ``pairs`` only, in their order (a
    design that tests fewer pairs: only the models in a pair are computed; every model's items still decide the
    common items and the draws, so a pair's numbers do not depend on the design).

    Only items every model has are used (``n_items``); rows sharing an ``item_id`` (several variants of one item)
    are resampled together. Returns one row per (model_a, model_b, metric): value_a, value_b, diff, ci_low,
    ci_high, p_boot (``bootstrap_p_value``), n_items, n_boot.

    ``statistic`` (per model, optional): the metric's ``bootstrap_statistic`` bound to that model's options,
    ``(per_item, Resamples) -> {(metric, category): values}``; it computes every replicate at once from the shared
    draws, the same numbers as ``aggregate`` on each resampled table (where it declines, returning None, that
    model's replicates take the generic path)."""
    columns = ["model_a", "model_b", "metric", "value_a", "value_b", "diff", "ci_low", "ci_high", "p_boot",
               "n_items", "n_boot"]
    models = list(per_item)
    common = set.intersection(*(set(df["item_id"]) for df in per_item.values())) if models else set()
    if not common:
        return pd.DataFrame(columns=columns)
    first = per_item[models[0]]
    order = [i for i in pd.unique(first["item_id"]) if i in common]
    if pairs is None:
        pairs = [(a, b, metric) for a, b in combinations(models, 2) for metric in metrics]
    involved = {m for a, b, _ in pairs for m in (a, b)}
    compared = [m for m in models if m in involved]
    tables = {m: per_item[m] if len(per_item[m]["item_id"].unique()) == len(common)
              else per_item[m][per_item[m]["item_id"].isin(common)] for m in compared}
    point = {m: _values(aggregate[m](tables[m]), metrics, category) for m in compared}
    reps = {m: np.full((max(n_boot, 0), len(metrics)), np.nan) for m in compared}
    if n_boot > 0:
        first_rows = first.drop_duplicates("item_id").set_index("item_id")[strata]
        strata_of = first_rows.astype(str)  # NaN: a stratum too
        # positions into ``order`` of each stratum's items (strata in sorted order, items in ``order``)
        groups = [np.asarray(pos) for _, pos in pd.Series(np.arange(len(order))).groupby(
            strata_of.loc[order].values, sort=True)]
        # the draws, replicate by replicate and stratum by stratum: the one seeded stream every path shares
        rng = np.random.default_rng(seed)
        picked = np.empty((n_boot, len(order)), dtype=np.int64)
        for b in range(n_boot):
            picked[b] = np.concatenate([pos[rng.integers(0, len(pos), size=len(pos))] for pos in groups])
        spans, start = {}, 0
        for pos in groups:
            label = first_rows.loc[order[pos[0]]]  # the stratum's own label (not its text)
            spans[label if not pd.isna(label) else str(label)] = slice(start, start + len(pos))
            start += len(pos)
        item_stratum = first_rows.loc[order].to_dict()
        shared: tuple[pd.DataFrame, Resamples] | None = None
        for m in compared:
            fast = (statistic or {}).get(m)
            if fast:  # models whose tables list the same items in the same rows share one Resamples (and its counts)
                if shared is None or not _same_rows(shared[0], tables[m]):
                    shared = (tables[m], _model_resamples(tables[m], order, picked, spans, item_stratum))
                values = fast(tables[m], shared[1])
            else:
                values = None
            if values is not None:
                for j, metric in enumerate(metrics):
                    if (metric, category) in values:
                        reps[m][:, j] = np.asarray(values[(metric, category)], dtype=np.float64)
                continue
            rows_of = tables[m].groupby("item_id", sort=False).indices
            rows_at = [rows_of[i] for i in order]
            for b in range(n_boot):  # the same resampled items for every model
                rows = np.concatenate([rows_at[p] for p in picked[b]])
                reps[m][b] = _values(aggregate[m](tables[m].iloc[rows]), metrics, category)
    alpha = (1.0 - level) / 2.0
    column = {metric: j for j, metric in enumerate(metrics)}
    out = []
    for a, b, metric in pairs:
        j = column[metric]
        d = reps[a][:, j] - reps[b][:, j]
        d = d[~np.isnan(d)]
        lo, hi = (np.quantile(d, alpha), np.quantile(d, 1 - alpha)) if d.size else (np.nan, np.nan)
        out.append({"model_a": a, "model_b": b, "metric": metric, "value_a": point[a][j],
                    "value_b": point[b][j], "diff": point[a][j] - point[b][j], "ci_low": float(lo),
                    "ci_high": float(hi), "p_boot": bootstrap_p_value(d) if d.size else np.nan,
                    "n_items": len(order), "n_boot": int(d.size)})
    return pd.DataFrame(out, columns=columns)
