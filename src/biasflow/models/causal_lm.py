"""Causal language models (GPT-2, Llama-style, any AutoModelForCausalLM) by hub id or local path.

On CPU (float32 and bfloat16) the linear layers, GPT-2's ``Conv1D`` included, run through oneDNN
(``model.cpu_linear: auto|onednn|default``, see ``models/onednn.py``): faster than torch's MKL path on this AMD CPU,
and its float32 kernels give a row the same result whatever the batch (``models/batch_invariant.py``).

Opt-in (issue 37, off by default): ``model.head_chunk`` (the vocabulary head and its log-sum-exp in chunks,
``models/chunked_head.py``) and ``model.compile: blocks`` (torch.compile of the RMSNorm and gated-MLP blocks,
``models/compiled.py``).
"""
from __future__ import annotations

from typing import Any, Mapping

from transformers import AutoModelForCausalLM

from biasflow.models.chunked_head import ChunkedHead, head_chunk_for, head_on_real_tokens
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
        self.chunked_head = chunked_head(self.model, self.opts.head_chunk, self.device)
        self.compiled = None
        if self.opts.compile is not None:
            from biasflow.models.compiled import compile_blocks

            self.compiled = compile_blocks(self.model, str(self.opts.compile), name=self.name)
            if self.chunked_head is not None:  # and the chunked head's per-chunk reduction
                self.chunked_head.compile()
        self.onednn_linears = use_onednn_linears(self.model) if want_onednn(self.opts, self.device, self.dtype) else 0


def chunked_head(model, value: Any, device) -> ChunkedHead | None:
    """``model.head_chunk`` as a ``ChunkedHead`` on ``model``'s plain vocabulary head (None: off, or a model whose
    logits are not a plain head); built before the CPU's linears become oneDNN's."""
    chunk = head_chunk_for(value, device)
    if chunk is None or not head_on_real_tokens(model):
        return None
    return ChunkedHead.of(model, chunk)
