"""Model kinds, each declared once: the one place that says what a ``model.kind`` is.

A declaration (``ModelKindSpec``) names the kind's adapter factory and answerers as ``"module:function"`` strings
(imported only when a model is loaded or a request answered, so declaring a kind imports neither torch nor
transformers), the scheduling defaults of its score jobs, and how its fingerprint is found. Everything else that
knows about model kinds reads it from here:

* ``schema.ModelKind`` (``ModelConfig.kind``): a config's kind must be a declared one; an unknown kind is a one-line
  error listing the known kinds;
* ``models.MODEL_KINDS`` / ``models.load_model``: the adapter factory;
* ``scoring.answer.ANSWERERS`` (who answers which request kind), ``ANSWER_REVISIONS`` (the cache folder revision of
  an answerer's numbers) and ``LOAD_AS`` (a request answered by a sibling head of the same checkpoint);
* ``scheduling.KIND_DEFAULTS``: memory, CPUs, time limit and whether the kind can use a GPU;
* ``models.fingerprint``: which kinds load a Hugging Face folder (their fingerprint is known without loading them)
  and which config keys say only where a model runs;
* the plan: a metric that accepts ``like``'s kind accepts this one too.

The built-in kinds are declared at the end of this module; ``docs/adding_a_model_kind.md`` adds one. A second
declaration under a taken name is an error naming both modules. This module imports no other biasflow module (the
schema sits above it).
"""
from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator, Mapping

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _check_target(value: Any, what: str) -> None:
    if callable(value):
        return
    if not isinstance(value, str) or not _TARGET.match(value):
        raise ValueError(f"{what}={value!r} must be 'package.module:function' (imported when needed) or a callable")


@dataclass(frozen=True)
class Answer:
    """How a model kind answers one request kind.

    ``target``: ``fn(model, requests, budget) -> DataFrame`` (one row per request, in order, the answer's columns),
    as ``"module:function"`` or the function itself. ``revision``: raised whenever a change moves the answers, even
    in the last bits (the cache keeps each revision's answers in ``<request kind>.r<N>``, never mixing two).
    ``load_as``: another declared kind whose adapter (a sibling head of the same checkpoint) answers it."""

    target: str | Callable
    revision: int = 1
    load_as: str | None = None

    def __post_init__(self):
        _check_target(self.target, "target")
        if isinstance(self.revision, bool) or not isinstance(self.revision, int) or self.revision < 1:
            raise ValueError(f"revision={self.revision!r} must be an integer >= 1")


@dataclass(frozen=True)
class Resources:
    """What one score job of a model of this kind asks the scheduler for, unless its config's ``resources:`` says
    otherwise (``scheduling.score_resources``). ``gpu_capable``: a GPU is asked for when ``model.device`` is CUDA
    (False for vector tables, n-gram models, HTTP clients: they never use one)."""

    mem_mb: int
    cpus: int
    runtime_min: int
    gpu_capable: bool

    def __post_init__(self):
        for f in ("mem_mb", "cpus", "runtime_min"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"resources.{f}={value!r} must be a positive integer")
        if not isinstance(self.gpu_capable, bool):
            raise ValueError(f"resources.gpu_capable={self.gpu_capable!r} must be true or false")

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ModelKindSpec:
    """One model kind.

    ``name``: the ``model.kind`` value. ``factory``: ``cfg -> adapter`` as ``"module:function"`` (a class is fine);
    the adapter has ``name``, ``kind``, ``fingerprint`` and ``provenance()``. ``answers``: request kind ->
    ``Answer`` (or just its target). ``resources``: the scheduling defaults. ``like``: a declared kind whose
    metrics accept this kind too (it must answer the request kinds they ask of one). ``hf_files``: loaded from a
    Hugging Face folder or hub id (``models.fingerprint.load_identity`` then knows the fingerprint without loading
    the model). ``location_keys``: config keys that say where the model runs, not what it computes (left out of
    its fingerprint). ``module``: the declaring module (set by ``register_model_kind``)."""

    name: str
    factory: str | Callable
    answers: Mapping[str, Answer | str | Callable]
    resources: Resources
    like: str | None = None
    hf_files: bool = False
    location_keys: tuple[str, ...] = ()
    # the model-config keys (schema.ModelConfig fields) this kind reads beyond COMMON_OPTIONS; a config of the kind
    # that sets another is refused at plan time (a key the adapter never reads would be silently ignored). None: any
    options: tuple[str, ...] | None = None
    module: str | None = field(default=None, compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"model kind name {self.name!r}: use letters, digits and _ (starting with a letter)")
        try:
            _check_target(self.factory, "factory")
            if not isinstance(self.answers, Mapping):
                raise ValueError("answers must map request kinds to answerers")
            answers = {}
            for request_kind, answer in self.answers.items():
                if not isinstance(request_kind, str) or not request_kind:
                    raise ValueError(f"answers: {request_kind!r} is not a request kind name")
                try:
                    answers[request_kind] = answer if isinstance(answer, Answer) else Answer(answer)
                except ValueError as exc:
                    raise ValueError(f"answers[{request_kind!r}]: {exc}") from None
            resources = self.resources
            if isinstance(resources, Mapping):
                resources = Resources(**resources)
            if not isinstance(resources, Resources):
                raise ValueError("resources must be a Resources(mem_mb=..., cpus=..., runtime_min=..., "
                                 "gpu_capable=...)")
            if self.like is not None and (not isinstance(self.like, str) or self.like == self.name):
                raise ValueError(f"like={self.like!r} must name another model kind")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model kind {self.name!r}: {exc}") from None
        object.__setattr__(self, "answers", answers)
        object.__setattr__(self, "resources", resources)
        object.__setattr__(self, "location_keys", tuple(self.location_keys))
        if self.options is not None:
            object.__setattr__(self, "options", tuple(self.options))


