"""StereoSet (Nadeem et al. 2021): ``dev.json`` (StereoSet repository) or bias-bench's ``test.json`` -> items.

One row per (example, sentence): ``item_id`` is the sentence id (the ids a StereoSet predictions file uses),
``example_id`` the id of the example the three sentences belong to. ``candidate_word`` is the word the
intrasentence blank-fill scorer scores (empty for intersentence rows), computed exactly as the reference
``dataloader.py`` does: the context is split on single spaces, the index of the LAST token containing "BLANK" is
taken, the sentence is split on single spaces and its token at that index, with every ASCII punctuation character
removed, is the candidate.
"""
from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.io import read_text_utf8
from biasflow.errors import DataFormatError
from biasflow.registry import register_loader

TASKS = ("intrasentence", "intersentence")
DOMAINS = ("gender", "profession", "race", "religion")
GOLD_LABELS = ("stereotype", "anti-stereotype", "unrelated")
_PUNCT_TABLE = str.maketrans("", "", string.punctuation)

COLUMNS = ["item_id", "benchmark", "split", "category", "task", "example_id", "domain", "target", "context",
           "sentence", "gold_label", "candidate_word"]


def blank_index(context: str) -> int | None:
    """Index of the last single-space token of ``context`` that contains "BLANK" (the reference keeps the last)."""
    found = None
    for i, word in enumerate(context.split(" ")):
        if "BLANK" in word:
            found = i
    return found


def candidate_word(context: str, sentence: str) -> str:
    """The intrasentence candidate: the sentence's token at the BLANK index, ASCII punctuation stripped."""
    idx = blank_index(context)
    if idx is None:
        raise ValueError(f"context has no BLANK: {context!r}")
    words = sentence.split(" ")
    if idx >= len(words):
        raise ValueError(f"sentence {sentence!r} has no word at the BLANK index {idx} of {context!r}")
    return words[idx].translate(_PUNCT_TABLE)


def read_stereoset(path: str | Path, split: str = "dev") -> pd.DataFrame:
    """Parse a StereoSet JSON file into sentence rows; validate every example (labels, BLANK, ids)."""
    path = Path(path)
    try:
        doc = json.loads(read_text_utf8(path, "StereoSet file"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: not valid JSON ({exc})") from exc
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or not any(t in data for t in TASKS):
        raise DataFormatError(f"{path}: expected {{'data': {{'intrasentence': [...], 'intersentence': [...]}}}}")
    rows: list[dict[str, Any]] = []
    for task in TASKS:
        for n, ex in enumerate(data.get(task, [])):
            ex_id = ex.get("id") or f"<{task} example #{n}>"
            where = f"{path}: {task} example {ex_id}"
            for key in ("id", "target", "bias_type", "context", "sentences"):
                if key not in ex:
                    raise DataFormatError(f"{where}: missing field {key!r}")
            sentences = ex["sentences"]
            labels = [s.get("gold_label") for s in sentences]
            bad = [lab for lab in labels if lab not in GOLD_LABELS]
            if bad:
                raise DataFormatError(f"{where}: gold_label {bad[0]!r} is not one of {GOLD_LABELS}")
            missing = [lab for lab in GOLD_LABELS if lab not in labels]
            doubled = sorted({lab for lab in labels if labels.count(lab) > 1})
            if missing or doubled:
                problem = "; ".join(filter(None, [f"missing label(s) {missing}" if missing else "",
                                                  f"label(s) {doubled} appear more than once" if doubled else ""]))
                raise DataFormatError(f"{where}: {problem}; each example needs exactly one "
                                      f"stereotype, one anti-stereotype and one unrelated sentence")
            if task == "intrasentence" and blank_index(ex["context"]) is None:
                raise DataFormatError(f"{where}: intrasentence context has no BLANK: {ex['context']!r}")
            for s in sentences:
                if "id" not in s or "sentence" not in s:
                    raise DataFormatError(f"{where}: a sentence lacks 'id' or 'sentence'")
                word = ""
                if task == "intrasentence":
                    try:
                        word = candidate_word(ex["context"], s["sentence"])
                    except ValueError as exc:
                        raise DataFormatError(f"{where}, sentence {s['id']}: {exc}") from exc
                    if not word:
                        raise DataFormatError(f"{where}, sentence {s['id']}: the candidate word is empty "
                                              f"after stripping punctuation")
                rows.append({"item_id": s["id"], "benchmark": "stereoset", "split": split,
                             "category": ex["bias_type"], "task": task, "example_id": ex["id"],
                             "domain": ex["bias_type"], "target": ex["target"], "context": ex["context"],
                             "sentence": s["sentence"], "gold_label": s["gold_label"], "candidate_word": word})
    if not rows:
        raise DataFormatError(f"{path}: no examples")
    df = pd.DataFrame(rows, columns=COLUMNS)
    dup = df["item_id"][df["item_id"].duplicated()]
    if not dup.empty:
        raise DataFormatError(f"{path}: duplicate sentence ids {sorted(set(dup))[:5]}")
    return df


def chosen_file(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> str:
    """The key of the one file ``cfg.split`` reads (the file of that split, or the only file)."""
    split = str(cfg.get("split", "dev"))
    if split in files:
        return split
    if len(files) == 1:
        return next(iter(files))
    raise DataFormatError(f"benchmark.stereoset.split={split!r}: no such file; have {sorted(files)}")


def file_rows(items: pd.DataFrame, files: Mapping[str, Path], cfg: Mapping[str, Any]) -> dict[str, int]:
    """Every item comes from the file of the chosen split; the other split's file is not read."""
    return {chosen_file(files, cfg): len(items)}


@register_loader("stereoset", splits=("dev", "test"), file_rows=file_rows)
def load_stereoset(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    """``files`` maps a split name (``dev``/``test``) to its JSON; ``cfg.split`` picks one."""
    return read_stereoset(files[chosen_file(files, cfg)], split=str(cfg.get("split", "dev")))
