"""Causal language models (GPT-2, Llama-style, any AutoModelForCausalLM) by hub id or local path.

On CPU (float32 and bfloat16) the linear layers, GPT-2's ``Conv1D`` included, run through oneDNN
(``model.cpu_linear: auto|onednn|default``, see ``models/onednn.py``): faster than torch's MKL path on this AMD CPU,
and its float32 kernels give a row the same result whatever the batch (``models/batch_invariant.py``).
"""
from __future__ import annotations

from typing import Any, Mapping

from transformers import AutoModelForCausalLM

from biasflow.models.hf import HFAdapter
from biasflow.models.onednn import use_onednn_linears, want_onednn


class CausalLM(HFAdapter):
    auto_class = AutoModelForCausalLM
    kind = "causal_lm"

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(cfg)
        # GPT-2 has no pad token; padding positions are masked out anyway.
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        bos = self.tokenizer.bos_token_id
        self.bos_token_id = bos if bos is not None else self.tokenizer.eos_token_id
        self.onednn_linears = use_onednn_linears(self.model) if want_onednn(self.cfg, self.device, self.dtype) else 0
