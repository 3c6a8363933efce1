"""Shared loading code for Hugging Face models: hub id or local path, pinned revision, device, dtype."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from biasflow.errors import ModelLoadError
from biasflow.io import stable_hash
# planning needs these without torch; they live in models.fingerprint and stay importable from here
from biasflow.models.fingerprint import (PROCESS_KEYS, SCORING_KEYS, config_fingerprint,  # noqa: F401
                                         local_weights_digest)

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def source_of(cfg: Mapping[str, Any]) -> str:
    src = cfg.get("path") or cfg.get("hub_id")
    if not src:
        raise ModelLoadError(f"model {cfg.get('name')!r}: set model.hub_id (a hub id) or model.path (a local folder)")
    return str(src)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


def check_model_folder(folder: Path, name: str) -> None:
    """A local model folder must be what ``save_pretrained`` writes; otherwise say what is missing (transformers'
    own message for an empty or wrong folder talks about sentencepiece and tiktoken)."""
    if not folder.is_dir():
        raise ModelLoadError(f"model {name!r}: {folder} is a file, not a model folder (save_pretrained output)")
    missing = []
    if not (folder / "config.json").exists():
        missing.append("config.json")
    if not any((folder / f).exists() for f in WEIGHT_FILES):
        missing.append("weights (" + " or ".join(WEIGHT_FILES[::2]) + ")")
    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        missing.append("tokenizer files (" + ", ".join(TOKENIZER_FILES[:3]) + ", ...)")
    if missing:
        found = sorted(p.name for p in folder.iterdir())[:8]
        raise ModelLoadError(f"model {name!r}: {folder} is not a model folder: no {'; no '.join(missing)} "
                             f"(found {found or 'nothing'}). Point model.path at the output of save_pretrained.")


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


@dataclass
class Loaded:
    """What ``load_pretrained`` gives: the model (eval mode, on its device), its tokenizer and where it came from."""

    model: Any
    tokenizer: Any
    source: str
    device: torch.device
    dtype: torch.dtype
    resolved_revision: str

    def fingerprint(self, cfg: Mapping[str, Any]) -> str:
        """Changes whenever the model's outputs could: the scoring options, the resolved revision, the class."""
        return stable_hash({"config": config_fingerprint(cfg), "revision": self.resolved_revision,
                            "cls": type(self.model).__name__}, 24)


def load_pretrained(cfg: Mapping[str, Any], auto_class: Any, *, tokenizer: bool = True) -> Loaded:
    """THE way biasflow loads a Hugging Face model: ``model.path`` (a local ``save_pretrained`` folder, checked) or
    ``model.hub_id`` at ``model.revision``, in ``model.dtype`` on ``model.device`` (auto: cuda, mps, cpu), with
    ``model.attn_implementation`` if set. Errors name the model and where it was looked for."""
    from transformers import AutoTokenizer

    name = cfg.get("name") or source_of(cfg)
    source = source_of(cfg)
    revision = cfg.get("revision") or None
    device = resolve_device(cfg.get("device", "auto"))
    dtype_name = str(cfg.get("dtype", "float32"))
    if dtype_name not in DTYPES:
        raise ModelLoadError(f"model.dtype={dtype_name!r} is not one of {sorted(DTYPES)}")
    local = Path(source).expanduser()
    is_local = local.exists()
    if cfg.get("path") and not is_local:
        raise ModelLoadError(f"model.path={source!r} does not exist")
    if is_local:
        check_model_folder(local, name)
    kwargs: dict[str, Any] = {}
    if not is_local and revision:
        kwargs["revision"] = revision
    where_from = str(local) if is_local else source
    try:
        tok = AutoTokenizer.from_pretrained(where_from, **kwargs) if tokenizer else None
        model_kwargs = dict(kwargs, dtype=DTYPES[dtype_name])
        if cfg.get("attn_implementation"):
            model_kwargs["attn_implementation"] = cfg["attn_implementation"]
        model = auto_class.from_pretrained(where_from, **model_kwargs)
    except (OSError, ValueError, ImportError) as exc:
        where = f"local folder {local}" if is_local else f"hub id {source!r} (revision {revision})"
        raise ModelLoadError(f"could not load model {name!r} from {where}: {exc}") from exc
    model.to(device).eval()
    if is_local:
        resolved = "local:" + local_weights_digest(local)
    else:
        resolved = getattr(model.config, "_commit_hash", None) or revision or "unpinned"
    return Loaded(model=model, tokenizer=tok, source=source, device=device, dtype=DTYPES[dtype_name],
                  resolved_revision=resolved)


class HFAdapter:
    """Base adapter: loads tokenizer + model once (``load_pretrained``), records provenance, runs in eval mode."""

    auto_class: Any = None
    kind = "hf"

    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = dict(cfg)
        self.name = cfg.get("name") or source_of(cfg)
        self.lowercase = bool(cfg.get("lowercase", False))
        loaded = load_pretrained(cfg, self.auto_class)
        self.source, self.revision = loaded.source, cfg.get("revision") or None
        self.device, self.dtype = loaded.device, loaded.dtype
        self.tokenizer, self.model = loaded.tokenizer, loaded.model
        self.resolved_revision = loaded.resolved_revision
        self.fingerprint = loaded.fingerprint(cfg)

    def normalise(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def provenance(self) -> dict[str, str]:
        return {"model.source": self.source, "model.revision": str(self.resolved_revision),
                "model.class": type(self.model).__name__, "model.dtype": str(self.dtype).replace("torch.", ""),
                "model.device": str(self.device), "model.fingerprint": self.fingerprint}
