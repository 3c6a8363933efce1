"""Generators that are not local models: ``model.kind: generator``, the backend named by ``model.generator``.

* ``openai_compatible``: ``POST {base_url}/chat/completions`` for ``model_id`` (``OpenAIChatBackend``; the key is
  read from ``api_key_file`` or the variable named by ``api_key_env``, never from the config);
* ``responses_file``: a user's CSV / JSONL / Parquet of responses (``path``).

They answer only ``Generation`` requests (``biasflow.generation.answer.answer_generation``). A local causal LM that
generates (``hf_generate``) is a ``causal_lm`` model: loaded once by ``models.hf.load_pretrained`` and answering
``Generation`` with its ``generate``. ``generation.config.generator_model`` writes these configs from
``+generator=...``.
"""
from __future__ import annotations

from typing import Any, Mapping

from biasflow.errors import ConfigError
from biasflow.io import stable_hash
from biasflow.models.fingerprint import config_fingerprint

BACKENDS = ("openai_compatible", "responses_file")


class Generator:
    kind = "generator"

    def __init__(self, cfg: Mapping[str, Any]):
        from biasflow.generation.config import OPENAI_OPTIONS

        self.cfg = dict(cfg)
        backend = cfg.get("generator")
        if backend == "openai_compatible":
            from biasflow.generation.backends import OpenAIChatBackend

            options = {k: cfg[k] for k in OPENAI_OPTIONS if k in cfg and k != "flush_every"}
            self.backend = OpenAIChatBackend(cfg.get("base_url"), cfg.get("model_id"), **options)
        elif backend == "responses_file":
            from biasflow.generation.answer import ResponsesFileBackend

            if not cfg.get("path"):
                raise ConfigError("model.kind=generator with generator=responses_file needs model.path")
            self.backend = ResponsesFileBackend(cfg["path"])
        else:
            raise ConfigError(f"model.generator={backend!r} is not a generator backend of model.kind=generator; "
                              f"known: {', '.join(BACKENDS)} (a local causal LM generates as model.kind=causal_lm)")
        self.name = cfg.get("name") or self.backend.model_id
        # the config's identity plus what it reaches: the endpoint and its request options, or the file's content
        self.fingerprint = stable_hash({"config": config_fingerprint(cfg), "backend": self.backend.fingerprint}, 24)

    def provenance(self) -> dict[str, str]:
        source = self.cfg.get("base_url") or self.cfg.get("path")  # base_url: redacted when the plan was made
        return {"model.generator": str(self.cfg.get("generator")), "model.source": str(source),
                "model.fingerprint": self.fingerprint}
