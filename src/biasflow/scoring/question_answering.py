"""Start and end probabilities of answer spans from an extractive QA model: the answerer of ``SpanProbability``.

The question and the context are encoded as the tokenizer encodes a pair (question first, as the SQuAD models were
trained and as UnQover's ``qa_hf/predict.py`` feeds them); the start and end logits of every real position (special
and question tokens included, padding not) go through a softmax, as the authors' (their softmax is over the whole
row). A character span maps to tokens by the fast tokenizer's ``offset_mapping``. Nothing is truncated: an input
longer than the model takes is an error naming the question and context. Batched by token budget in canonical
widths (``scoring/batching.py``); the padding is masked out of the softmax, so an answer does not depend on the
batch it was computed in.
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

import pandas as pd
import torch

from biasflow.errors import ConfigError, DataFormatError
from biasflow.scoring.batching import pad_right, token_budget_batches

DEFAULT_BATCH_SIZE = 32


def model_max_length(model: Any, tokenizer: Any, configured: int | None = None) -> int:
    """The longest input the model takes: ``model.max_length`` if set, else the smaller of the tokenizer's
    ``model_max_length`` and the model's position embeddings (RoBERTa's 514 include two offsets, its tokenizer says
    512; a tiny test model has fewer positions than its borrowed tokenizer says). A ``model.max_length`` past the
    position embeddings is an error (the forward pass would fail on the first longer input)."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if configured:
        if positions and int(configured) > int(positions):
            raise ConfigError(f"model.max_length={configured} is more than the model's {positions} position "
                              f"embeddings: it cannot read longer inputs; leave model.max_length unset")
        return int(configured)
    limits = [int(tokenizer.model_max_length)] if int(tokenizer.model_max_length) < 10 ** 8 else []
    if positions:
        limits.append(int(positions))
    return min(limits) if limits else 512


def _where(question: str, context: str) -> str:
    short = context if len(context) <= 120 else context[:117] + "..."
    return f"question {question!r} on context {short!r}"


def encode(tokenizer: Any, question: str, context: str, spans: Sequence[tuple[int, int]], max_length: int):
    """(input ids, token type ids or None, [(start token, end token)] per span) of one request. The span's start
    token is the context token whose offsets hold character a, its end token the one holding character b - 1."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataFormatError(f"question answering needs a fast tokenizer (offset mapping); "
                              f"{type(tokenizer).__name__} is not one")
    enc = tokenizer(question, context, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    if len(ids) > max_length:
        raise DataFormatError(f"{_where(question, context)} is {len(ids)} tokens, longer than the model's "
                              f"{max_length}: not truncated (the answer could be cut off); shorten the context or "
                              f"set model.max_length if the model takes more")
    seq = enc.sequence_ids()
    char_to_token: dict[int, int] = {}
    for t, ((a, b), s) in enumerate(zip(enc["offset_mapping"], seq)):
        if s == 1:
            for c in range(a, b):
                char_to_token.setdefault(c, t)
    out = []
    for a, b in spans:
        first, last = char_to_token.get(a), char_to_token.get(b - 1)
        if first is None or last is None:
            raise DataFormatError(f"{_where(question, context)}: the span {context[a:b]!r} ({a}, {b}) does not begin "
                                  f"and end on a token (a space or a character the tokenizer drops)")
        out.append((first, last))
    types = list(enc["token_type_ids"]) if "token_type_ids" in enc else None
    return ids, types, out


def span_probabilities(model: Any, tokenizer: Any, requests: Sequence[Any], batch_tokens: int,
                       max_batch: int = DEFAULT_BATCH_SIZE, max_length: int | None = None
                       ) -> list[tuple[list[float], list[float]]]:
    """Per request, the P(start) and P(end) of each of its spans (``SpanProbability``)."""
    device = next(model.parameters()).device
    limit = model_max_length(model, tokenizer, max_length)
    encoded = [encode(tokenizer, r.question, r.context, r.spans, limit) for r in requests]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    # segment ids where the tokenizer gives them and the model takes them (DistilBERT's forward has none, whatever
    # tokenizer a local folder holds)
    types_taken = "token_type_ids" in inspect.signature(model.forward).parameters
    out: list[tuple[list[float], list[float]]] = [([], [])] * len(requests)
    model.eval()
    for batch in token_budget_batches(list(range(len(encoded))), [len(e[0]) for e in encoded], batch_tokens,
                                      max_batch):
        ids, attn = pad_right([encoded[i][0] for i in batch], pad_id)
        extra = {}
        if types_taken and encoded[batch[0]][1] is not None:
            extra["token_type_ids"] = pad_right([encoded[i][1] for i in batch], 0)[0].to(device)
        with torch.no_grad():
            res = model(input_ids=ids.to(device), attention_mask=attn.to(device), **extra)
        mask = attn.to(device) == 0
        # padding is no answer: left out of the softmax, so a row's numbers do not depend on its batch's width
        p_start = res.start_logits.float().masked_fill(mask, float("-inf")).softmax(-1).cpu().numpy()
        p_end = res.end_logits.float().masked_fill(mask, float("-inf")).softmax(-1).cpu().numpy()
        for row, i in enumerate(batch):
            tokens = encoded[i][2]
            out[i] = ([float(p_start[row, s]) for s, _ in tokens], [float(p_end[row, e]) for _, e in tokens])
    return out


def answer_span_probability(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``SpanProbability`` (model kind ``question_answering``): ``start`` and ``end``, one per span; at
    most ``model.batch_size`` inputs (default 32) and ``batch_tokens`` tokens per forward pass."""
    # model.lowercase: only where lower-casing keeps every character's position (the spans are character offsets)
    def norm_text(t: str) -> str:
        low = adapter.normalise(t)
        return low if len(low) == len(t) else t

    norm = [type(r)(norm_text(r.question), norm_text(r.context), r.spans) for r in requests]
    probs = span_probabilities(adapter.model, adapter.tokenizer, norm, budget.batch_tokens,
                               max_batch=int(adapter.opts.batch_size or DEFAULT_BATCH_SIZE),
                               max_length=adapter.opts.max_length)
    return pd.DataFrame({"start": [s for s, _ in probs], "end": [e for _, e in probs]})
