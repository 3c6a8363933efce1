"""Generator configs at plan time: no secrets in them, and the model config of a generation job.

A job whose text comes from a generator (``+generator=...``) is the generator's model's job: its folders
(``model_key``), MLflow run and report rows name that model, not the run's ``model=`` (which generated nothing), and
its score stage loads that model config (``biasflow.models.load_model``) to answer the ``Generation`` requests:
kind ``generator`` (``models/generator.py``: an OpenAI-compatible server or a responses file, the backend named by
its ``generator`` field) or ``causal_lm`` (``hf_generate``: a local causal LM's ``generate``).
"""
from __future__ import annotations

from typing import Any, Mapping

from biasflow.errors import ConfigError
from biasflow.generator_kinds import (GENERATOR_KINDS, HF_GENERATE_OPTIONS, SAMPLING_KEYS, generator_kind,
                                       name_slug)

# Config keys that would hold a secret; secrets come only from the environment or a file (api_key_env / _file).
SECRET_KEYS = frozenset({"api_key", "apikey", "api_token", "token", "access_token", "authorization", "password",
                         "secret"})


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


def check_generator_keys(gen_cfg: Mapping[str, Any] | None, option: str = "generator") -> None:
    """ConfigError naming a key set in the generator config that its kind never reads (``use_chat_template`` or
    ``device`` on an OpenAI-compatible server, ``temperature`` on a responses file), with the kinds that do."""
    if not gen_cfg or gen_cfg.get("kind") not in GENERATOR_KINDS:
        return
    kind = gen_cfg["kind"]
    for key, value in gen_cfg.items():
        if value is not None and key not in GENERATOR_KINDS[kind].reads:
            readers = [k for k, spec in GENERATOR_KINDS.items() if key in spec.reads]
            raise ConfigError(f"{option}.{key}={value!r} is not read by generator kind {kind}, so it would be ignored"
                              + (f" (it is read by: {', '.join(readers)})" if readers else "") + "; remove it")


def check_metric_overrides(gen_cfg: Mapping[str, Any] | None, defaults: Mapping[str, Any], metric: str,
                           metric_settings: Mapping[str, Any]) -> None:
    """For a metric that answers with its own generation settings (BBQ, stereoset_mc: greedy, one short reply):
    ConfigError naming a sampling setting the user set on the generator (it differs from the generator config's
    default ``defaults``), which the metric's ``metric.<name>.generation`` overrides."""
    if not gen_cfg:
        return
    for key in (*SAMPLING_KEYS, "max_failed_fraction"):
        if key in gen_cfg and gen_cfg.get(key) != defaults.get(key) and key == "count":
            raise ConfigError(
                f"generator.count={gen_cfg[key]!r} would be ignored: metric {metric} asks one reply per example (the "
                f"choice, greedy: metric.{metric}.generation.temperature="
                f"{metric_settings.get('temperature', 0.0)!r}). Remove generator.count")
        if key in gen_cfg and gen_cfg.get(key) != defaults.get(key):
            raise ConfigError(
                f"generator.{key}={gen_cfg[key]!r} would be ignored: metric {metric} answers with its own generation "
                f"settings (metric.{metric}.generation.{key}={metric_settings.get(key)!r}; the generator supplies "
                f"the endpoint). Set metric.{metric}.generation.{key} instead")


def generator_model(gen_cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model config of a generation job (what it is filed under and what its score stage loads), or None
    when the job's own causal LM generates (``hf_generate`` without ``generator.model``). ``generator.name`` names
    it explicitly. Written by the generator kind's declaration (``generator_kinds``)."""
    return generator_kind(gen_cfg.get("kind")).job_model(gen_cfg)


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


def with_generation_options(model: Mapping[str, Any], metric_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``model`` with the ``hf_generate`` options that change its text (``use_chat_template``,
    ``generate_kwargs``) when the metric's generator sets them off their defaults and ``model`` is the causal LM
    that generates; they enter its fingerprint, so other settings never share its cached answers."""
    gen_cfg = metric_cfg.get("generator") or {}
    if gen_cfg.get("kind") != "hf_generate" or model.get("kind") != "causal_lm":
        return dict(model)
    options = {k: gen_cfg[k] for k, default in HF_GENERATE_OPTIONS.items() if gen_cfg.get(k, default) != default}
    return {**model, **options}


__all__ = ["check_generator_config", "check_generator_keys", "check_metric_overrides", "generator_model", "job_model", "name_slug", "with_generation_options",
           "SECRET_KEYS"]
