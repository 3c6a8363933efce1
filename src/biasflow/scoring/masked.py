"""Per-token scores from masked LMs.

``pseudo_log_likelihoods``: for every scored position i of a text, the log-probability of the original token when
position i alone is masked (Salazar et al.; CrowS-Pairs masks one aligned token at a time exactly like this).
All masked copies of all texts are batched together by a token budget in canonical length buckets (a copy's batch
width depends on its own length only, so its score does not depend on which other texts are scored: see
``scoring/batching.py``), and the vocabulary head runs only at the masked positions; identical requests are scored once; a batch that does not fit in memory is
split (halved token budget) and retried. ``tests/test_scoring.py`` checks the numbers against the plain
one-copy-per-forward loop; ``benchmarks/scoring_speed.py`` measures the speed (``docs/performance.md``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS
from biasflow.scoring.batching import padded_width, run_with_backoff

PLL_KIND = "pll"


def encode(adapter, texts: Sequence[str]) -> list[list[int]]:
    """Token ids with the tokenizer's special tokens, as ``tokenizer.encode`` gives them."""
    return [adapter.tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]


def scored_positions(tokenizer, ids: Sequence[int]) -> list[int]:
    special = tokenizer.get_special_tokens_mask(list(ids), already_has_special_tokens=True)
    return [i for i, s in enumerate(special) if not s]


def pseudo_log_likelihoods(adapter, token_ids: Sequence[Sequence[int]], batch_tokens: int = DEFAULT_BATCH_TOKENS,
                           progress: bool = True, max_batch: int = 1024) -> list[np.ndarray]:
    """Per-position log P(token_i | text with position i masked); NaN at special-token positions.

    Identical token sequences are scored once. Masked copies of all sequences are sorted by length and batched by
    ``batch_tokens`` (rows x padded length); on out-of-memory the budget is halved and the batch retried.
    """
    tok = adapter.tokenizer
    mask_id = tok.mask_token_id
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    device = adapter.device
    # de-duplicate identical requests: each distinct sequence is scored once, results are shared
    index: dict[tuple[int, ...], int] = {}
    owner = [index.setdefault(tuple(int(x) for x in ids), len(index)) for ids in token_ids]
    seqs = list(index)
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    padded = np.full((len(seqs), padded_width(int(lens.max())) if len(seqs) else 0), pad_id, dtype=np.int64)
    for u, s in enumerate(seqs):
        padded[u, : len(s)] = s
    scores = [np.full(len(s), np.nan, dtype=np.float64) for s in seqs]
    jobs = [(u, p) for u, s in enumerate(seqs) for p in scored_positions(tok, s)]
    bar = tqdm(total=len(jobs), desc=f"PLL {adapter.name}", unit="mask", disable=not progress, mininterval=1.0)

    def run_batch(batch: list[tuple[int, int]]) -> None:
        rows = np.fromiter((u for u, _ in batch), dtype=np.int64, count=len(batch))
        cols = np.fromiter((p for _, p in batch), dtype=np.int64, count=len(batch))
        width = padded_width(int(lens[rows].max()))  # the same for every row of a batch
        ids = padded[rows, :width].copy()
        targets = ids[np.arange(len(batch)), cols]
        ids[np.arange(len(batch)), cols] = mask_id
        attn = (np.arange(width)[None, :] < lens[rows][:, None]).astype(np.int64)
        logits = adapter.logits_at(torch.from_numpy(ids).to(device), torch.from_numpy(attn).to(device),
                                   torch.arange(len(batch), device=device), torch.from_numpy(cols).to(device))
        logp = torch.log_softmax(logits.float(), dim=-1)
        picked = logp.gather(1, torch.from_numpy(targets).to(device)[:, None])[:, 0].double().cpu().numpy()
        for (u, p), v in zip(batch, picked):  # results are written only after the forward pass succeeded
            scores[u][p] = v
        bar.update(len(batch))

    run_with_backoff(jobs, [int(lens[u]) for u, _ in jobs], batch_tokens, run_batch, max_batch=max_batch)
    bar.close()
    return [scores[o].copy() for o in owner]


def answer_pll(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``PseudoLogLikelihood`` requests: token_ids, logprobs (NaN at special tokens), total."""
    ids = encode(adapter, [adapter.normalise(r.text) for r in requests])
    lps = pseudo_log_likelihoods(adapter, ids, batch_tokens=budget.batch_tokens, progress=budget.progress)
    return pd.DataFrame({"token_ids": [list(map(int, x)) for x in ids], "logprobs": [x.tolist() for x in lps],
                         "total": [float(np.nansum(x)) for x in lps]})
