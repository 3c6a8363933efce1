"""BERT next-sentence-prediction head (StereoSet intersentence) by hub id or local path: ``model.kind: bert_nsp``.

Loads ``AutoModelForNextSentencePrediction`` in eval + inference mode. A checkpoint without trained NSP weights
(RoBERTa, or a BERT saved as a bare masked LM) would get a randomly initialised head and meaningless scores, so that
is refused with a clear error instead.
"""
from __future__ import annotations

from typing import Any, Mapping

from transformers import AutoModelForNextSentencePrediction

from biasflow.errors import ModelLoadError
from biasflow.models.hf import HFAdapter

NSP_HEAD_KEYS = ("cls.seq_relationship.weight", "cls.seq_relationship.bias")


class _CheckedNSP:
    """``from_pretrained`` that fails when the checkpoint lacks the next-sentence head."""

    @staticmethod
    def from_pretrained(source, **kwargs):
        model, info = AutoModelForNextSentencePrediction.from_pretrained(source, output_loading_info=True, **kwargs)
        missing = [k for k in info.get("missing_keys", []) if any(k.endswith(h) for h in NSP_HEAD_KEYS)]
        if missing:
            raise ModelLoadError(
                f"{source}: the checkpoint has no trained next-sentence head (missing {missing}); StereoSet "
                f"intersentence with NSP needs a BERT pre-trained with NSP (use metric.stereoset.tasks=[intrasentence] "
                f"otherwise)")
        return model


class BertNSP(HFAdapter):
    auto_class = _CheckedNSP
    kind = "bert_nsp"

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(cfg)
