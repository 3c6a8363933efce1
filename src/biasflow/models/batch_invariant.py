"""Batch-invariant matrix products: while scoring, every linear layer runs on row tiles of a fixed size.

Matrix-multiply libraries (MKL, oneDNN, cuBLAS) choose their blocking and how they split the work across threads
from the number of rows, so the last bits of a row's result can depend on how many other rows share its batch
(measured on this project's CPU: a 384-wide BERT gives different logits for a row computed with fewer than 16
other rows than with more). Scores would then depend on which texts a run happened to score together, and a
resumed run would differ from an uninterrupted one. Inside ``batch_invariant(model)`` every ``nn.Linear``,
GPT-2 ``Conv1D`` and ``OneDNNLinear`` of the model multiplies a fixed number of rows per call (the last tile is
zero-padded), so a row's result depends only on the row. Every other op of a transformer (attention within one
sequence, layer norm, softmax, activations) already computes each row on its own.

The tile of a layer depends on its shape only (``tile_rows``): 256 rows for the encoder's layers, fewer for layers
with many outputs such as the vocabulary head (16 rows for 30k words), so a call still has plenty of work and the
zero padding of the last tile stays small.

The patch is an instance attribute set on enter and removed on exit: parameters, ``state_dict`` and code that uses
the model outside the block (generation, saving) are untouched.
"""
from __future__ import annotations

import contextlib
from functools import partial
from typing import Iterator

import torch

MAX_TILE = 256  # rows per matrix product: large enough to run near the matmul rate, small enough to pad little
MIN_TILE = 16
TILE_OUTPUTS = 1 << 18  # a tile of a layer with many outputs shrinks so that it still yields about this many


def tile_rows(out_features: int) -> int:
    """Rows per call for a layer with ``out_features`` outputs: a power of two from MIN_TILE to MAX_TILE."""
    rows = 1 << max(0, (TILE_OUTPUTS // max(1, int(out_features))).bit_length() - 1)
    return max(MIN_TILE, min(MAX_TILE, rows))


def _out_features(module: torch.nn.Module) -> int:
    if type(module).__name__ == "Conv1D":  # transformers' GPT-2 layer: weight is (in, out)
        return int(module.nf)
    return int(module.out_features)


def _linear_like(module: torch.nn.Module) -> bool:
    if isinstance(module, torch.nn.Linear):
        return True
    # transformers' Conv1D (GPT-2) and our OneDNNLinear, matched by name to avoid importing either here
    return type(module).__name__ in ("Conv1D", "OneDNNLinear")


def _tiled_forward(forward, tile: int, x: torch.Tensor) -> torch.Tensor:
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows == 0:
        return forward(x)
    full, rest = divmod(rows, tile)
    outs = [forward(flat[i * tile:(i + 1) * tile]) for i in range(full)]
    if rest:
        last = flat.new_zeros((tile, flat.shape[1]))
        last[:rest] = flat[full * tile:]
        outs.append(forward(last)[:rest])
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.reshape(*lead, out.shape[-1])


@contextlib.contextmanager
def batch_invariant(*modules: torch.nn.Module | None) -> Iterator[None]:
    """Run the linear layers under ``modules`` on fixed-size row tiles until the block ends (re-entrant)."""
    patched = []
    try:
        for root in modules:
            if root is None:
                continue
            for module in root.modules():
                if _linear_like(module) and "forward" not in module.__dict__:
                    module.forward = partial(_tiled_forward, module.forward, tile_rows(_out_features(module)))
                    patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward
