"""torch.compile of a causal LM's memory-bound blocks (``model.compile: blocks``, issue 37).

The first GPU round's profile of the 1B Llama-shaped model: matmuls ~165 ms of a 0.43 s pass, ~115 ms in
transformers' element-wise work (float32 RMSNorm, rotary, SiLU, casts), each op one pass over memory. ``blocks``
compiles, with ``torch.compile(dynamic=True)`` (one kernel for every token count, so no recompilation per batch
shape and no shape-bucketing):

* every ``*RMSNorm`` layer's own ``forward`` (its float32 cast, mean of squares, rsqrt, scale and cast back fused
  into one kernel); the layer keeps a class name ending in ``RMSNorm``, so ``batch_invariant`` still runs it in its
  fixed GPU tiles (``models/batch_invariant.py``);
* the gated MLP's ``act_fn(gate) * up`` (Llama, Mistral, Qwen: ``gate_proj``/``up_proj``/``down_proj``): one kernel
  instead of two passes; the three linear layers stay as they are (eager, in ``batch_invariant``'s fixed tiles), so
  the matmuls and their batch invariance are unchanged;
* rotary positions (``apply_rotary_pos_emb`` of the model's transformers module) while this model runs (a forward
  pre-hook / hook pair on the model switches the compiled function on; other models in the process keep the eager
  one).

Not offered: compiling the whole model (``torch.compile(model)``): the packed layout (``models/packed.py``) and the
fixed tiles of ``batch_invariant`` are Python-level patches whose loops and per-batch layouts would break the graph
or recompile for each batch.

Numbers: a compiled kernel computes the same formula in one pass, rounding its intermediates where eager does
(inductor's ``emulate_precision_casts``), so the log-probs agree with the eager path within float rounding (float32:
~5e-7 measured, ``tests/test_causal_fast_paths.py`` states 1e-5; bfloat16: ~5e-6 measured on the tiny Llama shape,
~2e-3 without the option). Each row of an element-wise kernel and each row's reduction over the hidden size is computed on its
own, so a text's numbers stay the same alone and in a batch (tested).

Compile time is spent on the first calls; ``compile_blocks`` warms the compiled functions up on the model's device
and dtype and logs how long it took (``CompiledBlocks.seconds``). Inductor keeps its compiled kernels and its FX
graph cache in ``TORCHINDUCTOR_CACHE_DIR`` (default ``/tmp/torchinductor_<user>``): set it to a lasting folder to
reuse them across processes (a warm cache takes the compile from tens of seconds to a few). On a CPU the kernels
go to a subfolder keyed by the CPU and its kernel limits (``cpu_keyed_cache_dir``).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
MODES = ("blocks",)
_SILU_NAMES = ("SiLU", "SiLUActivation")


@dataclass
class CompiledBlocks:
    """What ``compile_blocks`` compiled, and how long the warm-up (the compilation) took."""

    mode: str
    norms: int = 0
    mlps: int = 0
    rotary: bool = False
    seconds: float = 0.0
    cache_dir: str = ""
    hooks: list[Any] = field(default_factory=list)

    def summary(self) -> str:
        return (f"compile={self.mode}: {self.norms} RMSNorm, {self.mlps} gated MLP"
                f"{', rotary' if self.rotary else ''} compiled (dynamic shapes) in {self.seconds:.1f} s; "
                f"inductor cache {self.cache_dir}")


def cpu_keyed_cache_dir() -> str:
    """Point inductor's cache at a folder of its own for this CPU and its kernel limits (``cpu-<key>`` under
    ``TORCHINDUCTOR_CACHE_DIR``). Inductor's graph cache does not key its CPU kernels on ``ATEN_CPU_CAPABILITY`` and
    the like: kernels compiled with AVX-512, reused under AVX2 limits (or on another CPU sharing the folder), gave
    log-probabilities of 1e36 instead of about -4 (found by the AVX2 check of issue 47)."""
    import hashlib

    from biasflow.provenance import cpu_description

    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:  # not Linux: the description alone
        flags = []
    key = "cpu-" + hashlib.sha256("\n".join([cpu_description(), *sorted(flags)]).encode()).hexdigest()[:12]
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or inductor_cache_dir()
    if os.path.basename(os.path.normpath(base)) != key:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, key)
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def inductor_cache_dir() -> str:
    """Where inductor keeps its compiled kernels (``TORCHINDUCTOR_CACHE_DIR``, else its default)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return str(cache_dir())
    except Exception:  # noqa: BLE001 - only for the log line
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR", "(torch default)")


def compiler_problem() -> str | None:
    """Why inductor cannot compile here (None when it can): on a CPU it needs a C++ compiler."""
    import shutil

    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "torch.compile (inductor) needs a C++ compiler on a CPU: install one (apt-get install g++)"
    return None


