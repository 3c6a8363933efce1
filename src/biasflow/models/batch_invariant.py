"""Batch-invariant matrix products: while scoring, a row's result must not depend on how many rows share its call.

Matrix-multiply libraries choose their algorithm from the number of rows: measured on this project's CPU, MKL (torch's
float32 ``nn.Linear``) computes a row differently when the call has fewer than 6-14 rows (up to 300 with 2 threads
and 3072 inputs), and oneDNN's bfloat16 kernels differ at various row counts. Scores would then depend on which texts
a run happened to batch together, and a resumed run would differ from an uninterrupted one in the last bits (enough
to flip CrowS-Pairs' 3-decimal rounding). Inside ``batch_invariant(model)`` each linear layer of the model
(``nn.Linear``, GPT-2 ``Conv1D``, ``OneDNNLinear``) is called in one of two ways:

* oneDNN float32 linears (``models/onednn.py``, the default on CPU) compute a row the same way for any row count
  from 2 up (``tests/test_batch_invariance.py`` checks it on this machine); a call with fewer than ``MIN_ROWS``
  rows is zero-padded to ``MIN_ROWS``, everything else runs as it is, at full speed;
* any other layer (MKL, bfloat16, GPU) multiplies fixed tiles of ``tile_rows`` rows per call (the last tile
  zero-padded), so every row is computed in a call of the same shape. This costs speed (up to ~20-40% on small
  models, where a call's work is small), so it is the fallback, not the default path.
* on a GPU the tiles are larger (``gpu_tile_rows``: 1,024 to 4,096 rows): a call of a few hundred rows would leave
  most of the chip idle and the launch of each call, not the arithmetic, would set the pace. cuBLAS picks its kernel
  from the call's shape, so a fixed tile is what keeps a row's result independent of its company there too.

A GPU needs three more things (none of them applies on a CPU, whose numbers this module leaves as they were):

* CUDA's reductions (``sum``, ``mean``, ``amax``) split a row's reduction over threads and blocks by the shape of
  the whole call, and its softmax kernels by the alignment of the row in memory. Norm layers that reduce in Python
  (``*RMSNorm``: Llama, Mistral, Qwen) therefore also run in fixed tiles there, and the scorers take the
  log-sum-exp over the vocabulary through ``row_logsumexp``: fixed tiles of ``GPU_REDUCE_ROWS`` rows whose rows are
  padded with -inf to a multiple of ``REDUCE_COLUMNS`` (every row starts on the same alignment).
* the attention kernel is pinned to flash or memory-efficient attention (``torch.nn.attention.sdpa_kernel``), never
  cuDNN's: cuDNN builds an execution plan for every new shape, measured on an H200 as most of the time of a
  bfloat16 scoring run whose batches change shape (``docs/performance.md``), and its choice may vary with the shape.
* nn.LayerNorm's kernel (one block per row) and flash attention on texts of up to 256 tokens compute a row on its
  own already; flash attention may split longer keys by the number of rows in a call, so texts longer than that may
  differ in the last bits between a batch and a resumed run on a GPU.

Every other op of a transformer (attention within one sequence, layer norm, softmax, activations) computes each
row on its own. The patch is an instance attribute set on enter and removed on exit: parameters, ``state_dict`` and
code that uses the model outside the block (generation, saving) are untouched.
"""
from __future__ import annotations

import contextlib
from functools import partial
from typing import Iterator

import torch

MIN_ROWS = 16  # oneDNN float32: calls are padded to at least this many rows (a single row takes a GEMV path)
MAX_TILE = 256  # fixed tiles: large enough to run near the matmul rate, small enough to pad little
MIN_TILE = 64  # ... and never so small that a wide layer (the vocabulary head) re-reads its weights too often
TILE_OUTPUTS = 1 << 18  # a tile of a layer with many outputs shrinks so that it yields about this many values
# on a GPU (weights on a CUDA device): tiles of GPU_MIN_TILE..GPU_MAX_TILE rows, about GPU_TILE_OUTPUTS values each
GPU_MAX_TILE = 4096
GPU_MIN_TILE = 1024
GPU_TILE_OUTPUTS = 1 << 24
GPU_NORM_TILE = 16384  # norm layers on a GPU (memory-bound: a large tile costs little, few calls cost less)
GPU_REDUCE_ROWS = 1024  # row_logsumexp on a GPU: rows per call
REDUCE_COLUMNS = 128  # ... and rows padded to a multiple of this many columns


