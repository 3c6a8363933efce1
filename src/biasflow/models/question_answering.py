"""Extractive question-answering models (any AutoModelForQuestionAnswering: a SQuAD-fine-tuned BERT, RoBERTa,
DistilBERT) by hub id or local path: ``model.kind: question_answering``. They answer ``SpanProbability`` requests
(UnQover's QA scoring, ``metrics/unqover.py``)."""
from __future__ import annotations

from transformers import AutoModelForQuestionAnswering

from biasflow.models.hf import HFAdapter


class QuestionAnswering(HFAdapter):
    auto_class = AutoModelForQuestionAnswering
    kind = "question_answering"
