"""What names a model's outputs, from its config and files alone: importable without torch.

Planning (the Snakefile parse, ``biasflow plan``) hashes every model config into output paths; these helpers used to
live in ``models.hf`` (which imports torch, a second or more per process) and are still importable from there.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

from biasflow.io import stable_hash

# Config keys that change what a model computes, for every model kind (a key a kind does not use is simply absent).
# device and batch sizes do not change the numbers (batch sizes not at all: scoring/batching.py; a device only up to
# float rounding), so they are not here.
SCORING_KEYS = ("kind", "hub_id", "path", "package", "revision", "dtype", "lowercase", "attn_implementation",
                "format", "header", "pooling", "max_length")

# Keys of process models (LM Challenge) and generators (served models, a causal LM's generate options): in the
# fingerprint only when set, so other models' keys never change.
PROCESS_KEYS = ("order", "level", "command", "predictions", "generator", "model_id", "base_url", "extra_body",
                "use_chat_template", "generate_kwargs", "served_model_name", "bos_text")

# Keys that say where a model runs, not what it computes: a served causal LM is named by the server's model name and
# its pinned revision, so moving the server to another node keeps its results and cached answers.
LOCATION_KEYS = {"served_causal_lm": ("base_url",)}


def config_fingerprint(cfg: Mapping[str, Any]) -> str:
    """Fingerprint from the config alone (known before the model is loaded): names output folders."""
    key = {k: cfg.get(k) for k in SCORING_KEYS}
    key.update({k: cfg[k] for k in PROCESS_KEYS if cfg.get(k) is not None
                and k not in LOCATION_KEYS.get(str(cfg.get("kind")), ())})
    return stable_hash(key, 16)


def local_weights_digest(path: Path) -> str:
    """Cheap content digest of a local model folder: sizes plus head and tail bytes of every file.

    Retraining a model in place changes it, so a cache never serves scores of old weights.
    """
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        size = f.stat().st_size
        h.update(f"{f.relative_to(path)}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            if size > 2 << 20:
                fh.seek(-(1 << 20), os.SEEK_END)
                h.update(fh.read())
    return h.hexdigest()[:16]
