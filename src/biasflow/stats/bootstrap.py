"""Seeded bootstrap confidence intervals for any aggregate of per-item results.

Items are resampled with replacement within each category (stratified), so every category keeps its size and the
overall value is computed from the same resample. The interval is the percentile interval of the replicates.

The draws are made once, as a matrix (:class:`Resamples`), from one seeded stream in a fixed order: replicate by
replicate, stratum by stratum (strata sorted), ``rng.integers(0, size, size=size)`` per stratum. That is the stream
biasflow has always used, so seeded intervals did not change when the matrix came in. The replicates are then
evaluated one of two ways, which give the same numbers:

* generic: the metric's own ``aggregate`` on each resampled table (every metric supports it; a pandas aggregate of a
  few ms costs seconds per 1,000 replicates);
* arrays: a metric's ``MetricSpec.bootstrap_statistic`` computes every replicate at once from the resamples
  (``counts`` times per-item flags for counts and rates, ``ordered_sums`` for float means); ``tests/test_bootstrap.py``
  checks it against the generic path value for value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

# (metric, category) -> one value per replicate (NaN where the aggregate has no such row)
ReplicateValues = Mapping[tuple[str, str], np.ndarray]


@dataclass(frozen=True)
class Resamples:
    """``n_boot`` stratified resamples of the items of a per-item table.

    ``index[b]`` lists the items replicate ``b`` drew (positions into ``item_ids``), stratum by stratum in sorted
    stratum order, each stratum's items in the order drawn: the generic path's resampled table is the rows of those
    items in that order (an item's rows in table order), see :meth:`rows`."""

    item_ids: np.ndarray  # unique item ids, in order of first appearance in the table
    row_item: np.ndarray  # (n_rows,) position in item_ids of each row of the table
    index: np.ndarray  # (n_boot, n_drawn) positions in item_ids drawn by each replicate
    strata: dict[Any, slice]  # stratum label -> the columns of index holding its draws
    item_stratum: np.ndarray  # (n_items,) stratum label of each item (None: in no stratum, never drawn)
    _row_order: np.ndarray = field(repr=False)  # rows sorted by item (stable)
    _row_start: np.ndarray = field(repr=False)  # first position in _row_order of each item's rows
    _row_count: np.ndarray = field(repr=False)  # number of rows of each item

    @property
    def n_boot(self) -> int:
        return self.index.shape[0]

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def one_row_per_item(self) -> bool:
        return bool((self._row_count == 1).all())

    def rows(self, b: int) -> np.ndarray:
        """Row positions of replicate ``b``'s resampled table."""
        drawn = self.index[b]
        if self.one_row_per_item:
            return self._row_order[self._row_start[drawn]]
        lengths = self._row_count[drawn]
        starts = np.repeat(self._row_start[drawn], lengths)
        offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return self._row_order[starts + offsets]

    @cached_property
    def _draws_by_item(self) -> np.ndarray:
        """(n_items, n_boot), contiguous by item: how many times each replicate drew each item (float64)."""
        flat = (self.index * self.n_boot + np.arange(self.n_boot)[:, None]).ravel()
        return np.bincount(flat, minlength=self.n_items * self.n_boot).reshape(self.n_items, self.n_boot) \
            .astype(np.float64)

    @property
    def counts(self) -> np.ndarray:
        """(n_boot, n_items): how many times each replicate drew each item (float64, for BLAS products; a view of
        the counts stored item by item, which a sparse product reads fastest)."""
        return self._draws_by_item.T

    def first_values(self, column: pd.Series | np.ndarray) -> np.ndarray:
        """Per item, the value of ``column`` (one entry per table row) on the item's first row."""
        return np.asarray(column)[self._row_order[self._row_start]]

    def item_values(self, column: pd.Series | np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Per item (float), the value of ``column`` on its one row among ``rows`` (a boolean mask over the table's
        rows; all rows if None); 0 for items with no such row."""
        values = np.asarray(column, dtype=np.float64)
        sel = np.ones(len(values), bool) if rows is None else np.asarray(rows, bool)
        pos = self.row_item[sel]
        if len(np.unique(pos)) != len(pos):
            raise ValueError("an item has several rows in the selection: select one row per item")
        out = np.zeros(self.n_items)
        out[pos] = values[sel]
        return out

    def totals(self, per_item: np.ndarray) -> np.ndarray:
        """Sum over each replicate's draws of per-item values: (n_items,) -> (n_boot,), (n_items, k) -> (n_boot, k).

        Exactly the sum of the resampled rows (in any order) when the values are integers or halves (counts, 0/1
        flags, 0/0.5/1 scores): every product and partial sum is then exact in float64. Other floats: ordered_sums."""
        values = np.asarray(per_item, dtype=np.float64)
        if values.ndim == 2 and 4 * np.count_nonzero(values) < values.size:
            # values spread over groups (mostly zeros, as totals_by and the metrics lay them out): a sparse product
            # does a few times fewer operations, with the same exact sums
            import scipy.sparse

            return np.ascontiguousarray((scipy.sparse.csr_array(values.T) @ self._draws_by_item).T)
        return self.counts @ values

    def totals_by(self, groups: np.ndarray, n_groups: int, *per_item: np.ndarray) -> list[np.ndarray]:
        """Per replicate and group (``groups``: a code in 0..n_groups-1 per item), the number of draws and, for each
        ``per_item`` array, the sum of its values over the draws: a list of (n_boot, n_groups) arrays. Exact like
        ``totals``, for integer values: one product of the draw counts with the values spread over their groups
        (every product and partial sum an integer below 2**53, so the order of the additions cannot matter)."""
        groups = np.asarray(groups)
        columns = [np.ones(self.n_items), *(np.asarray(v, dtype=np.float64) for v in per_item)]
        spread = np.zeros((self.n_items, len(columns) * n_groups))
        for j, values in enumerate(columns):  # column j * n_groups + g: values of the items of group g
            spread[np.arange(self.n_items), j * n_groups + groups] = values
        product = self.totals(spread)
        return [product[:, j * n_groups:(j + 1) * n_groups] for j in range(len(columns))]

    def ordered_sums(self, per_item: np.ndarray, stratum: Any = None) -> np.ndarray:
        """(n_boot,) sums of per-item float values over each replicate's draws (of one stratum, or all), added in
        draw order: bit for bit what pandas' ``sum``/``mean`` gives on the resampled table's rows (numpy's pairwise
        summation of a row is that of the same 1-D array)."""
        cols = self.strata[stratum] if stratum is not None else slice(None)
        gathered = np.asarray(per_item, dtype=np.float64)[self.index[:, cols]]
        return gathered.sum(axis=1)


def draw_resamples(per_item: pd.DataFrame, n_boot: int, seed: int = 0, strata: str = "category") -> Resamples:
    """The replicates' draws: items resampled with replacement within each ``strata`` value, seeded."""
    row_item, item_ids = pd.factorize(per_item["item_id"])
    first_rows = per_item.drop_duplicates("item_id")
    groups = first_rows.assign(_pos=np.arange(len(first_rows))).groupby(strata, sort=True)["_pos"]
    labels, members = zip(*[(k, g.to_numpy()) for k, g in groups]) if len(first_rows) else ((), ())
    item_stratum = np.full(len(item_ids), None, dtype=object)
    strata_cols: dict[Any, slice] = {}
    start = 0
    for label, pos in zip(labels, members):
        item_stratum[pos] = label
        strata_cols[label] = slice(start, start + len(pos))
        start += len(pos)
    rng = np.random.default_rng(seed)
    index = np.empty((n_boot, start), dtype=np.int64)
    for b in range(n_boot):
        for label, pos in zip(labels, members):
            index[b, strata_cols[label]] = pos[rng.integers(0, len(pos), size=len(pos))]
    order = np.argsort(row_item, kind="stable")
    count = np.bincount(row_item, minlength=len(item_ids))
    return Resamples(item_ids=np.asarray(item_ids), row_item=row_item, index=index, strata=strata_cols,
                     item_stratum=item_stratum, _row_order=order, _row_start=np.cumsum(count) - count,
                     _row_count=count)


def generic_replicates(per_item: pd.DataFrame, aggregate: Callable[[pd.DataFrame], pd.DataFrame],
                       resamples: Resamples) -> pd.DataFrame:
    """Long table (metric, category, value, replicate): ``aggregate`` run on every resampled table."""
    frames = []
    for b in range(resamples.n_boot):
        agg = aggregate(per_item.iloc[resamples.rows(b)])[["metric", "category", "value"]]
        frames.append(agg.assign(replicate=b))
    return pd.concat(frames, ignore_index=True)


def replicate_frame(values: ReplicateValues) -> pd.DataFrame:
    """The long table of :func:`generic_replicates` from a ``bootstrap_statistic``'s arrays."""
    if not values:
        return pd.DataFrame(columns=["metric", "category", "value", "replicate"])
    keys = list(values)
    arrays = [np.asarray(values[k], dtype=np.float64) for k in keys]
    sizes = [len(a) for a in arrays]
    return pd.DataFrame({"metric": np.repeat([k[0] for k in keys], sizes),
                         "category": np.repeat([k[1] for k in keys], sizes),
                         "value": np.concatenate(arrays), "replicate": np.concatenate([np.arange(n) for n in sizes])})


def bootstrap_ci(per_item: pd.DataFrame, aggregate: Callable[[pd.DataFrame], pd.DataFrame], n_boot: int = 1000,
                 seed: int = 0, level: float = 0.95, strata: str = "category",
                 statistic: Callable[[pd.DataFrame, Resamples], ReplicateValues | None] | None = None
                 ) -> pd.DataFrame:
    """``aggregate(per_item)`` with ``ci_low``/``ci_high`` columns added (NaN where undefined or n_boot=0).

    ``statistic(per_item, resamples)``, if given, computes every replicate's values at once (a metric's
    ``bootstrap_statistic``); it returns None when it cannot, and the generic path runs instead."""
    point = aggregate(per_item).copy()
    point["ci_low"] = np.nan
    point["ci_high"] = np.nan
    if n_boot <= 0 or per_item.empty or point.empty:
        return point
    resamples = draw_resamples(per_item, n_boot, seed, strata)
    values = statistic(per_item, resamples) if statistic is not None else None
    reps = replicate_frame(values) if values is not None else generic_replicates(per_item, aggregate, resamples)
    alpha = (1.0 - level) / 2.0
    grouped = reps.dropna(subset=["value"]).groupby(["metric", "category"])["value"]
    bounds = pd.DataFrame({"ci_low": grouped.quantile(alpha), "ci_high": grouped.quantile(1 - alpha)}).reset_index()
    point = point.drop(columns=["ci_low", "ci_high"]).merge(bounds, on=["metric", "category"], how="left")
    return point


def rate(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """100 x numerator / denominator, NaN where the denominator is 0 (the metrics' ``ratio``, elementwise)."""
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator != 0, 100.0 * numerator / np.where(denominator != 0, denominator, 1.0), np.nan)
