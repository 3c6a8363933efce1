"""Generated text from an OpenAI-compatible chat endpoint or a responses file. Its model configs are written by the
plan from a metric's ``generator`` section (``generator_config.generator_model``), which ``schema.GeneratorConfig``
validates; so the kind declares no config model of its own (no option for a user to set), only the model of the
configs the plan writes (``plan_config``), by which a loaded one is validated (``schema.model_options``)."""
from __future__ import annotations

from typing import Any, Optional

from biasflow.model_kinds import ModelKindSpec, Resources, register_model_kind
from biasflow.schema import GeneratorKind, ModelOptions, PositiveInt, http_client_options


class GeneratorModelConfig(ModelOptions, http_client_options(default_concurrency=4, default_timeout_s=60)):
    """A generation job's model config as ``generator_kinds`` writes it: the backend (``generator``), the server's
    model name and API root (redacted when planned) with the generator's HTTP options, or a responses file."""

    generator: Optional[GeneratorKind] = None
    model_id: Optional[str] = None
    base_url: Optional[str] = None
    path: Optional[str] = None
    extra_body: Optional[dict[str, Any]] = None
    flush_every: Optional[PositiveInt] = None  # requests per cached chunk (null: the request kind's)


register_model_kind(ModelKindSpec(
    name="generator", factory="biasflow.models.generator:Generator", plan_config=GeneratorModelConfig,
    answers={"generation": "biasflow.generation.answer:answer_generation"},
    resources=Resources(mem_mb=8000, cpus=2, runtime_min=120, gpu_capable=False)))
