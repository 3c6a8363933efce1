"""LangFair's classification fairness metrics (LangFair 0.8.0 ``ClassificationMetrics``) on a user's predictions.

Written from LangFair's definitions (docs/langfair_fairness.md), not from its code. The items are the rows of the
user's file (``predictions_file``: ``y_true``, ``y_pred``, ``group``; ``biasflow.data.fairness_files``); the model is
asked nothing. Per group: the predicted prevalence rate P(pred = 1), false positive rate FP / (FP + TN), false
negative rate FN / (FN + TP), false omission rate FN / (FN + TN) and false discovery rate FP / (FP + TP). Between the
two groups, each rate's disparity as LangFair computes it: ``|r1 - r2|`` (``*_difference``, 0 = fair) and ``r1 / r2``
(``*_ratio``, 1 = fair), group 1 being the first of ``groups`` (null: the file's two groups in sorted order, as
LangFair's ``np.unique``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from biasflow.errors import DataFormatError
from biasflow.schema import USER_FILE, MetricBase

METRIC = "classification_fairness"
# rate -> (LangFair's metric type, its parity metric's name, what the rate is)
RATES = {
    "predicted_prevalence_rate": ("representation", "PredictedPrevalenceRateParity", "P(predicted positive)"),
    "false_positive_rate": ("punitive", "FalsePositiveRateParity", "FP / (FP + TN): negatives predicted positive"),
    "false_negative_rate": ("assistive", "FalseNegativeRateParity", "FN / (FN + TP): positives predicted negative"),
    "false_omission_rate": ("assistive", "FalseOmissionRateParity",
                            "FN / (FN + TN): predicted negatives that are positive"),
    "false_discovery_rate": ("punitive", "FalseDiscoveryRateParity",
                             "FP / (FP + TP): predicted positives that are negative"),
}
# what each rate is undefined without (its denominator)
DENOMINATORS = {"predicted_prevalence_rate": "rows", "false_positive_rate": "negative labels (y_true = 0)",
                "false_negative_rate": "positive labels (y_true = 1)",
                "false_omission_rate": "negative predictions (y_pred = 0)",
                "false_discovery_rate": "positive predictions (y_pred = 1)"}


class ClassificationFairness(MetricBase):
    """The options of ``metric.classification_fairness``."""

    # the user's predictions: CSV / JSONL / Parquet with y_true, y_pred (0/1) and group; `example`: the shipped one
    predictions_file: Optional[str] = Field(None, json_schema_extra=USER_FILE)
    # LangFair's metric_type: assistive (FNR, FOR), punitive (FPR, FDR), representation (predicted prevalence), all
    metric_type: Literal["all", "assistive", "punitive", "representation"] = "all"
    # the two groups compared, group 1 first (the ratio's numerator); null: the file's two groups, sorted as text
    groups: Optional[list[str]] = None

    @classmethod
    def check_user_file(cls, option: str, path: Path) -> None:
        """Plan time (``plan.user_files``): the file reads (columns, 0/1 values, groups, ids), before any job runs."""
        if option == "predictions_file":
            from biasflow.data.fairness_files import checked

            checked("classification", str(Path(path).resolve()), *_stat(path))

    @field_validator("groups")
    @classmethod
    def _two(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is not None and (len(v) != 2 or v[0] == v[1]):
            raise ValueError(f"must name two different groups (group 1, group 2), got {v}")
        return v


def _stat(path: Path) -> tuple[int, int]:
    stat = Path(path).stat()
    return stat.st_mtime_ns, stat.st_size


def rates_of(metric_type: str) -> list[str]:
    """The rates LangFair's ``metric_type`` selects, in the order of ``RATES``."""
    return [r for r, (kind, _, _) in RATES.items() if metric_type in ("all", kind)]


def confusion(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, int]:
    """Counts of true/false positives/negatives (LangFair's binary confusion matrix)."""
    t, p = np.asarray(y_true) == 1, np.asarray(y_pred) == 1
    return {"tp": int(np.sum(t & p)), "fp": int(np.sum(~t & p)), "tn": int(np.sum(~t & ~p)), "fn": int(np.sum(t & ~p))}


