"""Generator kinds: where a metric's generated text comes from (``+generator=<kind>``), each declared once, here.

A kind declares the keys of a ``generator`` section it reads (any other key set there would be ignored, so the plan
refuses it naming the kinds that read it), how the generation job's model config is written from that section (the
model its jobs are filed under and its score stage loads; None: the run's own causal LM generates), and, for a kind
answered by ``model.kind: generator``, the backend that model builds. Everything else reads these declarations:
``schema.GeneratorConfig`` (which kinds exist), ``generator_config`` (the keys each reads, the job's model),
``models.generator`` (the backends). A new kind is one ``register_generator_kind`` call in a declaration module
(``src/biasflow/kinds/<name>.py``, or a module of one's own package named under the ``biasflow.kinds`` entry-point
group), read on the first read of this registry (it is filled with ``model_kinds.KINDS``: one
``biasflow.declared.Registry`` loading).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from biasflow.errors import ConfigError
from biasflow.declared import Registry
from biasflow.model_kinds import HTTP_CLIENT_OPTIONS, KINDS


@dataclass(frozen=True)
class GeneratorKindSpec:
    name: str
    # the keys of its ``generator`` section this kind reads
    reads: tuple[str, ...]
    # generator section -> the generation job's model config, or None when the run's own causal LM generates
    job_model: Callable[[Mapping[str, Any]], dict[str, Any] | None]
    # "module:function" (or the function): model config (kind generator) -> an object with ``generate(requests,
    # settings)``, ``model_id`` and ``fingerprint``, imported only when a job loads it; None for a kind whose model is
    # not of kind generator (hf_generate: a causal_lm)
    backend: str | Callable[[Mapping[str, Any]], Any] | None = None
    # keys of the generator section copied into the job's model config when set (what its backend reads)
    model_options: tuple[str, ...] = ()
    # "module:function" (model config, a metric's Generation requests, the metric's name) run by the score stage
    # before anything is answered: what the kind can refuse up front (a responses file that answers a prompt more
    # often than the metric asks); None: nothing to check
    check_requests: str | None = None


# read after the declaration modules are imported (a kind of one's own declared there is known everywhere)
GENERATOR_KINDS: dict[str, GeneratorKindSpec] = Registry("generator kind", filled_with=KINDS)


def register_generator_kind(spec: GeneratorKindSpec) -> GeneratorKindSpec:
    old = GENERATOR_KINDS.registered(spec.name)
    return GENERATOR_KINDS.add(spec.name, spec, spec.job_model.__module__,
                               old.job_model.__module__ if old is not None else None)


def known() -> list[str]:
    return list(GENERATOR_KINDS)


def generator_kind(kind: Any, option: str = "generator.kind") -> GeneratorKindSpec:
    spec = GENERATOR_KINDS.get(str(kind))
    if spec is None:
        raise ConfigError(f"{option}={kind!r} is not a generator; known: {', '.join(known())}")
    return spec


def name_slug(text: str) -> str:
    """A model name usable as a folder name: runs of other characters than [A-Za-z0-9._-] become '_'."""
    import re

    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._-")
    return slug or "generator"


# ------------------------------------------------------------------------------------------------ built-in kinds
SAMPLING_KEYS = ("count", "system_prompt", "temperature", "max_tokens", "seed")
_EVERY_KIND = ("kind", "name", "max_failed_fraction", "progress")
# options of hf_generate that change the text, carried by the causal LM's model config when set (its fingerprint)
HF_GENERATE_OPTIONS = {"use_chat_template": "auto", "generate_kwargs": None}


def _hf_generate_model(gen_cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    source = gen_cfg.get("model")
    if not source:
        return None
    where = "path" if Path(str(source)).expanduser().exists() else "hub_id"
    return {"name": name_slug(gen_cfg.get("name") or Path(str(source)).name), "kind": "causal_lm",
            where: str(source), "generator": "hf_generate", "device": gen_cfg.get("device")}


def _openai_model(gen_cfg: Mapping[str, Any]) -> dict[str, Any]:
    from biasflow.secrets import redact_uri

    if not gen_cfg.get("model") or not gen_cfg.get("base_url"):
        raise ConfigError("generator=openai_compatible needs generator.model (the server's model name) and "
                          "generator.base_url")
    options = {k: gen_cfg[k] for k in OPENAI_COMPATIBLE.model_options if gen_cfg.get(k) is not None}
    return {"name": name_slug(gen_cfg.get("name") or gen_cfg["model"]), "kind": "generator",
            "generator": "openai_compatible", "model_id": str(gen_cfg["model"]),
            "base_url": redact_uri(str(gen_cfg["base_url"])), **options,
            "api_key_env": gen_cfg.get("api_key_env", "OPENAI_API_KEY")}


def _responses_file_model(gen_cfg: Mapping[str, Any]) -> dict[str, Any]:
    path = gen_cfg.get("path")
    if not path:
        raise ConfigError("generator=responses_file needs generator.path (CSV / JSONL / Parquet with prompt, "
                          "response)")
    stem = Path(str(path)).name.split(".")[0]
    return {"name": name_slug(gen_cfg.get("name") or stem), "kind": "generator", "generator": "responses_file",
            "path": str(path)}


# a local causal LM's generate (the run's model, or generator.model): its model config is a causal_lm's
register_generator_kind(GeneratorKindSpec(
    name="hf_generate", reads=(*_EVERY_KIND, "model", "device", *SAMPLING_KEYS, *HF_GENERATE_OPTIONS),
    job_model=_hf_generate_model))
# POST {base_url}/chat/completions (the key from api_key_file or the variable api_key_env names, never the config)
OPENAI_COMPATIBLE = register_generator_kind(GeneratorKindSpec(
    name="openai_compatible",
    reads=(*_EVERY_KIND, "model", "base_url", *SAMPLING_KEYS, *HTTP_CLIENT_OPTIONS, "extra_body", "flush_every"),
    job_model=_openai_model, backend="biasflow.generation.backends:openai_chat_backend",
    model_options=(*HTTP_CLIENT_OPTIONS, "extra_body", "flush_every")))
# a user's CSV / JSONL / Parquet of responses
register_generator_kind(GeneratorKindSpec(
    name="responses_file", reads=(*_EVERY_KIND, "path", "count"), job_model=_responses_file_model,
    backend="biasflow.generation.answer:responses_file_backend",
    check_requests="biasflow.generation.answer:check_responses_cover"))

__all__ = ["GeneratorKindSpec", "GENERATOR_KINDS", "register_generator_kind", "known", "generator_kind",
           "name_slug", "SAMPLING_KEYS", "HTTP_CLIENT_OPTIONS", "HF_GENERATE_OPTIONS"]
