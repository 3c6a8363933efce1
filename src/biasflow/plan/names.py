"""Display names of the models of a sweep: each model's own name, told apart where two differ only in config."""
from __future__ import annotations

import re
from typing import Any

from biasflow.errors import ConfigError
from biasflow.models.fingerprint import config_fingerprint


def display_name(model: dict[str, Any]) -> str | None:
    """The name a model without ``model.name`` goes by: its local folder's name, else the last part of its hub id or
    the server's name for it, made folder-safe; None when there is nothing to name it after."""
    source = model.get("path") or model.get("hub_id") or model.get("served_model_name")
    if not isinstance(source, str) or not source.strip("/"):
        return None
    base = source.rstrip("/").replace("\\", "/").split("/")[-1]
    slug = re.sub(r"[^A-Za-z0-9._+-]+", "_", base).strip("._-+")[:120]
    return slug or None


def with_display_names(models: list[dict[str, Any]]) -> None:
    """Give every model of a plan without ``model.name`` its ``display_name`` (in place), unique within the plan:
    two different models that would share one (two checkpoints in folders of one name) get a short suffix, the
    first hex of their fingerprints; the report's provenance lists each one's source."""
    derived = [(m, display_name(m)) for m in models if not m.get("name")]
    for model, name in derived:
        if name is None:
            raise ConfigError("model.name is not set and the model has no path, hub id or served name to be named "
                              "after: set model.name=<name>")
    fingerprints: dict[str, set[str]] = {}
    for model, name in derived:
        fingerprints.setdefault(name, set()).add(config_fingerprint(model))
    for model, name in derived:
        model["name"] = name if len(fingerprints[name]) == 1 else f"{name}-{config_fingerprint(model)[:4]}"
