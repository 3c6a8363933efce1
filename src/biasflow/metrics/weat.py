"""WEAT: the Word Embedding Association Test (Caliskan et al. 2017), as SEAT's reference code (sent-bias) runs it.

For target sets X, Y and attribute sets A, B of vectors:

* ``s(w, A, B) = mean_a cos(w, a) - mean_b cos(w, b)`` for every target w;
* effect size ``d = (mean_X s - mean_Y s) / std_{X u Y} s`` with ``ddof`` 1 (sent-bias; ``ddof: 0`` is the
  population standard deviation);
* one-sided permutation p-value ``P[s(X_i, Y_i) >= s(X, Y)]`` over the partitions (X_i, Y_i) of X u Y with
  |X_i| = |X|. Since sum_{X_i} s + sum_{Y_i} s is the same for every partition, comparing ``sum_{X_i} s`` is
  equivalent (sent-bias does the same). Exact over all C(|X|+|Y|, |X|) partitions when there are at most
  ``exact_limit`` of them, else ``n_samples`` seeded random partitions. sent-bias counts ties as exceeding the
  observed value (conservative) and, when sampling, counts the observed partition once among the samples
  (p = (1 + hits in n_samples - 1 draws) / n_samples); ``ties: exclude`` gives the strict ``>`` of the paper.

The pipeline side: ``requests`` asks a ``word_vectors`` model for every word's vector (``WordVector``), ``compute``
reads the answers, applies the OOV policy and the balancing of target sets and returns one row per word
(``value`` = s(w, A, B) for the targets kept), ``aggregate`` computes the effect size and p-value per test (plus
the average |d| per bias type, as bias-bench).
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from math import comb
from typing import Any, Literal, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from biasflow.errors import ConfigError, DataFormatError
from biasflow.schema import MetricBase, PositiveInt
from biasflow.registry import MetricSpec, register_metric
from biasflow.interface.requests import WordVector
from biasflow.stats.bootstrap import Resamples

log = logging.getLogger(__name__)


class Association(MetricBase):
    """The options of ``metric.weat`` and ``metric.seat`` (metrics/seat.py): the permutation test's."""

    pooling: Optional[Literal["mean", "cls", "first", "sbert_mean"]] = None
    ddof: Literal[0, 1] = 1
    exact_limit: PositiveInt = 100000
    n_samples: PositiveInt = 100000
    seed: int = 0
    ties: Literal["count", "exclude"] = "count"
    oov: Literal["drop", "error"] = "drop"
    balance: Literal["truncate", "none", "drop_last"] = "truncate"
    balance_seed: int = 1111
    tests: Optional[list[str]] = None
    bias_types: Optional[dict[str, list[str]]] = None


TARGET_SETS = ("targ1", "targ2")
ATTRIBUTE_SETS = ("attr1", "attr2")
SETS = TARGET_SETS + ATTRIBUTE_SETS

DEFAULTS: dict[str, Any] = {
    "ddof": 1,  # sent-bias: sample standard deviation
    "exact_limit": 100_000,  # exact permutation test up to this many partitions
    "n_samples": 100_000,  # partitions drawn above the limit
    "seed": 0,
    "ties": "count",  # count | exclude
    "oov": "drop",  # drop | error
    "balance": "truncate",  # truncate | drop_last | none: equal-size target sets after dropping (BALANCE_MODES)
    "balance_seed": 1111,  # sent-bias's default seed
    "tests": None,  # None = every test of the items table
}

# what the headline numbers mean (the report prints them beside the tables of ``weat`` and ``seat``)
# 0 = no association; the p-value is shown, not ranked
GOALS = {"effect_size": 0.0, "avg_abs_effect_size": 0.0, "p_value": None}
MEANINGS = {
    "effect_size": "per test: effect size d = (mean s of target set X - mean s of Y) / pooled std, s = mean cos to "
                   "attribute set A - to B; 0 = none, + = X leans to A",
    "p_value": "per test: one-sided permutation test p-value of the effect (X more associated with A than Y is); "
               "not a bias score",
    "avg_abs_effect_size": "mean |d| over the tests run (per bias type: over its tests); 0 = no association, "
                           "larger = stronger",
    "p_value_exact": "per test: 1 when p_value is exact (every partition, n_partitions <= exact_limit), 0 when "
                     "estimated from n_samples random partitions; a diagnostic, not a bias score",
    "n_partitions": "per test: C(|X|+|Y|, |X|), the ways to split the target words into sets of X's and Y's sizes "
                    "(the permutation test's population); a count, not a bias score",
    "n_permutations": "per test: partitions the permutation test evaluated (all of them when exact, else n_samples); "
                      "a count, not a bias score",
    "n_dropped_oov": "per test: words of its four sets without a vector, left out (oov: drop); a count, not a bias "
                     "score; 0 = every word used",
}

