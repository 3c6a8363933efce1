"""What the report says about its numbers: each headline metric's meaning, the definition a table was computed
under, why a cell is blank, what a slice of the data left out.

A blank cell is never left to guess: ``blank_reason`` names why a value or its CI is missing (no items, undefined on
the items there are, every resample undefined); a reason shared by a whole table (the bootstrap is off, the metric
has none) is said once in ``ci_note`` instead of in every cell.
"""
from __future__ import annotations

import fnmatch
import math
from typing import Any, Mapping, Sequence

import pandas as pd

from biasflow.schema import StatsConfig


def stats_of(plan: Mapping[str, Any]) -> StatsConfig:
    """The run's statistics settings: the bootstrap every job of a plan shares (its ``stats``) and the report's
    paired-test design (the plan's, in its sweep jobs' configs)."""
    sweep = plan.get("sweep") or [{}]
    own = dict((sweep[0].get("config") or {}).get("stats") or {})
    return StatsConfig.model_validate({**own, **((plan["jobs"][0].get("stats") or {}) if plan["jobs"] else {})})


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (not isinstance(v, str) and pd.isna(v))


def ci_expected(spec: Any, stats: StatsConfig) -> bool:
    """Whether the metric's values come with a bootstrap CI in this run."""
    return bool(spec.bootstrap) and stats.n_boot > 0


def ci_label(stats: StatsConfig | None) -> str:
    """What the run's intervals are, as plots and captions name them ("95% bootstrap CI"); '' without a bootstrap
    (stats.n_boot=0: no caption promises a CI)."""
    if stats is None:
        return "95% bootstrap CI"
    return f"{100 * stats.level:g}% bootstrap CI" if stats.n_boot > 0 else ""


def ci_note(spec: Any, stats: StatsConfig) -> str:
    """Why a whole table has no CI ('' when it has them)."""
    if not spec.bootstrap:
        return "No CIs: this metric is reported without a bootstrap (its aggregate is too slow to resample)."
    if stats.n_boot <= 0:
        return "No CIs: the bootstrap is off in this run (stats.n_boot=0)."
    return ""


def blank_reason(value: Any, ci_low: Any, ci_high: Any, n: Any, with_ci: bool) -> str:
    """Why this cell (value, or its CI where the run computes CIs) is blank; '' when nothing is."""
    if _missing(n) or float(n) == 0:
        return "no items"
    count = int(n)
    if _missing(value):
        return f"undefined on its {count} item{'s' if count != 1 else ''}"
    if with_ci and (_missing(ci_low) or _missing(ci_high)):
        return f"no CI: undefined in every resample of {count} item{'s' if count != 1 else ''}"
    return ""


def definition_text(spec: Any, cfgs: Sequence[Mapping[str, Any]]) -> str:
    """``definition=parity``: the options that choose the definition of the numbers, where every job of the table
    uses one value (a definition that differs between jobs is in their setting instead)."""
    parts = []
    for option in getattr(spec, "definition_options", ()) or ():
        values = {str(cfg.get(option)) for cfg in cfgs if cfg.get(option) is not None}
        if len(values) == 1:
            parts.append(f"{option}={values.pop()}")
    return ", ".join(parts)


def heading_note(spec: Any, cfgs: Sequence[Mapping[str, Any]], modes: Sequence[Any] = ()) -> str:
    """What a family heading says after its name: the published definition its numbers follow, the options that
    choose among definitions, and the run mode (``Nangia et al. 2020 (the authors' metric.py) · run.mode=parity``).
    A definition or mode that differs between the table's jobs is in their setting instead."""
    parts = [getattr(spec, "follows", "") or "", definition_text(spec, cfgs)]
    distinct = {str(m) for m in modes if m is not None}
    if len(distinct) == 1:
        parts.append(f"run.mode={distinct.pop()}")
    return " · ".join(p for p in parts if p)


