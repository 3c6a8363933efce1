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

from biasflow.score_kinds import MASK_PLACEHOLDER

MULTI_MASK_POSITION_RULES = ("aligned", "reference")
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

    @property
    def work_key(self) -> str:
        """Requests with the same work key share model work (a forward pass): answered together, it is done once.
        By default a request shares nothing."""
        return self.key


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
    """log P(token_i | the whole unmasked ``text``) at every position, special tokens included (Kaneko & Bollegala's
    AUL). Answer: ``token_ids`` (with special tokens), ``logprobs``, ``top1`` (token i is the arg-max prediction)."""

    kind: ClassVar[str] = "unmasked_logprobs"
    text: str


@dataclass(frozen=True)
class UnmaskedLogprobsAttention(Request):
    """``UnmaskedLogprobs`` plus the attention each position receives, averaged over layers, heads and all query
    positions (AULA; the model runs eager attention). Answer: ``token_ids``, ``logprobs``, ``top1``, ``attention``."""

    kind: ClassVar[str] = "unmasked_logprobs_attn"
    text: str


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
    """Log-probabilities of a word's pieces at masks of a sentence (LPBS, CBS). Each ``[MASK]`` placeholder of
    ``text`` stands for the word of ``words`` in the same order and becomes one mask per word piece of it (the
    model's tokenizer counts them); the pieces of ``words[target]`` are read at the positions ``position_rule``
    says: ``aligned`` = the masks of placeholder ``target``; ``reference`` = Ahn & Oh's ``find_mask_token(last=True)``:
    a target after the first placeholder is read from the sentence's second mask token on. Answer: ``positions``
    (token positions read, special tokens counted), ``token_ids`` (the target's pieces) and ``logprobs``, the
    positions x pieces matrix flattened row-major."""

    kind: ClassVar[str] = "multi_mask"
    text: str
    words: tuple[str, ...]
    target: int = 0
    position_rule: str = "aligned"

    @property
    def work_key(self) -> str:  # the questions about one template share its masked passes
        return self.text

    def __post_init__(self):
        object.__setattr__(self, "words", tuple(self.words))
        placeholders = self.text.count(MASK_PLACEHOLDER)
        if placeholders != len(self.words):
            raise ValueError(f"multi-mask request {self.text!r}: {placeholders} {MASK_PLACEHOLDER} placeholders "
                             f"for {len(self.words)} words {list(self.words)}")
        if not 0 <= self.target < len(self.words):
            raise ValueError(f"multi-mask request {self.text!r}: target {self.target} is not a placeholder index")
        if self.position_rule not in MULTI_MASK_POSITION_RULES:
            raise ValueError(f"multi-mask request {self.text!r}: position_rule={self.position_rule!r}, expected one "
                             f"of {MULTI_MASK_POSITION_RULES}")
        if self.target == 0:  # the rules agree on a first placeholder: one request (one cache entry) either way
            object.__setattr__(self, "position_rule", "aligned")


@dataclass(frozen=True)
class FirstMaskProbability(Request):
    """P(the token of ``original`` at the first mask of ``text``), as Bartl et al. (2020)'s BEC-Pro code reads it
    (``prob_with_prior``): ``text`` (``[MASK]`` placeholders) and ``original`` are encoded with special tokens; with
    ``pad_to``, each is cut or padded to that many tokens with mask tokens that are attended to (the reference's
    ``input_pipeline``: ``pad_sequences(value=mask_token_id)`` and an attention mask of ``id > 0``); the probability
    (float32 softmax) is read at the first mask position of ``text``, for the token ``original`` has there.
    Answer: ``position``, ``token_id``, ``prob``."""

    kind: ClassVar[str] = "first_mask_probability"
    text: str
    original: str
    pad_to: int | None = None


@dataclass(frozen=True)
class BlankFill(Request):
    """StereoSet intrasentence with a masked LM: the mean probability of ``word``'s pieces at the BLANK of
    ``context`` (``word_prefix_space``: the pieces of ``" " + word``). Answer: ``token_ids`` (the word's pieces),
    ``probs`` (each piece at its mask), ``probability`` (their mean)."""

    kind: ClassVar[str] = "blank_fill"
    context: str
    word: str
    word_prefix_space: bool = False

    @property
    def work_key(self) -> str:  # the candidates of a context share its first masked pass
        return self.context


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
class StereoSetSentenceLogprobs(Request):
    """log P(token_i | what precedes it) for every token of ``text`` as StereoSet's reference computes them: token 0
    from a pass on the start token alone, the rest from the text without it (one unbatched pass per text), each
    read from a float32 ``softmax``. The same quantity as ``TokenLogprobs(text, first_token="separate")``, but that
    scorer is batched, computes ``logit - logsumexp`` and rounds differently in the last float32 bits (a few 1e-7
    relative), which can reorder StereoSet's near-ties; kept apart so StereoSet's numbers stay those of its
    reference arithmetic. Answer: ``token_ids``, ``probs`` (the float32 probabilities; not from a served model),
    ``logprobs``, ``total``."""

    kind: ClassVar[str] = "stereoset_sentence_logprobs"
    text: str


@dataclass(frozen=True)
class ContinuationLogprobs(Request):
    """log P(``continuation`` | ``context``) token by token, context and continuation tokenised separately;
    ``start_token``: the context follows the model's start token (BOS, else EOS), so it may be empty.
    Answer: ``token_ids`` (the continuation's), ``logprobs``, ``total`` (their float32 sum)."""

    kind: ClassVar[str] = "continuation_logprobs"
    context: str
    continuation: str
    start_token: bool = False