# Chunk sizes bound the memory of the vectorised permutation test (rows x set size integers).
_EXACT_CHUNK = 200_000
_SAMPLE_CHUNK_ELEMS = 4_000_000


def option(cfg: Association | None, name: str) -> Any:
    value = None if cfg is None else getattr(cfg, name)
    return DEFAULTS[name] if value is None else value


# --------------------------------------------------------------------------------------------------- the statistic
def _unit_rows(m: np.ndarray, what: str) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] == 0:
        raise ValueError(f"{what}: need a non-empty 2-d array of vectors, got shape {m.shape}")
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError(f"{what}: a zero vector has no cosine similarity")
    return m / norms


def association(targets: np.ndarray, attr_a: np.ndarray, attr_b: np.ndarray) -> np.ndarray:
    """s(w, A, B) for every row w of ``targets``."""
    t = _unit_rows(targets, "targets")
    a = _unit_rows(attr_a, "attribute set A")
    b = _unit_rows(attr_b, "attribute set B")
    return (t @ a.T).mean(axis=1) - (t @ b.T).mean(axis=1)


def effect_size(s_x: np.ndarray, s_y: np.ndarray, ddof: int = 1) -> float:
    s_x = np.asarray(s_x, dtype=np.float64)
    s_y = np.asarray(s_y, dtype=np.float64)
    if len(s_x) == 0 or len(s_y) == 0:
        return float("nan")
    pooled = np.concatenate([s_x, s_y])
    if len(pooled) <= ddof:
        return float("nan")
    return float((s_x.mean() - s_y.mean()) / pooled.std(ddof=ddof))


@dataclass(frozen=True)
class PermutationResult:
    p_value: float
    method: str  # "exact" | "sampled"
    n_partitions: int  # C(|X|+|Y|, |X|)
    n_samples: int  # partitions evaluated (all of them when exact)
    n_ties: int  # partitions whose statistic equals the observed one (counted only when ties == "count")


def _tie_tolerance(s: np.ndarray) -> float:
    # Sums taken in different orders differ in the last bits; treat those as equal, as sent-bias's exact floats did.
    return 1e-12 * max(1.0, float(np.abs(s).sum()))


def _count(stats: np.ndarray, observed: float, tol: float) -> tuple[int, int]:
    greater = int(np.count_nonzero(stats > observed + tol))
    ties = int(np.count_nonzero(np.abs(stats - observed) <= tol))
    return greater, ties


def _partition_sums_exact(s: np.ndarray, size: int):
    """Yield chunks of sum_{X_i} s over every size-``size`` subset X_i, in itertools.combinations order."""
    n = len(s)
    combos = itertools.combinations(range(n), size)
    total = comb(n, size)
    dtype = np.dtype((np.intp, size))
    done = 0
    while done < total:
        rows = min(_EXACT_CHUNK, total - done)
        idx = np.fromiter(combos, dtype=dtype, count=rows).reshape(rows, size)
        yield s[idx].sum(axis=1)
        done += rows


