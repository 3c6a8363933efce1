"""Token-budget batching with canonical length buckets, shared by every scorer, plus out-of-memory back-off.

Every job is padded to a width that depends on its own length only (``padded_width``: the exact length up to 31
tokens, then steps that keep padding under 1/16 of a row), and a batch holds only jobs of one width, as many rows
as fit in ``batch_tokens`` (rows x width). So a text is always computed in a batch of the same width, with the same
padding, whatever other texts are scored with it: float reductions whose order depends on the padded width
(attention over the keys, fused kernels) always run the same way for it. The number of rows still varies with the
company; the scorers run the model's linear layers on fixed-size row tiles (``models/batch_invariant.py``), so that
does not matter either: a text gets bit-identical scores in one run, in a resumed run that scores only what is
missing, inside a larger sweep, and under any token budget (``tests/test_batch_invariance.py``). Large batches are
what make a CPU or GPU run near its matmul rate; ``run_with_backoff`` halves the budget and retries when a batch does
not fit in memory.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


def padded_width(length: int) -> int:
    """Canonical padded width of a row of ``length`` tokens: a function of the length alone.

    Exact up to 31 tokens; above, rounded up to a step of 2 ** (floor(log2(length)) - 4) (2 from 32, 4 from 64,
    8 from 128, ...), so padding stays under 1/16 of a row while long rows of nearby lengths still share batches.
    """
    length = int(length)
    if length < 32:
        return max(length, 1)
    step = 1 << (length.bit_length() - 5)
    return -(-length // step) * step


def _bucket_order(lengths: Sequence[int]) -> list[int]:
    # by canonical width, then length; stable, so copies of one text stay together
    return sorted(range(len(lengths)), key=lambda i: (padded_width(lengths[i]), lengths[i]))


def _batch_end(order: Sequence[int], lengths: Sequence[int], start: int, batch_tokens: int, max_batch: int) -> int:
    """End (exclusive) of the batch that starts at ``order[start]``: jobs of one padded width, rows x width <= budget.

    At least one row, so a job wider than the budget on its own still runs.
    """
    width = padded_width(lengths[order[start]])
    rows = max(1, min(max_batch, batch_tokens // width))
    end = start + 1
    while end < len(order) and end - start < rows and padded_width(lengths[order[end]]) == width:
        end += 1
    return end


def token_budget_batches(jobs: Sequence[T], lengths: Sequence[int], batch_tokens: int,
                         max_batch: int = 1024) -> Iterator[list[T]]:
    """Yield batches of jobs of one canonical padded width each, with rows x ``padded_width`` <= batch_tokens.

    Batches come in increasing width. Pad a batch with ``pad_right`` (or to ``padded_width`` of its longest row).
    """
    if len(jobs) != len(lengths):
        raise ValueError(f"token_budget_batches: {len(jobs)} jobs but {len(lengths)} lengths")
    if batch_tokens < 1 or max_batch < 1:
        raise ValueError(f"token_budget_batches: batch_tokens={batch_tokens} and max_batch={max_batch} must be >= 1")
    order = _bucket_order(lengths)
    start = 0
    while start < len(order):
        end = _batch_end(order, lengths, start, batch_tokens, max_batch)
        yield [jobs[j] for j in order[start:end]]
        start = end


def packed_batches(jobs: Sequence[T], lengths: Sequence[int], batch_tokens: int) -> Iterator[list[T]]:
    """Yield batches of jobs to be laid end to end (``models/packed.py``): by length, as many as fit in
    ``batch_tokens`` tokens (at least one), so jobs of one length stay adjacent."""
    if len(jobs) != len(lengths):
        raise ValueError(f"packed_batches: {len(jobs)} jobs but {len(lengths)} lengths")
    if batch_tokens < 1:
        raise ValueError(f"packed_batches: batch_tokens={batch_tokens} must be >= 1")
    order = sorted(range(len(jobs)), key=lambda i: lengths[i])
    batch: list[T] = []
    tokens = 0
    for i in order:
        if batch and tokens + lengths[i] > batch_tokens:
            yield batch
            batch, tokens = [], 0
        batch.append(jobs[i])
        tokens += lengths[i]
    if batch:
        yield batch


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int):
    """(ids, attention mask) long tensors of the sequences, right-padded to the canonical width of the longest."""
    import torch

    width = padded_width(max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, seq in enumerate(seqs):
        ids[r, : len(seq)] = torch.as_tensor(seq)
        attn[r, : len(seq)] = 1
    return ids, attn


# below this width ``padded_width`` is exact: a batch of a narrower width never holds padding
EXACT_WIDTHS = 32


def gpu_padding_column(device) -> bool:
    """Whether a padded batch on ``device`` gets one more all-padding column when its width is EXACT_WIDTHS or more
    (``with_padding_column``): on a GPU only. transformers drops an attention mask that is all ones and the
    attention kernel then changes (flash without a mask, memory-efficient with one; their last bits differ), so a
    batch of one canonical width must either never or always hold padding, whatever texts share it."""
    import torch

    return torch.device(device).type == "cuda"


def with_padding_column(ids, attn, pad_id: int, device):
    """(ids, attn) long tensors, with one more padding column on a GPU when the width is EXACT_WIDTHS or more
    (``gpu_padding_column``); unchanged otherwise. The extra column is attended by nothing and scored by nothing."""
    import torch

    if ids.shape[1] < EXACT_WIDTHS or not gpu_padding_column(device):
        return ids, attn
    return (torch.nn.functional.pad(ids, (0, 1), value=int(pad_id)), torch.nn.functional.pad(attn, (0, 1), value=0))


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA/MPS/CPU allocation failures (torch raises OutOfMemoryError or a RuntimeError that says so)."""
    import torch

    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    if isinstance(exc, (RuntimeError, MemoryError)):
        text = str(exc).lower()
        return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text
    return False


