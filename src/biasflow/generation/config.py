"""Generator configs at plan time: no secrets in them, and the model a generation job is filed under.

A job whose text comes from a generator (``+generator=...``) is the generator's model's job: its folders
(``model_key``), MLflow run and report rows name that model, not the run's ``model=`` (which generated nothing).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from biasflow.errors import ConfigError
from biasflow.secrets import redact_uri

# Config keys that would hold a secret; secrets come only from the environment or a file (api_key_env / _file).
SECRET_KEYS = frozenset({"api_key", "apikey", "api_token", "token", "access_token", "authorization", "password",
                         "secret"})
GENERATOR_KINDS = ("hf_generate", "openai_compatible", "responses_file")


def check_generator_config(gen_cfg: Mapping[str, Any] | None, option: str = "generator") -> None:
    """ConfigError if the generator config holds a secret (the value is never repeated in the message)."""
    if not gen_cfg:
        return
    found = sorted(k for k in gen_cfg if str(k).lower() in SECRET_KEYS)
    if found:
        raise ConfigError(
            f"{option}.{found[0]} is not accepted: a secret in the config would be written to the plan, logs and "
            f"MLflow. Put the key in an environment variable and set {option}.api_key_env=<VARIABLE NAME>, or in "
            f"a file and set {option}.api_key_file=<path>")


def name_slug(text: str) -> str:
    """A model name usable as a folder name: runs of other characters than [A-Za-z0-9._-] become '_'."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._-")
    return slug or "generator"


def generator_model(gen_cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model config a generation job is filed under, or None when the job's own causal LM generates
    (``hf_generate`` without ``generator.model``). ``generator.name`` names it explicitly."""
    kind = gen_cfg.get("kind")
    if kind not in GENERATOR_KINDS:
        raise ConfigError(f"generator.kind={kind!r} is not a generator; known: {', '.join(GENERATOR_KINDS)}")
    explicit = gen_cfg.get("name")
    if kind == "hf_generate":
        source = gen_cfg.get("model")
        if not source:
            return None
        where = "path" if Path(str(source)).expanduser().exists() else "hub_id"
        return {"name": name_slug(explicit or Path(str(source)).name), "kind": "causal_lm", where: str(source),
                "generator": kind, "device": gen_cfg.get("device")}
    if kind == "openai_compatible":
        if not gen_cfg.get("model") or not gen_cfg.get("base_url"):
            raise ConfigError("generator=openai_compatible needs generator.model (the server's model name) and "
                              "generator.base_url")
        return {"name": name_slug(explicit or gen_cfg["model"]), "kind": "generator", "generator": kind,
                "model_id": str(gen_cfg["model"]), "base_url": redact_uri(str(gen_cfg["base_url"]))}
    path = gen_cfg.get("path")
    if not path:
        raise ConfigError("generator=responses_file needs generator.path (CSV / JSONL / Parquet with prompt, "
                          "response)")
    stem = Path(str(path)).name.split(".")[0]
    return {"name": name_slug(explicit or stem), "kind": "generator", "generator": kind, "path": str(path)}


def job_model(cfg: Mapping[str, Any], metric: str, metric_cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """For ``build_plan``: the generator's model when metric ``metric`` takes its text from a generator, else None
    (the job's model as configured). Rejects secrets in the root and the metric's generator config."""
    check_generator_config(cfg.get("generator"), "generator")
    gen_cfg = metric_cfg.get("generator")
    if not gen_cfg:
        return None
    check_generator_config(gen_cfg, f"metric.{metric}.generator")
    model = generator_model(gen_cfg)
    if model is None:  # hf_generate with the job's model: it has to be a causal LM (or the metric's default one)
        job = cfg.get("model") or {}
        if job.get("kind") != "causal_lm" and not metric_cfg.get("default_model"):
            raise ConfigError(
                f"metric {metric}: generator=hf_generate without generator.model generates with the run's model, "
                f"but model={job.get('name')!r} is a {job.get('kind')!r}, not a causal LM: set generator.model="
                f"<hub id or path of a causal LM> or model=<a causal LM config>")
    return model


__all__ = ["check_generator_config", "generator_model", "job_model", "name_slug", "SECRET_KEYS"]
