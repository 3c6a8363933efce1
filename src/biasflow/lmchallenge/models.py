"""The model a game is played against, as the command line names it.

* a shell command speaking the line protocol, as upstream's ``lmc run`` takes it (e.g.
  ``python -m biasflow.lmchallenge.ngram --order 3 --train FILE``);
* ``model=<config>`` -- one of the pipeline's model configs (``conf/model/``: ``ngram2``, ``ngram3``, ``char3``,
  ``lmc_command``, the Hugging Face masked and causal LMs), with ``model.<key>=<value>`` overrides: the same
  configuration, validation and defaults as ``biasflow run``. The n-gram and protocol-command kinds train on
  ``training_text`` (a file of lines), as the pipeline's do on the benchmark's training lines.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from .protocol import Model
from .text import DEFAULT_WORD_TOKENIZER

GAME_KINDS = ("ngram", "lmc_process", "masked_lm", "causal_lm")


def open_model(model: str, *, overrides: Sequence[str] = (), training_text: str | None = None,
               timeout: float = 60.0, tokenizer: str = DEFAULT_WORD_TOKENIZER) -> Model:
    if not model.startswith("model="):
        if overrides:
            raise ValueError(f"--set {overrides[0]}: settings apply to a model config (model=<name>), not to a "
                             f"protocol command")
        from .process import ProcessModel

        return ProcessModel(model, timeout=timeout)
    bad = [o for o in overrides if not o.startswith(("model.", "+model."))]
    if bad:
        raise ValueError(f"--set {bad[0]}: only model.<key>=<value> settings apply here")
    from biasflow.plan import compose
    from biasflow.schema import validate_model_config

    cfg = compose([model, *overrides])["model"]
    validate_model_config(cfg)
    kind = cfg["kind"]
    if kind not in GAME_KINDS:
        raise ValueError(f"{model}: a model of kind {kind!r} cannot play the games (kinds that can: "
                         f"{', '.join(GAME_KINDS)})")
    if kind in ("ngram", "lmc_process"):
        if not training_text:
            raise ValueError(f"{model} (kind {kind}) is trained on a text: give --training-text FILE")
        from .ngram import NgramModel, load_training_lines

        lines = load_training_lines(training_text)
        if kind == "ngram":  # in-process, with this command's tokenizer
            return NgramModel(order=cfg["order"], level=cfg["level"], n_predictions=cfg["predictions"],
                              tokenizer=tokenizer).fit(lines)
        from biasflow.models import load_model

        from .pipeline import training_text as joined
        from .process import ProcessModel

        digest = hashlib.sha256(joined(lines).encode()).hexdigest()
        return ProcessModel(load_model(cfg).command(lines, digest), timeout=cfg["timeout_s"])
    from biasflow.models import load_model

    from .pipeline import hf_model

    return hf_model(load_model(cfg))
