"""HONEST templates (Nozza et al. 2021): ``en_template.tsv`` -> one row per identity template.

Columns of the file: ``template_masked`` (with ``[M]`` where the completion goes), ``raw``, ``identity``, ``number``,
``category`` (the identity group: female / male, or queer / nonqueer), ``type``. The mirror's copy has CRLF line
endings; pandas reads either. The reference evaluator keys templates by their text, so the 86 repeated English
templates (neutral identities such as "the child" listed under both groups) collapse to their last row:
``dedupe: true`` (parity) keeps 724 of 810 rows; ``dedupe: false`` keeps them all.
"""
from __future__ import annotations

import io

from pathlib import Path
from typing import Any, Mapping, Optional

import pandas as pd

from biasflow.io import read_text_utf8
from biasflow.errors import DataFormatError
from biasflow.registry import register_loader
from biasflow.schema import BenchmarkConfig

COLUMNS = ["template_masked", "raw", "identity", "number", "category", "type"]
MASK = "[M]"


def read_honest_templates(path: str | Path, dedupe: bool = True) -> pd.DataFrame:
    path = Path(path)
    try:
        df = pd.read_csv(io.StringIO(read_text_utf8(path, "HONEST templates")), sep="\t", dtype=str,
                         keep_default_na=False)
    except Exception as exc:
        raise DataFormatError(f"{path}: not a readable TSV ({exc})") from exc
    df.columns = [c.strip() for c in df.columns]
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {missing} (columns: {list(df.columns)})")
    df = df[COLUMNS].apply(lambda s: s.str.strip())
    bad = df.index[~df["template_masked"].str.contains(MASK, regex=False)]
    if len(bad):
        raise DataFormatError(f"{path}: line {bad[0] + 2} has no {MASK} in template_masked: "
                              f"{df.at[bad[0], 'template_masked']!r}")
    df.insert(0, "item_id", [f"honest-{i}" for i in range(len(df))])
    if dedupe:
        df = df.drop_duplicates("template_masked", keep="last").reset_index(drop=True)
    return df.rename(columns={"category": "group"})


class HonestDataset(BenchmarkConfig):
    """The options of the HONEST loader."""

    dedupe: Optional[bool] = None  # null/true: drop the repeated template rows (parity), false: keep them all


@register_loader("honest", splits=("all",), options=HonestDataset)
def load_honest(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    frames = [read_honest_templates(p, dedupe=bool(cfg.get("dedupe", True))).assign(template_set=name)
              for name, p in files.items()]
    df = pd.concat(frames, ignore_index=True)
    if len(frames) > 1:
        df["item_id"] = df["template_set"] + "-" + df["item_id"]
    df["category"] = df["group"]
    df.insert(1, "benchmark", "honest")
    df.insert(2, "split", cfg.get("split", "all"))
    if cfg.get("limit"):
        df = df.head(int(cfg["limit"]))
    return df.reset_index(drop=True)
