"""GAP (Webster et al. 2018, "Mind the GAP: A Balanced Corpus of Gendered Ambiguous Pronouns", TACL):
``gap-development.tsv``, ``gap-validation.tsv``, ``gap-test.tsv`` -> items, one row per example (2,000 / 454 / 2,000).

Each example is a Wikipedia snippet with an ambiguous pronoun and two candidate names of the same gender; the gold
labels say, for each name, whether the pronoun refers to it (``A-coref``, ``B-coref``: at most one TRUE; neither in
about 10% of the examples). The eleven columns (google-research-datasets/gap-coreference's README): ``ID``, ``Text``,
``Pronoun``, ``Pronoun-offset``, ``A``, ``A-offset``, ``A-coref``, ``B``, ``B-offset``, ``B-coref``, ``URL``; the
offsets are character offsets into ``Text``.

The gender of an example is its pronoun's, as the official scorer (``gap_scorer.py``, ``constants.PRONOUNS``) reads
it, lowercased: she / her / hers = feminine (``F``), he / his / him = masculine (``M``); reflexives are not in GAP.

Items: ``item_id`` (the ``ID``, unique over the three files: ``development-1`` ...), ``split``, ``category`` and
``gender`` (``feminine`` / ``masculine``; ``gender_code`` ``F`` / ``M``), ``text``, ``pronoun``, ``pronoun_offset``,
``a``, ``a_offset``, ``a_coref``, ``b``, ``b_offset``, ``b_coref`` (booleans), ``gold`` (``A``, ``B``, ``neither``)
and ``url``. Every row is checked: eleven fields, integer offsets at which the text has the pronoun / name written
there, TRUE / FALSE labels, a known pronoun; an error names the file and line.

``split``: ``all`` (the default: development, validation, test in that order), or one of the three. ``limit`` N:
the first N examples of that order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError
from biasflow.io import read_tsv_rows
from biasflow.provenance import rows_by_column
from biasflow.registry import register_loader

SPLITS = ("development", "validation", "test")
HEADER = ["ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref", "URL"]
# the official scorer's constants.PRONOUNS (lowercased pronoun -> gender)
PRONOUN_GENDER = {"she": "feminine", "her": "feminine", "hers": "feminine",
                  "he": "masculine", "his": "masculine", "him": "masculine"}
GENDER_CODE = {"feminine": "F", "masculine": "M"}
LABELS = {"TRUE": True, "FALSE": False}
COLUMNS = ["item_id", "split", "category", "gender", "gender_code", "text", "pronoun", "pronoun_offset", "a",
           "a_offset", "a_coref", "b", "b_offset", "b_coref", "gold", "url"]


def _offset(path, line: int, column: str, value: str, text: str, expected: str) -> int:
    try:
        at = int(value)
    except ValueError:
        raise DataFormatError(f"{path}, line {line}: {column} must be an integer character offset, got "
                              f"{value!r}") from None
    if at < 0 or text[at:at + len(expected)] != expected:
        found = text[max(at, 0):max(at, 0) + len(expected)]
        raise DataFormatError(f"{path}, line {line}: {column} {at} does not point at {expected!r} in Text (found "
                              f"{found!r})")
    return at


def _label(path, line: int, column: str, value: str) -> bool:
    if value.upper() not in LABELS:
        raise DataFormatError(f"{path}, line {line}: {column} must be TRUE or FALSE, got {value!r}")
    return LABELS[value.upper()]


def read_split(path: str | Path, split: str) -> pd.DataFrame:
    """The items of one GAP file, checked row by row."""
    def check(found: list[str]) -> None:
        if found != HEADER:
            raise DataFormatError(f"{path}: expected the header {HEADER}, found {found}")

    rows = []
    for line, fields in read_tsv_rows(path, f"GAP {split}", check)[1]:
        ex_id, text, pronoun, p_off, a, a_off, a_coref, b, b_off, b_coref, url = fields
        if not ex_id.strip():
            raise DataFormatError(f"{path}, line {line}: empty ID")
        gender = PRONOUN_GENDER.get(pronoun.lower())
        if gender is None:
            raise DataFormatError(f"{path}, line {line}: Pronoun {pronoun!r} is none of {sorted(PRONOUN_GENDER)} "
                                  f"(the official scorer's pronouns)")
        if not a.strip() or not b.strip():
            raise DataFormatError(f"{path}, line {line}: empty candidate name (A {a!r}, B {b!r})")
        row = {"item_id": ex_id, "split": split, "category": gender, "gender": gender,
               "gender_code": GENDER_CODE[gender], "text": text, "pronoun": pronoun,
               "pronoun_offset": _offset(path, line, "Pronoun-offset", p_off, text, pronoun),
               "a": a, "a_offset": _offset(path, line, "A-offset", a_off, text, a),
               "a_coref": _label(path, line, "A-coref", a_coref),
               "b": b, "b_offset": _offset(path, line, "B-offset", b_off, text, b),
               "b_coref": _label(path, line, "B-coref", b_coref), "url": url}
        if row["a_coref"] and row["b_coref"]:
            raise DataFormatError(f"{path}, line {line}: A-coref and B-coref are both TRUE (GAP marks at most one "
                                  f"name as the pronoun's antecedent)")
        row["gold"] = "A" if row["a_coref"] else "B" if row["b_coref"] else "neither"
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def load_items(files: Mapping[str, str | Path], splits: tuple[str, ...] = SPLITS) -> pd.DataFrame:
    """The examples of ``splits`` (in that order) from their files (file key = split name)."""
    missing = [s for s in splits if s not in files]
    if missing:
        raise ConfigError(f"benchmark.gap: no file for the split(s) {missing} (files: {sorted(files)})")
    items = pd.concat([read_split(files[s], s) for s in splits], ignore_index=True)
    dup = items["item_id"][items["item_id"].duplicated()]
    if len(dup):
        first = dup.iloc[0]
        where = items.loc[items["item_id"] == first, "split"].tolist()
        raise DataFormatError(f"GAP: duplicate ID {first!r} (in {where}); {len(dup)} duplicate(s) in all")
    return items


@register_loader("gap", splits=("all", *SPLITS), file_rows=rows_by_column("split"))
def load_gap(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    split = cfg.get("split") or "all"
    if split not in ("all", *SPLITS):
        raise ConfigError(f"benchmark.gap.split={split!r}: expected all, {', '.join(SPLITS)}")
    items = load_items(files, SPLITS if split == "all" else (split,))
    return items.head(int(cfg["limit"])).reset_index(drop=True) if cfg.get("limit") else items


__all__ = ["load_gap", "load_items", "read_split", "SPLITS", "HEADER", "PRONOUN_GENDER"]
