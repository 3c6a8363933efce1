"""oneDNN linear layers for CPU inference, shared by the masked and causal LM adapters.

torch sends float32 matmuls to MKL, which on non-Intel CPUs (this AMD EPYC) runs at less than half the rate oneDNN
reaches; ``use_onednn_linears`` swaps a model's ``nn.Linear`` (and GPT-2 ``Conv1D``) layers for ``OneDNNLinear``:
oneDNN's fused linear op on a weight packed once (the op torch.compile uses on CPU), same numbers to ~1e-6. Its
float32 kernels also compute a row the same way whatever the number of rows in the call (``batch_invariant``
relies on that; ``tests/test_batch_invariance.py`` checks it), which MKL's do not.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import torch

log = logging.getLogger(__name__)
BF16_CPU_FEATURES = "AVX512-BW/VL/DQ or AVX-NE-CONVERT"  # what oneDNN's bf16 inner product needs

_POINTWISE = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)


def _is_conv1d(module: torch.nn.Module) -> bool:
    return type(module).__name__ == "Conv1D"  # transformers' GPT-2 layer: y = x @ W + b with W of shape (in, out)


class OneDNNLinear(torch.nn.Module):
    """Inference-only ``nn.Linear`` (or GPT-2 ``Conv1D``) computed by oneDNN on a weight packed once.

    Uses oneDNN's fused linear op (the one torch.compile uses on CPU) on dense tensors, optionally with the exact
    GELU fused in; falls back to converting activations to and from oneDNN tensors on torch builds without it.
    """

    def __init__(self, linear: torch.nn.Module, widen: bool = False):
        super().__init__()
        weight = linear.weight.detach()
        weight = (weight.t() if _is_conv1d(linear) else weight).contiguous()  # (out, in)
        self.out_features, self.in_features = weight.shape
        self.bias = None if linear.bias is None else linear.bias.detach().contiguous()
        # widen: a bfloat16 layer on a CPU whose oneDNN has no bf16 kernels, computed as a float32 product of its
        # bf16 weights and inputs (exact in float32) rounded back to bfloat16: float32 accumulation, as oneDNN's bf16
        # inner product does, at float32 speed; torch's own bf16 kernels there are ~10x slower than float32
        self.output_dtype = weight.dtype if widen else None
        if widen:
            weight = weight.float()
            self.bias = None if self.bias is None else self.bias.float()
        self.fused_activation = "none"
        self.gelu_approximation = "none"  # "tanh": GPT-2's gelu_new, fused the same way
        self.use_pointwise = _POINTWISE is not None
        if self.use_pointwise:
            try:
                self.weight = _REORDER(weight) if _REORDER is not None else weight
            except RuntimeError:  # older oneDNN builds: an unpacked weight works too, a little slower
                self.weight = weight
        else:
            self.weight = weight.to_mkldnn()
            self.bias_onednn = None if self.bias is None else self.bias.to_mkldnn()

    @property
    def widened(self) -> bool:
        return self.output_dtype is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.output_dtype is not None:
            return self._forward(x.float()).to(self.output_dtype)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features).contiguous()
        if self.use_pointwise:
            algorithm = self.gelu_approximation if self.fused_activation == "gelu" else ""
            y = _POINTWISE(flat, self.weight, self.bias, self.fused_activation, [], algorithm)
        else:
            y = torch._C._nn.mkldnn_linear(flat.to_mkldnn(), self.weight, self.bias_onednn).to_dense()
            if self.fused_activation == "gelu":
                y = torch.nn.functional.gelu(y, approximate=self.gelu_approximation)
        return y.reshape(*lead, self.out_features)


def use_onednn_linears(module: torch.nn.Module) -> int:
    """Swap every float32/bfloat16 ``nn.Linear`` and ``Conv1D`` under ``module`` for ``OneDNNLinear``; returns how many.

    The GELU of the feed-forward is fused into its first linear op: the exact GELU of BERT/RoBERTa-style layers
    (``*Intermediate`` with ``dense`` and ``intermediate_act_fn``) and GPT-2's tanh approximation (``gelu_new``: an
    MLP with ``c_fc`` and ``act``). One pass over the feed-forward activations instead of eight elementwise ones.
    """
    widen = not onednn_runs_bf16()
    swapped = widened = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, torch.nn.Linear) or _is_conv1d(child)) and child.weight.dtype in (torch.float32,
                                                                                                     torch.bfloat16):
                bf16_widened = widen and child.weight.dtype == torch.bfloat16
                setattr(parent, name, OneDNNLinear(child, widen=bf16_widened))
                swapped += 1
                widened += bf16_widened
    if widened:
        log.warning("bfloat16 on this CPU: oneDNN cannot run bfloat16 linear layers here (it needs %s); %d layers "
                    "run as float32 products of their bfloat16 weights and inputs, rounded back to bfloat16 (float32 "
                    "accumulation, as oneDNN's bf16 does; their weights take twice the memory)",
                    BF16_CPU_FEATURES, widened)
    for parent in list(module.modules()):
        act = getattr(parent, "intermediate_act_fn", None)
        dense = getattr(parent, "dense", None)
        if (isinstance(dense, OneDNNLinear) and dense.use_pointwise and type(act).__name__ == "GELUActivation"
                and getattr(act, "act", None) is torch.nn.functional.gelu):
            dense.fused_activation = "gelu"
            parent.intermediate_act_fn = torch.nn.Identity()
        c_fc, act = getattr(parent, "c_fc", None), getattr(parent, "act", None)
        if isinstance(c_fc, OneDNNLinear) and c_fc.use_pointwise and _is_tanh_gelu(act):
            c_fc.fused_activation, c_fc.gelu_approximation = "gelu", "tanh"
            parent.act = torch.nn.Identity()
    return swapped


def _is_tanh_gelu(act: Any) -> bool:
    """transformers' ``gelu_new`` (NewGELUActivation) or ``gelu_pytorch_tanh``: 0.5 x (1 + tanh(sqrt(2/pi) (x +
    0.044715 x^3)))."""
    name = type(act).__name__
    return name in ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh")


def want_onednn(opts: Any, device: torch.device, dtype: torch.dtype) -> bool:
    """``model.cpu_linear`` of the model's options (``schema.model_options``): auto (oneDNN where usable), onednn
    (required), default (torch's own linear layers)."""
    choice = str(opts.cpu_linear or "auto")  # validated: auto, onednn or default
    usable = (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
              and torch.backends.mkldnn.is_available())
    if choice == "onednn" and not usable:
        raise ValueError("model.cpu_linear=onednn needs device=cpu, dtype float32 or bfloat16 and a torch built "
                         "with oneDNN")
    return usable and choice != "default"


@functools.lru_cache(maxsize=None)
def onednn_runs_bf16() -> bool:
    """Whether oneDNN runs bfloat16 linear layers on this CPU: it needs AVX512-BW/VL/DQ or AVX-NE-CONVERT (an AVX2-only
    CPU has neither; ``ONEDNN_MAX_CPU_ISA`` can forbid them). Tried on a tiny layer, since that is the call that would
    fail, as well as asked of torch."""
    if not torch.backends.mkldnn.is_available():
        return False
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if supported is not None and not supported():
        return False
    try:
        layer = OneDNNLinear(torch.nn.Linear(16, 8).to(torch.bfloat16))
        layer(torch.zeros(4, 16, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True
