"""Kinds loaded from a Hugging Face folder, hub id or packaged model: masked and causal LMs, BERT's next-sentence
head, sentence encoders, text classifiers and extractive question-answering models."""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field

from biasflow.model_kinds import Answer, ModelKindSpec, Resources, register_model_kind
from biasflow.schema import (DEFAULT_DTYPE, IDENTITY, IDENTITY_WHEN_SET, USER_FILE, DType, ModelOptions,
                             PositiveInt)

LMC = "biasflow.lmchallenge.pipeline:answer_lmc_line"
GENERATION = "biasflow.generation.answer:answer_generation"


class LocalModelOptions(ModelOptions):
    """Where a local model's weights come from and what its numbers are computed in (every kind of this module)."""

    hub_id: Optional[str] = Field(None, json_schema_extra=IDENTITY)
    path: Optional[str] = Field(None, json_schema_extra={**USER_FILE, **IDENTITY})
    revision: Optional[str] = Field(None, json_schema_extra=IDENTITY)
    lowercase: bool = Field(False, json_schema_extra=IDENTITY)
    dtype: DType = Field(DEFAULT_DTYPE, json_schema_extra=IDENTITY)  # its aliases made canonical in the fingerprint
    batch_size: Optional[PositiveInt] = None
    max_length: Optional[PositiveInt] = Field(None, json_schema_extra=IDENTITY)
    threads: Optional[PositiveInt] = None


class HFModelConfig(LocalModelOptions):
    """A transformers model (models/hf.py): its attention kernel, the CPU's oneDNN linears, and predictions per
    position for LM Challenge."""

    attn_implementation: Optional[Literal["eager", "sdpa", "flash_attention_2"]] = Field(
        None, json_schema_extra=IDENTITY)
    cpu_linear: Optional[Literal["auto", "onednn", "default"]] = None
    predictions: Optional[PositiveInt] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)


class MaskedLMConfig(HFModelConfig):
    """A masked LM; the demo model (build, train, demo) is one the workflow builds (models/demo.py)."""

    # a built model's recipe and training settings (every one of which changes the weights: models/demo.py) name
    # it: in its fingerprint, so each setting has its own key, score files and answer cache (only when set: the
    # models that are not built keep theirs)
    build: Optional[Literal["demo_mlm"]] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    demo: bool = False
    train: Optional[dict[str, Any]] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)


class CausalLMConfig(HFModelConfig):
    """A causal LM. Issue 37's opt-in fast paths (off by default: the default path is unchanged to the bit): the
    vocabulary head and its log-sum-exp in chunks of this many vocabulary columns (auto: 8,192 on CUDA, off
    elsewhere; models/chunked_head.py), and torch.compile of the RMSNorm and gated-MLP blocks (models/compiled.py).
    Their numbers equal the plain path's up to float rounding: in the fingerprint when set, so no cache mixes them.
    On a GPU they pay together (an H200: 1.35-1.41x with both; the chunks alone do not, docs/performance.md)."""

    head_chunk: Union[PositiveInt, Literal["auto"], None] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    compile: Optional[Literal["blocks"]] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)  # null: not compiled


class SentenceEncoderConfig(LocalModelOptions):
    """A sentence encoder (models/encoders.py), possibly shipped in a Python package, and how it pools tokens."""

    package: Optional[str] = Field(None, json_schema_extra=IDENTITY)
    pooling: Optional[Literal["mean", "cls", "first", "sbert_mean"]] = Field(None, json_schema_extra=IDENTITY)


# (answerers' numbers: revision 2 of causal_lm = packed passes and the vocabulary head in slices, answers moved by up
# to ~1e-6; stereoset_sentence_logprobs 3 = the reference's unbatched softmax loop, with `probs`)
register_model_kind(ModelKindSpec(
    name="bert_nsp", factory="biasflow.models.nsp:BertNSP", hf_files=True, config=HFModelConfig,
    answers={"next_sentence": "biasflow.scoring.stereoset:answer_next_sentence"},
    resources=Resources(mem_mb=8000, cpus=4, runtime_min=120, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    name="masked_lm", factory="biasflow.models.masked_lm:MaskedLM", hf_files=True, config=MaskedLMConfig,
    answers={
        "pll": "biasflow.scoring.masked:answer_pll",
        "unmasked_logprobs": "biasflow.scoring.unmasked:answer_unmasked_logprobs",
        "unmasked_logprobs_attn": "biasflow.scoring.unmasked:answer_unmasked_logprobs_attention",
        "mask_candidates": "biasflow.scoring.fill_mask:answer_mask_candidates",
        "mask_token_str": "biasflow.scoring.fill_mask:answer_mask_token_str",
        "mask_top_k": "biasflow.scoring.fill_mask:answer_mask_top_k",
        "multi_mask": "biasflow.scoring.multi_mask:answer_multi_mask",
        "first_mask_probability": "biasflow.scoring.first_mask:answer_first_mask_probability",
        "blank_fill": "biasflow.scoring.stereoset:answer_blank_fill",
        # BERT's next-sentence head of the same checkpoint, loaded as bert_nsp
        "next_sentence": Answer("biasflow.scoring.stereoset:answer_next_sentence", load_as="bert_nsp"),
        "lmc_line": LMC,
    },
    resources=Resources(mem_mb=8000, cpus=4, runtime_min=120, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    name="causal_lm", factory="biasflow.models.causal_lm:CausalLM", hf_files=True, config=CausalLMConfig,
    answers={
        "token_logprobs": Answer("biasflow.scoring.causal:answer_token_logprobs", revision=2),
        "stereoset_sentence_logprobs": Answer("biasflow.scoring.stereoset:answer_sentence_logprobs", revision=3),
        "continuation_logprobs": Answer("biasflow.scoring.causal_options:answer_continuation_logprobs", revision=2),
        "shared_context_continuation": "biasflow.scoring.causal_options:answer_shared_context",
        "lmc_line": LMC,
        "generation": GENERATION,
    },
    resources=Resources(mem_mb=16000, cpus=4, runtime_min=240, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    name="sentence_encoder", factory="biasflow.models.encoders:SentenceEncoder", hf_files=True,
    config=SentenceEncoderConfig,
    answers={"sentence_embedding": "biasflow.scoring.embeddings:answer_sentence_embedding"},
    resources=Resources(mem_mb=4000, cpus=2, runtime_min=60, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    # a sequence classifier scoring generated text (LangFair's stereotype classifier: metrics/langfair.py; the
    # toxicity classifier: metrics/toxicity.py), or the job's own model scoring sentence pairs (an NLI model:
    # metrics/bias_nli.py). Revision 2: a multi-label model's probabilities are sigmoids
    name="text_classifier", factory="biasflow.models.text_classifier:TextClassifier", hf_files=True,
    config=HFModelConfig,
    answers={"classification": Answer("biasflow.scoring.classification:answer_classification", revision=2),
             "text_pair_classification": "biasflow.scoring.classification:answer_pair_classification"},
    resources=Resources(mem_mb=8000, cpus=2, runtime_min=120, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    # an extractive QA model (SQuAD-style start / end heads) scoring spans of a context: UnQover's QA models
    # (metrics/unqover.py, unqover_qa)
    name="question_answering", factory="biasflow.models.question_answering:QuestionAnswering", hf_files=True,
    config=HFModelConfig,
    answers={"span_probability": "biasflow.scoring.question_answering:answer_span_probability"},
    resources=Resources(mem_mb=8000, cpus=2, runtime_min=120, gpu_capable=True)))
