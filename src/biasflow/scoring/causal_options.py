"""Log-likelihood of a continuation after a context under a causal LM (``ContinuationLogprobs`` requests): the
options of a multiple-choice question after its prompt, StereoSet's intersentence sentence after its context.

For each (context, continuation) the continuation's tokens are appended to the context's tokens and the
log-probabilities of the continuation tokens are read, each predicted from everything before it (as
lm-evaluation-harness scores choices); with ``start_token`` the context follows the model's start token (BOS, else
EOS). Context and continuation are tokenised separately, so the continuation's pieces are the same whatever the
context; start a continuation with a space (" C. Both A and B") when it follows the context after a space.

Two request kinds, one answer: ``ContinuationLogprobs`` scores context + continuation as one text per request
(``scoring.causal.next_token_logprobs``, packed or padded batches), lm-evaluation-harness's way;
``SharedContextContinuation`` computes each distinct context once for every continuation asked after it
(``scoring.causal.shared_prefix_logprobs``: a packed tree, each continuation attending to the context's keys and
values), the same numbers up to float rounding with a fraction of the tokens (BBQ: ~70 instead of ~177 an example).
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS
from biasflow.scoring.causal import DEFAULT_MAX_LOGITS, next_token_logprobs, prefix_token_id, shared_prefix_logprobs


def _prompt_ids(tokenizer, prompt: str, prefix: Sequence[int] = ()) -> list[int]:
    ids = list(prefix) + tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("an empty prompt gives the first option token nothing to be predicted from")
    return ids


def _option_ids(tokenizer, option: str) -> list[int]:
    ids = tokenizer(option, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"option {option!r} has no tokens")
    return ids


def _encode(tokenizer, prompt: str, option: str, prefix: Sequence[int] = ()) -> tuple[list[int], int]:
    p = _prompt_ids(tokenizer, prompt, prefix)
    return p + _option_ids(tokenizer, option), len(p)


def option_logprobs(adapter, prompts: Sequence[str], options: Sequence[str], batch_tokens: int = DEFAULT_BATCH_TOKENS,
                    progress: bool = False, start_token: bool = False,
                    max_logits: int = DEFAULT_MAX_LOGITS) -> list[dict]:
    """One dict per (prompts[i], options[i]): ``logprob`` (sum over option tokens), ``n_tokens``, ``token_logprobs``,
    ``token_ids``; ``start_token`` puts the model's start token before every prompt."""
    if len(prompts) != len(options):
        raise ValueError("prompts and options must have the same length")
    tok = adapter.tokenizer
    prefix = [prefix_token_id(adapter)] if start_token else []
    enc = [_encode(tok, p, o, prefix) for p, o in zip(prompts, options)]
    found = next_token_logprobs(adapter, [full for full, _ in enc], batch_tokens, max_logits, progress, "options")
    out = []
    for (full, n_prompt), lp in zip(enc, found):
        vals = lp[n_prompt - 1:]  # token j is predicted at position j - 1
        out.append({"logprob": float(vals.sum()), "n_tokens": len(vals), "token_logprobs": [float(v) for v in vals],
                    "token_ids": full[n_prompt:]})
    return out


def answer_continuation_logprobs(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``ContinuationLogprobs``: context and continuation cased as the model expects
    (``model.lowercase``): ``token_ids``, ``logprobs``, ``total``."""
    out: list[dict | None] = [None] * len(requests)
    for start in dict.fromkeys(r.start_token for r in requests):
        rows = [i for i, r in enumerate(requests) if r.start_token == start]
        found = option_logprobs(adapter, [adapter.normalise(requests[i].context) for i in rows],
                                [adapter.normalise(requests[i].continuation) for i in rows],
                                batch_tokens=budget.batch_tokens, progress=budget.progress, start_token=bool(start),
                                max_logits=budget.max_logits)
        for i, f in zip(rows, found):
            out[i] = {"token_ids": f["token_ids"], "logprobs": f["token_logprobs"], "total": f["logprob"]}
    return pd.DataFrame(out, columns=["token_ids", "logprobs", "total"])


def answer_shared_context(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``SharedContextContinuation``: as ``answer_continuation_logprobs``, each distinct (context,
    start token) computed once for all its continuations in the chunk."""
    tok = adapter.tokenizer
    trees: dict[tuple[str, bool], list[int]] = {}
    for i, r in enumerate(requests):
        trees.setdefault((adapter.normalise(r.context), bool(r.start_token)), []).append(i)
    prefixes, branches = [], []
    for (context, start), rows in trees.items():
        prefixes.append(_prompt_ids(tok, context, [prefix_token_id(adapter)] if start else []))
        branches.append([_option_ids(tok, adapter.normalise(requests[i].continuation)) for i in rows])
    found = shared_prefix_logprobs(adapter, prefixes, branches, batch_tokens=budget.batch_tokens,
                                   max_logits=budget.max_logits, progress=budget.progress)
    out: list[dict | None] = [None] * len(requests)
    for rows, options, lps in zip(trees.values(), branches, found):
        for i, ids, lp in zip(rows, options, lps):
            out[i] = {"token_ids": list(ids), "logprobs": [float(v) for v in lp], "total": float(lp.sum())}
    return pd.DataFrame(out, columns=["token_ids", "logprobs", "total"])


__all__ = ["option_logprobs", "answer_continuation_logprobs", "answer_shared_context"]
