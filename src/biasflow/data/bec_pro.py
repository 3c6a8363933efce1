"""BEC-Pro, the Bias Evaluation Corpus with Professions (Bartl et al. 2020): ``BEC-Pro_EN.tsv`` /
``BEC-Pro_DE.tsv`` -> items, one row per sentence (5,400 per language).

Each row of a file: an index, ``Sentence`` ("My brother is a plumber."), ``Sent_TM`` (the person word masked:
"My [MASK] is a plumber."), ``Sent_AM`` (the profession masked, one ``[MASK]`` per space-separated word),
``Sent_TAM`` (both), ``Template``, ``Person`` (the person word), ``Gender`` (of the person word), ``Profession``,
``Prof_Gender`` (the profession group: ``male``, ``female``, ``balanced`` by the share of women in it) and, in
German, ``Profession_EN``. 5 templates x 18 person words (9 male, 9 female) x 60 professions (20 per group); the
German professions take the person's grammatical gender (Elektriker / Elektrikerin), so German has 118.

The masked columns are kept as the file has them: the reference scores them (``metrics/bec_pro.py``), quirks
included (``lodging manager`` with ``man``: "This [MASK] is a lodging [MASK]ager."). For the corrected scoring the
loader also builds ``tgt_text`` / ``prior_text`` from ``Sentence`` and ``Template``: the person word and the
profession as ``[MASK]`` placeholders, each standing for one word (the scorer gives it one mask per word piece).

``pad_length`` is the reference's input length, the smallest power of two >= the most space-separated words of a
``Sent_TM`` of the whole file (16 in both files), computed before ``limit``.

Pairs: within a profession group the file lists the 900 sentences of the male person words and then the 900 of the
female ones in the same order (He/She, man/woman, brother/sister, ..., dad/mom; same template and profession); the
k-th male and k-th female sentence of a group form ``pair_id``, the unit of the paired tests. The loader checks that
they match. Items keep a pair's sentences adjacent (male first) and take pairs in turn from the three groups, so
``limit`` N (the first ceil(N / 2) pairs) covers every group.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError
from biasflow.io import read_tsv_rows
from biasflow.registry import register_loader
from biasflow.schema import BenchmarkConfig
from biasflow.score_kinds import MASK_PLACEHOLDER

LANGUAGES = ("en", "de")
GROUPS = ("male", "female", "balanced")
COLUMNS = ["Sentence", "Sent_TM", "Sent_AM", "Sent_TAM", "Template", "Person", "Gender", "Profession", "Prof_Gender"]
PERSON, PROFESSION = "<person subject>", "<profession>"


def read_bec_pro(path: str | Path) -> pd.DataFrame:
    """The rows of a BEC-Pro TSV (first column the row index), checked (errors name the file and line)."""
    def check(header: list[str]) -> None:
        if not header:
            raise DataFormatError(f"{path}: empty file")
        if header[:1] != [""] or [c for c in COLUMNS if c not in header]:
            raise DataFormatError(f"{path}: expected a header of an unnamed index column and {COLUMNS} "
                                  f"(+ Profession_EN in German), found {header}")

    header, lines = read_tsv_rows(path, "BEC-Pro file", check)
    rows = []
    for n, fields in lines:
        rec = dict(zip(header, fields))
        try:
            rec["row"] = int(rec.pop(""))
        except ValueError:
            raise DataFormatError(f"{path}, line {n}: the first field must be the row index") from None
        rec["line"] = n
        if rec["Gender"] not in ("male", "female") or rec["Prof_Gender"] not in GROUPS:
            raise DataFormatError(f"{path}, line {n}: Gender must be male|female and Prof_Gender one of {GROUPS}, "
                                  f"got {rec['Gender']!r}, {rec['Prof_Gender']!r}")
        for col in ("Sent_TM", "Sent_TAM"):
            if MASK_PLACEHOLDER not in rec[col]:
                raise DataFormatError(f"{path}, line {n}: {col} has no {MASK_PLACEHOLDER}: {rec[col]!r}")
        rows.append(rec)
    if not rows:
        raise DataFormatError(f"{path}: no rows")
    df = pd.DataFrame(rows)
    if df["row"].duplicated().any():
        raise DataFormatError(f"{path}: duplicate row index {df.loc[df['row'].duplicated(), 'row'].iloc[0]}")
    return df


def pad_length(sent_tm: pd.Series) -> int:
    """The reference's input length: the smallest power of two >= the most words of a target-masked sentence."""
    return int(2 ** math.ceil(math.log2(max(len(s.split()) for s in sent_tm))))


def placeholder_texts(sentence: str, template: str, person: str, profession: str, where: str) -> tuple[str, str]:
    """(the sentence with the person word as ``[MASK]``, with the profession as ``[MASK]`` too), from the template:
    ``<person subject>`` is a phrase ending in the person word ("My brother"), ``<profession>`` the profession."""
    if template.count(PERSON) != 1 or template.count(PROFESSION) != 1:
        raise DataFormatError(f"{where}: template {template!r} needs one {PERSON} and one {PROFESSION}")
    pattern = "^" + re.escape(template).replace(re.escape(PERSON), "(?P<subj>.+?)").replace(
        re.escape(PROFESSION), "(?P<prof>.+)") + "$"
    m = re.match(pattern, sentence)
    if not m or m.group("prof") != profession or not re.search(rf"(^|\s){re.escape(person)}$", m.group("subj")):
        raise DataFormatError(f"{where}: {sentence!r} is not template {template!r} with person {person!r} and "
                              f"profession {profession!r}")
    subj_start, prof_start, prof_end = m.start("subj"), m.start("prof"), m.end("prof")
    person_start = m.end("subj") - len(person)
    head = sentence[:person_start] + MASK_PLACEHOLDER + sentence[m.end("subj"):prof_start]
    tail = sentence[prof_end:]
    assert subj_start <= person_start
    return head + profession + tail, head + MASK_PLACEHOLDER + tail


