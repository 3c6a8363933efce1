"""BBQ (Parrish et al. 2022): the 11 category files ``<Category>.jsonl`` and ``additional_metadata.csv`` -> items.

Each line of a category file is one example: a context (ambiguous or disambiguated), a question (negative or
non-negative polarity), three answers ``ans0..ans2`` of which one is the "unknown" answer, the correct ``label`` and
``answer_info`` (each answer's text and group, ``unknown`` for the unknown answer). The authors' analysis
(``analysis_scripts/BBQ_calculate_bias_score.R`` in nyu-mll/BBQ) takes the location of the biased answer
(``target_loc``) and the ``label_type`` (``name`` when the groups are given by first names) from
``additional_metadata.csv``, merged on (example_id, category, question_index); the items carry both, plus
``metadata_rows``, the number of metadata rows that merge gives the example (the R merge keeps them all: 64
Gender_identity examples have two rows, the same target, so the authors' analysis counts them twice) and NaN
``target_loc`` where the file has NA (16 Gender_identity examples; the analysis drops them).

The items keep the raw answer information as JSON (``answer_info``, ``stereotyped_groups``) so that the HELM and
lm-evaluation-harness definitions (``metrics/bbq.py``) can re-derive their own targets from it.

``split`` selects the context condition (``all``, ``ambig``, ``disambig``), ``categories`` the category files, and
``limit`` the first N examples taken in turn from each selected category (round robin in file order), so that a
small limit covers every category.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError, did_you_mean
from biasflow.provenance import rows_by_column
from biasflow.registry import register_loader
from biasflow.schema import BenchmarkConfig

CATEGORIES = ("Age", "Disability_status", "Gender_identity", "Nationality", "Physical_appearance", "Race_ethnicity",
              "Race_x_SES", "Race_x_gender", "Religion", "SES", "Sexual_orientation")
N_EXAMPLES = 58492
FIELDS = ("example_id", "question_index", "question_polarity", "context_condition", "category", "answer_info",
          "additional_metadata", "context", "question", "ans0", "ans1", "ans2", "label")
METADATA_COLUMNS = ("category", "question_index", "example_id", "target_loc", "label_type")


def read_category(path: Path, category: str, condition: str = "all", max_rows: int | None = None
                  ) -> list[dict[str, Any]]:
    """The examples of one category file in the context ``condition`` (all, ambig, disambig), the first
    ``max_rows`` of them (None: all), checked field by field (errors name the file and line)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if max_rows is not None and len(rows) >= max_rows:
                break
            if not line.strip():
                continue
            where = f"{path}, line {line_no}"
            try:
                ex = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{where}: not JSON ({exc.msg})") from None
            missing = [f for f in FIELDS if f not in ex]
            if missing:
                raise DataFormatError(f"{where}: missing field(s) {missing}")
            if ex["category"] != category:
                raise DataFormatError(f"{where}: category {ex['category']!r} in the file of {category!r}")
            if ex["label"] not in (0, 1, 2):
                raise DataFormatError(f"{where}: label {ex['label']!r} is not 0, 1 or 2")
            if ex["question_polarity"] not in ("neg", "nonneg"):
                raise DataFormatError(f"{where}: question_polarity {ex['question_polarity']!r}")
            if ex["context_condition"] not in ("ambig", "disambig"):
                raise DataFormatError(f"{where}: context_condition {ex['context_condition']!r}")
            info = ex["answer_info"]
            if not isinstance(info, dict) or any(not isinstance(info.get(f"ans{i}"), list) for i in range(3)):
                raise DataFormatError(f"{where}: answer_info must map ans0..ans2 to [text, group] lists")
            if condition != "all" and ex["context_condition"] != condition:
                continue
            unknown = [i for i in range(3) if info[f"ans{i}"][-1:] == ["unknown"]]
            if len(unknown) != 1:
                raise DataFormatError(f"{where}: {len(unknown)} answers are marked 'unknown' in answer_info "
                                      f"(expected exactly one)")
            rows.append({
                "example_id": int(ex["example_id"]), "category": category,
                "question_index": str(ex["question_index"]), "question_polarity": ex["question_polarity"],
                "context_condition": ex["context_condition"], "context": ex["context"], "question": ex["question"],
                "ans0": ex["ans0"], "ans1": ex["ans1"], "ans2": ex["ans2"], "label": int(ex["label"]),
                "unknown_loc": unknown[0], "answer_info": json.dumps(info, ensure_ascii=False),
                "stereotyped_groups": json.dumps(ex["additional_metadata"].get("stereotyped_groups") or [],
                                                 ensure_ascii=False),
                "line": line_no,
            })
    return rows


