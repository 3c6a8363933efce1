"""Masked language models (BERT, RoBERTa, ALBERT, DistilBERT, ...) by hub id or local path.

Speed notes (measured in ``benchmarks/scoring_speed.py``, see ``docs/performance.md``):
* the vocabulary head runs only at the positions asked for (``logits_at``), not at every position;
* a batch without padding is run with no attention mask (same numbers; lets SDPA skip the mask);
* with ``model.dtype=bfloat16``/``float16`` the encoder runs in low precision but the head runs on an fp32 copy:
  it is ~1-2% of the work and keeps the log-softmax over the vocabulary accurate;
* on CPU (float32 and bfloat16) the encoder's linear layers run through oneDNN's fused linear op on weights packed
  once, with the feed-forward GELU fused in (``model.cpu_linear: auto|onednn|default``): torch's fp32 matmul goes
  to MKL, which on non-Intel CPUs (this AMD EPYC) takes a path about half as fast; oneDNN gives the same numbers
  to ~1e-6;
* ``model.threads`` sets torch's intra-op threads (default: torch's choice, one per core).
"""
from __future__ import annotations

import copy
from typing import Any, Mapping

import torch
from transformers import AutoModelForMaskedLM

from biasflow.models import register_model_kind
from biasflow.models.batch_invariant import batch_invariant
from biasflow.models.hf import HFAdapter, config_fingerprint
from biasflow.io import stable_hash


def _mlm_head(model) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(encoder, head) split of a masked LM so the vocabulary projection runs only where it is needed.

    Returns None for architectures not listed here; callers then run the full model (same numbers, slower).
    """
    if hasattr(model, "bert") and hasattr(model, "cls"):
        return model.bert, model.cls
    if hasattr(model, "roberta") and hasattr(model, "lm_head"):
        return model.roberta, model.lm_head
    if hasattr(model, "albert") and hasattr(model, "predictions"):
        return model.albert, model.predictions
    if hasattr(model, "distilbert") and hasattr(model, "vocab_projector"):
        head = torch.nn.Sequential(model.vocab_transform, model.activation, model.vocab_layer_norm,
                                   model.vocab_projector)
        return model.distilbert, head
    return None


_POINTWISE = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)


class OneDNNLinear(torch.nn.Module):
    """Inference-only ``nn.Linear`` computed by oneDNN on a weight packed once in oneDNN's layout.

    Uses oneDNN's fused linear op (the one torch.compile uses on CPU) on dense tensors, optionally with the exact
    GELU fused in; falls back to converting activations to and from oneDNN tensors on torch builds without it.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().contiguous()
        self.bias = None if linear.bias is None else linear.bias.detach().contiguous()
        self.fused_activation = "none"
        self.use_pointwise = _POINTWISE is not None
        if self.use_pointwise:
            try:
                self.weight = _REORDER(weight) if _REORDER is not None else weight
            except RuntimeError:  # older oneDNN builds: an unpacked weight works too, a little slower
                self.weight = weight
        else:
            self.weight = weight.to_mkldnn()
            self.bias_onednn = None if self.bias is None else self.bias.to_mkldnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features).contiguous()
        if self.use_pointwise:
            algorithm = "none" if self.fused_activation == "gelu" else ""
            y = _POINTWISE(flat, self.weight, self.bias, self.fused_activation, [], algorithm)
        else:
            y = torch._C._nn.mkldnn_linear(flat.to_mkldnn(), self.weight, self.bias_onednn).to_dense()
            if self.fused_activation == "gelu":
                y = torch.nn.functional.gelu(y)
        return y.reshape(*lead, self.out_features)


def use_onednn_linears(module: torch.nn.Module) -> int:
    """Swap every float32/bfloat16 ``nn.Linear`` under ``module`` for ``OneDNNLinear``; returns how many were swapped.

    The exact-GELU feed-forward of BERT/RoBERTa-style layers (``*Intermediate`` with ``dense`` and
    ``intermediate_act_fn``) is fused into its linear op.
    """
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and child.weight.dtype in (torch.float32, torch.bfloat16):
                setattr(parent, name, OneDNNLinear(child))
                swapped += 1
    for parent in list(module.modules()):
        act = getattr(parent, "intermediate_act_fn", None)
        dense = getattr(parent, "dense", None)
        if (isinstance(dense, OneDNNLinear) and dense.use_pointwise and type(act).__name__ == "GELUActivation"
                and getattr(act, "act", None) is torch.nn.functional.gelu):
            dense.fused_activation = "gelu"
            parent.intermediate_act_fn = torch.nn.Identity()
    return swapped


