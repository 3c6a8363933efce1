"""Class probabilities of texts from a text-classification model: the answerer of ``Classification`` requests.

Texts are batched by token budget in canonical widths (``scoring/batching.py``): up to 31 tokens a text is never
padded, and its probabilities do not depend on which other texts were classified with it, so a cached answer is the
one a fresh run gives.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS
from biasflow.scoring.batching import pad_right, token_budget_batches

DEFAULT_BATCH_SIZE = 32
MAX_LENGTH = 512  # longer texts are truncated, as the HF text-classification pipeline LangFair calls does


def multi_label(model: Any) -> bool:
    """Whether the model scores each label on its own (a sigmoid per label, e.g. Detoxify's heads): its config says
    ``problem_type: multi_label_classification``, or it has one label. The Hugging Face text-classification
    pipeline (which LangFair calls) decides the same way; every other model gets a softmax over its labels."""
    cfg = model.config
    return getattr(cfg, "problem_type", None) == "multi_label_classification" or int(cfg.num_labels) == 1


def class_probabilities(model: Any, tokenizer: Any, texts: Sequence[str], batch_tokens: int = DEFAULT_BATCH_TOKENS,
                        max_batch: int = DEFAULT_BATCH_SIZE, max_length: int = MAX_LENGTH,
                        text_pairs: Sequence[str] | None = None) -> np.ndarray:
    """Each text's probability of each label (rows: texts in order, columns: label ids): a softmax over the labels,
    or a sigmoid per label for a multi-label model (``multi_label``). ``text_pairs``: each text's second sentence,
    encoded with it as the tokenizer encodes a pair (segment ids where the model has them)."""
    device = next(model.parameters()).device
    if text_pairs is None:
        enc = [tokenizer(str(t), truncation=True, max_length=max_length)["input_ids"] for t in texts]
        types = None
    else:
        encoded = [tokenizer(str(t), str(p), truncation=True, max_length=max_length)
                   for t, p in zip(texts, text_pairs, strict=True)]
        enc = [e["input_ids"] for e in encoded]
        types = [e["token_type_ids"] for e in encoded] if encoded and "token_type_ids" in encoded[0] else None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = np.zeros((len(texts), int(model.config.num_labels)), dtype=np.float32)
    model.eval()
    squash = torch.sigmoid if multi_label(model) else (lambda x: torch.softmax(x, dim=-1))
    for batch in token_budget_batches(list(range(len(enc))), [len(e) for e in enc], batch_tokens, max_batch):
        ids, attn = pad_right([enc[i] for i in batch], pad_id)
        extra = {} if types is None else {"token_type_ids": pad_right([types[i] for i in batch], 0)[0].to(device)}
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), attention_mask=attn.to(device), **extra).logits
        out[batch] = squash(logits.float()).cpu().numpy()
    return out


def answer_classification(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``Classification`` (model kind ``text_classifier``): ``labels`` and ``probabilities``; at most
    ``model.batch_size`` texts (default 32) and ``batch_tokens`` tokens per forward pass."""
    probs = class_probabilities(adapter.model, adapter.tokenizer, [r.text for r in requests], budget.batch_tokens,
                                max_batch=int(adapter.opts.batch_size or DEFAULT_BATCH_SIZE))
    labels = adapter.labels
    return pd.DataFrame({"labels": [list(labels) for _ in requests],
                         "probabilities": [[float(x) for x in row] for row in probs]})


def answer_pair_classification(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``TextPairClassification`` (model kind ``text_classifier``): ``labels`` and ``probabilities`` of
    each (``text``, ``text_pair``) encoded as a pair; batched as ``answer_classification``."""
    probs = class_probabilities(adapter.model, adapter.tokenizer, [r.text for r in requests], budget.batch_tokens,
                                max_batch=int(adapter.opts.batch_size or DEFAULT_BATCH_SIZE),
                                text_pairs=[r.text_pair for r in requests])
    labels = adapter.labels
    return pd.DataFrame({"labels": [list(labels) for _ in requests],
                         "probabilities": [[float(x) for x in row] for row in probs]})
