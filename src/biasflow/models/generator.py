"""Generators that are not local models: ``model.kind: generator``, the backend named by ``model.generator``.

* ``openai_compatible``: ``POST {base_url}/chat/completions`` for ``model_id`` (``OpenAIChatBackend``; the key is
  read from ``api_key_file`` or the variable named by ``api_key_env``, never from the config);
* ``responses_file``: a user's CSV / JSONL / Parquet of responses (``path``).

They answer only ``Generation`` requests (``biasflow.generation.answer.answer_generation``). A local causal LM that
generates (``hf_generate``) is a ``causal_lm`` model: loaded once by ``models.hf.load_pretrained`` and answering
``Generation`` with its ``generate``. ``generator_config.generator_model`` writes these configs from
``+generator=...``.
"""
from __future__ import annotations

from typing import Any, Mapping

from biasflow.errors import ConfigError
from biasflow.io import stable_hash
from biasflow.models.fingerprint import config_fingerprint
from biasflow.schema import ModelOptions, model_options


class Generator:
    kind = "generator"

    def __init__(self, cfg: Mapping[str, Any] | ModelOptions):
        from biasflow.generator_kinds import GENERATOR_KINDS
        from biasflow.model_kinds import resolve

        opts = self.opts = model_options(cfg, self.kind)  # kinds/generator.py: GeneratorModelConfig
        self.cfg = opts.written()  # as written: what the fingerprint hashes
        backend = opts.generator
        spec = GENERATOR_KINDS.get(str(backend))
        if spec is None or spec.backend is None:
            backends = [name for name, s in GENERATOR_KINDS.items() if s.backend is not None]
            raise ConfigError(f"model.generator={backend!r} is not a generator backend of model.kind=generator; "
                              f"known: {', '.join(backends)} (a local causal LM generates as model.kind=causal_lm)")
        self.backend = resolve(spec.backend)(opts)
        self.name = opts.name or self.backend.model_id
        # the config's identity plus what it reaches: the endpoint and its request options, or the file's content
        self.fingerprint = stable_hash({"config": config_fingerprint(self.cfg), "backend": self.backend.fingerprint},
                                       24)

    def provenance(self) -> dict[str, str]:
        source = self.opts.base_url or self.opts.path  # base_url: redacted when the plan was made
        return {"model.generator": str(self.opts.generator), "model.source": str(source),
                "model.fingerprint": self.fingerprint}
