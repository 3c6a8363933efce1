"""Generated text from an OpenAI-compatible chat endpoint or a responses file. Its model configs are written by the
plan from a metric's ``generator`` section (``generator_config.generator_model``), which ``schema.GeneratorConfig``
validates; so the kind declares no config model of its own."""
from __future__ import annotations

from biasflow.model_kinds import ModelKindSpec, Resources, register_model_kind

register_model_kind(ModelKindSpec(
    name="generator", factory="biasflow.models.generator:Generator",
    answers={"generation": "biasflow.generation.answer:answer_generation"},
    resources=Resources(mem_mb=8000, cpus=2, runtime_min=120, gpu_capable=False)))
