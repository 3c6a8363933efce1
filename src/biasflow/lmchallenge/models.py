"""Open a model from a spec string (CLI, rules and configs all use this).

* ``ngram:ORDER:FILE`` / ``ngram-char:ORDER:FILE`` -- the sample n-gram model, trained in-process on FILE;
* ``hf-causal:PATH_OR_ID`` / ``hf-masked:PATH_OR_ID`` -- a Hugging Face model in-process;
* anything else -- a shell command speaking the line protocol (e.g.
  ``python -m biasflow.lmchallenge.ngram --order 3 --train FILE``).
"""
from __future__ import annotations

from .protocol import Model
from .text import DEFAULT_WORD_TOKENIZER


def open_model(spec: str, timeout: float = 60.0, tokenizer: str = DEFAULT_WORD_TOKENIZER) -> Model:
    kind, _, rest = spec.partition(":")
    if kind in ("ngram", "ngram-char") and rest:
        from .ngram import NgramModel, load_training_lines

        order, _, path = rest.partition(":")
        if not order.isdigit() or not path:
            raise ValueError(f"model spec {spec!r}: expected {kind}:ORDER:FILE")
        model = NgramModel(order=int(order), level="char" if kind == "ngram-char" else "word",
                           tokenizer=tokenizer)
        return model.fit(load_training_lines(path))
    if kind in ("hf-causal", "hf-masked") and rest:
        from .hf import HFCausalLM, HFMaskedLM

        return (HFCausalLM if kind == "hf-causal" else HFMaskedLM).from_pretrained(rest)
    from .process import ProcessModel

    return ProcessModel(spec, timeout=timeout)
