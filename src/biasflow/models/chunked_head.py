"""The vocabulary head and its log-sum-exp in vocabulary chunks (``model.head_chunk``, issue 37).

A causal scorer needs, per token, ``logit[target] - logsumexp(logits)``. The plain path (``scoring/causal.py``'s
``_head_logprobs``) writes a slice's full ``rows x vocabulary`` logits and reduces them; for a 128,256-word head that
is the largest tensor of the pass and its write and re-read are memory-bound (issue 37: ~45 ms of a 0.43 s H200
pass). ``ChunkedHead`` multiplies the hidden states by ``chunk`` rows of the head's weight at a time and keeps a
running (online) log-sum-exp per token (the max so far ``m`` and ``s = sum exp(logit - m)``, rescaled when ``m``
grows); the target's logit is taken from the chunk that holds it. The largest logits tensor is ``rows x chunk``
(``peak_logits`` records it), never ``rows x vocabulary``.

Batch invariance: every product and every reduction runs on a tile of exactly ``rows`` rows (the last tile padded
with zero rows) against the same vocabulary chunks, so each call has one shape whatever the batch, and a token's
value does not depend on the other tokens of its pass (``models/batch_invariant.py``'s fixed-tile argument).

Numbers: the same products and the same float32 reduction as the plain path, only summed in another order: within
~1e-6 of it in float32 (``tests/test_causal_fast_paths.py`` states 1e-5), within bfloat16's rounding of the logits in bf16.
Off unless a model config sets ``head_chunk``: an integer (vocabulary columns per chunk) or ``auto``
(``AUTO_CHUNK`` on CUDA, off elsewhere), so the default CPU path is unchanged to the bit.
"""
from __future__ import annotations

from typing import Any

import torch

# model types whose logits are exactly ``lm_head(last hidden state)`` (no soft-capping or scaling after the head): for
# them the vocabulary head runs on the real tokens only, not on the padding of the batch, and may be chunked
PLAIN_HEAD_TYPES = {"gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "gpt_neo", "gptj", "opt", "phi3",
                    "olmo", "olmo2", "falcon", "bloom", "mixtral", "qwen2_moe", "smollm3"}


def head_on_real_tokens(model) -> bool:
    """Whether ``model``'s logits are a plain head over its last hidden state (``PLAIN_HEAD_TYPES``)."""
    return (getattr(model.config, "model_type", None) in PLAIN_HEAD_TYPES
            and model.get_output_embeddings() is not None and getattr(model, "base_model", None) is not model)


AUTO_CHUNK = 8192  # ``head_chunk: auto`` on CUDA: 2,048 rows x 8,192 columns of bf16 = 32 MB per chunk


def head_chunk_for(value: Any, device: torch.device | str) -> int | None:
    """The chunk size a model config's ``head_chunk`` asks for on ``device`` (None: the plain head)."""
    if value is None or value is False:
        return None
    if value == "auto":
        return AUTO_CHUNK if torch.device(device).type == "cuda" else None
    chunk = int(value)
    if chunk < 1:
        raise ValueError(f"model.head_chunk={value!r}: give a positive number of vocabulary columns, or auto")
    return chunk


class ChunkedHead:
    """``logit[target] - logsumexp(logits)`` of hidden states under a linear vocabulary head, in vocabulary chunks."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, chunk: int):
        if weight.dim() != 2:
            raise ValueError("ChunkedHead: the head's weight must be (vocabulary, hidden)")
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.chunk = max(1, min(int(chunk), int(weight.shape[0])))
        self.peak_logits = 0  # the most logits one product produced (rows x chunk): a structural memory bound
        self.step = chunk_step
        self.compiled = False

    def compile(self) -> ChunkedHead:
        """Fuse each chunk's reduction (max, rescaled sum of exponentials, the target's logit) into compiled kernels
        that read the chunk's logits once or twice instead of the ~10 passes of the eager ops (``model.compile:
        blocks`` turns this on with ``head_chunk``). Static shapes (``dynamic=False``): one kernel for the full chunk
        and one for the last, the same for every tile, so batch invariance is kept."""
        self.step = torch.compile(chunk_step, dynamic=False)
        self.compiled = True
        return self

    @classmethod
    def of(cls, model: torch.nn.Module, chunk: int) -> ChunkedHead:
        """The head of a ``PLAIN_HEAD_TYPES`` model (an ``nn.Linear``; tied or not); call before the CPU's linear
        layers are swapped for oneDNN's (whose weight is packed in oneDNN's own layout)."""
        head = model.get_output_embeddings()
        if type(head).__name__ == "OneDNNLinear":
            raise TypeError("ChunkedHead.of: the head is already a OneDNNLinear (packed weight); build the chunked "
                             "head before use_onednn_linears")
        if not isinstance(head, torch.nn.Linear):
            raise TypeError(f"ChunkedHead.of: the head is a {type(head).__name__}, not an nn.Linear")
        return cls(head.weight, head.bias, chunk)

    @property
    def vocab(self) -> int:
        return int(self.weight.shape[0])

    def chunks(self) -> list[tuple[int, int]]:
        return [(c, min(c + self.chunk, self.vocab)) for c in range(0, self.vocab, self.chunk)]

    @torch.inference_mode()
    def logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        """log P(targets[i]) for each row of ``hidden`` (tokens, hidden size), float32, in tiles of ``rows``."""
        rows = max(1, int(rows))
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        weight = self.weight if self.weight.dtype == hidden.dtype else self.weight.to(hidden.dtype)
        bias = None if self.bias is None else self.bias.to(hidden.dtype)
        for start in range(0, n, rows):
            part, target = hidden[start:start + rows], targets[start:start + rows]
            k = part.shape[0]
            if k < rows:  # one tile shape for every call: the padding rows are zeros and are dropped below
                part = torch.cat([part, part.new_zeros((rows - k, part.shape[1]))])
                target = torch.cat([target, target.new_zeros(rows - k)])
            out[start:start + k] = self._tile(part, target, weight, bias)[:k]
        return out

    def _tile(self, part: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        rows = part.shape[0]
        top = torch.full((rows,), float("-inf"), dtype=torch.float32, device=part.device)
        total = torch.zeros(rows, dtype=torch.float32, device=part.device)
        picked = torch.zeros(rows, dtype=torch.float32, device=part.device)
        for lo, hi in self.chunks():
            logits = torch.nn.functional.linear(part, weight[lo:hi], None if bias is None else bias[lo:hi])
            self.peak_logits = max(self.peak_logits, logits.numel())
            top, total, picked = self.step(logits, top, total, picked, target - lo)
        return picked - (top + torch.log(total))


def chunk_step(logits: torch.Tensor, top: torch.Tensor, total: torch.Tensor, picked: torch.Tensor,
               local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk of the online log-sum-exp: the running max ``top`` and ``total`` = sum exp(logit - top) updated with
    this chunk's logits (float32), and ``picked`` set to the target's logit where the target (``local``: its column
    in this chunk) falls in it."""
    logits = logits.float()
    new_top = torch.maximum(top, logits.amax(dim=-1))
    total = total * torch.exp(top - new_top) + torch.exp(logits - new_top[:, None]).sum(dim=-1)
    width = logits.shape[1]
    inside = (local >= 0) & (local < width)
    picked = torch.where(inside, logits.gather(-1, local.clamp(0, width - 1)[:, None])[:, 0], picked)
    return new_top, total, picked


__all__ = ["AUTO_CHUNK", "ChunkedHead", "chunk_step", "head_chunk_for"]
