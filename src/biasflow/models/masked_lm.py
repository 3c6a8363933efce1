"""Masked language models (BERT, RoBERTa, ALBERT, DistilBERT, ...) by hub id or local path.

Speed notes (measured in ``benchmarks/scoring_speed.py``, see ``docs/performance.md``):
* the vocabulary head runs only at the positions asked for (``logits_at``), not at every position;
* a batch without padding is run with no attention mask (same numbers; lets SDPA skip the mask); on a GPU the
  scorer decides that from the padded width alone (``scoring/masked.py``), since the kernel changes with it;
* with ``model.dtype=bfloat16``/``float16`` the encoder runs in low precision but the head runs on an fp32 copy:
  it is ~1-2% of the work and keeps the log-softmax over the vocabulary accurate;
* on CPU (float32 and bfloat16) the linear layers of the encoder and the head run through oneDNN's fused linear op
  on weights packed once, with the feed-forward GELU fused in (``model.cpu_linear: auto|onednn|default``, see
  ``models/onednn.py``): torch's fp32 matmul goes to MKL, which on non-Intel CPUs (this AMD EPYC) takes a path about
  half as fast; oneDNN gives the same numbers to ~1e-6;
* linear layers run under ``batch_invariant`` so a row's logits do not depend on how many rows share its batch;
* ``model.threads`` sets torch's intra-op threads on a CPU (default: torch's choice, one per core).
"""
from __future__ import annotations

import copy
from typing import Any, Mapping

import torch
from transformers import AutoModelForMaskedLM

from biasflow.io import stable_hash
from biasflow.models.batch_invariant import batch_invariant
from biasflow.models.hf import HFAdapter, config_fingerprint, numeric_library_versions
from biasflow.models.onednn import OneDNNLinear, use_onednn_linears, want_onednn
from biasflow.schema import model_options

__all__ = ["MaskedLM", "OneDNNLinear", "use_onednn_linears"]


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


def position_table(model) -> tuple[torch.nn.Module, int] | None:
    """The module that embeds a text (the owner of the learned position table) and the most tokens one text may
    have: the table's size, less RoBERTa's offset (its positions start after the padding index: 514 entries, 512
    tokens); None when the model has no learned position table."""
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding):
            offset = module.padding_idx + 1 if module.padding_idx is not None else 0
            return modules[name.rpartition(".")[0]], module.num_embeddings - offset
    return None


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
        self.opts = model_options(self.cfg)
        self.name = name
        self.source = self.opts.path
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
                                        "cls": type(self.model).__name__, "libraries": numeric_library_versions()},
                                       24)
        self._setup()
        return self

    def _setup(self) -> None:
        if self.tokenizer.mask_token_id is None:
            raise ValueError(f"model {self.name!r}: tokenizer has no mask token; is it a masked LM?")
        self._refuse_texts_too_long()
        threads = self.opts.threads
        if threads and self.device.type == "cpu":  # a CPU setting: a model on a GPU leaves torch's threads alone
            torch.set_num_threads(int(threads))
        self.split = _mlm_head(self.model)
        self.head_fp32 = None
        if self.split is not None and self.dtype != torch.float32:
            # fp32 copy of the (small) head: the log-softmax over ~30k words is where low precision hurts most
            self.head_fp32 = copy.deepcopy(self.split[1]).float()
        self.onednn_linears = 0
        if want_onednn(self.opts, self.device, self.dtype):
            # encoder and the head that runs (its tied input embedding keeps its own weights)
            if self.split is None:
                parts = [self.model]
            else:
                parts = [self.split[0], self.head_fp32 if self.head_fp32 is not None else self.split[1]]
            self.onednn_linears = sum(use_onednn_linears(part) for part in parts)

    def _refuse_texts_too_long(self) -> None:
        """A text longer than the model's position table fails every masked scorer with a plain error naming the
        model, the limit and the text, instead of a tensor-size error deep in torch (GAP's passages reach 355 word
        pieces; a small model takes 128). Checked where every forward pass starts: the embeddings."""
        found = position_table(self.model)
        if found is None:
            return
        embeddings, limit = found

        def check(_module, args, kwargs) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[-1] <= limit:
                return
            pad = self.tokenizer.pad_token_id
            lengths = (ids != pad).sum(-1) if pad is not None else torch.full(ids.shape[:1], ids.shape[-1])
            if int(lengths.max()) <= limit:
                return  # padding beyond the table: the model's own business (RoBERTa gives pads no position)
            row = int(lengths.argmax())
            start = self.tokenizer.decode([int(t) for t in ids[row][:40] if pad is None or int(t) != pad])
            raise ValueError(f"model {self.name!r} takes at most {limit} tokens per text; a text of "
                             f"{int(lengths.max())} tokens (special tokens included) starts {start!r}: shorten the "
                             f"items or use a model with more positions")

        embeddings.register_forward_pre_hook(check, with_kwargs=True)

    @torch.inference_mode()
    def logits_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, rows: torch.Tensor,
                  cols: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits (float32) at positions (rows[i], cols[i]) of a padded batch.

        Linear layers run on fixed-size row tiles (``batch_invariant``), so a row's logits do not depend on how
        many rows share the batch.
        """
        if attention_mask is not None and self.device.type == "cpu" and bool(attention_mask.all()):
            attention_mask = None  # no padding: an all-ones mask changes nothing but costs a masked attention
        # on a GPU the mask is kept as the caller gives it: whether there is one picks the attention kernel (flash
        # or memory-efficient, whose last bits differ), so it must not depend on the company of a row
        with batch_invariant(self.model, self.head_fp32):
            if self.split is not None:
                encoder, head = self.split
                hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[rows, cols]
                if self.head_fp32 is not None:
                    return self.head_fp32(hidden.float())
                return head(hidden).float()
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
            return logits[rows, cols].float()