class DoesNotFit(MemoryError):
    """Out of memory at the smallest budget there is: halving again cannot help (one row too long for the device)."""


B = TypeVar("B")
R = TypeVar("R")


def halving_on_out_of_memory(attempt: Callable[[B], R], budget: B, halve: Callable[[B], B | None],
                             describe: Callable[[B], str], tokens: Callable[[B], int] = int,
                             on_backoff: Callable[[int, int], None] | None = None) -> tuple[R, B]:
    """``attempt(budget)``; while it runs out of memory, again with ``halve(budget)``. The one back-off loop of
    biasflow: a scorer's batches (``run_with_backoff``) and a chunk of requests (``scoring.answer``) both use it.

    Only out-of-memory is retried (``is_out_of_memory``). When ``halve`` returns None (nothing smaller to try) the
    error is ``DoesNotFit``, naming what did not fit (``describe(budget)``), and no caller retries it again.
    ``attempt`` must have no side effects before it fails (scorers write their results last). Returns the result and
    the budget in force, which the caller keeps (the attempt that failed is the largest so far only by chance)."""
    while True:
        try:
            return attempt(budget), budget
        except DoesNotFit:
            raise
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is handled, everything else re-raised
            if not is_out_of_memory(exc):
                raise
            smaller = halve(budget)
            if smaller is None:
                raise DoesNotFit(f"{describe(budget)} does not fit in memory (token budget already down to "
                                 f"{tokens(budget)}): {exc}") from exc
            log.warning("out of memory on %s; token budget %d -> %d", describe(budget), tokens(budget),
                        tokens(smaller))
            if on_backoff is not None:
                on_backoff(tokens(budget), tokens(smaller))
            _free_cached_memory()
            budget = smaller


def run_with_backoff(jobs: Sequence[T], lengths: Sequence[int], batch_tokens: int,
                     run_batch: Callable[[list[T]], None], max_batch: int = 1024,
                     on_backoff: Callable[[int, int], None] | None = None) -> int:
    """Run ``run_batch`` on token-budget batches of ``jobs``; on out-of-memory halve the budget and retry
    (``halving_on_out_of_memory``).

    The smaller budget is kept for the rest of the run (the batch that failed is the longest so far only by
    chance, so the next ones would likely fail too). A single row that does not fit is ``DoesNotFit``: nothing
    smaller can be tried. ``run_batch`` must not have side effects before it fails (it writes its results last).
    Returns the budget in force at the end.
    """
    if len(jobs) != len(lengths):
        raise ValueError(f"run_with_backoff: {len(jobs)} jobs but {len(lengths)} lengths")
    order = _bucket_order(lengths)
    budget = int(batch_tokens)
    start = 0

    def batch_end(budget: int) -> int:
        return _batch_end(order, lengths, start, budget, max_batch)

    def attempt(budget: int) -> int:
        end = batch_end(budget)
        run_batch([jobs[j] for j in order[start:end]])
        return end

    def halve(budget: int) -> int | None:
        rows = batch_end(budget) - start
        return None if rows == 1 else max(1, rows * padded_width(lengths[order[start]]) // 2)

    def describe(budget: int) -> str:
        rows = batch_end(budget) - start
        width = lengths[order[start]]
        return f"one row of {width} tokens" if rows == 1 else \
            f"a batch of {rows} rows ({rows * padded_width(width)} tokens)"

    while start < len(order):
        start, budget = halving_on_out_of_memory(attempt, budget, halve, describe, on_backoff=on_backoff)
    return budget


def _free_cached_memory() -> None:
    import gc

    import torch

    if torch.cuda.is_available():  # on CPU the failed batch's tensors are already freed when the exception unwinds
        gc.collect()
        torch.cuda.empty_cache()
