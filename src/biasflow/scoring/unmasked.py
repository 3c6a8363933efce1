"""One unmasked forward pass of a masked LM per text: per-token log-probs, top-1 hits and attention received.

Answers two request types (``interface.requests``):

* ``UnmaskedLogprobs``: ``logprobs[i]`` = log-softmax at position i of the token at position i, with nothing
  masked (Kaneko & Bollegala 2022, AUL), at EVERY position including special tokens (the metric decides which
  positions count); ``top1[i]`` = whether that token is the arg-max prediction (their token accuracy).
* ``UnmaskedLogprobsAttention``: the same plus ``attention[i]``: the attention weight position i receives, averaged
  over layers, heads and all (non-padding) query positions, special tokens included, as their ``evaluate.py`` does
  (``mean`` over the concatenated layers, then heads, then the query axis). Needs eager attention: SDPA/flash
  kernels return no weights. A model loaded otherwise is switched to eager in place (logged); the eager attention
  runs one text at a time (``eager_attention_row_by_row``), so a text's weights never depend on its company.

Texts are batched by a token budget with right padding; padded keys get zero weight from the attention mask and
padded query rows are left out of the average, so a batch gives the numbers of one text alone. The model
normalises each text (an uncased model lowercases it) before encoding it with special tokens.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from biasflow.bars import progress_bar as tqdm

from biasflow.models.batch_invariant import batch_invariant, row_logsumexp
from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS, DEFAULT_MAX_LOGITS, Budget
from biasflow.scoring.batching import pad_right, token_budget_batches, with_padding_column

log = logging.getLogger(__name__)


def encode(adapter, texts: Sequence[str]) -> list[list[int]]:
    """Token ids with the tokenizer's special tokens, as ``tokenizer.encode`` gives them."""
    return [adapter.tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]


ROW_EAGER = "biasflow_eager_rows"


