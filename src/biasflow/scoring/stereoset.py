"""StereoSet's model answers, batched: blank fill (masked LMs), sentence log-probs (causal LMs), next sentence.

Parity with the reference code (moinnadeem/StereoSet ``code/``, McGill-NLP/bias-bench ``benchmark/stereoset``):

* **Masked-LM blank fill** (``BlankFill``, intrasentence): the candidate word is tokenised without special tokens;
  for its token k the context's BLANK (every occurrence, as ``str.replace`` does) becomes
  ``decode(tokens[:k]) + MASK`` and the whole string is re-tokenised; the softmax probability of token k at the
  (first) mask is read; the score is the arithmetic mean of those probabilities. ``word_prefix_space``: ``False``
  encodes the bare word (original StereoSet), ``True`` encodes ``" " + word`` (bias-bench for roberta-base; gives
  the Ġ-prefixed pieces). Two contexts (dev) have two BLANKs: the reference with batch size 1 reads the first mask,
  so do we.
* **Causal LM** (``StereoSetSentenceLogprobs``, intrasentence, GPT-2 style): the reference's loop itself, one
  sentence per forward pass: the sentence tokenised without special tokens; the first token's probability from a
  separate pass on the end-of-text token alone, every later token's conditioned on the preceding sentence tokens
  WITHOUT that start token (the reference's quirk), each read from a float32 ``torch.softmax`` of the logits; the
  metric's score is ``2 ** (sum(log2 p) / n)`` in the reference's numpy arithmetic, so an exported predictions file
  holds the reference's numbers to the bit. (``TokenLogprobs(first_token="separate")`` is the same quantity,
  batched, with other float32 rounding: see the request's doc.)
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
def reference_start_probabilities(adapter) -> torch.Tensor:
    """The reference's ``initial_token_probabilities``: ``torch.softmax(model(start_token)[0], dim=-1)`` for the
    start token alone (BOS, else EOS: GPT-2's ``<|endoftext|>``), shape (1, 1, vocab); one pass, kept on the adapter."""
    from biasflow.scoring.causal import prefix_token_id

    cached = getattr(adapter, "_stereoset_start_probabilities", None)
    if cached is not None:
        return cached
    start = torch.tensor([prefix_token_id(adapter)], device=adapter.device).unsqueeze(0)
    with torch.inference_mode():
        probs = torch.softmax(adapter.model(start)[0].float(), dim=-1)
    try:
        adapter._stereoset_start_probabilities = probs
    except AttributeError:
        pass
    return probs


def reference_sentence_probabilities(adapter, texts: Sequence[str]) -> list[tuple[list[int], np.ndarray]]:
    """StereoSet's GPT-2 scoring loop (``code/eval_generative_models.py``, bias-bench's
    ``_likelihood_score_generative``), one sentence per forward pass as the reference runs it: token 0's probability
    from the start token's pass, token i's from ``torch.softmax(model(tokens)[0], dim=-1)[0, i - 1, tokens[i]]`` of
    the sentence without the start token. The float32 probabilities, as float64 (``.item()``), per text.

    Unbatched on purpose: a batched pass (padding, other rows in the matrix products) rounds the logits differently
    in the last bits, and the exported predictions file must hold the reference's numbers. A text's values depend
    on that text alone, so resumed runs and sweeps agree too."""
    tok = adapter.tokenizer
    encoded = [tok.encode(t, add_special_tokens=False) for t in texts]
    if any(len(e) == 0 for e in encoded):
        raise ValueError(f"empty text after tokenisation: {texts[[len(e) for e in encoded].index(0)]!r}")
    from biasflow.scoring.causal import _check_lengths

    _check_lengths(adapter, encoded)
    first = reference_start_probabilities(adapter)
    out = []
    for tokens in encoded:
        probs = np.empty(len(tokens), dtype=np.float64)
        probs[0] = first[0, 0, tokens[0]].item()
        if len(tokens) > 1:
            with torch.inference_mode():
                output = torch.softmax(adapter.model(torch.tensor(tokens, device=adapter.device).unsqueeze(0))[0]
                                       .float(), dim=-1)
            index = torch.arange(len(tokens) - 1, device=output.device)
            probs[1:] = output[0, index, torch.tensor(tokens[1:], device=output.device)].double().cpu().numpy()
        out.append((tokens, probs))
    return out


def causal_sentence_logprobs(adapter, texts: Sequence[str], batch_tokens: int = DEFAULT_BATCH_TOKENS,
                             max_logits: int = DEFAULT_MAX_LOGITS) -> list[tuple[list[int], np.ndarray]]:
    """StereoSet's GPT-2 scoring as natural-log probabilities per token (``reference_sentence_probabilities``:
    token 0 after the start token alone, the rest without it). ``batch_tokens`` and ``max_logits`` are accepted
    for the answerer interface; the reference's loop runs one sentence per pass."""
    return [(ids, np.log(probs)) for ids, probs in reference_sentence_probabilities(adapter, texts)]


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
    """Answerer of ``StereoSetSentenceLogprobs``: ``token_ids``, ``probs`` (the reference's float32 softmax
    probabilities, as float64), ``logprobs`` (their natural logs) and ``total``; the metric scores a sentence from
    ``probs`` in the reference's arithmetic (``metrics.stereoset.reference_sentence_score``)."""
    found = reference_sentence_probabilities(adapter, [adapter.normalise(r.text) for r in requests])
    return pd.DataFrame({"token_ids": [list(map(int, ids)) for ids, _ in found],
                         "probs": [p.tolist() for _, p in found],
                         "logprobs": [np.log(p).tolist() for _, p in found],
                         "total": [float(np.log(p).sum()) for _, p in found]})


def answer_next_sentence(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``NextSentence`` (a ``bert_nsp`` model): ``probability`` = P(IsNext)."""
    return pd.DataFrame({"probability": nsp_is_next_probabilities(
        adapter, [adapter.normalise(r.context) for r in requests], [adapter.normalise(r.sentence) for r in requests],
        budget.batch_tokens)})
