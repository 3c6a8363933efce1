"""The probability of a sentence's token at the first mask of a masked version of it, as Bartl et al. (2020)'s
BEC-Pro code computes it (``FirstMaskProbability`` requests; ``code/bias_utils/utils.py`` of
marionbartl/gender-bias-BERT: ``input_pipeline``, ``model_evaluation``, ``prob_with_prior``).

The reference encodes the masked sentence and the original with special tokens and brings every sequence to one
length, ``pad_to`` (a power of two): longer ones are cut at the end (``truncating="post"``), shorter ones filled
with *mask* tokens (``pad_sequences(value=tokenizer.mask_token_id)``), and its attention mask is ``id > 0``, so the
filling masks are attended to like words. The word read is the original's token at the first mask position of the
masked sentence (the person word's first piece: the person comes first in every BEC-Pro template), its probability
the float32 softmax there. Sequences of one length need no padding of ours, so the model sees exactly the
reference's input. The reference's ``id > 0`` rule would also hide a real token whose id is 0 (none in BERT
vocabularies, where 0 is ``[PAD]``; RoBERTa's ``<s>``); biasflow attends every token.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd
import torch

from biasflow.scoring.masked import vocabulary_scores
from biasflow.score_kinds import MASK_PLACEHOLDER


def model_ids(adapter, text: str, pad_to: int | None) -> list[int]:
    """The token ids the reference feeds the model: ``text`` cased as the model expects, ``[MASK]`` placeholders as
    the tokenizer's mask token, special tokens added, cut or filled with mask tokens to ``pad_to``."""
    tok = adapter.tokenizer
    text = adapter.normalise(text).replace(MASK_PLACEHOLDER.lower(), MASK_PLACEHOLDER)
    ids = tok(text.replace(MASK_PLACEHOLDER, tok.mask_token), add_special_tokens=True)["input_ids"]
    if pad_to is None:
        return list(ids)
    return (list(ids) + [tok.mask_token_id] * int(pad_to))[:int(pad_to)]


def read_position(adapter, text: str, original: str, pad_to: int | None) -> tuple[list[int], int, int]:
    """(the masked sequence, its first mask position, the original's token id there)."""
    ids = model_ids(adapter, text, pad_to)
    mask_id = adapter.tokenizer.mask_token_id
    if mask_id not in ids:
        raise ValueError(f"no mask token in {text!r} after encoding (cut at {pad_to} tokens?)")
    position = ids.index(mask_id)
    orig = model_ids(adapter, original, pad_to)
    if position >= len(orig):
        raise ValueError(f"the first mask of {text!r} is at token {position}, past the end of {original!r}")
    return ids, position, int(orig[position])


def first_mask_probabilities(adapter, requests: Sequence, batch_tokens: int, progress: bool = False) -> pd.DataFrame:
    found = [read_position(adapter, r.text, r.original, r.pad_to) for r in requests]
    probs = vocabulary_scores(adapter, [ids for ids, _, _ in found], [[p] for _, p, _ in found],
                              [[t] for _, _, t in found], torch.softmax, batch_tokens, progress, desc="first-mask")
    return pd.DataFrame({"position": [p for _, p, _ in found], "token_id": [t for _, _, t in found],
                         "prob": [float(m[0, 0]) for m in probs]})


def answer_first_mask_probability(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``FirstMaskProbability``: ``position``, ``token_id``, ``prob``."""
    return first_mask_probabilities(adapter, requests, budget.batch_tokens, budget.progress)


__all__ = ["answer_first_mask_probability", "first_mask_probabilities", "model_ids", "read_position"]