def _want_onednn(cfg: Mapping[str, Any], device: torch.device, dtype: torch.dtype) -> bool:
    choice = str(cfg.get("cpu_linear") or "auto")
    if choice not in ("auto", "onednn", "default"):
        raise ValueError(f"model.cpu_linear={choice!r} is not one of auto, onednn, default")
    usable = (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
              and torch.backends.mkldnn.is_available())
    if choice == "onednn" and not usable:
        raise ValueError("model.cpu_linear=onednn needs device=cpu, dtype float32 or bfloat16 and a torch built "
                         "with oneDNN")
    return usable and choice != "default"


@register_model_kind("masked_lm")
class MaskedLM(HFAdapter):
    auto_class = AutoModelForMaskedLM
    kind = "masked_lm"

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(cfg)
        self._setup()

    @classmethod
    def from_model(cls, model, tokenizer, name: str = "in-memory", dtype: str = "float32",
                   device: str = "cpu", threads: int | None = None, cpu_linear: str = "auto") -> "MaskedLM":
        """Adapter around a model object already in memory (tests, benchmarks); no files are read.

        The fingerprint hashes the model's config and a sample of its weights, so two different random models
        never share cache entries.
        """
        from biasflow.models.hf import DTYPES

        self = cls.__new__(cls)
        self.cfg = {"name": name, "kind": "masked_lm", "path": f"<memory:{name}>", "dtype": dtype,
                    "device": device, "threads": threads, "cpu_linear": cpu_linear}
        self.name = name
        self.source = self.cfg["path"]
        self.revision = None
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        self.lowercase = False
        self.tokenizer = tokenizer
        self.model = model.to(self.device, self.dtype).eval()
        sample = [float(p.detach().float().flatten()[:64].sum()) for p in list(self.model.parameters())[:8]]
        self.resolved_revision = "memory:" + stable_hash({"config": self.model.config.to_dict(),
                                                          "weights": sample}, 16)
        self.fingerprint = stable_hash({"config": config_fingerprint(self.cfg), "revision": self.resolved_revision,
                                        "cls": type(self.model).__name__}, 24)
        self._setup()
        return self

    def _setup(self) -> None:
        if self.tokenizer.mask_token_id is None:
            raise ValueError(f"model {self.name!r}: tokenizer has no mask token; is it a masked LM?")
        threads = self.cfg.get("threads")
        if threads:
            torch.set_num_threads(int(threads))
        self.split = _mlm_head(self.model)
        self.onednn_linears = 0
        if _want_onednn(self.cfg, self.device, self.dtype):
            # the encoder only: the head runs on a few rows, and other code may read its (tied) weights
            self.onednn_linears = use_onednn_linears(self.split[0] if self.split is not None else self.model)
        self.head_fp32 = None
        if self.split is not None and self.dtype != torch.float32:
            # fp32 copy of the (small) head: the log-softmax over ~30k words is where low precision hurts most
            self.head_fp32 = copy.deepcopy(self.split[1]).float()

    @torch.inference_mode()
    def logits_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, rows: torch.Tensor,
                  cols: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits (float32) at positions (rows[i], cols[i]) of a padded batch.

        Linear layers run on fixed-size row tiles (``batch_invariant``), so a row's logits do not depend on how
        many rows share the batch.
        """
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # no padding: an all-ones mask changes nothing but costs a masked attention
        with batch_invariant(self.model, self.head_fp32):
            if self.split is not None:
                encoder, head = self.split
                hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[rows, cols]
                if self.head_fp32 is not None:
                    return self.head_fp32(hidden.float())
                return head(hidden).float()
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
            return logits[rows, cols].float()