def read_metadata(path: Path) -> pd.DataFrame:
    """``additional_metadata.csv``: one row per (example_id, category, question_index) as the R analysis reads it
    (``read.csv``: "NA" is missing), with ``target_loc`` as float (NaN where NA)."""
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as exc:
        raise DataFormatError(f"{path} could not be read as CSV: {exc}") from exc
    missing = [c for c in METADATA_COLUMNS if c not in df.columns]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")
    loc = df["target_loc"].str.strip()
    bad = ~loc.isin(["0", "1", "2", "NA", ""])
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise DataFormatError(f"{path}, row {row + 2}: target_loc {df['target_loc'].iloc[row]!r} is not 0, 1, 2 "
                              f"or NA")
    ids = pd.to_numeric(df["example_id"].str.strip(), errors="coerce")
    if ids.isna().any():
        row = int(ids.isna().to_numpy().nonzero()[0][0])
        raise DataFormatError(f"{path}, row {row + 2}: example_id {df['example_id'].iloc[row]!r} is not an integer")
    return pd.DataFrame({"category": df["category"], "question_index": df["question_index"].str.strip(),
                         "example_id": ids.astype(int), "target_loc": pd.to_numeric(loc, errors="coerce"),
                         "label_type": df["label_type"]})


def selected_categories(cfg: Mapping[str, Any]) -> list[str]:
    wanted = cfg.get("categories")
    if wanted is None:
        return list(CATEGORIES)
    unknown = [c for c in wanted if c not in CATEGORIES]
    if unknown or not wanted:
        raise ConfigError(f"benchmark.bbq.categories={list(wanted)!r}: unknown category {unknown}"
                          f"{did_you_mean(unknown[0], CATEGORIES)} (known: {', '.join(CATEGORIES)})" if unknown else
                          "benchmark.bbq.categories=[]: select at least one category (or null for all)")
    return list(dict.fromkeys(wanted))


def round_robin(frames: list[pd.DataFrame], limit: int | None) -> pd.DataFrame:
    """The first ``limit`` rows taken in turn from each frame (frame order, then row order); all rows when None."""
    if limit is None:
        return pd.concat(frames, ignore_index=True)
    parts = [f.assign(_rank=range(len(f)), _frame=i) for i, f in enumerate(frames)]
    merged = pd.concat(parts, ignore_index=True).sort_values(["_rank", "_frame"], kind="stable").head(limit)
    return merged.sort_values(["_frame", "_rank"], kind="stable").drop(columns=["_rank", "_frame"]) \
        .reset_index(drop=True)


def check_options(cfg: Mapping[str, Any]) -> None:
    """What needs no data: the category names and the split (at plan time, before any download)."""
    selected_categories(cfg)
    split = cfg.get("split") or "all"
    if split not in ("all", "ambig", "disambig"):
        raise ConfigError(f"benchmark.bbq.split={split!r}: must be all, ambig or disambig")


class BBQDataset(BenchmarkConfig):
    """The options of the BBQ loader."""

    categories: Optional[list[str]] = None  # the category files to read (null = all)


@register_loader("bbq", splits=("all", "ambig", "disambig"), check=check_options, options=BBQDataset,
                 file_rows=rows_by_column("category", supporting=("metadata",)))
def load(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    check_options(cfg)
    categories = selected_categories(cfg)
    split = cfg.get("split") or "all"
    for key in (*categories, "metadata"):
        if key not in files:
            raise ConfigError(f"benchmark.bbq.files has no {key!r} file (files: {sorted(files)})")
    meta_path = Path(files["metadata"])
    meta = read_metadata(meta_path)
    keys = ["category", "example_id", "question_index"]
    grouped = meta.groupby(keys, sort=False)
    targets = grouped.agg(target_loc=("target_loc", "first"), label_type=("label_type", "first"),
                          metadata_rows=("target_loc", "size"))
    n_targets = grouped["target_loc"].nunique(dropna=False)
    if (n_targets > 1).any():
        cat, eid, qi = n_targets[n_targets > 1].index[0]
        raise DataFormatError(f"{meta_path}: {cat} example {eid} (question {qi}) has rows with different "
                              f"target_loc values")
    targets = targets.reset_index()
    frames = []
    for category in categories:
        path = Path(files[category])
        # a category gives at most ``limit`` examples to the round robin: read no more
        df = pd.DataFrame(read_category(path, category, split, cfg.get("limit")))
        if df.empty:
            raise DataFormatError(f"{path}: no examples")
        dup = df.example_id.duplicated()
        if dup.any():
            raise DataFormatError(f"{path}: example_id {int(df.example_id[dup].iloc[0])} appears twice")
        df = df.merge(targets, on=["category", "example_id", "question_index"], how="left")
        df["metadata_rows"] = df["metadata_rows"].fillna(0).astype(int)
        df["label_type"] = df["label_type"].fillna("")
        frames.append(df.reset_index(drop=True))
    items = round_robin(frames, cfg.get("limit"))
    items.insert(0, "item_id", [f"bbq-{c}-{e}" for c, e in zip(items.category, items.example_id)])
    items.insert(2, "split", split)
    items["benchmark"] = "bbq"
    return items.drop(columns=["line"])


__all__ = ["load", "read_category", "read_metadata", "round_robin", "CATEGORIES", "N_EXAMPLES"]