# name -> declaration: the one registry of model kinds
KINDS: dict[str, ModelKindSpec] = {}


def register_model_kind(spec: ModelKindSpec, module: str | None = None) -> ModelKindSpec:
    """Declare ``spec`` (``module``: the declaring module, by default the caller's). A second declaration under a
    taken name is an error naming both modules; the same declaration again from the same module (a re-import) is
    fine."""
    if not isinstance(spec, ModelKindSpec):
        raise TypeError("register_model_kind takes a ModelKindSpec(name=..., factory='module:function', answers=..., "
                        "resources=Resources(...)), see docs/adding_a_model_kind.md")
    module = module or spec.module or sys._getframe(1).f_globals.get("__name__", "?")
    old = KINDS.get(spec.name)
    if old is not None and old.module != module:
        raise ValueError(f"model kind {spec.name!r} is registered twice: by {old.module} and by {module}; give one "
                         f"of them another name")
    if old is not None and old != spec:
        raise ValueError(f"model kind {spec.name!r} is registered twice in {module}, differently; keep one of the "
                         f"declarations")
    for other in ([spec.like] if spec.like else []) + [a.load_as for a in spec.answers.values() if a.load_as]:
        if other not in KINDS and other != spec.name:
            raise ValueError(f"model kind {spec.name!r} refers to model kind {other!r}, which is not registered; "
                             f"known: {', '.join(sorted(KINDS))}")
    spec = dataclasses.replace(spec, module=module)
    KINDS[spec.name] = spec
    return spec


def known() -> list[str]:
    return sorted(KINDS)


def unknown_kind_message(kind: Any) -> str:
    return f"{kind!r} is not a known model kind; known: {', '.join(known())}"


# model-config keys every kind takes: its name and kind, where it runs, what its score jobs ask the scheduler for,
# and the token budget of a scoring chunk (scoring.answer.Budget, halved on out-of-memory for every kind)
COMMON_OPTIONS = ("name", "kind", "device", "resources", "batch_tokens")


def foreign_options(kind: Any, given: Mapping[str, Any]) -> dict[str, list[str]]:
    """The keys of a model config ``given`` (those set, not None) that its kind does not read, each with the kinds
    that do: ``{}`` when every key is the kind's (or the kind declares no option list)."""
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    if spec is None or spec.options is None:
        return {}
    own = set(COMMON_OPTIONS) | set(spec.options)
    return {key: sorted(k.name for k in KINDS.values() if k.options and key in k.options)
            for key, value in given.items() if value is not None and key not in own}


def accepts(model_kinds: tuple[str, ...] | list[str], kind: Any) -> bool:
    """Whether a metric written for ``model_kinds`` takes a model of ``kind``: listed, or declared ``like`` a
    listed kind."""
    if kind in model_kinds:
        return True
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    return spec is not None and spec.like is not None and spec.like in model_kinds


def resolve(target: str | Callable) -> Callable:
    """The callable a ``"module:function"`` target names (imported now)."""
    if callable(target):
        return target
    import importlib

    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


class View(Mapping):
    """A read-only table derived from ``KINDS`` on every access (so kinds registered later appear in it)."""

    def __init__(self, build: Callable[[], dict], doc: str = ""):
        self._build = build
        self.__doc__ = doc

    def __getitem__(self, key):
        return self._build()[key]

    def __iter__(self) -> Iterator:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())

    def __contains__(self, key) -> bool:
        return key in self._build()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._build()!r})"


