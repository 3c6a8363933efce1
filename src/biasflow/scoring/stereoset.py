"""StereoSet's model answers, batched: blank fill (masked LMs), sentence log-probs (causal LMs), next sentence.

Parity with the reference code (moinnadeem/StereoSet ``code/``, McGill-NLP/bias-bench ``benchmark/stereoset``):

* **Masked-LM blank fill** (``BlankFill``, intrasentence): the candidate word is tokenised without special tokens;
  for its token k the context's BLANK (every occurrence, as ``str.replace`` does) becomes
  ``decode(tokens[:k]) + MASK`` and the whole string is re-tokenised; the softmax probability of token k at the
  (first) mask is read; the score is the arithmetic mean of those probabilities. ``word_prefix_space``: ``False``
  encodes the bare word (original StereoSet), ``True`` encodes ``" " + word`` (bias-bench for roberta-base; gives
  the Ġ-prefixed pieces). Two contexts (dev) have two BLANKs: the reference with batch size 1 reads the first mask,
  so do we.
* **Causal LM** (``StereoSetSentenceLogprobs``, intrasentence, GPT-2 style): per-token log-probs of the sentence
  tokenised without special tokens; the first token's from a separate forward pass on the end-of-text token alone,
  every later token conditioned on the preceding sentence tokens WITHOUT that start token (the reference's quirk);
  the metric's score is their geometric-mean probability. (``TokenLogprobs(first_token="separate")`` is the same
  quantity with other float32 rounding: see the request's doc.)
* **Next-sentence prediction** (``NextSentence``, intersentence, BERT): P(IsNext) = softmax(NSP logits)[0] for
  ``[CLS] context [SEP] sentence [SEP]``.
* The causal-LM intersentence extension is a ``ContinuationLogprobs`` request (``scoring/causal_options.py``).

The numerical functions take an adapter (``.model``, ``.tokenizer``, ``.device``, optional ``.name``) and return
numbers for a list of inputs; the ``answer_*`` functions are their answerers (``scoring/answer.py``), which case the
text as the model expects. ``tests/test_stereoset_scoring.py`` checks each against a one-input-per-forward loop.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from biasflow.models.batch_invariant import batch_invariant
from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS
from biasflow.scoring.batching import pad_right, token_budget_batches
from biasflow.scoring.causal import DEFAULT_MAX_LOGITS
from biasflow.scoring.masked import vocabulary_scores

# ------------------------------------------------------------------------------------------------ helpers
def _pad_id(tokenizer) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if tid is not None:
            return int(tid)
    return 0


# ------------------------------------------------------------------------------------------------ blank fill
def word_token_ids(tokenizer, word: str, word_prefix_space: bool) -> list[int]:
    return tokenizer.encode((" " + word) if word_prefix_space else word, add_special_tokens=False)


def blank_fill_inputs(tokenizer, context: str, word: str, word_prefix_space: bool
                      ) -> tuple[list[int], list[tuple[list[int], int, int]]]:
    """(word token ids, [(input ids, mask position, target token id) for each word token])."""
    word_ids = word_token_ids(tokenizer, word, word_prefix_space)
    mask, mask_id = tokenizer.mask_token, tokenizer.mask_token_id
    jobs = []
    for k, target in enumerate(word_ids):
        text = context.replace("BLANK", tokenizer.decode(word_ids[:k]) + mask)
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        if mask_id not in ids:
            raise ValueError(f"no mask token left after tokenising {text!r} (truncated?)")
        jobs.append((ids, ids.index(mask_id), int(target)))
    return word_ids, jobs


def blank_fill_probabilities(adapter, contexts: Sequence[str], words: Sequence[str], word_prefix_space: bool,
                             batch_tokens: int = DEFAULT_BATCH_TOKENS) -> list[tuple[list[int], np.ndarray]]:
    """For each (context, word): (word token ids, probability of each word token at its mask)."""
    tok = adapter.tokenizer
    prepared = [blank_fill_inputs(tok, c, w, word_prefix_space) for c, w in zip(contexts, words)]
    out = [(word_ids, np.full(len(word_ids), np.nan)) for word_ids, _ in prepared]
    jobs = [(i, k, seq, pos, target) for i, (_, js) in enumerate(prepared) for k, (seq, pos, target) in enumerate(js)]
    probs = vocabulary_scores(adapter, [j[2] for j in jobs], [[j[3]] for j in jobs], [[j[4]] for j in jobs],
                              torch.softmax, batch_tokens)
    for (i, k, *_), p in zip(jobs, probs):
        out[i][1][k] = float(p[0, 0])
    return out


# ------------------------------------------------------------------------------------------------ causal LMs
def causal_sentence_logprobs(adapter, texts: Sequence[str], batch_tokens: int = DEFAULT_BATCH_TOKENS,
                             max_logits: int = DEFAULT_MAX_LOGITS) -> list[tuple[list[int], np.ndarray]]:
    """StereoSet's GPT-2 scoring: per-token log-probs, token 0 after <eot> alone, the rest without <eot>.
    A batch holds at most ``batch_tokens`` tokens and ``max_logits`` vocabulary floats."""
    from biasflow.scoring.causal import first_token_logprobs, next_token_logprobs

    encoded = [adapter.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    if any(len(e) == 0 for e in encoded):
        raise ValueError(f"empty text after tokenisation: {texts[[len(e) for e in encoded].index(0)]!r}")
    first = first_token_logprobs(adapter)
    out = [(e, np.full(len(e), np.nan)) for e in encoded]
    for i, e in enumerate(encoded):
        out[i][1][0] = float(first[e[0]])
    for (_, lp), rest in zip(out, next_token_logprobs(adapter, encoded, batch_tokens, max_logits)):
        lp[1:] = rest
    return out


# ------------------------------------------------------------------------------------------------ NSP
def nsp_is_next_probabilities(adapter, contexts: Sequence[str], sentences: Sequence[str],
                              batch_tokens: int = DEFAULT_BATCH_TOKENS) -> np.ndarray:
    """P(IsNext) (softmax index 0 of BERT's next-sentence head) for ``[CLS] context [SEP] sentence [SEP]``."""
    tok = adapter.tokenizer
    enc = [tok(c, s, add_special_tokens=True) for c, s in zip(contexts, sentences)]
    out = np.full(len(enc), np.nan)
    for batch in token_budget_batches(list(range(len(enc))), [len(e["input_ids"]) for e in enc], batch_tokens):
        ids, attn = pad_right([enc[i]["input_ids"] for i in batch], _pad_id(tok))
        types, _ = pad_right([enc[i].get("token_type_ids", [0] * len(enc[i]["input_ids"])) for i in batch], 0)
        with torch.inference_mode(), batch_invariant(adapter.model):
            logits = adapter.model(input_ids=ids.to(adapter.device), attention_mask=attn.to(adapter.device),
                                   token_type_ids=types.to(adapter.device)).logits
        out[batch] = torch.softmax(logits.float(), dim=-1)[:, 0].double().cpu().numpy()
    return out


# ------------------------------------------------------------------------------------------------ answerers
def _normalise_context(adapter, context: str) -> str:
    """Case a blank-fill context as the model expects without touching its BLANK marker."""
    return "BLANK".join(adapter.normalise(part) for part in context.split("BLANK"))


def answer_blank_fill(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``BlankFill``: ``token_ids``, ``probs``, ``probability`` (the arithmetic mean of ``probs``)."""
    out: list[dict | None] = [None] * len(requests)
    for prefix_space in dict.fromkeys(r.word_prefix_space for r in requests):
        rows = [i for i, r in enumerate(requests) if r.word_prefix_space == prefix_space]
        found = blank_fill_probabilities(adapter, [_normalise_context(adapter, requests[i].context) for i in rows],
                                         [adapter.normalise(requests[i].word) for i in rows], bool(prefix_space),
                                         budget.batch_tokens)
        for i, (ids, probs) in zip(rows, found):
            out[i] = {"token_ids": list(map(int, ids)), "probs": probs.tolist(),
                      "probability": float(np.mean(probs)) if len(probs) else float("nan")}
    return pd.DataFrame(out, columns=["token_ids", "probs", "probability"])


def answer_sentence_logprobs(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``StereoSetSentenceLogprobs``: ``token_ids``, ``logprobs``, ``total``."""
    found = causal_sentence_logprobs(adapter, [adapter.normalise(r.text) for r in requests], budget.batch_tokens,
                                     budget.max_logits)
    return pd.DataFrame({"token_ids": [list(map(int, ids)) for ids, _ in found],
                         "logprobs": [lp.tolist() for _, lp in found],
                         "total": [float(lp.sum()) for _, lp in found]})


def answer_next_sentence(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``NextSentence`` (a ``bert_nsp`` model): ``probability`` = P(IsNext)."""
    return pd.DataFrame({"probability": nsp_is_next_probabilities(
        adapter, [adapter.normalise(r.context) for r in requests], [adapter.normalise(r.sentence) for r in requests],
        budget.batch_tokens)})
