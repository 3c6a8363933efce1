"""Extractive question-answering models (any AutoModelForQuestionAnswering: a SQuAD-fine-tuned BERT, RoBERTa,
DistilBERT) by hub id or local path: ``model.kind: question_answering``. They answer ``SpanProbability`` requests
(UnQover's QA scoring, ``metrics/unqover.py``).

A checkpoint without trained span weights (a bare BERT, a masked LM) would get a randomly initialised, unseeded head:
numbers that change from run to run. That is refused with an error naming the folder and the missing weights.
"""
from __future__ import annotations

from transformers import AutoModelForQuestionAnswering

from biasflow.errors import ModelLoadError
from biasflow.models.hf import HFAdapter


class _CheckedQA:
    """``from_pretrained`` that fails when the checkpoint lacks weights outside the base model (the span head)."""

    @staticmethod
    def from_pretrained(source, **kwargs):
        model, info = AutoModelForQuestionAnswering.from_pretrained(source, output_loading_info=True, **kwargs)
        base = f"{model.base_model_prefix}."
        missing = sorted(k for k in info.get("missing_keys", []) if not k.startswith(base))
        if missing:
            raise ModelLoadError(
                f"{source}: the checkpoint has no trained question-answering head (missing {missing}): it would "
                f"answer with random weights. Use a model fine-tuned for extractive QA (SQuAD), e.g. "
                f"model=distilbert_squad")
        return model


class QuestionAnswering(HFAdapter):
    auto_class = _CheckedQA
    kind = "question_answering"