def permutation_p_value(s_x: Sequence[float], s_y: Sequence[float], *, exact_limit: int = 100_000,
                        n_samples: int = 100_000, seed: int = 0, ties: str = "count") -> PermutationResult:
    """One-sided permutation p-value of sum_X s - sum_Y s (see the module docstring)."""
    if ties not in ("count", "exclude"):
        raise ConfigError(f"ties={ties!r}: use 'count' (sent-bias) or 'exclude' (strict >)")
    s_x = np.asarray(s_x, dtype=np.float64)
    s_y = np.asarray(s_y, dtype=np.float64)
    nx, ny = len(s_x), len(s_y)
    if nx == 0 or ny == 0:
        return PermutationResult(float("nan"), "none", 0, 0, 0)
    s = np.concatenate([s_x, s_y])
    n_partitions = comb(nx + ny, nx)
    tol = _tie_tolerance(s)
    if n_partitions <= exact_limit:
        chunks = _partition_sums_exact(s, nx)
        first = next(chunks)
        observed = first[0]  # combinations start with (0, ..., nx-1): X itself, summed the same way as the rest
        greater, equal = _count(first, observed, tol)
        for chunk in chunks:
            g, e = _count(chunk, observed, tol)
            greater += g
            equal += e
        hits = greater + (equal if ties == "count" else 0)
        return PermutationResult(hits / n_partitions, "exact", n_partitions, n_partitions, equal)
    if n_samples < 2:
        raise ConfigError(f"n_samples={n_samples}: need at least 2 sampled partitions")
    rng = np.random.default_rng(seed)
    observed = s[:nx].sum()
    # sent-bias: the observed partition is one of the n_samples (a hit), then n_samples - 1 random partitions.
    greater, equal = 0, 1
    remaining = n_samples - 1
    rows_per_chunk = max(1, _SAMPLE_CHUNK_ELEMS // len(s))
    while remaining > 0:
        rows = min(rows_per_chunk, remaining)
        # The nx smallest of iid uniforms index a uniformly random size-nx subset.
        idx = np.argpartition(rng.random((rows, len(s))), nx - 1, axis=1)[:, :nx]
        g, e = _count(s[idx].sum(axis=1), observed, tol)
        greater += g
        equal += e
        remaining -= rows
    hits = greater + equal if ties == "count" else greater + 1
    return PermutationResult(hits / n_samples, "sampled", n_partitions, n_samples, equal)


@dataclass(frozen=True)
class WeatResult:
    effect_size: float
    p_value: float
    permutation: PermutationResult
    s_x: np.ndarray
    s_y: np.ndarray
    ddof: int


def weat(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray, *, ddof: int = 1, exact_limit: int = 100_000,
         n_samples: int = 100_000, seed: int = 0, ties: str = "count") -> WeatResult:
    """Effect size and permutation p-value of one WEAT from the four sets of vectors (rows)."""
    s_x = association(x, a, b)
    s_y = association(y, a, b)
    perm = permutation_p_value(s_x, s_y, exact_limit=exact_limit, n_samples=n_samples, seed=seed, ties=ties)
    return WeatResult(effect_size(s_x, s_y, ddof), perm.p_value, perm, s_x, s_y, ddof)


# ------------------------------------------------------------------------------------------ OOV and balancing
BALANCE_MODES = {
    "truncate": "a seeded random subset of the longer target set, list order kept (sent-bias's truncate_lists)",
    "drop_last": "the first words of the longer target set, in list order (its last words are dropped)",
    "none": "keep both sets as they are (permutations over unequal partitions)",
}


def balance_indices(n_x: int, n_y: int, seed: int, mode: str = "truncate") -> tuple[np.ndarray, np.ndarray]:
    """Positions kept in each target set so both have min(n_x, n_y) members (``mode``: see BALANCE_MODES).

    ``truncate`` is sent-bias's ``truncate_lists`` (unseeded there, seeded here); ``drop_last`` keeps list order's
    first min(n_x, n_y) words.
    """
    rng = np.random.default_rng(seed)
    keep = min(n_x, n_y)

    def pick(n: int) -> np.ndarray:
        if n == keep or mode == "drop_last":
            return np.arange(keep)
        return np.sort(rng.choice(n, size=keep, replace=False))

    return pick(n_x), pick(n_y)


def select_units(units: pd.DataFrame, cfg: Association | None) -> pd.DataFrame:
    """Apply the OOV policy and target balancing to one test's units; adds a ``status`` column.

    ``units`` has one row per word (or sentence) with columns ``test``, ``set``, ``position``, ``text``,
    ``found`` (bool). status: ``used`` | ``oov`` (no vector: dropped) | ``balanced_out`` (dropped to equalise
    the target sets).
    """
    oov = option(cfg, "oov")
    balance = option(cfg, "balance")
    if oov not in ("drop", "error"):
        raise ConfigError(f"metric option oov={oov!r}: use 'drop' or 'error'")
    if balance not in BALANCE_MODES:
        raise ConfigError(f"metric option balance={balance!r}: use one of {', '.join(BALANCE_MODES)}")
    units = units.sort_values(["set", "position"]).reset_index(drop=True)
    units["status"] = np.where(units["found"].astype(bool), "used", "oov")
    missing = units[units["status"] == "oov"]
    if len(missing) and oov == "error":
        listing = "; ".join(f"{t}/{s}: {', '.join(g['text'])}" for (t, s), g in missing.groupby(["test", "set"]))
        raise DataFormatError(f"words without a vector (metric option oov=error; use oov=drop to drop them): "
                              f"{listing}")
    for name in SETS:
        if not ((units["set"] == name) & (units["status"] == "used")).any():
            test = units["test"].iloc[0] if len(units) else "?"
            raise DataFormatError(f"test {test}: set {name} has no word with a vector; cannot run the test")
    if balance != "none":
        used_x = units.index[(units["set"] == "targ1") & (units["status"] == "used")]
        used_y = units.index[(units["set"] == "targ2") & (units["status"] == "used")]
        if len(used_x) != len(used_y):
            keep_x, keep_y = balance_indices(len(used_x), len(used_y), int(option(cfg, "balance_seed")), balance)
            dropped = used_x.difference(used_x[keep_x]).union(used_y.difference(used_y[keep_y]))
            units.loc[dropped, "status"] = "balanced_out"
    return units


# ------------------------------------------------------------------------------------------ bias types
@lru_cache(maxsize=1)
def bias_type_map() -> dict[str, dict[str, list[str]]]:
    """``{"bias_bench": {type: [tests]}, "extra": {...}}`` from ``resources/seat/bias_types.yaml``."""
    import yaml

    text = resources.files("biasflow").joinpath("resources/seat/bias_types.yaml").read_text()
    data = yaml.safe_load(text)
    return {group: {k: list(v) for k, v in (data.get(group) or {}).items()} for group in ("bias_bench", "extra")}


def test_bias_types(cfg: Association | None) -> dict[str, list[str]]:
    mapping = cfg.bias_types if cfg else None
    if mapping:
        return {str(k): list(v) for k, v in dict(mapping).items()}
    groups = bias_type_map()
    return {**groups["bias_bench"], **groups["extra"]}


# ------------------------------------------------------------------------------------------ pipeline
def _units_from_answers(items: pd.DataFrame, answers: pd.DataFrame) -> pd.DataFrame:
    """One row per word item: its vector, whether the model has one, and the form it looked up (``text``)."""
    from biasflow.scoring.answer import lookup

    asked = [WordVector(str(w)) for w in items["word"]]
    units = items[["item_id", "test", "set", "position", "word"]].reset_index(drop=True)
    return units.assign(text=lookup(answers, asked, "looked_up"), found=lookup(answers, asked, "found"),
                        vector=lookup(answers, asked, "vector"))


def compute_units(units: pd.DataFrame, cfg: Association | None, metric: str) -> pd.DataFrame:
    """Per-unit rows (word or sentence) for every test: status and s(w, A, B) of the target units kept."""
    tests = option(cfg, "tests")
    if tests:
        unknown = sorted(set(tests) - set(units["test"]))
        if unknown:
            raise ConfigError(f"metric option tests: unknown tests {unknown}; known: {sorted(set(units['test']))}")
        units = units[units["test"].isin(list(tests))]
    out = []
    for test, group in units.groupby("test", sort=False):
        group = select_units(group, cfg)
        used = group["status"] == "used"

        def mat(name: str) -> np.ndarray:
            rows = group.loc[used & (group["set"] == name), "vector"]
            return np.stack([np.asarray(v, dtype=np.float64) for v in rows])

        a, b = mat("attr1"), mat("attr2")
        value = np.full(len(group), np.nan)
        for name in TARGET_SETS:
            sel = (used & (group["set"] == name)).to_numpy()
            value[sel] = association(mat(name), a, b)
        group = group.assign(value=value, metric=metric, category=test)
        out.append(group.drop(columns=["vector", "found"]))
    if not out:
        raise DataFormatError("no WEAT test to run (empty items table or metric option tests selects none)")
    return pd.concat(out, ignore_index=True)


def aggregate(per_item: pd.DataFrame, cfg: Association | None) -> pd.DataFrame:
    """Rows (metric, category, value, n): per test ``effect_size``, ``p_value`` and what the p-value used
    (``p_value_exact`` 1/0, ``n_partitions``, ``n_permutations`` evaluated), ``n_dropped_oov``; per bias type
    ``avg_abs_effect_size`` (mean |d| over the type's tests present, as bias-bench; category ``overall``: over
    every test run). On a bootstrap resample
    (repeated item ids) only the effect sizes and their averages are computed."""
    ddof = int(option(cfg, "ddof"))
    kw = dict(exact_limit=int(option(cfg, "exact_limit")), n_samples=int(option(cfg, "n_samples")),
              seed=int(option(cfg, "seed")), ties=str(option(cfg, "ties")))
    rows = []
    effects: dict[str, float] = {}
    # A bootstrap resample repeats words; the permutation test is defined on sets of distinct words (and is its
    # own inference), so resamples give effect sizes (for their CIs) but no p-value.
    resample = "item_id" in per_item.columns and per_item["item_id"].duplicated().any()
    for test, group in per_item.groupby("category", sort=False):
        used = group[group["status"] == "used"]
        s_x = used.loc[used["set"] == "targ1", "value"].to_numpy(float)
        s_y = used.loc[used["set"] == "targ2", "value"].to_numpy(float)
        n = len(s_x) + len(s_y)
        d = effect_size(s_x, s_y, ddof)
        effects[test] = d
        if resample:
            rows.append(("effect_size", test, d, n))
            continue
        perm = permutation_p_value(s_x, s_y, **kw)
        rows += [
            ("effect_size", test, d, n),
            ("p_value", test, perm.p_value, n),
            ("p_value_exact", test, float(perm.method == "exact"), n),
            ("n_partitions", test, float(perm.n_partitions), n),
            ("n_permutations", test, float(perm.n_samples), n),
            ("n_dropped_oov", test, float((group["status"] == "oov").sum()), len(group)),
        ]
    rows += _average_rows(effects, test_bias_types(cfg))
    return pd.DataFrame(rows, columns=["metric", "category", "value", "n"])


def _average_rows(effects: Mapping[str, float], bias_types: Mapping[str, list[str]]) -> list[tuple]:
    """``avg_abs_effect_size`` rows: mean |d| over every test run (category ``overall``, the run's headline) and
    over each bias type's tests present; a row only where some effect size is finite."""
    rows = []
    finite = [abs(d) for d in effects.values() if np.isfinite(d)]
    if finite:
        rows.append(("avg_abs_effect_size", "overall", float(np.mean(finite)), len(finite)))
    for bias_type, tests in bias_types.items():
        present = [abs(effects[t]) for t in tests if t in effects and np.isfinite(effects[t])]
        if present:
            rows.append(("avg_abs_effect_size", bias_type, float(np.mean(present)), len(present)))
    return rows


def bootstrap_statistic(per_item: pd.DataFrame, cfg: Association | None, r: Resamples) -> dict | None:
    """What ``aggregate`` gives on each bootstrap resample (effect sizes and their averages), without building a
    table per replicate: each test's resampled values are gathered from the draw matrix in draw order, the order
    of the resampled table's rows, so every value is bit for bit the generic path's. Declines (None) unless the
    table has one row per unit and its strata are its tests."""
    if per_item.empty or not r.one_row_per_item:
        return None
    if list(r.item_stratum) != list(r.first_values(per_item["category"])):
        return None  # resampled by something other than the test
    ddof = int(option(cfg, "ddof"))
    value = r.first_values(per_item["value"].astype(float))
    used = r.first_values(per_item["status"] == "used")
    target = r.first_values(per_item["set"])
    in_x, in_y = used & (target == TARGET_SETS[0]), used & (target == TARGET_SETS[1])
    effects: dict[str, np.ndarray] = {}  # test -> its effect size in every replicate
    for test, cols in r.strata.items():
        drawn = r.index[:, cols]
        values, xs, ys = value[drawn], in_x[drawn], in_y[drawn]
        effects[str(test)] = np.array([effect_size(values[b][xs[b]], values[b][ys[b]], ddof) for b in range(r.n_boot)])
    out = {("effect_size", test): d for test, d in effects.items()}
    bias_types = test_bias_types(cfg)
    for b in range(r.n_boot):
        for metric, category, v, _ in _average_rows({t: d[b] for t, d in effects.items()}, bias_types):
            out.setdefault((metric, category), np.full(r.n_boot, np.nan))[b] = v
    return out


def requests(items: pd.DataFrame, cfg: Association, model_kind: str) -> list[WordVector]:
    """The vector of every word, as the list writes it (the model lowercases if its config says so)."""
    return [WordVector(str(w)) for w in items["word"]]


def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: Association) -> pd.DataFrame:
    return compute_units(_units_from_answers(items, answers), cfg, "association")


register_metric(MetricSpec(
    follows="Caliskan et al. 2017, as sent-bias runs it",
    name="weat", options=Association,
    benchmark="weat",
    model_kinds=("word_vectors",),
    requests=requests,
    compute=compute,
    aggregate=aggregate,
    score_keys=(),
    headline=("effect_size", "p_value", "avg_abs_effect_size"),
    plot_metric="effect_size",
    plot_reference=0.0,
    bootstrap_statistic=bootstrap_statistic, exact_replicates=True,
    goals=GOALS,
    meanings=MEANINGS,
))