@dataclass(frozen=True)
class SharedContextContinuation(ContinuationLogprobs):
    """``ContinuationLogprobs`` with the context computed once for every continuation asked after it (a causal LM in
    process: one pass over the context, each continuation attending to its keys and values; served: the server's
    prefix cache). The same answer columns; the numbers equal the separate pass's up to float rounding, so they are
    cached under a kind of their own and never mixed with its answers."""

    kind: ClassVar[str] = "shared_context_continuation"

    @property
    def work_key(self) -> str:  # the continuations of one context share its pass
        return request_key(self.kind, {"context": self.context, "start_token": self.start_token})


# how a multiple-choice metric has a causal LM score its options (the metric option ``context_pass``): the context
# once for all options, or once per option (lm-evaluation-harness's requests)
CONTINUATION_REQUESTS: dict[str, type[ContinuationLogprobs]] = {
    "once": SharedContextContinuation, "per_option": ContinuationLogprobs}


def continuation_request(context: str, continuation: str, start_token: bool = False,
                         context_pass: str = "once") -> ContinuationLogprobs:
    """The request for ``continuation`` after ``context`` under a metric's ``context_pass``."""
    if context_pass not in CONTINUATION_REQUESTS:
        raise ValueError(f"context_pass={context_pass!r} is not one of {list(CONTINUATION_REQUESTS)}")
    return CONTINUATION_REQUESTS[context_pass](context, continuation, start_token)


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
    labels in id order), ``probabilities`` (same order: softmax, or a sigmoid per label for a multi-label model)."""

    kind: ClassVar[str] = "classification"
    text: str
    classifier: str


@dataclass(frozen=True)
class TextPairClassification(Request):
    """The class probabilities the job's sequence classifier (model kind ``text_classifier``) gives the sentence pair
    (``text``, ``text_pair``), encoded as its tokenizer encodes a pair (an NLI model's premise and hypothesis: Bias-NLI,
    ``metrics/bias_nli.py``). Answer: ``labels`` (the model's labels in id order), ``probabilities`` (same order)."""

    kind: ClassVar[str] = "text_pair_classification"
    text: str
    text_pair: str


# ----------------------------------------------------------------------------------------- question answering
@dataclass(frozen=True)
class SpanProbability(Request):
    """An extractive QA model's (model kind ``question_answering``) start and end probabilities of character spans
    of ``context`` as the answer to ``question``: the model reads the question and the context as its tokenizer
    encodes a pair (question first), the start and end logits go through a softmax over every position of that
    input (question and special tokens included, padding not), and span (a, b) (``context[a:b]``) gets P(start) of
    the token holding character a and P(end) of the token holding character b - 1. Answer: ``start``, ``end`` (one
    per span, in order). UnQover's QA scoring (``metrics/unqover.py``, ``unqover_qa``)."""

    kind: ClassVar[str] = "span_probability"
    question: str
    context: str
    spans: tuple[tuple[int, int], ...]

    def __post_init__(self):
        object.__setattr__(self, "spans", tuple((int(a), int(b)) for a, b in self.spans))
        for a, b in self.spans:
            if not 0 <= a < b <= len(self.context):
                raise ValueError(f"span ({a}, {b}) is not a non-empty span of the context {self.context!r}")


# ------------------------------------------------------------------------------------------------- embeddings
@dataclass(frozen=True)
class SentenceEmbedding(Request):
    """A sentence encoder's vector of ``text`` (``pooling`` None: the encoder's own, ``model.pooling``).
    Answer: ``vector`` (list<float32>), ``pooling_used`` (the pooling that made it)."""

    kind: ClassVar[str] = "sentence_embedding"
    text: str
    pooling: str | None = None


@dataclass(frozen=True)
class WordVector(Request):
    """A static word vector of ``word`` as the metric writes it (the model lowercases if its config says so).
    Answer: ``vector`` (list<float32>, empty when the word is not in the vocabulary), ``found``, ``looked_up``
    (the form looked up)."""

    kind: ClassVar[str] = "word_vector"
    word: str


# ------------------------------------------------------------------------------------------------ LM Challenge
@dataclass(frozen=True)
class LMChallengeLine(Request):
    """One test line played in an LM Challenge game (``wc``, ``we``, ``ce``, ``wr``; biasflow.lmchallenge.games).

    A game asks the model one question per token (wc: one per typed prefix), each depending only on the line, the
    line's ``message`` index (wr's typo generator is seeded by it) and the game's options, so a line is the unit
    of caching; the questions of a line are answered together and the answer is that line's log. ``train`` is the
    sha256 of the training text, which trains the n-gram and protocol models and gives wr its vocabulary;
    ``training_lines`` carries that text to the model and is not part of the key (``train`` stands for it).
    Options a game does not use keep their defaults, so they never split its cache. Answer: ``data`` (the line's
    log datums, a JSON list, as ``run_game`` yields them)."""

    kind: ClassVar[str] = "lmc_line"
    game: str
    text: str
    message: int
    train: str
    next_word_only: bool = False
    num_candidates: int = 50
    seed: int = 42
    p_anykey: float = 0.1
    training_lines: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def fields(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "training_lines"}
