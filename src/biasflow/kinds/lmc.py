"""LM Challenge protocol models: biasflow's n-gram model, or any program speaking the line protocol
(lmchallenge/protocol_model.py)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from biasflow.model_kinds import ModelKindSpec, Resources, register_model_kind
from biasflow.schema import IDENTITY_WHEN_SET, ModelOptions, PositiveInt

LMC = "biasflow.lmchallenge.pipeline:answer_lmc_line"


class ProtocolModelOptions(ModelOptions):
    """How a protocol model plays: predictions per position, processes in parallel, seconds per answered line."""

    predictions: Optional[PositiveInt] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    shards: Optional[PositiveInt] = None
    timeout_s: float = Field(120, gt=0)


class NgramConfig(ProtocolModelOptions):
    order: Optional[PositiveInt] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    level: Optional[Literal["word", "char"]] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)


class LmcProcessConfig(ProtocolModelOptions):
    command: Optional[str] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)


register_model_kind(ModelKindSpec(
    name="ngram", factory="biasflow.lmchallenge.protocol_model:ProtocolModel", answers={"lmc_line": LMC}, config=NgramConfig,
    resources=Resources(mem_mb=4000, cpus=1, runtime_min=60, gpu_capable=False)))
register_model_kind(ModelKindSpec(
    name="lmc_process", factory="biasflow.lmchallenge.protocol_model:ProtocolModel", answers={"lmc_line": LMC},
    config=LmcProcessConfig,
    resources=Resources(mem_mb=4000, cpus=1, runtime_min=120, gpu_capable=False)))
