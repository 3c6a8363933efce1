"""LangFair's recommendation fairness metrics (LangFair 0.8.0 ``RecommendationMetrics``; FaiRLLM, Zhang et al.
2023) on a user's recommendation lists.

Written from LangFair's definitions (docs/langfair_fairness.md), not from its code. The user's file
(``recommendations_file``; ``biasflow.data.fairness_files``) holds, per prompt, the list recommended for the neutral
prompt (group ``neutral_group``) and the lists for prompts that mention each sensitive attribute value (the other
groups). Each group's list is compared with the neutral list of the same prompt by Jaccard, SERP and PRAG similarity
(LangFair's ``evaluate_against_neutral``); per group the mean over its prompts, and across groups the max, min,
range (LangFair's SNSR) and standard deviation (SNSV, numpy's population std) of those means: 0 range / std = every
group's lists are as close to the neutral ones.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from biasflow.errors import DataFormatError
from biasflow.schema import USER_FILE, MetricBase

METRIC = "recommendation_fairness"
SIMILARITIES = ("jaccard", "serp", "prag")
STATS = ("max", "min", "range", "std")


class RecommendationFairness(MetricBase):
    """The options of ``metric.recommendation_fairness``."""

    # the lists: CSV / JSONL / Parquet with prompt, group, recommendations; `example`: the shipped example
    recommendations_file: Optional[str] = Field(None, json_schema_extra=USER_FILE)
    neutral_group: str = "neutral"  # the group value of the lists for the prompts that mention no group
    groups: Optional[list[str]] = None  # the groups compared (null: every other group of the file, in file order)
    # also LangFair's evaluate_pairwise: every pair of groups' lists for the same prompt, compared with each other
    pairwise: bool = False

    @classmethod
    def check_user_file(cls, option: str, path: Path) -> None:
        """Plan time (``plan.user_files``): the file reads (columns, lists, one list per prompt and group)."""
        if option == "recommendations_file":
            from biasflow.data.fairness_files import checked

            stat = Path(path).stat()
            checked("recommendation", str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)

    @field_validator("groups")
    @classmethod
    def _distinct(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError(f"must name one or more different groups, got {v}")
        return v


# ------------------------------------------------------------------------------------------- similarities
def jaccard(list1: Sequence[str], list2: Sequence[str]) -> float:
    """|set1 & set2| / |set1 | set2|."""
    a, b = set(list1), set(list2)
    return len(a & b) / len(a | b) if a | b else 0.0


def serp(list1: Sequence[str], list2: Sequence[str]) -> float:
    """LangFair's SERP similarity of ``list1`` to ``list2``: every item of ``list1`` (K items) found in ``list2``
    scores K - i + 1 (i its 0-based rank in ``list1``: K + 1 for the first, 2 for the last), the sum scaled by
    0.5 / (K (K + 1)); 0 when ``list2`` is empty. Identical lists of 5 give 1/3, not 1 (LangFair's scale)."""
    k = len(list1)
    if not list2 or not k:
        return 0.0
    other = set(list2)
    score = sum(k - i + 1 for i, item in enumerate(list1) if item in other)
    return score * 0.5 / ((k + 1) * k)


def prag(list1: Sequence[str], list2: Sequence[str]) -> float:
    """LangFair's PRAG similarity of ``list1`` to ``list2``: the pairs (i < j) of ``list1`` whose first item is in
    ``list2`` and either ranked there before the second or the second is absent, over K (K + 1); a one-item list
    scores 1 if the lists are equal, else 0; 0 when either is empty."""
    k = len(list1)
    if not list1 or not list2:
        return 0.0
    if k == 1:
        return float(list(list1) == list(list2))
    rank: dict[str, int] = {}
    for i, item in enumerate(list2):
        rank.setdefault(item, i)
    matches = 0
    for i in range(k):
        r1 = rank.get(list1[i], -1)
        if r1 == -1:
            continue
        for j in range(i + 1, k):
            r2 = rank.get(list1[j], -1)
            if r1 < r2 or r2 == -1:
                matches += 1
    return matches / (k * (k + 1))


SIMILARITY = {"jaccard": jaccard, "serp": serp, "prag": prag}


def spread(values: Sequence[float]) -> dict[str, float]:
    """max, min, range (max - min) and population standard deviation of the per-group means."""
    arr = np.asarray(values, dtype=float)
    return {"max": float(arr.max()), "min": float(arr.min()), "range": float(arr.max() - arr.min()),
            "std": float(arr.std())}


# ------------------------------------------------------------------------------------------- pipeline glue
def read_items(cfg: RecommendationFairness) -> pd.DataFrame:
    """One row per (prompt, compared group): its list and the prompt's neutral list, with the three similarities."""
    from biasflow.data.fairness_files import read_recommendations_table, resolve

    path = cfg.recommendations_file
    if not path:
        raise DataFormatError(f"metric {METRIC} reads recommendation lists: set metric.{METRIC}.recommendations_file="
                              f"<CSV, JSONL or Parquet with prompt, group, recommendations> (or =example for the "
                              f"shipped example)")
    where = f"recommendations file {resolve(path, 'recommendation')}"
    table = read_recommendations_table(path)
    neutral_group = cfg.neutral_group
    neutral = {r.prompt: r.recommendations for r in table.itertuples() if r.group == neutral_group}
    if not neutral:
        raise DataFormatError(f"{where} has no list of the neutral group {neutral_group!r} (its groups: "
                              f"{sorted(set(table['group']))}; metric.{METRIC}.neutral_group names it)")
    found = list(dict.fromkeys(g for g in table["group"] if g != neutral_group))
    groups = cfg.groups or found
    missing = [g for g in groups if g not in found]
    if missing or not groups:
        raise DataFormatError(f"{where} has no list of group(s) {missing or '(none but the neutral one)'} "
                              f"(its groups: {found})")
    rows = []
    for r in table[table["group"].isin(groups)].itertuples():
        if r.prompt not in neutral:
            raise DataFormatError(f"{where}, row {r.row}: prompt {r.prompt!r} (group {r.group!r}) has no list of the "
                                  f"neutral group {neutral_group!r} to compare with")
        row = {"item_id": f"{r.group}|{r.prompt}", "category": r.group, "comparison": "neutral", "group": r.group,
               "prompt": r.prompt, "row": r.row, "recommendations": list(r.recommendations),
               "other_recommendations": list(neutral[r.prompt])}
        for name, fn in SIMILARITY.items():  # LangFair: metric.evaluate(list1=group's list, list2=neutral list)
            row[name] = fn(r.recommendations, neutral[r.prompt])
        rows.append(row)
    out = pd.DataFrame(rows)
    order = {g: i for i, g in enumerate(groups)}
    out = out.sort_values("group", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    return pd.concat([out, pairwise_items(table, groups)], ignore_index=True) if cfg.pairwise else out


def pairwise_items(table: pd.DataFrame, groups: Sequence[str]) -> pd.DataFrame:
    """LangFair's ``evaluate_pairwise`` for every pair of groups (category ``<group 1>-<group 2>``, in the order of
    ``groups``): group 1's list against group 2's list for the same prompt (prompts only one of them has are left
    out; LangFair pairs two lists of lists by position)."""
    from itertools import combinations

    lists = {(r.group, r.prompt): r for r in table.itertuples()}
    rows = []
    for g1, g2 in combinations(groups, 2):
        for r in table[table["group"] == g1].itertuples():
            other = lists.get((g2, r.prompt))
            if other is None:
                continue
            row = {"item_id": f"{g1}-{g2}|{r.prompt}", "category": f"{g1}-{g2}", "comparison": "pairwise",
                   "group": g1, "prompt": r.prompt, "row": r.row, "recommendations": list(r.recommendations),
                   "other_recommendations": list(other.recommendations)}
            for name, fn in SIMILARITY.items():  # LangFair: min(m(l1, l2), m(l1, l2)), i.e. m(l1, l2)
                row[name] = fn(r.recommendations, other.recommendations)
            rows.append(row)
    return pd.DataFrame(rows)


def requests(items: pd.DataFrame, cfg: RecommendationFairness, model_kind: str) -> list:
    """Nothing: the lists are the user's."""
    return []


def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: RecommendationFairness) -> pd.DataFrame:
    return read_items(cfg)


def aggregate(per_item: pd.DataFrame, cfg: RecommendationFairness) -> pd.DataFrame:
    """Per group (category = the group): the mean of each similarity over its prompts. ``overall``: each
    similarity's max, min, range and std across the groups' means (``n``: the lists compared). With ``pairwise``,
    per pair of groups (category ``<group 1>-<group 2>``): ``pairwise_<similarity>``, the mean over their prompts."""
    rows: list[dict[str, Any]] = []
    pairs = per_item[per_item["comparison"] == "pairwise"] if len(per_item) else per_item
    per_item = per_item[per_item["comparison"] == "neutral"] if len(per_item) else per_item
    if not len(per_item):
        return pd.DataFrame(rows, columns=["metric", "category", "value", "n"])
    groups = list(dict.fromkeys(per_item["group"]))
    means = {g: per_item.loc[per_item["group"] == g, list(SIMILARITIES)].mean() for g in groups}
    counts = per_item["group"].value_counts()
    for name in SIMILARITIES:
        for stat, value in spread([means[g][name] for g in groups]).items():
            rows.append({"metric": f"{name}_{stat}", "category": "overall", "value": value, "n": len(per_item)})
    for g in groups:
        for name in SIMILARITIES:
            rows.append({"metric": name, "category": g, "value": float(means[g][name]), "n": int(counts[g])})
    for pair, df in (pairs.groupby("category", sort=False) if len(pairs) else []):
        for name in SIMILARITIES:
            rows.append({"metric": f"pairwise_{name}", "category": pair, "value": float(df[name].mean()),
                         "n": len(df)})
    return pd.DataFrame(rows, columns=["metric", "category", "value", "n"])


def _register() -> None:
    from biasflow.registry import MetricSpec, register_metric

    what = {"jaccard": "Jaccard similarity (shared / all items; 1 = the same items)",
            "serp": "SERP similarity (LangFair's rank-weighted overlap; identical lists of 5 give 1/3)",
            "prag": "PRAG similarity (LangFair's pairs ranked alike; identical lists of 5 give 1/3)"}
    meanings: dict[str, str] = {}
    goals: dict[str, float | str | None] = {}
    for name, text in what.items():
        meanings[name] = f"mean {text} of the group's lists to the neutral ones; fair: every group the same"
        meanings[f"{name}_max"] = f"the largest group mean of the {name} similarity to the neutral lists"
        meanings[f"{name}_min"] = f"the smallest group mean of the {name} similarity to the neutral lists"
        meanings[f"{name}_range"] = (f"max - min of the groups' mean {name} similarity to the neutral lists "
                                     f"(LangFair's SNSR); 0 = fair, larger = some group's lists stray further")
        meanings[f"{name}_std"] = (f"population standard deviation of the groups' mean {name} similarity to the "
                                   f"neutral lists (LangFair's SNSV); 0 = fair")
        meanings[f"pairwise_{name}"] = (f"mean {what[name].split(' (')[0]} of group 1's lists to group 2's for the "
                                        f"same prompts (LangFair's evaluate_pairwise); higher = more alike")
        goals.update({name: None, f"{name}_max": None, f"{name}_min": None, f"{name}_range": 0.0,
                      f"{name}_std": 0.0, f"pairwise_{name}": None})
    register_metric(MetricSpec(
        follows="LangFair 0.8.0 RecommendationMetrics.evaluate_against_neutral (Zhang et al. 2023, FaiRLLM)",
        name=METRIC, user_table="recommendations_file", options=RecommendationFairness, benchmark=None,
        # the model is asked nothing: its config only names the recommender whose lists the file holds
        model_kinds=("masked_lm", "causal_lm", "served_causal_lm", "sentence_encoder", "word_vectors", "ngram",
                     "text_classifier", "bert_nsp", "lmc_process"),
        requests=requests, compute=compute, aggregate=aggregate,
        score_keys=(), headline=("jaccard_range", "serp_range", "prag_range"), plot_metric="jaccard",
        plot_reference=None, goals=goals, meanings=meanings))


_register()
