"""WinoBias (Zhao et al. 2018): ``{pro,anti}_stereotyped_type{1,2}.txt.{dev,test}`` -> items.

A line looks like ``12 [The developer] argued with the designer because [he] did not like the design.``: a source
number, then the sentence with bracketed spans. The first span is the antecedent (an occupation), the last span is
the pronoun that refers to it; 87 of the 3,168 lines have a third span (a second pronoun in the middle, e.g.
``... because [she] needed to cut [her] hair.``), which stays in the sentence unmasked.

Each item carries the sentence without brackets, the antecedent, the pronoun with its character offsets, the
sentence with the pronoun replaced by ``[MASK]`` and the male/female pronoun pair the fill-mask test compares.

``her`` is ambiguous (object ``him`` vs possessive ``his``). The pro- and anti-stereotyped files are parallel (line
``i`` of one is line ``i`` of the other with the pronoun's gender swapped), so the counterpart pronoun of the
parallel line decides (``pronoun_pair_source = "parallel"``); when that line is missing or does not swap the pronoun
(5 of 3,168 lines are not exactly parallel), a rule on the next word decides (``"rule"``): ``her`` followed by
punctuation, the end of the sentence or a function word is ``him``, otherwise ``his``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from biasflow.io import read_text_utf8
from biasflow.errors import ConfigError, DataFormatError
from biasflow.registry import register_loader
from biasflow.score_kinds import MASK_PLACEHOLDER

FILE_RE = re.compile(r"^(pro|anti)_stereotyped_type([12])\.txt\.(dev|test)$")
SPAN_RE = re.compile(r"\[([^\[\]]*)\]")
LINE_RE = re.compile(r"^\s*(\d+)\s+(.*\S)\s*$")
SPLITS = ("dev", "test")

# pronoun -> its gender and its opposite-gender form (her's counterpart is decided per line)
MALE = {"he": "she", "him": "her", "his": "her", "himself": "herself"}
FEMALE = {"she": "he", "hers": "his", "herself": "himself"}
# after object "her" (him) rather than possessive "her" (his)
OBJECT_FOLLOWERS = frozenset(
    "a an the to that about for with and if how what when where why whether in on of at from as because so but "
    "some up out into back again by not never all many more less lots one nothing it well over off down too".split())


def file_key(name: str) -> tuple[str, int, str]:
    """(stereotype, type, split) from a WinoBias file name, e.g. anti_stereotyped_type2.txt.dev."""
    m = FILE_RE.match(Path(name).name)
    if not m:
        raise DataFormatError(f"{name}: not a WinoBias file name ({{pro,anti}}_stereotyped_type{{1,2}}.txt.{{dev,test}})")
    return m.group(1), int(m.group(2)), m.group(3)


def parse_line(line: str, where: str) -> dict[str, Any]:
    """One WinoBias line -> sentence without brackets, antecedent, pronoun and its offsets. ``where`` names the
    file and line in errors."""
    m = LINE_RE.match(line)
    if not m:
        raise DataFormatError(f"{where}: expected '<number> <sentence with [bracketed] spans>', got {line!r}")
    source_id, text = m.group(1), m.group(2)
    spans = list(SPAN_RE.finditer(text))
    if len(spans) < 2:
        raise DataFormatError(f"{where}: expected at least 2 [bracketed] spans (antecedent, pronoun), "
                              f"found {len(spans)} in {line!r}")
    if text.count("[") != len(spans) or text.count("]") != len(spans):
        raise DataFormatError(f"{where}: unbalanced brackets in {line!r}")
    # rebuild the sentence without brackets, tracking where each span lands
    out, pos, offsets = [], 0, []
    cursor = 0
    for s in spans:
        out.append(text[pos:s.start()])
        cursor += s.start() - pos
        inner = s.group(1).strip()
        lead = len(s.group(1)) - len(s.group(1).lstrip())  # "[ physician]" keeps its space outside the span
        out.append(s.group(1))
        offsets.append((cursor + lead, cursor + lead + len(inner)))
        cursor += len(s.group(1))
        pos = s.end()
    out.append(text[pos:])
    sentence = "".join(out)
    antecedent = spans[0].group(1).strip()
    pronoun = spans[-1].group(1).strip()
    start, end = offsets[-1]
    assert sentence[start:end] == pronoun
    if pronoun.lower() not in MALE and pronoun.lower() not in FEMALE and pronoun.lower() != "her":
        raise DataFormatError(f"{where}: last span {pronoun!r} is not a gendered pronoun")
    return {"source_id": int(source_id), "sentence": sentence, "antecedent": antecedent, "pronoun": pronoun,
            "pronoun_start": start, "pronoun_end": end, "n_spans": len(spans),
            "masked_sentence": sentence[:start] + MASK_PLACEHOLDER + sentence[end:]}


def her_by_rule(sentence: str, end: int) -> str:
    """'him' or 'his' for an ambiguous 'her' from the word that follows it."""
    rest = sentence[end:].split()
    nxt = rest[0] if rest else ""
    if not nxt or not nxt[0].isalnum() or nxt.lower().strip(".,;:!?'\"") in OBJECT_FOLLOWERS:
        return "him"
    return "his"


def pronoun_pair(pronoun: str, counterpart: str | None, sentence: str, end: int) -> tuple[str, str, str]:
    """(male form, female form, how it was decided) for the pronoun of one line."""
    p = pronoun.lower()
    if p in MALE:
        return p, MALE[p], "lexicon"
    if p in FEMALE:
        return FEMALE[p], p, "lexicon"
    # p == "her"
    if counterpart is not None and counterpart.lower() in ("his", "him"):
        return counterpart.lower(), "her", "parallel"
    return her_by_rule(sentence, end), "her", "rule"


def read_winobias_file(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    stereotype, wtype, split = file_key(path.name)
    rows = []
    if True:  # one decode step that names the file on bad bytes
        for n, raw in enumerate(read_text_utf8(path, "WinoBias file").splitlines(), start=1):
            if not raw.strip():
                continue
            rec = parse_line(raw, f"{path}, line {n}")
            rows.append({"line": n, "stereotype": stereotype, "type": wtype, "split": split, **rec})
    if not rows:
        raise DataFormatError(f"{path}: no lines")
    return pd.DataFrame(rows)


def build_items(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    df = pd.concat(list(frames), ignore_index=True)
    other = {"pro": "anti", "anti": "pro"}
    by_key = {(r.stereotype, r.type, r.split, r.line): r.pronoun for r in df.itertuples(index=False)}
    pairs = [pronoun_pair(r.pronoun, by_key.get((other[r.stereotype], r.type, r.split, r.line)), r.sentence,
                          r.pronoun_end) for r in df.itertuples(index=False)]
    df["pronoun_male"] = [p[0] for p in pairs]
    df["pronoun_female"] = [p[1] for p in pairs]
    df["pronoun_pair_source"] = [p[2] for p in pairs]
    df["pronoun_gender"] = ["female" if p.lower() in ("she", "her", "hers", "herself") else "male"
                            for p in df["pronoun"]]
    df["category"] = [f"type{t}_{s}" for t, s in zip(df["type"], df["stereotype"])]
    df["item_id"] = [f"{s}_stereotyped_type{t}.{sp}:{ln}" for s, t, sp, ln in
                     zip(df["stereotype"], df["type"], df["split"], df["line"])]
    # pro and anti versions of one sentence side by side, so `limit` keeps both
    df["_s"] = df["stereotype"].map({"pro": 0, "anti": 1})
    df = df.sort_values(["split", "type", "line", "_s"]).drop(columns="_s").reset_index(drop=True)
    cols = ["item_id", "split", "stereotype", "type", "category", "line", "source_id", "sentence", "antecedent",
            "pronoun", "pronoun_start", "pronoun_end", "pronoun_gender", "pronoun_male", "pronoun_female",
            "pronoun_pair_source", "n_spans", "masked_sentence"]
    return df[cols]


def file_rows(items: pd.DataFrame, files: Mapping[str, Path], cfg: Mapping[str, Any]) -> dict[str, int]:
    """The items of each file (one per non-empty line of it that ``limit`` kept), by the file its item id names;
    the files of the split not chosen are not read."""
    key_of = {Path(p).name: key for key, p in files.items()}
    names = [f"{s}_stereotyped_type{t}.txt.{sp}" for s, t, sp in zip(items["stereotype"], items["type"], items["split"])]
    return {key_of[name]: n for name, n in pd.Series(names, dtype=object).value_counts(sort=False).items()}


@register_loader("winobias", splits=("dev", "test", "all"), file_rows=file_rows)
def load_winobias(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    split = cfg.get("split", "test")
    wanted = SPLITS if split == "all" else (split,)
    if any(s not in SPLITS for s in wanted):
        raise ConfigError(f"benchmark.winobias.split={split!r}: expected dev, test or all")
    chosen = [Path(p) for p in files.values() if file_key(Path(p).name)[2] in wanted]
    if not chosen:
        raise ConfigError(f"benchmark.winobias: no configured file is of split {split!r}; files: {list(files.values())}")
    items = build_items(read_winobias_file(p) for p in chosen)
    items.insert(1, "benchmark", "winobias")
    return items


__all__ = ["read_winobias_file", "parse_line", "build_items", "load_winobias", "pronoun_pair", "her_by_rule"]