def group_rates(y_true: np.ndarray | None, y_pred: np.ndarray) -> dict[str, tuple[float, int]]:
    """rate -> (value, its denominator); NaN where the denominator is 0 (or the labels are missing)."""
    y_pred = np.asarray(y_pred)
    out = {"predicted_prevalence_rate": (float(np.mean(y_pred)) if len(y_pred) else float("nan"), len(y_pred))}
    if y_true is None:
        return out
    c = confusion(y_true, y_pred)
    for rate, (num, den) in {"false_positive_rate": ("fp", ("fp", "tn")), "false_negative_rate": ("fn", ("fn", "tp")),
                             "false_omission_rate": ("fn", ("fn", "tn")),
                             "false_discovery_rate": ("fp", ("fp", "tp"))}.items():
        d = c[den[0]] + c[den[1]]
        out[rate] = (c[num] / d if d else float("nan"), d)
    return out


def parity(r1: float, r2: float) -> tuple[float, float]:
    """(|r1 - r2|, r1 / r2): LangFair's difference and ratio; NaN where a rate is undefined (the ratio also where
    r2 = 0)."""
    diff = abs(r1 - r2) if not (np.isnan(r1) or np.isnan(r2)) else float("nan")
    ratio = r1 / r2 if not (np.isnan(r1) or np.isnan(r2)) and r2 != 0 else float("nan")
    return float(diff), float(ratio)


def chosen_groups(found: list[str], cfg: ClassificationFairness, path: str | None = None) -> list[str]:
    """The two groups compared: ``groups``, each present in the file, or the file's two groups sorted."""
    where = f"predictions file {path}" if path else "the predictions"
    if cfg.groups:
        missing = [g for g in cfg.groups if g not in found]
        if missing:
            raise DataFormatError(f"metric.{METRIC}.groups={cfg.groups}: {where} has no row of group(s) "
                                  f"{missing} (its groups: {sorted(found)})")
        return list(cfg.groups)
    if len(set(found)) != 2:
        raise DataFormatError(f"{where} has {len(set(found))} group(s) {sorted(set(found))}: LangFair's classification "
                              f"metrics compare exactly two; name them with metric.{METRIC}.groups=[<group 1>,<group 2>]")
    return sorted(set(found))


def read_items(cfg: ClassificationFairness) -> pd.DataFrame:
    """The per-item table: the file's rows of the two compared groups."""
    from biasflow.data.fairness_files import read_predictions_table, resolve

    path = cfg.predictions_file
    if not path:
        raise DataFormatError(f"metric {METRIC} reads a predictions file: set metric.{METRIC}.predictions_file=<CSV, "
                              f"JSONL or Parquet with y_true, y_pred, group> (or =example for the shipped example)")
    rates = rates_of(cfg.metric_type)
    table = read_predictions_table(path, need_labels=rates != ["predicted_prevalence_rate"])
    groups = chosen_groups(table["group"].tolist(), cfg, str(resolve(path, "classification")))
    return table[table["group"].isin(groups)].reset_index(drop=True)


def requests(items: pd.DataFrame, cfg: ClassificationFairness, model_kind: str) -> list:
    """Nothing: the predictions are the user's."""
    return []


def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: ClassificationFairness) -> pd.DataFrame:
    """One row per prediction of the two compared groups (category = its group), with its outcome columns."""
    out = read_items(cfg)
    t, p = out["y_true"].to_numpy(), out["y_pred"].to_numpy()
    out["true_positive"], out["false_positive"] = (t == 1) & (p == 1), (t == 0) & (p == 1)
    out["true_negative"], out["false_negative"] = (t == 0) & (p == 0), (t == 1) & (p == 0)
    out["source"] = str(Path(str(cfg.predictions_file)))
    return out