def _compiled(fn):
    # emulate_precision_casts: the fused kernel rounds its intermediates to the input's dtype where eager does (bf16
    # between ops), so a bf16 model's compiled blocks give eager's numbers to ~1e-6 instead of ~2e-3 (measured on the
    # tiny Llama shape of device_speed.py); still one kernel, one pass over memory
    import torch._inductor.config as inductor

    options = {"emulate_precision_casts": True} if hasattr(inductor, "emulate_precision_casts") else None
    return torch.compile(fn, dynamic=True, options=options)


def _norm_class(cls: type) -> type:
    """A subclass of an RMSNorm class whose forward is the class's own forward compiled (name kept: ``*RMSNorm``)."""
    compiled = _compiled(cls.forward)

    def forward(self, hidden_states):
        return compiled(self, hidden_states)

    return type(f"Compiled{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})


def _act_mul(act):
    def act_mul(gate, up):
        return act(gate) * up

    return _compiled(act_mul)


def _mlp_class(cls: type) -> type:
    def forward(self, x):
        return self.down_proj(self._biasflow_act_mul(self.gate_proj(x), self.up_proj(x)))

    return type(f"Compiled{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})


def _gated_mlp(module: torch.nn.Module) -> bool:
    return (all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj"))
            and type(getattr(module, "act_fn", None)).__name__ in _SILU_NAMES)


class _Rotary:
    """The model module's ``apply_rotary_pos_emb`` replaced by one that calls the compiled function while a model
    that asked for it runs (``depth`` > 0), the eager one otherwise."""

    def __init__(self, module, eager):
        self.module, self.eager, self.depth = module, eager, 0
        self.compiled = _compiled(eager)

    def __call__(self, *args, **kwargs):
        return (self.compiled if self.depth > 0 else self.eager)(*args, **kwargs)


def _rotary_for(model: torch.nn.Module) -> _Rotary | None:
    module = sys.modules.get(type(model).__module__)
    current = getattr(module, "apply_rotary_pos_emb", None)
    if current is None:
        return None
    if not isinstance(current, _Rotary):
        current = _Rotary(module, current)
        module.apply_rotary_pos_emb = current
    return current


def compile_blocks(model: torch.nn.Module, mode: str = "blocks", name: str = "", warm_up: bool = True
                   ) -> CompiledBlocks:
    """Compile ``model``'s RMSNorm, gated-MLP and rotary blocks in place (module doc); returns what was done."""
    if mode not in MODES:
        raise ValueError(f"model.compile={mode!r}: one of {MODES} (or false)")
    if next(model.parameters()).device.type == "cpu":
        problem = compiler_problem()
        if problem:
            raise RuntimeError(f"model {name!r}: compile={mode}: {problem}")
        cpu_keyed_cache_dir()
    done = CompiledBlocks(mode=mode, cache_dir=inductor_cache_dir())
    norm_classes: dict[type, type] = {}
    mlp_classes: dict[type, type] = {}
    acts: dict[type, Any] = {}
    for module in model.modules():
        cls = type(module)
        if cls.__name__.endswith("RMSNorm") and cls.__module__ != __name__:
            module.__class__ = norm_classes.setdefault(cls, _norm_class(cls))
            done.norms += 1
        elif _gated_mlp(module) and cls.__module__ != __name__:
            module._biasflow_act_mul = acts.setdefault(type(module.act_fn), _act_mul(module.act_fn))
            module.__class__ = mlp_classes.setdefault(cls, _mlp_class(cls))
            done.mlps += 1
    base = getattr(model, "base_model", model)
    rotary = _rotary_for(model) if getattr(model.config, "model_type", "") != "gpt2" else None
    if rotary is not None:
        done.rotary = True

        def enter(*_args, **_kwargs):
            rotary.depth += 1

        def leave(*_args, **_kwargs):
            rotary.depth -= 1

        done.hooks = [base.register_forward_pre_hook(enter), base.register_forward_hook(leave, always_call=True)]
    if warm_up and (done.norms or done.mlps):
        done.seconds = _warm_up(model, base)
    log.info("model %s: %s", name or type(model).__name__, done.summary())
    return done


@torch.inference_mode()
def _warm_up(model: torch.nn.Module, base: torch.nn.Module) -> float:
    """One short pass of two texts' worth of tokens through the base model: compiles every block's kernel (the
    compile time) before the first batch is timed."""
    from biasflow.models.batch_invariant import batch_invariant

    started = time.perf_counter()
    device = next(model.parameters()).device
    ids = torch.arange(3, 3 + 5, device=device)[None] % int(model.config.vocab_size)
    with batch_invariant(model):  # the shapes scoring uses (on a GPU the norms run in fixed 2-D tiles)
        base(input_ids=ids, use_cache=False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


__all__ = ["MODES", "CompiledBlocks", "compile_blocks", "compiler_problem", "inductor_cache_dir"]
