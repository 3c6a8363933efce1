"""What the report says about its numbers: each headline metric's meaning, the definition a table was computed
under, why a cell is blank, what a slice of the data left out.

A blank cell is never left to guess: ``blank_reason`` names why a value or its CI is missing (no items, undefined on
the items there are, every resample undefined); a reason shared by a whole table (the bootstrap is off, the metric
has none) is said once in ``ci_note`` instead of in every cell.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from biasflow.schema import StatsConfig


def stats_of(plan: Mapping[str, Any]) -> StatsConfig:
    """The bootstrap settings of the run (every job of a plan shares them)."""
    return StatsConfig.model_validate((plan["jobs"][0].get("stats") or {}) if plan["jobs"] else {})


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (not isinstance(v, str) and pd.isna(v))


def ci_expected(spec: Any, stats: StatsConfig) -> bool:
    """Whether the metric's values come with a bootstrap CI in this run."""
    return bool(spec.bootstrap) and stats.n_boot > 0


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


def meaning_lines(spec: Any, metrics: Sequence[str]) -> list[str]:
    """``metric: what it measures, which way is fair`` for each of ``metrics`` the metric explains."""
    meanings = getattr(spec, "meanings", None) or {}
    return [f"{m}: {meanings[m]}" for m in metrics if m in meanings]


def missing_headline(spec: Any, present: set[str]) -> list[str]:
    """Headline metrics the job did not produce (a slice of the data without the subset they are computed on)."""
    return [m for m in spec.headline if m not in present]


def missing_note(metrics: Sequence[str]) -> str:
    return (f"Not computed here: {', '.join(metrics)} (these items hold nothing that "
            f"{'this metric is' if len(metrics) == 1 else 'these metrics are'} computed on, e.g. a slice of the data "
            "without that subset).")