def aggregate(per_item: pd.DataFrame, cfg: ClassificationFairness) -> pd.DataFrame:
    """Per group (category = the group) and over both (``overall``): each selected rate; ``overall`` also has each
    rate's ``_difference`` and ``_ratio`` between group 1 and group 2. ``n``: the rate's denominator (rows for
    the predicted prevalence, negative labels for the false positive rate, ...), the two groups' rows for a
    disparity."""
    rates = rates_of(cfg.metric_type)
    rows: list[dict[str, Any]] = []
    groups = chosen_groups(per_item["group"].tolist(), cfg) if len(per_item) else []
    labelled = bool(len(per_item)) and bool((per_item["y_true"] >= 0).all())

    def rates_for(df: pd.DataFrame) -> dict[str, tuple[float, int]]:
        return group_rates(df["y_true"].to_numpy() if labelled else None, df["y_pred"].to_numpy())

    by_group = {g: rates_for(per_item[per_item["group"] == g]) for g in groups}
    overall = rates_for(per_item) if len(per_item) else {}
    for rate in rates:
        if rate in overall:
            rows.append({"metric": rate, "category": "overall", "value": overall[rate][0], "n": overall[rate][1]})
    if len(groups) == 2:
        (g1, r1), (g2, r2) = by_group.items()
        n = int(len(per_item))
        for rate in rates:
            if rate in r1:
                diff, ratio = parity(r1[rate][0], r2[rate][0])
                rows.append({"metric": f"{rate}_difference", "category": "overall", "value": diff, "n": n})
                rows.append({"metric": f"{rate}_ratio", "category": "overall", "value": ratio, "n": n})
    for g in groups:
        for rate in rates:
            if rate in by_group[g]:
                rows.append({"metric": rate, "category": g, "value": by_group[g][rate][0], "n": by_group[g][rate][1]})
    out = pd.DataFrame(rows, columns=["metric", "category", "value", "n"])
    out["value"] = pd.to_numeric(out["value"], errors="coerce")
    return out


def _register() -> None:
    from biasflow.registry import MetricSpec, register_metric

    meanings: dict[str, str] = {}
    for rate, (_, name, what) in RATES.items():
        meanings[rate] = f"{what}, in the group (overall: both groups); describes the group: compare the groups"
        meanings[f"{rate}_difference"] = (f"LangFair's {name}: |group 1's {rate.replace('_', ' ')} - group 2's|; "
                                          f"0 = fair, larger = a larger gap")
        meanings[f"{rate}_ratio"] = (f"LangFair's {name} with ratio=True: group 1's rate / group 2's (group 1: "
                                     f"first of groups, or sorted); 1 = fair, away from 1 = a gap")
    undefined = {rate: f"the group has no {DENOMINATORS[rate]}" for rate in RATES}
    undefined.update({f"{rate}_difference": f"a group has no {DENOMINATORS[rate]}" for rate in RATES})
    undefined.update({f"{rate}_ratio": f"a group has no {DENOMINATORS[rate]}, or group 2's rate is 0"
                      for rate in RATES})
    goals: dict[str, float | str | None] = {}
    for rate in RATES:
        goals.update({rate: None, f"{rate}_difference": 0.0, f"{rate}_ratio": 1.0})
    register_metric(MetricSpec(
        follows="LangFair 0.8.0 ClassificationMetrics (Bouchard 2024)",
        name=METRIC, user_table="predictions_file", options=ClassificationFairness, benchmark=None,
        # the model is asked nothing: its config only names the classifier whose predictions the file holds
        model_kinds=("masked_lm", "causal_lm", "served_causal_lm", "sentence_encoder", "word_vectors", "ngram",
                     "text_classifier", "bert_nsp", "lmc_process"),
        requests=requests, compute=compute, aggregate=aggregate,
        score_keys=(), headline=tuple(f"{r}_difference" for r in RATES), plot_metric="predicted_prevalence_rate",
        plot_reference=None, goals=goals, meanings=meanings, undefined=undefined))


_register()
