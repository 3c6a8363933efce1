"""Log-likelihood of answer options after a prompt under a causal LM (multiple-choice by option likelihood).

For each (prompt, option) the option's tokens are appended to the prompt's tokens and the log-probabilities of
the option tokens are summed, each predicted from everything before it (as lm-evaluation-harness scores choices).
Prompt and option are tokenised separately, so the option's pieces are the same whatever the prompt; start an option
with a space (" C. Both A and B") when it follows the prompt after a space. Rows of a batch are right-padded (GPT-2
style absolute positions stay correct) and only real tokens are read.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from biasflow.models.batch_invariant import batch_invariant
from biasflow.scoring.batching import pad_right, token_budget_batches
from biasflow.scoring.cache import ScoreCache, request_key

KIND = "causal_options"


def _encode(tokenizer, prompt: str, option: str) -> tuple[list[int], int]:
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    o = tokenizer(option, add_special_tokens=False)["input_ids"]
    if not p:
        raise ValueError("an empty prompt gives the first option token nothing to be predicted from")
    if not o:
        raise ValueError(f"option {option!r} has no tokens")
    return p + o, len(p)


@torch.inference_mode()
def option_logprobs(adapter, prompts: Sequence[str], options: Sequence[str], batch_tokens: int = 8192,
                    progress: bool = False) -> list[dict]:
    """One dict per (prompts[i], options[i]): ``logprob`` (sum over option tokens), ``n_tokens``, ``token_logprobs``."""
    if len(prompts) != len(options):
        raise ValueError("prompts and options must have the same length")
    tok = adapter.tokenizer
    enc = [_encode(tok, p, o) for p, o in zip(prompts, options)]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    out: list[dict] = [{} for _ in enc]
    bar = tqdm(total=len(enc), desc=f"options {adapter.name}", unit="option", disable=not progress, mininterval=1.0)
    for batch in token_budget_batches(list(range(len(enc))), [len(e[0]) for e in enc], batch_tokens):
        ids, attn = pad_right([enc[i][0] for i in batch], pad_id)
        with batch_invariant(adapter.model):
            logits = adapter.model(input_ids=ids.to(adapter.device), attention_mask=attn.to(adapter.device)).logits
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        for r, i in enumerate(batch):
            full, n_prompt = enc[i]
            # token at position j is predicted by the logits at position j - 1
            pos = torch.arange(n_prompt, len(full))
            vals = logp[r, pos - 1, torch.as_tensor(full[n_prompt:])]
            out[i] = {"logprob": float(vals.sum()), "n_tokens": len(pos),
                      "token_logprobs": [float(v) for v in vals]}
        bar.update(len(batch))
    bar.close()
    return out


def option_table(adapter, prompts: Sequence[str], options: Sequence[str], cache: ScoreCache | None = None,
                 batch_tokens: int = 8192, progress: bool = False) -> pd.DataFrame:
    """Cached ``option_logprobs``: one row per distinct (prompt, option) with key, kind, prompt, option."""
    req = pd.DataFrame({"prompt": list(prompts), "option": list(options)})
    req["key"] = [request_key(adapter.fingerprint, KIND, {"prompt": p, "option": o})
                  for p, o in zip(req["prompt"], req["option"])]

    def compute(chunk: pd.DataFrame) -> pd.DataFrame:
        res = pd.DataFrame(option_logprobs(adapter, chunk["prompt"].tolist(), chunk["option"].tolist(),
                                           batch_tokens=batch_tokens, progress=progress))
        res.insert(0, "key", chunk["key"].values)
        res.insert(1, "kind", KIND)
        res.insert(2, "prompt", chunk["prompt"].values)
        res.insert(3, "option", chunk["option"].values)
        return res

    if cache is None:
        return compute(req.drop_duplicates("key").reset_index(drop=True))
    return cache.fetch_or_compute(req, compute)


__all__ = ["option_logprobs", "option_table", "KIND"]