def kept_reason(spec: Any, metric: str, rows: pd.DataFrame, cfg: Mapping[str, Any] | None) -> str:
    """Why a rate over filtered items is blank when its items exist: ``0 of 1,018 one-word pairs kept
    (filter_threshold 0.15)``. ``rows``: the job's aggregate rows of one category. '' where the filter kept some (or the metric has
    no filter)."""
    kept_by = getattr(spec, "kept_by", None) or {}
    if metric not in kept_by:
        return ""
    kept_metric, noun, rule = kept_by[metric]
    kept = rows[rows["metric"] == kept_metric]
    if kept.empty or _missing(kept["n"].iloc[0]) or int(kept["n"].iloc[0]) == 0:
        return ""
    total, share = int(kept["n"].iloc[0]), kept["value"].iloc[0]
    if _missing(share) or float(share) > 0:
        return ""
    try:
        rule = rule.format_map(dict(cfg or {}))
    except (KeyError, ValueError, IndexError):  # an option the job lacks: the rule's words without its value
        rule = rule.split("{", 1)[0].strip()
    return f"0 of {total:,} {noun} kept" + (f" by {rule}" if rule else "")


def cell_reason(spec: Any, metric: str, value: Any, ci_low: Any, ci_high: Any, n: Any, with_ci: bool,
                rows: pd.DataFrame | None = None, cfg: Mapping[str, Any] | None = None) -> str:
    """``blank_reason``, where a filter emptied a rate naming the filter instead of "no items" (``kept_reason``;
    ``rows``: the job's aggregate rows of the cell's category, ``cfg``: the job's metric options)."""
    why = blank_reason(value, ci_low, ci_high, n, with_ci)
    if why == "no items" and rows is not None:
        why = kept_reason(spec, metric, rows, cfg) or why
    elif why.startswith("undefined on its"):
        undefined = getattr(spec, "undefined", None) or {}
        cause = by_metric_name(undefined, metric)
        if cause:
            why = f"undefined: {cause} ({why.split(' its ', 1)[1]})"
    return why


def is_p_value(metric: str) -> bool:
    """A test's p-value (``p_value``, ``wilcoxon_p``, ``p_value_exact``): shown to 3 significant digits (1e-05, not
    0.00) and never with a CI."""
    return metric.startswith("p_value") or metric.endswith("_p")


def value_text(metric: str, v: Any) -> str:
    """A value as the report's tables show it: 2 decimals; a p-value to 3 significant digits."""
    if _missing(v):
        return ""
    return f"{float(v):.3g}" if is_p_value(metric) else f"{float(v):.2f}"


def no_ci_note(metrics: Sequence[str]) -> str:
    """The note under a table whose ``metrics`` (p-values, pass/fail verdicts) are shown without a CI."""
    return (f"No CI for {', '.join(metrics)}: a test's p-value or a pass/fail verdict is the outcome of a test, not "
            "an estimate to resample.") if metrics else ""


def by_metric_name(mapping: Mapping[str, Any], metric: str) -> Any:
    """``mapping``'s entry for ``metric``: its exact name first, then a pattern (``fnmatch``: ``honest_*@*``); None
    when neither matches. The one lookup of the metrics' goals, meanings and undefined causes."""
    if metric in mapping:
        return mapping[metric]
    for pattern, value in mapping.items():
        if any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(metric, pattern):
            return value
    return None


def meaning_of(spec: Any, metric: str) -> str | None:
    """What ``metric`` (a row of the family's tables) measures, from ``MetricSpec.meanings``; None when the family
    does not say."""
    return by_metric_name(getattr(spec, "meanings", None) or {}, metric)


def meaning_lines(spec: Any, metrics: Sequence[str]) -> list[str]:
    """``metric: what it measures, which way is fair`` for each of ``metrics`` the metric explains."""
    return [f"{m}: {text}" for m in metrics if (text := meaning_of(spec, m)) is not None]


def missing_headline(spec: Any, present: set[str]) -> list[str]:
    """Headline metrics the job did not produce (a slice of the data without the subset they are computed on)."""
    return [m for m in spec.headline if m not in present]


def missing_note(metrics: Sequence[str]) -> str:
    return (f"Not computed here: {', '.join(metrics)} (these items hold nothing that "
            f"{'this metric is' if len(metrics) == 1 else 'these metrics are'} computed on, e.g. a slice of the data "
            "without that subset).")
