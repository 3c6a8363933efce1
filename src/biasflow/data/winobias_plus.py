"""WinoBias+ (Vanmassenhove et al. 2021, "NeuTral Rewriter"): ``WinoBias+.preprocessed`` (gendered sentences) and
``WinoBias+.references`` (their gender-neutral rewrites, line by line) -> items, one per line pair (3,167).

Both files are tokenised as the authors scored them: punctuation and clitics are separate tokens (``the design .``,
``the librarian 's room``, ``didn 't``). Each item keeps the tokenised ``source`` and ``reference`` and the
``source_text`` a model reads (``detokenise(source)``: the tokens joined as ordinary English); ``tokenise`` maps a
model's rewrite back to the references' tokens, and ``tokenise(detokenise(line)) == line`` for every line of both
files (the loader checks it, so a line the round trip would change fails naming the file and line).

``category`` is the gender of the source's pronouns: ``male`` (he / him / his / himself), ``female`` (she / her /
hers / herself) or ``both`` (3 lines).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.errors import DataFormatError
from biasflow.io import read_text_utf8
from biasflow.registry import register_loader

MALE = frozenset({"he", "him", "his", "himself"})
FEMALE = frozenset({"she", "her", "hers", "herself"})
# a clitic ('s, 't, 're, ...) after a word; a comma, full stop, ... after a word, not inside a number (2,000)
_CLITIC = re.compile(r"(?<=\w)('\w+)\b")
_PUNCT = re.compile(r"(?<=\S)([.,!?;:])(?=\s|$)")
_DETOK = re.compile(r" ([.,!?;:]|'\w+\b)")
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'})


def tokenise(text: str) -> list[str]:
    """The tokens of ``text`` as WinoBias+ writes them: clitics (``'s``, ``'t``) and the punctuation that ends a
    word (``.`` ``,`` ``!`` ``?`` ``;`` ``:``) split off; curly apostrophes read as straight ones."""
    text = _CLITIC.sub(r" \1", text.translate(_QUOTES))
    return _PUNCT.sub(r" \1", text).split()


def detokenise(line: str) -> str:
    """A tokenised line as ordinary text: no space before punctuation or a clitic."""
    return _DETOK.sub(r"\1", line)


def pronoun_gender(tokens: list[str]) -> str:
    words = {t.lower() for t in tokens}
    male, female = bool(words & MALE), bool(words & FEMALE)
    return "both" if male and female else "male" if male else "female" if female else "none"


def read_lines(path: str | Path, what: str) -> list[str]:
    """The non-empty lines of a WinoBias+ file (CRLF or LF); an empty line inside the file is an error."""
    lines = read_text_utf8(path, f"WinoBias+ {what} file").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            raise DataFormatError(f"{path}, line {n}: empty line")
        if tokenise(detokenise(line)) != line.split():
            raise DataFormatError(f"{path}, line {n}: not tokenised as WinoBias+ is (the rewrite's tokens would not "
                                  f"compare with it): {line!r}")
    if not lines:
        raise DataFormatError(f"{path}: no lines")
    return lines


def file_rows(items: pd.DataFrame, files: Mapping[str, Path], cfg: Mapping[str, Any]) -> dict[str, int]:
    """Both files give every item (line i of one is line i of the other)."""
    return {key: len(items) for key in files}


@register_loader("winobias_plus", splits=("all",), file_rows=file_rows)
def load(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    sources = read_lines(files["sources"], "source")
    references = read_lines(files["references"], "reference")
    if len(sources) != len(references):
        raise DataFormatError(f"{files['sources']} has {len(sources)} lines, {files['references']} "
                              f"{len(references)}: the files must be parallel")
    genders = [pronoun_gender(s.split()) for s in sources]
    if "none" in genders:
        line = genders.index("none") + 1
        raise DataFormatError(f"{files['sources']}, line {line}: no gendered pronoun in {sources[line - 1]!r}")
    items = pd.DataFrame({
        "item_id": [f"winobias_plus:{n}" for n in range(1, len(sources) + 1)],
        "benchmark": "winobias_plus", "category": genders, "line": range(1, len(sources) + 1),
        "source": sources, "reference": references, "source_text": [detokenise(s) for s in sources],
        "reference_words": [len(r.split()) for r in references]})
    return items.head(cfg["limit"]) if cfg.get("limit") else items


__all__ = ["load", "tokenise", "detokenise", "pronoun_gender", "read_lines"]
