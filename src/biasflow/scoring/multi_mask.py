"""Log-probabilities of a word's pieces at masks of a sentence with several masks (LPBS, CBS).

Answers ``MultiMaskLogprobs`` (``interface.requests``): a sentence whose ``[MASK]`` placeholders each stand for a
word, and which word's pieces to read where. The model's tokenizer does the counting: every placeholder becomes one
mask per word piece of its word (the word as it appears mid-sentence, after a space), the text is normalised as the
model wants it (an uncased model lowercases it) and encoded with special tokens; the read positions follow the
request's rule (``read_positions``). One forward pass gives the ``len(positions) x len(pieces)`` matrix of
log-softmax values, stored flattened (row-major) so the metric decides how to combine them (product over a word's
pieces at their own positions, or Ahn & Oh's product over every piece at every target position) without re-running
the model. Positions index the tokenised text *with* special tokens.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS, Budget
from biasflow.scoring.fill_mask import MASK_PLACEHOLDER
from biasflow.scoring.masked import vocabulary_scores


def model_text(tokenizer, text: str) -> str:
    return text.replace(MASK_PLACEHOLDER, tokenizer.mask_token)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(model_text(tokenizer, text), add_special_tokens=True)["input_ids"]


def word_pieces(tokenizer, word: str) -> list[int]:
    """Vocabulary ids of ``word`` as it appears mid-sentence (after a space), without special tokens."""
    ids = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
    return ids or tokenizer(word, add_special_tokens=False)["input_ids"]


def read_positions(ids: Sequence[int], mask_id: int, counts: Sequence[int], target: int, rule: str) -> list[int]:
    """Token positions the target's pieces are read at, in a sentence whose masks are ``counts[i]`` masks for
    placeholder i, in order: ``aligned`` = the target placeholder's masks; ``reference`` = Ahn & Oh's
    ``find_mask_token(last=True)``: a target after the first placeholder is read from the sentence's second mask
    token on (off target when the first placeholder has several masks)."""
    mpos = [i for i, t in enumerate(ids) if t == mask_id]
    if len(mpos) != sum(counts):
        raise ValueError(f"expected {sum(counts)} masks, found {len(mpos)}")
    n = counts[target]
    if target == 0 or rule == "aligned":
        start = sum(counts[:target])
        return mpos[start:start + n]
    return list(range(mpos[1], mpos[1] + n))


def expand(adapter, request, pieces_of: Callable[[str], list[int]] | None = None,
           encode_text: Callable[[str], list[int]] | None = None) -> tuple[str, list[int], list[int]]:
    """The model's text of a ``MultiMaskLogprobs`` request, its read positions and the target's piece ids.
    ``pieces_of`` (word -> piece ids) and ``encode_text`` (text -> ids) may be memoised versions of the tokenizer's."""
    tok = adapter.tokenizer
    pieces_of = pieces_of or (lambda word: word_pieces(tok, adapter.normalise(word)))
    encode_text = encode_text or (lambda text: encode(tok, text))
    pieces = []
    for word in request.words:
        ids = pieces_of(word)
        if not ids:
            raise ValueError(f"word {word!r} of multi-mask request {request.text!r} has no word pieces")
        pieces.append(list(ids))
    parts = request.text.split(MASK_PLACEHOLDER)
    filled = parts[0] + "".join(" ".join([MASK_PLACEHOLDER] * len(p)) + rest for p, rest in zip(pieces, parts[1:]))
    # an uncased model lowercases the placeholders too: restore them
    text = adapter.normalise(filled).replace(MASK_PLACEHOLDER.lower(), MASK_PLACEHOLDER)
    positions = read_positions(encode_text(text), tok.mask_token_id, [len(p) for p in pieces], request.target,
                               request.position_rule)
    return text, positions, pieces[request.target]


def logprob_matrices(adapter, texts: Sequence[str], positions: Sequence[Sequence[int]],
                     token_ids: Sequence[Sequence[int]], batch_tokens: int = DEFAULT_BATCH_TOKENS,
                     progress: bool = False) -> list[np.ndarray]:
    """The ``len(positions[i]) x len(token_ids[i])`` log-softmax matrix of each text (identical texts run once)."""
    encoded = {t: encode(adapter.tokenizer, t) for t in dict.fromkeys(texts)}
    return vocabulary_scores(adapter, [encoded[t] for t in texts], positions, token_ids, torch.log_softmax,
                             batch_tokens, progress, desc="multi-mask")


def answer_multi_mask(adapter, requests, budget: Budget) -> pd.DataFrame:
    """Answerer of ``MultiMaskLogprobs``: positions, token_ids (the target's pieces), logprobs (flattened)."""
    tok = adapter.tokenizer
    # CBS asks tens of thousands of questions about a few hundred words and templates: tokenize each once
    pieces_of = lru_cache(maxsize=None)(lambda word: tuple(word_pieces(tok, adapter.normalise(word))))
    encode_text = lru_cache(maxsize=None)(lambda text: encode(tok, text))
    texts, positions, pieces = zip(*[expand(adapter, r, pieces_of, encode_text) for r in requests])
    mats = vocabulary_scores(adapter, [encode_text(t) for t in texts], positions, pieces, torch.log_softmax,
                             budget.batch_tokens, budget.progress, desc="multi-mask")
    return pd.DataFrame({"positions": [list(map(int, p)) for p in positions],
                         "token_ids": [list(map(int, i)) for i in pieces],
                         "logprobs": [m.reshape(-1).tolist() for m in mats]})


__all__ = ["answer_multi_mask", "logprob_matrices", "read_positions", "expand", "word_pieces", "encode"]
