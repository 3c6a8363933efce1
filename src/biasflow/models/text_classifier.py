"""Text classifiers (any AutoModelForSequenceClassification) by hub id or local path: ``model.kind:
text_classifier``. They answer ``Classification`` requests (LangFair's stereotype classifier scoring generated
text); a metric names its classifier in the request and the score stage loads it like any model."""
from __future__ import annotations

from transformers import AutoModelForSequenceClassification

from biasflow.models.hf import HFAdapter


class TextClassifier(HFAdapter):
    auto_class = AutoModelForSequenceClassification
    kind = "text_classifier"

    @property
    def labels(self) -> list[str]:
        """The model's labels in id order (the columns of its probabilities)."""
        id2label = {int(i): str(lab) for i, lab in self.model.config.id2label.items()}
        return [id2label[i] for i in sorted(id2label)]
