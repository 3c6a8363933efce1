"""LM Challenge text: BOLD Wikipedia sentences -> one row per line, split into train and test by order."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError
from biasflow.io import read_text_utf8
from biasflow.provenance import rows_by_column
from biasflow.registry import register_loader
from pydantic import Field

from biasflow.schema import BenchmarkConfig, PositiveInt


def bold_lines(path: Path) -> list[str]:
    """The sentences of one BOLD Wikipedia file, one non-empty line each, in file order."""
    try:
        doc = json.loads(read_text_utf8(path, "BOLD file"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: not valid JSON ({exc})") from exc
    out = []
    for people in doc.values():
        for sents in people.values():
            for s in sents:
                out += [line.strip() for line in s.splitlines() if line.strip()]
    return out


def split_lines(lines: list[str], test_every: int, test_limit: int | None) -> list[str]:
    """Per line: "test" for every ``test_every``-th line (the first ``test_limit`` of them), else "train" or ""
    (a test line beyond the limit is neither: it neither trains the model nor is played)."""
    if test_every < 2:
        raise ConfigError(f"test_every must be >= 2, got {test_every}")
    out, n_test = [], 0
    for i in range(len(lines)):
        if i % test_every == test_every - 1:
            n_test += 1
            out.append("test" if not test_limit or n_test <= test_limit else "")
        else:
            out.append("train")
    return out


class LMChallengeText(BenchmarkConfig):
    """The options of the LM Challenge text loader."""

    test_every: Optional[Annotated[int, Field(ge=2)]] = None  # every N-th line is a test line (null = 10)
    test_limit: Optional[PositiveInt] = None  # at most this many test lines


@register_loader("lmchallenge_text", splits=("all",), options=LMChallengeText,
                 file_rows=rows_by_column("category"))
def load_lmchallenge_text(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for key, path in sorted(files.items(), key=lambda kv: Path(kv[1]).name):  # file order fixes the split
        rows += [{"category": key, "text": line} for line in bold_lines(Path(path))]
    df = pd.DataFrame(rows)
    df["role"] = split_lines(df["text"].tolist(), int(cfg.get("test_every", 10)), cfg.get("test_limit"))
    df = df[df["role"] != ""].reset_index(drop=True)
    df.insert(0, "item_id", [f"lmc-{i}" for i in range(len(df))])
    df.insert(1, "benchmark", "lmchallenge_bold")
    df.insert(2, "split", cfg.get("split", "all"))
    return df