def _answerers() -> dict[tuple[str, str], str | Callable]:
    return {(k, r): a.target for k, spec in KINDS.items() for r, a in spec.answers.items()}


def _revisions() -> dict[tuple[str, str], int]:
    return {(k, r): a.revision for k, spec in KINDS.items() for r, a in spec.answers.items() if a.revision != 1}


def _load_as() -> dict[tuple[str, str], str]:
    return {(k, r): a.load_as for k, spec in KINDS.items() for r, a in spec.answers.items() if a.load_as}


def _resources() -> dict[str, dict[str, Any]]:
    return {k: spec.resources.as_dict() for k, spec in KINDS.items()}


# the derived tables (scoring.answer and scheduling show them under their old names)
ANSWERERS = View(_answerers, "(model kind, request kind) -> the answerer's 'module:function' (or callable)")
ANSWER_REVISIONS = View(_revisions, "(model kind, request kind) -> revision, where it is not 1")
LOAD_AS = View(_load_as, "(model kind, request kind) -> the kind of the sibling head that answers it")
KIND_DEFAULTS = View(_resources, "model kind -> its scheduling defaults (mem_mb, cpus, runtime_min, gpu_capable)")


# ------------------------------------------------------------------------------------------------ built-in kinds
# (answerers' numbers: revision 2 of causal_lm = packed passes and the vocabulary head in slices, answers moved by up
# to ~1e-6; stereoset_sentence_logprobs 3 = the reference's unbatched softmax loop, with `probs`; served 2 = a reply
# is checked (tokens, offsets, usage and finite log-probabilities agree): answers cached before the check may hold a
# dropped last token or -inf, so they are asked again, never served)
_LMC = "biasflow.lmchallenge.pipeline:answer_lmc_line"
# the config options of an HTTP client (``openai_http.OpenAIHTTPClient``): a served model's ``model.*`` and an
# OpenAI-compatible generator's ``generator.*`` (``generation.kinds``): where its key is, how it paces, bounds and
# retries its requests
HTTP_CLIENT_OPTIONS = ("api_key_env", "api_key_file", "timeout_s", "max_retries", "backoff_s", "max_backoff_s",
                       "concurrency", "requests_per_second")
_GENERATION = "biasflow.generation.answer:answer_generation"
# what a model loaded from a Hugging Face folder or hub id reads (models/hf.py, masked_lm.py: threads and the CPU's
# oneDNN linears; generation: batch_size prompts; LM Challenge: predictions per position)
_HF = ("hub_id", "path", "revision", "lowercase", "dtype", "attn_implementation", "cpu_linear", "threads",
       "batch_size", "max_length", "predictions")

