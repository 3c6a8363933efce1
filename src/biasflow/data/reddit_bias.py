"""RedditBias (Barikeri et al. 2021): ``reddit_comments_<dimension>_<group>_biased_test_reduced.csv`` -> items.

Each bias dimension has two parallel files: the target group's (a minoritized group: ``female``, ``black``, ``jews``,
``muslims``, ``lgbtq``) with the Reddit phrase in ``comments_processed``, and the counter-target group's (``male``,
``white``, ``christians``, ``straight``), whose row ``i`` is row ``i`` of the target file with the target words
swapped (the authors' ``DataPreparation/reddit_data_phrases_replace_target.py``: ``comments`` is the target phrase,
``comments_processed`` the swapped one, ``initial_demo``/``replaced_demo`` the words swapped). Both files are
published, so the counter-target sentences are read, not rebuilt; the loader checks that the two files are parallel.

One item per row pair: ``item_id`` ``<dimension>-<row>`` (the 0-based data row of both files), ``category`` the
dimension (``gender``, ``race``, ``religion1`` = Jews/Christians, ``religion2`` = Muslims/Christians,
``orientation``), the two sentences, the groups, and the authors' own perplexities of both sentences (the files'
``perplexity`` column, kept as ``reference_perplexity_*``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError, did_you_mean
from biasflow.registry import register_loader
from biasflow.schema import BenchmarkConfig

# dimension -> (target group, counter-target group), in the paper's order
DIMENSIONS = {"gender": ("female", "male"), "race": ("black", "white"), "religion1": ("jews", "christians"),
              "religion2": ("muslims", "christians"), "orientation": ("lgbtq", "straight")}
TARGET_COLUMNS = ("comments_processed", "perplexity")
COUNTER_COLUMNS = ("initial_demo", "replaced_demo", "comments", "comments_processed", "perplexity")


def file_key(dimension: str, group: str) -> str:
    """The key of a file in ``conf/benchmark/reddit_bias.yaml`` (e.g. ``religion1_jews``)."""
    return f"{dimension}_{group}"


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: not a readable RedditBias CSV ({exc})") from exc
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")
    return df


def _perplexity(value: str, path: Path, row: int) -> float:
    try:
        return float(value)
    except ValueError:
        raise DataFormatError(f"{path}, line {row + 2}: perplexity {value!r} is not a number") from None


def load_dimension(dimension: str, target_path: Path, counter_path: Path) -> pd.DataFrame:
    """The item pairs of one dimension; errors name the file and line (header = line 1)."""
    target_group, counter_group = DIMENSIONS[dimension]
    target, counter = _read(target_path, TARGET_COLUMNS), _read(counter_path, COUNTER_COLUMNS)
    if len(target) != len(counter):
        raise DataFormatError(f"{target_path} has {len(target)} rows but {counter_path} has {len(counter)}: "
                              f"the target and counter-target files must be parallel")
    rows = []
    for i, (t, c) in enumerate(zip(target.itertuples(index=False), counter.itertuples(index=False))):
        sentence = t.comments_processed.strip()
        if not sentence:
            raise DataFormatError(f"{target_path}, line {i + 2}: empty comments_processed")
        if not c.comments_processed.strip():
            raise DataFormatError(f"{counter_path}, line {i + 2}: empty comments_processed")
        if c.comments != t.comments_processed:
            raise DataFormatError(f"{counter_path}, line {i + 2}: its source phrase (comments) {c.comments!r} is not "
                                  f"line {i + 2} of {target_path.name} ({t.comments_processed!r}): not parallel")
        rows.append({
            "item_id": f"{dimension}-{i:03d}", "category": dimension, "source_row": i,
            "reddit_id": getattr(t, "id", "") or "",
            "target_group": target_group, "counter_group": counter_group,
            "sentence_target": t.comments_processed, "sentence_counter": c.comments_processed,
            "swapped_from": c.initial_demo, "swapped_to": c.replaced_demo,
            "reference_perplexity_target": _perplexity(t.perplexity, target_path, i),
            "reference_perplexity_counter": _perplexity(c.perplexity, counter_path, i),
        })
    return pd.DataFrame(rows)


def round_robin(frames: list[pd.DataFrame], limit: int | None) -> pd.DataFrame:
    """The first ``limit`` items taken in turn from each dimension (all of them when ``limit`` is None), in the
    dimensions' order then row order, so a small limit still covers every dimension."""
    if not frames:
        return pd.DataFrame()
    if limit is None:
        return pd.concat(frames, ignore_index=True)
    ranked = pd.concat([f.assign(_turn=range(len(f)), _dim=k) for k, f in enumerate(frames)], ignore_index=True)
    ranked = ranked.sort_values(["_turn", "_dim"], kind="stable").head(int(limit))
    return ranked.sort_values(["_dim", "_turn"], kind="stable").drop(columns=["_turn", "_dim"]).reset_index(drop=True)


def check_options(cfg: Mapping[str, Any]) -> None:
    """The category names (dimensions): checked at plan time, before any download."""
    selected = cfg.get("categories") or list(DIMENSIONS)
    unknown = [d for d in selected if d not in DIMENSIONS]
    if unknown:
        raise ConfigError(f"benchmark.reddit_bias.categories: unknown dimension(s) {unknown}"
                          f"{did_you_mean(unknown[0], DIMENSIONS)}; choose from {list(DIMENSIONS)}")


class RedditBiasDataset(BenchmarkConfig):
    """The options of the RedditBias loader."""

    categories: Optional[list[str]] = None  # the dimensions to read (null = all)


@register_loader("reddit_bias", splits=("test",), check=check_options, options=RedditBiasDataset)
def load(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    check_options(cfg)
    selected = cfg.get("categories") or list(DIMENSIONS)
    frames = []
    for dimension in DIMENSIONS:
        if dimension not in selected:
            continue
        keys = [file_key(dimension, g) for g in DIMENSIONS[dimension]]
        absent = [k for k in keys if k not in files]
        if absent:
            raise ConfigError(f"benchmark.reddit_bias.files: no file {absent} for dimension {dimension!r}")
        frames.append(load_dimension(dimension, Path(files[keys[0]]), Path(files[keys[1]])))
    items = round_robin(frames, cfg.get("limit"))
    items.insert(1, "benchmark", "reddit_bias")
    items.insert(2, "split", cfg.get("split") or "test")
    return items
