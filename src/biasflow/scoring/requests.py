"""What a metric asks of a model: small frozen request types, each with a stable key.

A metric declares its needs with ``requests(items, cfg, model_kind) -> list[Request]``; the score stage answers
them (``biasflow.scoring.answer.answer_requests``: the model kind's answerer for each request kind, behind one
cache) and the metric's ``compute(items, answers, cfg)`` reads the answers, looked up by ``Request.key``. A request
holds the text as the metric means it (no model-specific normalisation: the model lowercases or tokenises as its
config says), so the same request is the same cache entry whatever metric or job asked for it.

This module imports neither torch nor pandas: planning and metric stages use it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Iterable

REQUEST_TYPES: dict[str, type["Request"]] = {}


def request_key(kind: str, fields: dict[str, Any]) -> str:
    """sha256 of the request kind and its fields (the one key function of the answer cache)."""
    blob = json.dumps([kind, fields], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Request:
    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.kind:
            if cls.kind in REQUEST_TYPES:
                raise ValueError(f"request kind {cls.kind!r} is defined twice")
            REQUEST_TYPES[cls.kind] = cls

    def fields(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @cached_property
    def key(self) -> str:
        return request_key(self.kind, self.fields())


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def keys(requests: Iterable[Request]) -> list[str]:
    return [r.key for r in requests]


# ------------------------------------------------------------------------------------- masked language models
@dataclass(frozen=True)
class PseudoLogLikelihood(Request):
    """Per-token log P(token_i | text with position i masked), special tokens NaN (Salazar et al.).
    Answer: ``token_ids``, ``logprobs``, ``total``."""

    kind: ClassVar[str] = "pll"
    text: str


@dataclass(frozen=True)
class UnmaskedLogprobs(Request):
    """Log P(token_i | the whole unmasked text) at every position (AUL), with the attention weights (AULA).
    Answer: ``token_ids``, ``logprobs``, and ``attention`` when ``with_attention``."""

    kind: ClassVar[str] = "unmasked_logprobs"
    text: str
    with_attention: bool = False


@dataclass(frozen=True)
class MaskCandidates(Request):
    """Candidate words at the one mask of ``template`` (``[MASK]`` placeholder), each by its first word piece,
    template and words cased as the model expects. Answer: ``piece_ids``, ``n_pieces``, ``probs``, ``ranks``."""

    kind: ClassVar[str] = "mask_candidates"
    template: str
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class MaskTokenStr(Request):
    """Words exactly as written at the one mask of ``template``: every vocabulary entry whose decoded text is the
    word (the HF fill-mask pipeline's ``token_str``). Answer: ``match_probs``, ``match_ranks`` (per word)."""

    kind: ClassVar[str] = "mask_token_str"
    template: str
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class MaskTopK(Request):
    """The ``top_k`` most likely fillers of the one mask of ``template``. Answer: ``tokens``, ``probabilities``."""

    kind: ClassVar[str] = "mask_top_k"
    template: str
    top_k: int


@dataclass(frozen=True)
class MultiMaskLogprobs(Request):
    """Log-probabilities of target words at several masks of ``text`` (LPBS/CBS). Answer: ``logprobs``."""

    kind: ClassVar[str] = "multi_mask"
    text: str
    words: tuple[str, ...]


@dataclass(frozen=True)
class BlankFill(Request):
    """StereoSet intrasentence with a masked LM: the mean probability of ``word``'s pieces at the BLANK of
    ``context``. Answer: ``probability``."""

    kind: ClassVar[str] = "blank_fill"
    context: str
    word: str
    word_prefix_space: bool = False


@dataclass(frozen=True)
class NextSentence(Request):
    """P(``sentence`` follows ``context``) from a next-sentence-prediction head. Answer: ``probability``."""

    kind: ClassVar[str] = "next_sentence"
    context: str
    sentence: str


# ------------------------------------------------------------------------------------- causal language models
@dataclass(frozen=True)
class TokenLogprobs(Request):
    """log P(token_i | what precedes it) for every token of ``text``; ``first_token`` says how token 0 is
    conditioned (``prefix``: after the BOS/EOS prefix token, ``separate``: bias-bench's separate pass, ``none``:
    not scored). Answer: ``token_ids``, ``logprobs``, ``total``."""

    kind: ClassVar[str] = "token_logprobs"
    text: str
    first_token: str = "prefix"


@dataclass(frozen=True)
class ContinuationLogprobs(Request):
    """log P(``continuation`` | ``context``) token by token. Answer: ``token_ids``, ``logprobs``, ``total``."""

    kind: ClassVar[str] = "continuation_logprobs"
    context: str
    continuation: str


@dataclass(frozen=True)
class Generation(Request):
    """Sample ``sample_index`` of a response to ``prompt`` under the settings that determine it (temperature 0:
    greedy). Answered by every generator (a causal LM's ``generate``, an OpenAI-compatible server, a responses
    file). Answer: ``response`` (None when failed), ``status`` (``ok`` | ``failed``), ``error`` (redacted),
    ``latency_s``; a failed answer is cached but asked again on the next run."""

    kind: ClassVar[str] = "generation"
    prompt: str
    sample_index: int = 0
    system_prompt: str | None = None
    temperature: float = 1.0
    max_tokens: int = 256
    seed: int | None = 0

    def __post_init__(self):  # one key whether a config wrote 1 or 1.0
        object.__setattr__(self, "sample_index", int(self.sample_index))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "max_tokens", int(self.max_tokens))
        object.__setattr__(self, "seed", None if self.seed is None else int(self.seed))


# -------------------------------------------------------------------------------------------------- classifiers
@dataclass(frozen=True)
class Classification(Request):
    """The class probabilities a text classifier (``classifier``: hub id or local folder) gives ``text``; answered
    by that classifier (model kind ``text_classifier``), not by the job's model. Answer: ``labels`` (the model's
    labels in id order), ``probabilities`` (softmax, same order)."""

    kind: ClassVar[str] = "classification"
    text: str
    classifier: str


# ------------------------------------------------------------------------------------------------- embeddings
@dataclass(frozen=True)
class SentenceEmbedding(Request):
    """A sentence encoder's vector of ``text`` (``pooling`` None: the encoder's own). Answer: ``vector``."""

    kind: ClassVar[str] = "sentence_embedding"
    text: str
    pooling: str | None = None


@dataclass(frozen=True)
class WordVector(Request):
    """A static word vector. Answer: ``vector`` (empty when the word is not in the vocabulary), ``found``."""

    kind: ClassVar[str] = "word_vector"
    word: str