register_model_kind(ModelKindSpec(
    name="bert_nsp", factory="biasflow.models.nsp:BertNSP", hf_files=True, options=_HF,
    answers={"next_sentence": "biasflow.scoring.stereoset:answer_next_sentence"},
    resources=Resources(mem_mb=8000, cpus=4, runtime_min=120, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    # the demo model (build, train, demo) is a masked LM the workflow builds (models/demo.py)
    name="masked_lm", factory="biasflow.models.masked_lm:MaskedLM", hf_files=True,
    options=(*_HF, "build", "train", "demo"),
    answers={
        "pll": "biasflow.scoring.masked:answer_pll",
        "unmasked_logprobs": "biasflow.scoring.unmasked:answer_unmasked_logprobs",
        "unmasked_logprobs_attn": "biasflow.scoring.unmasked:answer_unmasked_logprobs_attention",
        "mask_candidates": "biasflow.scoring.fill_mask:answer_mask_candidates",
        "mask_token_str": "biasflow.scoring.fill_mask:answer_mask_token_str",
        "mask_top_k": "biasflow.scoring.fill_mask:answer_mask_top_k",
        "multi_mask": "biasflow.scoring.multi_mask:answer_multi_mask",
        "first_mask_probability": "biasflow.scoring.first_mask:answer_first_mask_probability",
        "blank_fill": "biasflow.scoring.stereoset:answer_blank_fill",
        # BERT's next-sentence head of the same checkpoint, loaded as bert_nsp
        "next_sentence": Answer("biasflow.scoring.stereoset:answer_next_sentence", load_as="bert_nsp"),
        "lmc_line": _LMC,
    },
    resources=Resources(mem_mb=8000, cpus=4, runtime_min=120, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    name="causal_lm", factory="biasflow.models.causal_lm:CausalLM", hf_files=True,
    options=(*_HF, "head_chunk", "compile"),
    answers={
        "token_logprobs": Answer("biasflow.scoring.causal:answer_token_logprobs", revision=2),
        "stereoset_sentence_logprobs": Answer("biasflow.scoring.stereoset:answer_sentence_logprobs", revision=3),
        "continuation_logprobs": Answer("biasflow.scoring.causal_options:answer_continuation_logprobs", revision=2),
        "shared_context_continuation": "biasflow.scoring.causal_options:answer_shared_context",
        "lmc_line": _LMC,
        "generation": _GENERATION,
    },
    resources=Resources(mem_mb=16000, cpus=4, runtime_min=240, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    # a causal LM behind an OpenAI-compatible server (docs/served_models.md); the GPUs are the server's (vLLM on its
    # own nodes), the job only sends HTTP requests; base_url says where it runs, not what it computes
    name="served_causal_lm", factory="biasflow.models.served:ServedCausalLM", location_keys=("base_url",),
    options=("base_url", "served_model_name", *HTTP_CLIENT_OPTIONS, "bos_text", "lowercase", "revision",
             "batch_size"),
    answers={
        "token_logprobs": Answer("biasflow.models.served:answer_token_logprobs", revision=2),
        "continuation_logprobs": Answer("biasflow.models.served:answer_continuation_logprobs", revision=2),
        # the same requests: vLLM's automatic prefix caching computes a context once for all its continuations
        # (docs/served_models.md), and the work key keeps them in one chunk, so the context alone is sent once
        "shared_context_continuation": "biasflow.models.served:answer_continuation_logprobs",
        # StereoSet's sentence log-probabilities (its reference arithmetic): first_token=separate
        "stereoset_sentence_logprobs": Answer("biasflow.models.served:answer_separate_logprobs", revision=2),
        "generation": _GENERATION,
    },
    resources=Resources(mem_mb=2000, cpus=1, runtime_min=240, gpu_capable=False)))
register_model_kind(ModelKindSpec(
    name="sentence_encoder", factory="biasflow.models.encoders:SentenceEncoder", hf_files=True,
    options=("hub_id", "path", "revision", "package", "lowercase", "dtype", "batch_size", "max_length", "pooling",
             "threads"),
    answers={"sentence_embedding": "biasflow.scoring.embeddings:answer_sentence_embedding"},
    resources=Resources(mem_mb=4000, cpus=2, runtime_min=60, gpu_capable=True)))
register_model_kind(ModelKindSpec(
    name="word_vectors", factory="biasflow.models.vectors:load_word_vectors",
    options=("path", "package", "format", "header", "lowercase"),
    answers={"word_vector": "biasflow.models.vectors:answer_word_vector"},
    resources=Resources(mem_mb=4000, cpus=1, runtime_min=30, gpu_capable=False)))
register_model_kind(ModelKindSpec(
    # LM Challenge protocol models: biasflow's n-gram model, or any program speaking the line protocol
    name="ngram", factory="biasflow.models.lmc_process:ProtocolModel", answers={"lmc_line": _LMC},
    options=("order", "level", "predictions", "shards", "timeout_s"),
    resources=Resources(mem_mb=4000, cpus=1, runtime_min=60, gpu_capable=False)))
register_model_kind(ModelKindSpec(
    name="lmc_process", factory="biasflow.models.lmc_process:ProtocolModel", answers={"lmc_line": _LMC},
    options=("command", "shards", "timeout_s", "predictions"),
    resources=Resources(mem_mb=4000, cpus=1, runtime_min=120, gpu_capable=False)))
register_model_kind(ModelKindSpec(
    # generated text from an OpenAI-compatible chat endpoint or a responses file (generation.config.generator_model)
    name="generator", factory="biasflow.models.generator:Generator", answers={"generation": _GENERATION},
    resources=Resources(mem_mb=8000, cpus=2, runtime_min=120, gpu_capable=False)))
register_model_kind(ModelKindSpec(
    # a sequence classifier scoring generated text (LangFair's stereotype classifier: metrics/langfair.py; the
    # toxicity classifier: metrics/toxicity.py). Revision 2: a multi-label model's probabilities are sigmoids
    name="text_classifier", factory="biasflow.models.text_classifier:TextClassifier", hf_files=True, options=_HF,
    answers={"classification": Answer("biasflow.scoring.classification:answer_classification", revision=2)},
    resources=Resources(mem_mb=8000, cpus=2, runtime_min=120, gpu_capable=True)))

__all__ = ["ModelKindSpec", "Answer", "Resources", "register_model_kind", "KINDS", "accepts", "known",
           "COMMON_OPTIONS", "foreign_options",
           "resolve", "ANSWERERS", "ANSWER_REVISIONS", "LOAD_AS", "KIND_DEFAULTS"]
