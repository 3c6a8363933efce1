"""BOLD Wikipedia sentences (Dhamala et al. 2021): ``{domain}_wiki.json`` -> one row per sentence."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.io import read_text_utf8
from biasflow.errors import DataFormatError
from biasflow.registry import register_loader


def read_bold_wikipedia(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    try:
        doc = json.loads(read_text_utf8(path, "BOLD file"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: not valid JSON ({exc})") from exc
    rows = []
    for group, people in doc.items():
        if not isinstance(people, dict):
            raise DataFormatError(f"{path}: group {group!r} is not an object of name -> sentences")
        for name, sentences in people.items():
            for i, sent in enumerate(sentences):
                rows.append({"item_id": f"bold-{path.stem}-{group}-{name}-{i}", "category": group,
                             "name": name, "text": sent})
    return pd.DataFrame(rows)


def documents(paths) -> list[list[str]]:
    """One list of consecutive sentences per Wikipedia article (person or profession)."""
    docs = []
    for p in paths:
        df = read_bold_wikipedia(p)
        docs += [g["text"].tolist() for _, g in df.groupby(["category", "name"], sort=False)]
    return docs


@register_loader("bold_wikipedia", splits=("all",))
def load_bold_wikipedia(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    df = pd.concat([read_bold_wikipedia(p) for p in files.values()], ignore_index=True)
    df.insert(1, "benchmark", "bold_wikipedia")
    df.insert(2, "split", cfg.get("split", "all"))
    return df
