"""Model adapters, chosen by ``model.kind`` in the config.

Each kind is declared once in ``biasflow.model_kinds`` (``ModelKindSpec``), with its adapter factory as
``"module:function"``; ``load_model(cfg)`` validates the config once into its kind's config model
(``schema.model_options``), imports that one module and builds the adapter from the validated options (their
attributes: ``opts.hub_id``, ``opts.dtype``; ``opts.written()`` is the config as written, for the fingerprint). Adapters expose at least
``name``, ``kind``, ``fingerprint`` (a string that changes whenever the model's outputs could change: id, resolved
revision, dtype, weights hash for local paths) and ``provenance()`` (a dict logged as MLflow tags).
"""
from __future__ import annotations

from typing import Any, Mapping

from biasflow import model_kinds
from biasflow.schema import ModelOptions, model_options


def load_model(cfg: Mapping[str, Any] | ModelOptions, kind: str | None = None):
    """The adapter of model config ``cfg`` (validated here, once: an unknown kind or a bad option is a ConfigError
    naming it), or of its sibling head ``kind`` (``model_kinds.Answer.load_as``)."""
    opts = model_options(cfg)
    if kind is not None:
        opts = opts.loaded_as(kind)
    return model_kinds.resolve(model_kinds.KINDS[opts.kind].factory)(opts)
