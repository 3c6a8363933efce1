"""A causal LM behind an OpenAI-compatible server (docs/served_models.md): the GPUs are the server's (vLLM on its own
nodes), the job only sends HTTP requests."""
from __future__ import annotations

from typing import Optional

from pydantic import Field, model_validator

from biasflow.model_kinds import Answer, ModelKindSpec, Resources, register_model_kind
from biasflow.schema import (IDENTITY, IDENTITY_WHEN_SET, HttpUrl, ModelOptions, PositiveInt,
                             http_client_options)

GENERATION = "biasflow.generation.answer:answer_generation"


class ServedCausalLMConfig(ModelOptions, http_client_options(default_concurrency=8, default_timeout_s=120)):
    """Where the server is (``base_url``: where it runs, not what it computes, so it is no part of the fingerprint:
    ``location_keys``), the model's name there, how requests are paced and retried, and what the scores follow
    from (the pinned revision, a BOS text, lowercasing)."""

    base_url: Optional[HttpUrl] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    served_model_name: Optional[str] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    bos_text: Optional[str] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    lowercase: bool = Field(False, json_schema_extra=IDENTITY)
    revision: Optional[str] = Field(None, json_schema_extra=IDENTITY)
    batch_size: Optional[PositiveInt] = None

    @model_validator(mode="after")
    def _needs_a_server(self):
        if not self.base_url:
            raise ValueError("model.kind=served_causal_lm needs model.base_url (the server's API root, e.g. "
                             "http://gpu-node-1:8000/v1)")
        return self


# (revision 2 of its answerers: a reply is checked (tokens, offsets, usage and finite log-probabilities agree):
# answers cached before the check may hold a dropped last token or -inf, so they are asked again, never served)
register_model_kind(ModelKindSpec(
    name="served_causal_lm", factory="biasflow.models.served:ServedCausalLM", location_keys=("base_url",),
    config=ServedCausalLMConfig,
    answers={
        "token_logprobs": Answer("biasflow.models.served:answer_token_logprobs", revision=2),
        "continuation_logprobs": Answer("biasflow.models.served:answer_continuation_logprobs", revision=2),
        # the same requests: vLLM's automatic prefix caching computes a context once for all its continuations
        # (docs/served_models.md), and the work key keeps them in one chunk, so the context alone is sent once
        "shared_context_continuation": "biasflow.models.served:answer_continuation_logprobs",
        # StereoSet's sentence log-probabilities (its reference arithmetic): first_token=separate
        "stereoset_sentence_logprobs": Answer("biasflow.models.served:answer_separate_logprobs", revision=2),
        "generation": GENERATION,
    },
    resources=Resources(mem_mb=2000, cpus=1, runtime_min=240, gpu_capable=False)))
