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
from biasflow.bars import progress_bar as tqdm

from biasflow.models.batch_invariant import batch_invariant, row_logsumexp
from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS
from biasflow.scoring.batching import (EXACT_WIDTHS, pad_right, padded_width, run_with_backoff,
                                       token_budget_batches, with_padding_column)

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
    # on a GPU a batch's scores stay on the device until the end (no wait for the chip after every batch), and the
    # attention mask is sent or not by the padded width alone: widths under 32 are exact (never padded) and go
    # without one, wider ones always with one that holds padding (an extra column), so the attention kernel (flash
    # or memory-efficient: their last bits differ) never depends on which rows share the batch; on a CPU each batch
    # is written as it finishes, as before
    on_gpu = torch.device(device).type == "cuda"
    pending: list[tuple[list[tuple[int, int]], torch.Tensor]] = []

    def to_device(array: np.ndarray) -> torch.Tensor:
        # on a GPU through pinned memory, without waiting: a plain copy would wait for the previous batch to finish
        if on_gpu:
            return torch.from_numpy(array).pin_memory().to(device, non_blocking=True)
        return torch.from_numpy(array).to(device)

    def run_batch(batch: list[tuple[int, int]]) -> None:
        rows = np.fromiter((u for u, _ in batch), dtype=np.int64, count=len(batch))
        cols = np.fromiter((p for _, p in batch), dtype=np.int64, count=len(batch))
        width = padded_width(int(lens[rows].max()))  # the same for every row of a batch
        ids = padded[rows, :width].copy()
        if on_gpu and width >= EXACT_WIDTHS:  # always some padding at this width (``with_padding_column``)
            ids = np.concatenate([ids, np.full((len(batch), 1), pad_id, dtype=ids.dtype)], axis=1)
        targets = ids[np.arange(len(batch)), cols]
        ids[np.arange(len(batch)), cols] = mask_id
        attn = (np.arange(ids.shape[1])[None, :] < lens[rows][:, None]).astype(np.int64)
        attn_t = None if on_gpu and width < EXACT_WIDTHS else to_device(attn)
        logits = adapter.logits_at(to_device(ids), attn_t, torch.arange(len(batch), device=device), to_device(cols))
        target_t = to_device(targets)[:, None]
        if on_gpu:  # logit - logsumexp in fixed-shape calls (``row_logsumexp``): a row's value ignores its company
            logits = logits.float()
            picked = logits.gather(1, target_t)[:, 0] - row_logsumexp(logits)
            pending.append((batch, picked))  # written after the last batch, only batches that succeeded
        else:
            picked = torch.log_softmax(logits.float(), dim=-1).gather(1, target_t)[:, 0]
            for (u, p), v in zip(batch, picked.double().cpu().numpy()):  # written only after the pass succeeded
                scores[u][p] = v
        bar.update(len(batch))

    run_with_backoff(jobs, [int(lens[u]) for u, _ in jobs], batch_tokens, run_batch, max_batch=max_batch)
    if pending:
        values = torch.cat([v for _, v in pending]).double().cpu().numpy()
        for (u, p), v in zip((job for batch, _ in pending for job in batch), values):
            scores[u][p] = v
    bar.close()
    return [scores[o].copy() for o in owner]