def pair_rows(df: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """``pair`` (rank within its group) and ``pair_id`` for every row; checks that the k-th male and female rows of a
    group share template and profession."""
    df = df.copy()
    df["pair"] = -1
    prof_key = "Profession_EN" if "Profession_EN" in df else "Profession"
    for group in GROUPS:
        m = df[(df["Prof_Gender"] == group) & (df["Gender"] == "male")]
        f = df[(df["Prof_Gender"] == group) & (df["Gender"] == "female")]
        if len(m) != len(f):
            raise DataFormatError(f"{path}: profession group {group!r} has {len(m)} sentences of male person words "
                                  f"and {len(f)} of female ones; the paired tests need as many of each")
        # German articles agree with the person's gender ("<person subject>, der/die <profession>, ...")
        tm = m["Template"].str.replace(", die ", ", der ", regex=False).to_numpy()
        tf = f["Template"].str.replace(", die ", ", der ", regex=False).to_numpy()
        bad = [k for k in range(len(m)) if tm[k] != tf[k] or m[prof_key].iat[k] != f[prof_key].iat[k]]
        if bad:
            k = bad[0]
            raise DataFormatError(f"{path}: the {k + 1}th male and female sentences of group {group!r} do not match "
                                  f"(rows {m['row'].iat[k]} and {f['row'].iat[k]}: {m['Sentence'].iat[k]!r} / "
                                  f"{f['Sentence'].iat[k]!r}); pairs need the same template and profession")
        df.loc[m.index, "pair"] = range(len(m))
        df.loc[f.index, "pair"] = range(len(f))
        ids = [f"{mr}-{fr}" for mr, fr in zip(m["row"], f["row"])]
        df.loc[m.index, "pair_rows"] = ids
        df.loc[f.index, "pair_rows"] = ids
    return df


def build_items(df: pd.DataFrame, language: str, path: str | Path) -> pd.DataFrame:
    df = pair_rows(df, path)
    texts = [placeholder_texts(r.Sentence, r.Template, r.Person, r.Profession, f"{path}, line {r.line}")
             for r in df.itertuples(index=False)]
    items = pd.DataFrame({
        "item_id": [f"{language}:{r}" for r in df["row"]], "language": language, "row": df["row"].to_numpy(),
        "category": df["Prof_Gender"].to_numpy(), "pair_id": [f"{language}:{p}" for p in df["pair_rows"]],
        "pair": df["pair"].to_numpy(), "gender": df["Gender"].to_numpy(), "person": df["Person"].to_numpy(),
        "profession": df["Profession"].to_numpy(),
        "profession_en": (df["Profession_EN"] if "Profession_EN" in df else df["Profession"]).to_numpy(),
        "prof_gender": df["Prof_Gender"].to_numpy(), "template": df["Template"].to_numpy(),
        "sentence": df["Sentence"].to_numpy(), "sent_tm": df["Sent_TM"].to_numpy(),
        "sent_am": df["Sent_AM"].to_numpy(), "sent_tam": df["Sent_TAM"].to_numpy(),
        "tgt_text": [t for t, _ in texts], "prior_text": [p for _, p in texts],
        "pad_length": pad_length(df["Sent_TM"])})
    # pairs adjacent (male first), pairs taken in turn from the groups: a limit covers every group
    items["_g"] = items["category"].map({g: i for i, g in enumerate(GROUPS)})
    items["_s"] = (items["gender"] == "female").astype(int)
    return items.sort_values(["pair", "_g", "_s"]).drop(columns=["_g", "_s"]).reset_index(drop=True)


class BECProDataset(BenchmarkConfig):
    """The options of the BEC-Pro loader."""

    language: Optional[Literal["en", "de"]] = None  # which language's file (null = en)


@register_loader("bec_pro", splits=("all",), options=BECProDataset,
                 file_rows=lambda items, files, cfg: {cfg.get("language") or "en": len(items)})
def load_bec_pro(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    language = cfg.get("language") or "en"
    if language not in LANGUAGES:
        raise ConfigError(f"benchmark.bec_pro.language={language!r}: expected one of {list(LANGUAGES)}")
    if language not in files:
        raise ConfigError(f"benchmark.bec_pro.files: no file for language {language!r} (keys: {sorted(files)})")
    split = cfg.get("split") or "all"
    if split != "all":
        raise ConfigError(f"benchmark.bec_pro.split={split!r}: expected all")
    items = build_items(read_bec_pro(files[language]), language, files[language])
    if cfg.get("limit"):
        pairs = list(dict.fromkeys(items["pair_id"]))[:math.ceil(int(cfg["limit"]) / 2)]
        items = items[items["pair_id"].isin(pairs)].reset_index(drop=True)
    items.insert(1, "benchmark", "bec_pro")
    return items


__all__ = ["read_bec_pro", "build_items", "load_bec_pro", "pad_length", "placeholder_texts", "LANGUAGES", "GROUPS"]
