"""Model kinds, each declared once: the registry that says what a ``model.kind`` is.

A declaration (``ModelKindSpec``) names the kind's adapter factory and answerers as ``"module:function"`` strings
(imported only when a model is loaded or a request answered, so declaring a kind imports neither torch nor
transformers), its config model (the options a model config of the kind takes, validated at plan time), the
scheduling defaults of its score jobs, and how its fingerprint is found. Everything else that knows about model kinds
reads it from here:

* ``schema.ModelKind`` and ``schema.validate_model_config``: a config's kind must be a declared one (an unknown kind
  is a one-line error listing the known kinds), and the kind's config model validates it;
* ``models.load_model``: the adapter factory;
* ``scoring.answer`` (``answer_for``): who answers which request kind, the cache folder revision of an answerer's
  numbers and ``load_as`` (a request answered by a sibling head of the same checkpoint);
* ``scheduling.score_resources``: memory, CPUs, time limit and whether the kind can use a GPU;
* ``models.fingerprint``: the identity markers of the config models, which kinds load a Hugging Face folder (their
  fingerprint is known without loading them) and which config keys say only where a model runs;
* the plan: a metric that accepts ``like``'s kind accepts this one too.

The declarations live in the modules of ``biasflow.kinds`` (one per family of kinds, each with its config models),
imported on the first read of ``KINDS`` (a ``biasflow.declared.Registry``, the mechanism of every registry);
``docs/adding_a_model_kind.md`` adds one there. A second declaration under a taken name is an error naming both
modules. This module imports no other biasflow module but ``declared`` (the schema, which the declarations' config
models build on, sits above it).
"""
from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

from biasflow.declared import Registry

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
    # the kind's config model: a ``schema.ModelOptions`` subclass (or "module:Class"), declared with the kind. It
    # says which keys a model config of the kind takes (any other is refused at plan time, naming the kinds that
    # take it), their types and defaults, and which of them are the model's identity (its fingerprint). None: the
    # plan writes the kind's configs itself and takes any key (the generator kind)
    config: str | type | None = None
    # for a kind whose configs the plan writes (``config`` None): the model those configs are validated by when the
    # model is loaded (``schema.model_options``); it is no config model of the kind (never a plan-time check)
    plan_config: str | type | None = None
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
            if self.config is not None:
                _check_target(self.config, "config")
            if self.plan_config is not None:
                _check_target(self.plan_config, "plan_config")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model kind {self.name!r}: {exc}") from None
        object.__setattr__(self, "answers", answers)
        object.__setattr__(self, "resources", resources)
        object.__setattr__(self, "location_keys", tuple(self.location_keys))


# name -> declaration: the one registry of model kinds, filled by the modules of ``biasflow.kinds`` and those an
# installed package names under the entry-point group ``biasflow.kinds`` (its pyproject.toml:
# [project.entry-points."biasflow.kinds"] my_kinds = "my_project.kinds"), so no file of biasflow is edited
_pending_references: list[ModelKindSpec] = []


def _check_pending_references() -> None:
    references, _pending_references[:] = list(_pending_references), []
    for spec in references:
        _check_references(spec)


KINDS: dict[str, ModelKindSpec] = Registry("model kind", ["biasflow.kinds"], "biasflow.kinds",
                                           after_load=_check_pending_references)


def _check_references(spec: ModelKindSpec) -> None:
    for other in ([spec.like] if spec.like else []) + [a.load_as for a in spec.answers.values() if a.load_as]:
        if other not in KINDS and other != spec.name:
            raise ValueError(f"model kind {spec.name!r} refers to model kind {other!r}, which is not registered; "
                             f"known: {', '.join(sorted(KINDS))}")


def register_model_kind(spec: ModelKindSpec, module: str | None = None) -> ModelKindSpec:
    """Declare ``spec`` (``module``: the declaring module, by default the caller's). A second declaration under a
    taken name is an error naming both modules; the same declaration again from the same module (a re-import) is
    fine."""
    if not isinstance(spec, ModelKindSpec):
        raise TypeError("register_model_kind takes a ModelKindSpec(name=..., factory='module:function', answers=..., "
                        "resources=Resources(...)), see docs/adding_a_model_kind.md")
    module = module or spec.module or sys._getframe(1).f_globals.get("__name__", "?")
    old = KINDS.registered(spec.name)
    KINDS.refuse_taken(spec.name, module, old.module if old is not None else None)
    if old is not None and old != spec:
        raise ValueError(f"model kind {spec.name!r} is registered twice in {module}, differently; keep one of the "
                         f"declarations")
    if KINDS.state == "loading":
        _pending_references.append(spec)  # checked once every declaration module is imported
    else:
        _check_references(spec)
    spec = dataclasses.replace(spec, module=module)
    return KINDS.add(spec.name, spec, module)


def config_model(kind: Any) -> type | None:
    """The config model of model kind ``kind`` (imported now when it is named as "module:Class"); None for an
    unknown kind or one that takes any key."""
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    return resolve(spec.config) if spec is not None and spec.config is not None else None


def plan_config_model(kind: Any) -> type | None:
    """The model of the configs the plan writes for ``kind`` (``ModelKindSpec.plan_config``), or None."""
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    return resolve(spec.plan_config) if spec is not None and spec.plan_config is not None else None


def known() -> list[str]:
    return sorted(KINDS)


def unknown_kind_message(kind: Any) -> str:
    return f"{kind!r} is not a known model kind; known: {', '.join(known())}"


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
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def answer_for(model_kind: Any, request_kind: str) -> Answer | None:
    """How ``model_kind`` answers ``request_kind`` requests (its target, cache revision and ``load_as``); None when it
    does not (or the kind is unknown)."""
    spec = KINDS.get(model_kind) if isinstance(model_kind, str) else None
    return spec.answers.get(request_kind) if spec is not None else None


def kinds_answering(request_kind: str) -> list[str]:
    """The declared model kinds that answer ``request_kind`` requests."""
    return sorted(name for name, spec in KINDS.items() if request_kind in spec.answers)


def loads_hf_files(kind: Any) -> bool:
    """Whether models of ``kind`` load from a Hugging Face folder or hub id (``ModelKindSpec.hf_files``)."""
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    return spec is not None and spec.hf_files


def location_keys(kind: Any) -> tuple[str, ...]:
    """The config keys of ``kind`` that say where its model runs, not what it computes."""
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    return spec.location_keys if spec is not None else ()


# the config options of an HTTP client (``openai_http.OpenAIHTTPClient``; ``schema.http_client_options`` declares
# their types and defaults): a served model's ``model.*`` and an OpenAI-compatible generator's ``generator.*``
# (``generator_kinds``): where its key is, how it paces, bounds and retries its requests
HTTP_CLIENT_OPTIONS = ("api_key_env", "api_key_file", "timeout_s", "max_retries", "backoff_s", "max_backoff_s",
                       "concurrency", "requests_per_second")

__all__ = ["ModelKindSpec", "Answer", "Resources", "register_model_kind", "KINDS", "accepts", "known",
           "config_model", "plan_config_model", "HTTP_CLIENT_OPTIONS", "resolve", "answer_for", "kinds_answering",
           "loads_hf_files", "location_keys"]
