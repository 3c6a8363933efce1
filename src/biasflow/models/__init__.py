"""Model adapters, chosen by ``model.kind`` in the config.

Each kind is declared once in ``biasflow.model_kinds`` (``ModelKindSpec``), with its adapter factory as
``"module:function"``; ``load_model(cfg)`` imports that one module and builds the adapter. Adapters expose at least
``name``, ``kind``, ``fingerprint`` (a string that changes whenever the model's outputs could change: id, resolved
revision, dtype, weights hash for local paths) and ``provenance()`` (a dict logged as MLflow tags).
"""
from __future__ import annotations

from typing import Any, Mapping

from biasflow import model_kinds
from biasflow.errors import ConfigError


def load_model(cfg: Mapping[str, Any]):
    kind = cfg.get("kind")
    spec = model_kinds.KINDS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise ConfigError(f"model.kind={model_kinds.unknown_kind_message(kind)}")
    return model_kinds.resolve(spec.factory)(cfg)