def eager_attention_row_by_row(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' eager attention (its weights are what AUL averages), computed one text of the batch at a time:
    batched matrix products choose their kernel by the batch count (seen on AVX2 CPUs: a text's attention weights
    changed in the last bits with its company), so each text's products are made in calls of its own shape."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    outputs, weights = [], []
    for row in range(query.shape[0]):
        w = torch.matmul(query[row], key[row].transpose(-2, -1)) * scaling
        if attention_mask is not None:
            mask = attention_mask[row]
            w = w.masked_fill(~mask, torch.finfo(w.dtype).min) if mask.dtype == torch.bool else w + mask
        p = torch.nn.functional.softmax(w, dim=-1)
        outputs.append(torch.matmul(p, value[row]))
        weights.append(p)
    return torch.stack(outputs).transpose(1, 2).contiguous(), torch.stack(weights)


def _register_row_eager() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(ROW_EAGER, eager_attention_row_by_row)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ROW_EAGER, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def ensure_eager_attention(adapter) -> None:
    """Eager attention (SDPA/flash kernels return no weights), computed text by text where the model's attention
    layers take transformers' attention functions; else transformers' own eager attention."""
    model = adapter.model
    impl = getattr(model.config, "_attn_implementation", None)
    if impl == ROW_EAGER:
        return
    if not hasattr(model, "set_attn_implementation"):
        if impl == "eager":
            return
        raise ValueError(f"model {adapter.name!r} uses {impl!r} attention, which returns no attention weights; "
                         "set model.attn_implementation=eager")
    if impl != "eager":
        log.warning("model %s: switching attention from %r to eager to read attention weights "
                    "(set model.attn_implementation=eager to load it that way)", adapter.name, impl)
    _register_row_eager()
    try:
        model.set_attn_implementation(ROW_EAGER)
    except (ValueError, KeyError, TypeError):  # a model whose layers ignore transformers' attention functions
        model.set_attn_implementation("eager")


@torch.inference_mode()
def unmasked_scores(adapter, token_ids: Sequence[Sequence[int]], with_attention: bool = False,
                    batch_tokens: int = DEFAULT_BATCH_TOKENS, max_logits: int = DEFAULT_MAX_LOGITS,
                    progress: bool = True) -> list[dict[str, np.ndarray]]:
    """For each id sequence: {"logprobs", "top1"[, "attention"]}, arrays of its length."""
    if with_attention:
        ensure_eager_attention(adapter)
    tok = adapter.tokenizer
    model = adapter.model
    device = adapter.device
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    vocab = int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None \
        else len(tok)
    budget = max(1, min(int(batch_tokens), int(max_logits) // max(1, vocab)))
    out: list[dict[str, np.ndarray]] = [{} for _ in token_ids]
    bar = tqdm(total=len(token_ids), desc=f"unmasked {adapter.name}", unit="text", disable=not progress,
               mininterval=1.0)
    for batch in token_budget_batches(list(range(len(token_ids))), [len(x) for x in token_ids], budget):
        ids, attn = with_padding_column(*pad_right([token_ids[t] for t in batch], pad_id), pad_id, device)
        ids, attn = ids.to(device), attn.to(device)
        with batch_invariant(model):
            res = model(input_ids=ids, attention_mask=attn, output_attentions=with_attention)
        logits = res.logits.float()
        if logits.device.type == "cuda":  # fixed-shape reductions: a row's value ignores its company
            lse = row_logsumexp(logits.reshape(-1, logits.shape[-1])).reshape(logits.shape[:-1])
        else:
            lse = torch.logsumexp(logits, dim=-1)
        lp = (logits.gather(-1, ids[..., None])[..., 0] - lse).cpu().numpy()
        top1 = (logits.argmax(-1) == ids).cpu().numpy()
        received = None
        if with_attention:
            if not res.attentions:
                raise ValueError(f"model {adapter.name!r} returned no attention weights; "
                                 "set model.attn_implementation=eager")
            # per text: (query, key) averaged over layers and heads, then over its real query rows only; one text
            # at a time, since a reduction over the whole batch sums in an order that depends on the batch size
            received = np.stack([_attention_received(res.attentions, r, attn[r]) for r in range(len(batch))])
        for r, t in enumerate(batch):
            n = len(token_ids[t])
            out[t] = {"logprobs": lp[r, :n].astype(np.float64), "top1": top1[r, :n].copy()}
            if received is not None:
                out[t]["attention"] = received[r, :n].astype(np.float64)
        bar.update(len(batch))
    bar.close()
    return out


def _attention_received(attentions, row: int, mask: torch.Tensor) -> np.ndarray:
    """The attention each position of batch row ``row`` receives, averaged over layers, heads and real queries."""
    per_query = torch.stack([a[row].float() for a in attentions], 0).mean(dim=(0, 1))  # (query, key)
    qmask = mask.float()[:, None]
    return ((per_query * qmask).sum(0) / qmask.sum()).cpu().numpy()


def _answer(adapter, requests, budget: Budget, with_attention: bool) -> pd.DataFrame:
    ids = encode(adapter, [adapter.normalise(r.text) for r in requests])
    res = unmasked_scores(adapter, ids, with_attention=with_attention, batch_tokens=budget.batch_tokens,
                          max_logits=budget.max_logits, progress=budget.progress)
    out = pd.DataFrame({"token_ids": [list(map(int, x)) for x in ids],
                        "logprobs": [r["logprobs"].tolist() for r in res],
                        "top1": [r["top1"].astype(bool).tolist() for r in res]})
    if with_attention:
        out["attention"] = [r["attention"].tolist() for r in res]
    return out


def answer_unmasked_logprobs(adapter, requests, budget: Budget) -> pd.DataFrame:
    """Answerer of ``UnmaskedLogprobs``: token_ids, logprobs, top1."""
    return _answer(adapter, requests, budget, with_attention=False)


def answer_unmasked_logprobs_attention(adapter, requests, budget: Budget) -> pd.DataFrame:
    """Answerer of ``UnmaskedLogprobsAttention``: token_ids, logprobs, top1, attention."""
    return _answer(adapter, requests, budget, with_attention=True)
