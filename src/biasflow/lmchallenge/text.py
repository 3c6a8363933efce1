"""Tokenisation and test-text input shared by the games and the word models.

Word tokenizers (``WORD_TOKENIZERS``; whitespace separates tokens and is never a token):

* ``lmchallenge`` (default) -- LM Challenge 5.2's ``WORD_TOKENIZER`` (``lmchallenge/core/common.py``): a single
  emoji; or a run of letters, digits, connector and dash punctuation and ``'@#``; or a run of punctuation and
  symbols (``'``, ``-``, ``@``, ``#`` included, so ``.-`` and ``,'`` are one token). A character in none of these
  (a combining mark, a format character such as ZWJ or the soft hyphen, a variation selector) belongs to no token:
  ``cafe\u0301`` gives ``cafe``, and Devanagari loses its vowel signs. Emoji are the Unicode ``Emoji`` code points
  except the keycap bases ``#*0-9`` and the regional indicators -- the single code points that emoji 0.4.5 (LM
  Challenge 5.2's dependency) matched; like it, a modifier or a ZWJ sequence is not joined to its emoji. One
  deliberate difference: emoji newer than LM Challenge's Unicode tables (e.g. U+1F970) are emoji tokens here,
  where the original drops them as unassigned characters.
* ``lossless`` -- every non-space character belongs to a token: a run of word characters (letters with their
  combining marks, digits, connector and dash punctuation, ``'@#``) or a run of everything else (punctuation,
  symbols, emoji with their modifiers and joiners, format characters), so ``.-born`` gives ``.`` and ``-born``.
  Better for scripts written with combining marks (``\u0939\u093f\u0928\u094d\u0926\u0940`` stays one word)
  and for decomposed (NFD) text. This is biasflow's earlier tokenizer, except that it split combining marks off
  their letters.

The character tokenizer makes every character (spaces included) a token.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import regex

_LMC_EMOJI = r"[\p{Emoji}--[#*0-9\p{Regional_Indicator}]]"
_LOSSLESS_WORD = r"\p{L}\p{M}\p{N}\p{Pc}\p{Pd}'@#"
WORD_TOKENIZERS: dict[str, regex.Pattern] = {
    "lmchallenge": regex.compile(rf"{_LMC_EMOJI}|[\p{{L}}\p{{N}}\p{{Pc}}\p{{Pd}}'@#]+|[\p{{P}}\p{{S}}]+", regex.V1),
    "lossless": regex.compile(rf"[{_LOSSLESS_WORD}]+|[^{_LOSSLESS_WORD}\s]+", regex.V1),
}
DEFAULT_WORD_TOKENIZER = "lmchallenge"
WORD_TOKENIZER = WORD_TOKENIZERS[DEFAULT_WORD_TOKENIZER]
CHARACTER_TOKENIZER = re.compile(r".|\n", re.DOTALL)


def word_tokenizer(name: str = DEFAULT_WORD_TOKENIZER) -> regex.Pattern:
    """The word tokenizer called ``name`` (see the module docstring)."""
    try:
        return WORD_TOKENIZERS[name]
    except KeyError:
        raise ValueError(f"unknown word tokenizer {name!r} (expected one of {', '.join(WORD_TOKENIZERS)})") from None


@dataclass(frozen=True)
class Token:
    index: int  # token index within the message
    character: int  # offset of the token's first character within the message
    target: str


def find_tokens(text: str, tokenizer: re.Pattern = WORD_TOKENIZER) -> list[Token]:
    return [Token(i, m.start(), m.group()) for i, m in enumerate(tokenizer.finditer(text))]


def split_context(context: str, tokenizer: re.Pattern = WORD_TOKENIZER) -> tuple[list[str], str]:
    """Split an untokenised context into (complete tokens, in-progress prefix).

    A token touching the end of the context is still being typed (LM Challenge's convention), so
    ``"I like bi"`` -> (["I", "like"], "bi") and ``"I like "`` -> (["I", "like"], "").
    """
    matches = list(tokenizer.finditer(context))
    if matches and matches[-1].end() == len(context):
        return [m.group() for m in matches[:-1]], matches[-1].group()
    return [m.group() for m in matches], ""


@dataclass(frozen=True)
class Message:
    user: str | None
    text: str
    timestamp: float | None = None


def read_messages(lines: Iterable[str], fmt: str = "auto", source: str = "<input>") -> Iterator[Message]:
    """Parse test text: plain lines, or JSON lines ``{"user"|"userId", "timestamp", "text"}``.

    ``fmt='auto'`` decides from the first non-empty line (a JSON object with a "text" key means JSON lines).
    Tabs become spaces: the model protocol reserves the tab character.
    """
    if fmt not in ("auto", "text", "json"):
        raise ValueError(f"unknown input format {fmt!r} (expected auto, text or json)")
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if fmt == "auto":
            fmt = "json" if _looks_like_json(line) else "text"
        if fmt == "text":
            yield Message(None, line.replace("\t", " "))
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise ValueError(f"{source}:{lineno}: expected a JSON object with a string field 'text'")
        user = obj.get("user", obj.get("userId"))
        yield Message(None if user is None else str(user), obj["text"].replace("\t", " "), obj.get("timestamp"))


def _looks_like_json(line: str) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "text" in obj
