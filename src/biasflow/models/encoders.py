"""Sentence encoders (model kind ``sentence_encoder``): any HF encoder by hub id or local path, with a pooling option.

Poolings (``model.pooling`` or the metric's ``pooling``):

* ``mean``: mean of the last layer over every token of the text *including* the special tokens, then L2
  normalised: bias-bench's SEAT encoder (``last_hidden_state.mean(dim=1)`` on one unpadded text, then
  ``/ norm``). Batched here, so the mean runs over the attention mask, which is the same set of tokens.
* ``cls``: last-layer state of the first position with special tokens added ([CLS] for BERT), not normalised.
* ``first``: last-layer state of the first token of the text tokenised *without* special tokens, not normalised
  (sent-bias's BERT encoder: ``tokenizer.tokenize`` + ``enc[:, 0, :]``).
* ``sbert_mean``: a sentence-transformers model read from its own config files without the
  sentence-transformers package: ``sentence_bert_config.json`` (max_seq_length, do_lower_case),
  ``1_Pooling/config.json`` (mean over the attention mask, or CLS / max) and a ``Normalize`` module in
  ``modules.json`` (L2 norm). all-MiniLM-L6-v2 is mean + normalize.

Config keys: ``hub_id`` or ``path`` (or ``package``: a Python package shipping the model folder, used when
installed), ``revision``, ``device`` (auto), ``dtype`` (float32), ``pooling`` (mean),
``max_length`` (truncation, default the model's), ``lowercase``, ``batch_size`` (32). Loaded by
``models.hf.load_pretrained``; the vectors are ``SentenceEmbedding`` answers (``scoring.embeddings``).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from biasflow.errors import ConfigError, ModelLoadError
from biasflow.models.fingerprint import package_folder
from biasflow.models.hf import load_pretrained
from biasflow.schema import ModelOptions, model_options

log = logging.getLogger(__name__)

POOLINGS = ("mean", "cls", "first", "sbert_mean")


def read_sbert_config(folder: Path | None) -> dict[str, Any]:
    """Pooling settings of a sentence-transformers model folder; defaults (mean + normalize) when absent."""
    out = {"mode": "mean", "normalize": True, "max_seq_length": None, "do_lower_case": False, "found": False}
    if folder is None or not (folder / "modules.json").exists():
        return out
    out["found"] = True
    modules = json.loads((folder / "modules.json").read_text())
    out["normalize"] = any(m.get("type", "").endswith("Normalize") for m in modules)
    pooling = next((m for m in modules if m.get("type", "").endswith("Pooling")), None)
    if pooling is not None:
        cfg_path = folder / pooling.get("path", "") / "config.json"
        pooling_cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        modes = [m for m, key in (("mean", "pooling_mode_mean_tokens"), ("cls", "pooling_mode_cls_token"),
                                  ("max", "pooling_mode_max_tokens")) if pooling_cfg.get(key)]
        if len(modes) != 1:
            raise ModelLoadError(f"{cfg_path}: biasflow supports exactly one of mean/cls/max pooling, got {modes}")
        out["mode"] = modes[0]
    st_cfg = folder / "sentence_bert_config.json"
    if st_cfg.exists():
        st = json.loads(st_cfg.read_text())
        out["max_seq_length"] = st.get("max_seq_length")
        out["do_lower_case"] = bool(st.get("do_lower_case", False))
    return out


class SentenceEncoder:
    kind = "sentence_encoder"

    def __init__(self, cfg: Mapping[str, Any] | ModelOptions):
        from transformers import AutoModel

        opts = self.opts = model_options(cfg, self.kind)
        self.cfg = opts.written()  # as written: what the fingerprint hashes
        folder = package_folder(opts.package)
        if not (folder or opts.path or opts.hub_id):
            raise ModelLoadError(f"model {opts.name!r}: set model.hub_id, model.path or model.package")
        self.pooling = str(opts.pooling or "mean")
        self._check_pooling(self.pooling)
        # the packaged folder is loaded as a local path; the fingerprint still names the config as written
        loaded = load_pretrained(opts.model_copy(update={"path": str(folder)}) if folder else opts, AutoModel)
        self.source, self.device, self.dtype = loaded.source, loaded.device, loaded.dtype
        self.tokenizer, self.model = loaded.tokenizer, loaded.model
        self.resolved_revision = loaded.resolved_revision
        self.fingerprint = loaded.fingerprint(opts)
        self.name = opts.name or self.source
        self.batch_size = int(opts.batch_size or 32)
        self.lowercase = opts.lowercase
        self.max_length = opts.max_length
        self.tokenizer.padding_side = "right"  # position 0 is the first token in every row
        if self.tokenizer.pad_token is None:  # GPT-2 style: any id works, padded positions are masked out
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        local = Path(self.source).expanduser()
        self.sbert = read_sbert_config(local if local.exists() else self._hub_folder(opts.revision or None))
        self.forward_calls = 0  # model forward passes run (tests check the cache with it)

    def _hub_folder(self, revision: str | None) -> Path | None:
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(self.source, revision=revision,
                                          allow_patterns=["modules.json", "*/config.json", "sentence_*.json"]))
        except Exception:  # no sentence-transformers files (or offline): plain HF model, defaults apply
            return None

    @staticmethod
    def _check_pooling(pooling: str) -> None:
        if pooling not in POOLINGS:
            raise ConfigError(f"pooling={pooling!r} is not one of {list(POOLINGS)}")

    def provenance(self) -> dict[str, str]:
        return {"model.source": self.source, "model.revision": str(self.resolved_revision),
                "model.class": type(self.model).__name__, "model.pooling": self.pooling,
                "model.device": str(self.device), "model.fingerprint": self.fingerprint}

    def _prepare(self, texts: Sequence[str], pooling: str) -> list[str]:
        lower = self.lowercase or (pooling == "sbert_mean" and self.sbert["do_lower_case"])
        return [t.lower() for t in texts] if lower else list(texts)

    @torch.inference_mode()
    def encode_batch(self, texts: Sequence[str], pooling: str | None = None) -> np.ndarray:
        """One forward pass over ``texts`` -> float32 array (len(texts), hidden)."""
        pooling = pooling or self.pooling
        self._check_pooling(pooling)
        max_length = self.max_length
        if pooling == "sbert_mean" and self.sbert["max_seq_length"]:
            max_length = max_length or self.sbert["max_seq_length"]
        enc = self.tokenizer(self._prepare(texts, pooling), padding=True, truncation=max_length is not None,
                             max_length=max_length, add_special_tokens=pooling != "first", return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        self.forward_calls += 1
        hidden = self.model(**enc).last_hidden_state.float()
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mode = self.sbert["mode"] if pooling == "sbert_mean" else pooling
        if mode == "mean":
            out = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        elif mode == "max":
            out = hidden.masked_fill(mask == 0, float("-inf")).max(1).values
        else:  # cls, first (and sbert cls): position 0
            out = hidden[:, 0]
        normalize = pooling == "mean" or (pooling == "sbert_mean" and self.sbert["normalize"])
        if normalize:
            out = out / out.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        return out.cpu().numpy().astype(np.float32)

    def encode(self, texts: Sequence[str], pooling: str | None = None, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        """Batched encoding (texts sorted by length so batches pad little), rows in the order given."""
        from biasflow.bars import progress_bar as tqdm

        texts = list(texts)
        if not texts:
            return np.zeros((0, self.model.config.hidden_size), np.float32)
        batch_size = batch_size or self.batch_size
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: np.ndarray | None = None
        starts = range(0, len(order), batch_size)
        for start in tqdm(starts, desc=f"encode {self.name}", unit="batch", disable=not progress):
            idx = order[start:start + batch_size]
            vecs = self.encode_batch([texts[i] for i in idx], pooling)
            if out is None:
                out = np.zeros((len(texts), vecs.shape[1]), np.float32)
            out[idx] = vecs
        return out
