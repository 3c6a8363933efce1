"""CrowS-Pairs (Nangia et al. 2020): ``crows_pairs_anonymized.csv`` -> items.

Line endings inside fields are normalised to ``\\n`` so the canonical file (LF) and the PyPI mirror (CRLF, one
field with an embedded CRLF) give identical items.
"""
from __future__ import annotations

import io

import csv
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.io import read_text_utf8
from biasflow.errors import DataFormatError
from biasflow.registry import register_loader

REQUIRED_COLUMNS = ("sent_more", "sent_less", "stereo_antistereo", "bias_type")
DIRECTIONS = ("stereo", "antistereo")
BIAS_TYPES = ("race-color", "socioeconomic", "gender", "disability", "nationality", "sexual-orientation",
              "physical-appearance", "religion", "age")


def read_crows_pairs(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    rows = []
    with io.StringIO(read_text_utf8(path, "CrowS-Pairs CSV"), newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise DataFormatError(f"{path}: missing column(s) {missing}; found {header}")
        index_col = header[0] if header and header[0] not in REQUIRED_COLUMNS else None
        for n, rec in enumerate(reader):
            line = reader.line_num
            if None in rec or any(rec.get(c) is None for c in REQUIRED_COLUMNS):
                raise DataFormatError(f"{path}, line {line}: wrong number of fields")
            rec = {k: (v.replace("\r\n", "\n").replace("\r", "\n") if isinstance(v, str) else v)
                   for k, v in rec.items()}
            direction = rec["stereo_antistereo"].strip()
            if direction not in DIRECTIONS:
                raise DataFormatError(
                    f"{path}, line {line}: stereo_antistereo={direction!r}, expected one of {DIRECTIONS}")
            bias = rec["bias_type"].strip()
            if bias not in BIAS_TYPES:
                raise DataFormatError(f"{path}, line {line}: bias_type={bias!r}, expected one of {BIAS_TYPES}")
            for col in ("sent_more", "sent_less"):
                if not rec[col].strip():
                    raise DataFormatError(f"{path}, line {line}: empty {col}")
            source_id = rec[index_col].strip() if index_col and rec[index_col].strip() else str(n)
            rows.append({"item_id": f"crows-{source_id}", "source_row": n, "category": bias,
                         "direction": direction, "sent_more": rec["sent_more"], "sent_less": rec["sent_less"]})
    if not rows:
        raise DataFormatError(f"{path}: no rows")
    df = pd.DataFrame(rows)
    dup = df["item_id"][df["item_id"].duplicated()]
    if not dup.empty:
        raise DataFormatError(f"{path}: duplicate row ids {dup.tolist()[:5]}")
    return df


@register_loader("crows_pairs", splits=("all",))
def load_crows_pairs(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    df = read_crows_pairs(files["csv"])
    df.insert(1, "benchmark", "crows_pairs")
    df.insert(2, "split", cfg.get("split", "all"))
    return df