def tile_rows(out_features: int) -> int:
    """Rows per call of the fixed-tile path for a layer with ``out_features`` outputs (a power of two)."""
    rows = 1 << max(0, (TILE_OUTPUTS // max(1, int(out_features))).bit_length() - 1)
    return max(MIN_TILE, min(MAX_TILE, rows))


def gpu_tile_rows(out_features: int) -> int:
    """Rows per call of the fixed-tile path on a GPU (a power of two, GPU_MIN_TILE..GPU_MAX_TILE)."""
    rows = 1 << max(0, (GPU_TILE_OUTPUTS // max(1, int(out_features))).bit_length() - 1)
    return max(GPU_MIN_TILE, min(GPU_MAX_TILE, rows))


def _tile_for(module: torch.nn.Module) -> int:
    out = _out_features(module)
    return gpu_tile_rows(out) if module.weight.device.type == "cuda" else tile_rows(out)


def row_logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log-sum-exp over the last dimension of a 2-D float tensor (rows, n), each row computed the same way
    whatever else is in ``x``: ``torch.logsumexp`` on a CPU; on a GPU in float32 (whatever ``x``'s float type) in
    calls of one fixed shape (see the module doc), GPU_REDUCE_ROWS rows padded with -inf to a multiple of
    REDUCE_COLUMNS columns."""
    if x.device.type != "cuda":
        return torch.logsumexp(x, dim=-1)
    rows, n = x.shape
    width = -(-n // REDUCE_COLUMNS) * REDUCE_COLUMNS
    buf = torch.full((GPU_REDUCE_ROWS, width), float("-inf"), dtype=torch.float32, device=x.device)
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    for start in range(0, rows, GPU_REDUCE_ROWS):
        part = x[start:start + GPU_REDUCE_ROWS]
        buf[: part.shape[0], :n] = part  # rows past the part keep earlier values: each row is reduced on its own
        out[start:start + part.shape[0]] = torch.logsumexp(buf, dim=-1)[: part.shape[0]]
    return out


def _norm_like(module: torch.nn.Module) -> bool:
    # norm layers written in Python whose mean over a row is a CUDA reduction shaped by the whole call
    return type(module).__name__.endswith("RMSNorm")


def _on_gpu(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.device.type == "cuda"


def _linear_like(module: torch.nn.Module) -> bool:
    # transformers' Conv1D (GPT-2) and our OneDNNLinear are matched by name to avoid importing either here
    return isinstance(module, torch.nn.Linear) or type(module).__name__ in ("Conv1D", "OneDNNLinear")


def _row_invariant(module: torch.nn.Module) -> bool:
    """Layers whose kernel gives a row the same result for any row count >= 2: oneDNN's float32 linear op."""
    return (type(module).__name__ == "OneDNNLinear" and getattr(module, "use_pointwise", False)
            and module.weight.dtype == torch.float32)


def _out_features(module: torch.nn.Module) -> int:
    return int(module.nf) if type(module).__name__ == "Conv1D" else int(module.out_features)


def _weight_in_out(module: torch.nn.Module) -> torch.Tensor | None:
    """The (in, out) weight of a layer that is a plain ``x @ W + b`` torch can write into a given output."""
    if type(module) is torch.nn.Linear:
        return module.weight.t()
    if type(module).__name__ == "Conv1D":
        return module.weight
    return None


def _padded(part: torch.Tensor, rows: int) -> torch.Tensor:
    if part.shape[0] >= rows:
        return part
    out = part.new_zeros((rows, part.shape[1]))
    out[:part.shape[0]] = part
    return out


def _at_least_rows(forward, rows_min: int, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows == 0 or rows >= rows_min:
        return forward(x)
    out = forward(_padded(flat, rows_min))[:rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _fixed_tiles(module: torch.nn.Module, forward, tile: int, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows == 0:
        return forward(x)
    weight = _weight_in_out(module)
    if weight is not None and not torch.is_grad_enabled() and weight.dtype == flat.dtype:
        # each tile's product is written straight into the output: no copy of the (possibly very wide) result
        out = flat.new_empty((-(-rows // tile) * tile, weight.shape[1]))
        for start in range(0, rows, tile):
            part = _padded(flat[start:start + tile], tile)
            if module.bias is None:
                torch.mm(part, weight, out=out[start:start + tile])
            else:
                torch.addmm(module.bias, part, weight, out=out[start:start + tile])
    else:
        outs = [forward(_padded(flat[start:start + tile], tile)) for start in range(0, rows, tile)]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
    out = out[:rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


@contextlib.contextmanager
def batch_invariant(*modules: torch.nn.Module | None) -> Iterator[None]:
    """Make the linear layers under ``modules`` batch-invariant until the block ends (re-entrant); on a GPU also
    the norm layers that reduce in Python, and the attention kernel pinned (module doc)."""
    patched = []
    gpu = False
    try:
        for root in modules:
            if root is None:
                continue
            for module in root.modules():
                if "forward" in module.__dict__:
                    continue
                if _linear_like(module):
                    gpu = gpu or module.weight.device.type == "cuda"
                    if _row_invariant(module):
                        module.forward = partial(_at_least_rows, module.forward, MIN_ROWS)
                    else:
                        module.forward = partial(_fixed_tiles, module, module.forward, _tile_for(module))
                elif _norm_like(module) and _on_gpu(module):
                    module.forward = partial(_fixed_tiles, module, module.forward, GPU_NORM_TILE)
                else:
                    continue
                patched.append(module)
        with _gpu_attention() if gpu else contextlib.nullcontext():
            yield
    finally:
        for module in patched:
            del module.forward


def _gpu_attention():
    """SDPA on a GPU: flash or memory-efficient attention (math where neither applies), never cuDNN's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