def logits_at(adapter, ids: torch.Tensor, attn: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits at (rows, cols) of a padded batch; the adapter's head-only path when it has one."""
    if hasattr(adapter, "logits_at"):
        return adapter.logits_at(ids, attn, rows, cols)
    with torch.inference_mode(), batch_invariant(adapter.model):
        return adapter.model(input_ids=ids, attention_mask=attn).logits[rows, cols].float()


def vocabulary_transform(transform, logits: torch.Tensor) -> torch.Tensor:
    """``transform`` (log_softmax or softmax over the last dimension) of float32 logits; on a GPU through
    ``row_logsumexp``, so that a row's values do not depend on the other rows of the call."""
    if logits.device.type != "cuda" or transform not in (torch.log_softmax, torch.softmax):
        return transform(logits, dim=-1)
    logp = logits - row_logsumexp(logits)[:, None]
    return logp if transform is torch.log_softmax else logp.exp()


@torch.inference_mode()
def vocabulary_scores(adapter, seqs: Sequence[Sequence[int]], positions: Sequence[Sequence[int]],
                      columns: Sequence[Sequence[int]], transform=torch.log_softmax,
                      batch_tokens: int = DEFAULT_BATCH_TOKENS, progress: bool = False,
                      desc: str = "masked") -> list[np.ndarray]:
    """For each i, ``transform`` (``torch.log_softmax`` or ``torch.softmax``, over the vocabulary in float32) of
    the logits at ``positions[i]`` of the token sequence ``seqs[i]``, read at the vocabulary ids ``columns[i]``: a
    float64 array ``len(positions[i]) x len(columns[i])``.

    Identical sequences go through the model once, the head at the union of their positions: CBS asks 49,000
    questions of 1,480 distinct masked sentences, StereoSet three candidate words of one masked context. Numbers are
    the same as one pass per question: a row's scores do not depend on the rest of its batch (``batching.py``)."""
    rows_of: dict[tuple[int, ...], dict[int, int]] = {}  # distinct sequence -> {position: row}
    cols_of: dict[tuple[int, ...], dict[int, int]] = {}  # distinct sequence -> {vocabulary id: column}
    keys = []
    for seq, pos, cols in zip(seqs, positions, columns):
        key = tuple(int(t) for t in seq)
        if any(p < 0 or p >= len(key) for p in pos):
            raise ValueError(f"positions {list(pos)} out of range for a sequence of {len(key)} tokens")
        row_of, col_of = rows_of.setdefault(key, {}), cols_of.setdefault(key, {})
        for p in pos:
            row_of.setdefault(int(p), len(row_of))
        for c in cols:
            col_of.setdefault(int(c), len(col_of))
        keys.append(key)
    distinct = [k for k, row_of in rows_of.items() if row_of]
    pad_id = adapter.tokenizer.pad_token_id
    pad_id = 0 if pad_id is None else int(pad_id)
    device = adapter.device
    scores: dict[tuple[int, ...], np.ndarray] = {}
    bar = tqdm(total=len(distinct), desc=f"{desc} {adapter.name}", unit="text", disable=not progress,
               mininterval=1.0)
    for batch in token_budget_batches(distinct, [len(k) for k in distinct], batch_tokens):
        ids, attn = with_padding_column(*pad_right(batch, pad_id), pad_id, device)  # unchanged on a CPU
        rows = [r for r, key in enumerate(batch) for _ in rows_of[key]]
        cols = [p for key in batch for p in rows_of[key]]
        logits = logits_at(adapter, ids.to(device), attn.to(device), torch.as_tensor(rows, device=device),
                           torch.as_tensor(cols, device=device))
        values = vocabulary_transform(transform, logits.float()).cpu()
        at = 0
        for key in batch:
            n = len(rows_of[key])
            vocab_ids = torch.as_tensor(list(cols_of[key]), dtype=torch.long)
            scores[key] = values[at:at + n][:, vocab_ids].double().numpy()
            at += n
        bar.update(len(batch))
    bar.close()
    out = []
    for key, pos, cols in zip(keys, positions, columns):
        if not len(pos):
            out.append(np.empty((0, len(cols))))
            continue
        r = [rows_of[key][int(p)] for p in pos]
        c = [cols_of[key][int(t)] for t in cols]
        out.append(scores[key][np.ix_(r, c)])
    return out


def answer_pll(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``PseudoLogLikelihood`` requests: token_ids, logprobs (NaN at special tokens), total."""
    ids = encode(adapter, [adapter.normalise(r.text) for r in requests])
    # rows per batch: capped at 1,024 on a CPU; on a GPU the token budget alone decides (a row's numbers do not
    # depend on how many share its batch, and wide batches are what keep a GPU busy)
    max_batch = budget.batch_tokens if torch.device(adapter.device).type == "cuda" else 1024
    lps = pseudo_log_likelihoods(adapter, ids, batch_tokens=budget.batch_tokens, progress=budget.progress,
                                 max_batch=max(1024, max_batch))
    return pd.DataFrame({"token_ids": [list(map(int, x)) for x in ids], "logprobs": [x.tolist() for x in lps],
                         "total": [float(np.nansum(x)) for x in lps]})
