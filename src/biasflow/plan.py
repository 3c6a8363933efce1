"""Hydra overrides -> a plan: every job of a run or sweep, with the paths of every stage.

A sweep (``-m model=a,b metric.crows_pairs.diff_threshold=0.05,0.1``) is expanded here with Hydra's own override
parser, each combination is composed with Hydra's compose API, and all jobs go into ONE plan, hence one Snakemake
DAG: two jobs that need the same model outputs point at the same score file, which Snakemake builds once.

Paths carry hashes of exactly what can change their content:
  items   results/items/<benchmark>-<hash of benchmark config>.parquet
  scores  results/scores/<model_key>/<metric>-<hash of model, benchmark, score options>.parquet
  metric  results/metrics/<model_key>/<metric>/<hash of everything of the job>/
  run     results/runs/<hash of the set of jobs and tracking>/
so a threshold change creates a new metric folder and reuses the score file.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from omegaconf import OmegaConf

from biasflow.errors import ConfigError
from biasflow.generation.config import job_model as generation_job_model
from biasflow.generation.config import with_generation_options
from biasflow.io import stable_hash, write_json, write_text_if_changed
from biasflow.model_kinds import accepts as accepts_kind
from biasflow.models.fingerprint import config_fingerprint
from biasflow.ordered import is_ordered_list, ordered_items
from biasflow.schema import validate_job_config, validate_model_config
from biasflow.secrets import environ_snapshot, public_uri, redact_text, redact_uri, secret_env_values, uri_has_secret

log = logging.getLogger(__name__)


def conf_dir() -> Path:
    """The configuration to compose: ``BIASFLOW_CONF``, else ``conf/`` of the working directory, else the conf/
    shipped with this install (the checkout of an editable install, or the wheel's copy: ``biasflow.installed``), so
    biasflow works in any folder. A conf folder without ``config.yaml`` is a layer of the user's own files (a model,
    a benchmark, an experiment) over the shipped configuration: ``layered_conf`` joins the two."""
    from biasflow.installed import installed_project

    shipped = installed_project()
    base = shipped / "conf" if shipped is not None and (shipped / "conf" / "config.yaml").exists() else None
    if "BIASFLOW_CONF" in os.environ:
        own = Path(os.environ["BIASFLOW_CONF"]).resolve()
    else:
        own = Path("conf").resolve()
        if not own.is_dir() and base is not None:
            return base
    if (own / "config.yaml").exists() or base is None or not own.is_dir() or own == base.resolve():
        return own
    return layered_conf(own, base)


SOURCES = ".sources.json"  # in a layered conf folder: each file's original, for error messages


def source_file(path: str | os.PathLike) -> str:
    """The file a user wrote for a config file biasflow read (a layered conf's copy names its original)."""
    path = Path(path)
    for folder in path.parents:
        if folder.name.startswith("conf-") and (folder / SOURCES).exists():
            try:
                return json.loads((folder / SOURCES).read_text())[str(path.relative_to(folder))]
            except (OSError, ValueError, KeyError):
                break
    return str(path)


def yaml_error_text(exc: Exception) -> str:
    """A YAML syntax error as one line naming the user's file and line."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source_file(mark.name)}, line {mark.line + 1}" if mark is not None else "a config file"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: not valid YAML ({problem}); fix the file (YAML: key: value, two-space indents)"


def layered_conf(own: Path, base: Path) -> Path:
    """``base`` with the YAML files of ``own`` on top (a file of ``own`` replaces the one at the same place), as a
    folder named by the content of both (``.biasflow/conf-<digest>`` beside ``own``): written once, atomically, and
    reused while neither changes."""
    import hashlib
    import shutil
    import tempfile

    files = {p.relative_to(base): p for p in base.rglob("*.yaml")}
    files.update({p.relative_to(own): p for p in own.rglob("*.yaml")})
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(str(rel).encode() + b"\0" + files[rel].read_bytes() + b"\0")
    dest = own.parent / ".biasflow" / f"conf-{digest.hexdigest()[:16]}"
    if (dest / SOURCES).exists():  # complete (renamed into place whole)
        return dest
    shutil.rmtree(dest, ignore_errors=True)  # a folder of an older biasflow, without its sources
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".conf-", dir=dest.parent))
    for rel, src in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, tmp / rel)
    (tmp / SOURCES).write_text(json.dumps({str(rel): str(src) for rel, src in files.items()}, indent=1))
    try:
        tmp.rename(dest)
    except OSError:  # made meanwhile by another process: the same content
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# Hydra's override parser takes time quadratic in a list's length (each element is looked up among all the
# list's children): a 100 kB list took 71 s, parsed three times. Each override is parsed once per process, and a
# long list value in chunks of LIST_CHUNK elements, each parsed by Hydra as it would parse the whole.
_PARSED: dict[str, Any] = {}
LIST_CHUNK = 256


def _top_level_elements(value: str) -> list[str] | None:
    """The elements of a list literal ``[a, 'b,c', {x: 1}, ${y}]`` as written, split at its top-level commas; None
    when the text is not one balanced list."""
    if not (value.startswith("[") and value.endswith("]")):
        return None
    inner, parts, depth, quote, start, i = value[1:-1], [], 0, None, 0, 0
    while i < len(inner):
        c = inner[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth < 0:
                return None
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
        i += 1
    if quote or depth:
        return None
    parts.append(inner[start:])
    return parts


def parse_overrides(overrides: Sequence[str]) -> list[Any]:
    """Hydra's parse of each override (``Override`` objects), as ``OverridesParser.parse_overrides`` gives it."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = None
    out = []
    for line in overrides:
        if line not in _PARSED:
            parser = parser or OverridesParser.create()
            key, sep, value = line.partition("=")
            elements = _top_level_elements(value) if sep and len(value) > 4096 else None
            if elements is None or len(elements) <= LIST_CHUNK:
                _PARSED[line] = parser.parse_overrides([line])[0]
            else:
                values: list[Any] = []
                for i in range(0, len(elements), LIST_CHUNK):
                    values += parser.parse_overrides([f"{key}=[{','.join(elements[i:i + LIST_CHUNK])}]"])[0]._value
                whole = parser.parse_overrides([f"{key}=[]"])[0]
                whole._value, whole.input_line = values, line
                _PARSED[line] = whole
        out.append(copy.deepcopy(_PARSED[line]))
    return out


def expand_sweep(overrides: Sequence[str], multirun: bool) -> list[list[str]]:
    """One override list per job: the cartesian product of every swept key (Hydra's basic sweeper semantics)."""
    from hydra.errors import HydraException

    try:
        parsed = parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(f"could not parse overrides {list(overrides)}: {exc}") from exc
    choices = []
    for o in parsed:
        if o.is_sweep_override():
            if not multirun:
                raise ConfigError(f"override {o.input_line!r} is a sweep: add -m (multirun) to sweep it")
            choices.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([o.input_line])
    return [list(c) for c in itertools.product(*choices)] if choices else [[]]


def _config_groups(cdir: Path) -> frozenset[str]:
    return frozenset(p.name for p in cdir.iterdir() if p.is_dir())


def _is_group_override(override: str, groups: frozenset[str]) -> bool:
    """``model=gpt2``, ``+experiment=x``, ``benchmark=[a,b]``: they choose config files (the defaults list); every
    other override (``metric.crows_pairs.diff_threshold=0.1``) sets a value in the composed config."""
    key = override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]
    return "." not in key and key in groups


# Composed (unresolved) configs by (conf dir, group overrides): a sweep over values composes its defaults once.
_COMPOSED: dict[tuple[str, str, tuple[str, ...]], Any] = {}


def _composed(cdir: Path, group_overrides: tuple[str, ...]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    files = sorted((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in cdir.rglob("*.yaml"))
    key = (str(cdir), stable_hash(files, 16), group_overrides)  # an edited config file is composed again
    if key not in _COMPOSED:
        with initialize_config_dir(config_dir=str(cdir), version_base="1.3"):
            _COMPOSED[key] = hydra_compose("config", overrides=list(group_overrides))
    return _COMPOSED[key]


def _swappable_model(cdir: Path, group_overrides: Sequence[str]) -> Path | None:
    """The file of a ``model=<name>`` choice that composing once and swapping the ``model`` node reproduces exactly:
    no other group may set model values (an experiment's body may; benchmark, metric, tracking, generator cannot) and the model
    file is plain (no defaults list, no package directive)."""
    # groups whose configs are packaged under their own key and so cannot set model values
    own_package = ("benchmark=", "metric=", "tracking=", "generator=", "+generator=")
    chosen = [o for o in group_overrides if not o.startswith(own_package)]
    if len(chosen) != 1 or not chosen[0].startswith("model="):
        return None
    path = cdir / "model" / f"{chosen[0].split('=', 1)[1]}.yaml"
    if not path.is_file():
        return None  # Hydra says what is wrong
    text = path.read_text()
    if "@package" in text or re.search(r"^defaults\s*:", text, re.M):
        return None
    return path


def compose(overrides: Sequence[str]) -> dict[str, Any]:
    """The resolved config of one job, as plain containers.

    The same as Hydra's compose with all ``overrides``, computed in two steps so sweeps plan fast: the defaults list
    (config groups) is composed once per distinct choice of groups, and value overrides are applied to a copy with
    Hydra's own override code, in the order given, after composition (as Hydra does)."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    cdir = conf_dir()
    if not (cdir / "config.yaml").exists():
        raise ConfigError(f"no config.yaml in {cdir} (run from the project root or set BIASFLOW_CONF)")
    typed = list(overrides)  # what the user wrote (errors quote only these)
    overrides = with_every_benchmark(overrides, sorted(p.stem for p in (cdir / "benchmark").glob("*.yaml")))
    groups = _config_groups(cdir)
    group_overrides = tuple(o for o in overrides if _is_group_override(o, groups))
    values = [o for o in overrides if not _is_group_override(o, groups)]
    model_file = _swappable_model(cdir, group_overrides)
    if model_file is not None:  # a model sweep: one composition, the model node swapped per job
        group_overrides = tuple(o for o in group_overrides if not o.startswith("model="))
    base = None  # for the error message: the composed groups, once known
    try:
        base = _resolved_base(cdir, group_overrides, model_file)
        values = _adding_known_options(values, base["config"])
        fast = None
        if base["resolved"] is not None:
            fast = _apply_values_fast(base, values) if values else copy.deepcopy(base["resolved"])
        if fast is not None:
            return fast
        cfg = copy.deepcopy(base["config"])
        ConfigLoaderImpl._apply_overrides_to_config(parse_overrides(values), cfg)
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, yaml.YAMLError):
            raise ConfigError(yaml_error_text(cause)) from None
        raise ConfigError(_override_error(exc, typed, base)) from exc
    except yaml.YAMLError as exc:  # a config file that is not YAML (the model file swapped in, say)
        raise ConfigError(yaml_error_text(exc)) from None


def _section_options(parent: str) -> set[str]:
    """The options the schema declares for a config section (``model``, ``generator``, ``benchmark.<name>``,
    ``metric.<name>``), whether or not its YAML file lists them."""
    from biasflow.schema import BenchmarkConfig, GeneratorConfig, ModelConfig

    parts = parent.split(".")
    if parts == ["model"]:
        return set(ModelConfig.model_fields)
    if parts == ["generator"]:
        return set(GeneratorConfig.model_fields)
    if len(parts) == 2 and parts[0] == "benchmark":
        return set(BenchmarkConfig.model_fields)
    if len(parts) == 2 and parts[0] == "metric":
        from biasflow.registry import metric_options

        options = metric_options(parts[1])
        return set(options.model_fields) if options is not None else set()
    return set()


def _adding_known_options(values: Sequence[str], config) -> list[str]:
    """``model.path=DIR`` on a config whose file does not list ``path``: an option the schema declares is added (as
    ``+model.path=DIR``), so the user never needs Hydra's ``+`` for a documented option."""
    from omegaconf import DictConfig, OmegaConf

    out = []
    for o in values:
        key = o.split("=", 1)[0]
        if "=" in o and not key.startswith(("+", "~")) and "." in key:
            parent, _, name = key.rpartition(".")
            node = OmegaConf.select(config, parent)
            if isinstance(node, DictConfig) and name not in node and name in _section_options(parent):
                o = "+" + o
        out.append(o)
    return out


def _override_error(exc: Exception, typed: Sequence[str], base: Mapping[str, Any] | None) -> str:
    """A failed override, in the user's words: an unknown key gets the closest known one (never Hydra's advice to
    add it with ``+``, which would only move the failure to validation); other errors quote the overrides typed."""
    from omegaconf import OmegaConf

    from biasflow.errors import did_you_mean

    m = re.search(r"Could not override '([^']+)'", str(exc))
    if m and base is not None:
        path = m.group(1)
        parent, _, key = path.rpartition(".")
        node = OmegaConf.select(base["config"], parent) if parent else base["config"]
        known = sorted({str(k) for k in node.keys()} | _section_options(parent)) if node is not None and hasattr(
            node, "keys") else []
        if parent == "model" and node is not None:  # the options of this model's kind, not of every kind
            from biasflow import model_kinds

            spec = model_kinds.KINDS.get(str(node.get("kind")))
            if spec is not None and spec.options is not None:
                known = sorted({str(k) for k in node.keys()} | set(spec.options) | set(model_kinds.COMMON_OPTIONS))
        given = next((o for o in typed if o.lstrip("+~").split("=", 1)[0] == path), path)
        if known:
            return (f"{given}: {parent or 'the configuration'} has no option {key!r}{did_you_mean(key, known)}; its "
                    f"options: {', '.join(known)}")
        return f"{given}: {parent or 'the configuration'} is not a section of this run's configuration"
    return f"invalid configuration {list(typed)}: {exc}"


_RESOLVED: dict[tuple, dict[str, Any]] = {}
_ENV_NAMES: dict[int, list[str]] = {}  # composed config (by id; kept alive by _COMPOSED) -> variables it reads


def _resolved_base(cdir: Path, group_overrides: tuple[str, ...], model_file: Path | None) -> dict[str, Any]:
    """The composed config (model node swapped in) and its resolved form, with the keys interpolations read."""
    import copy

    from omegaconf import open_dict

    composed = _composed(cdir, group_overrides)
    # ${oc.env:VAR} resolves to the environment of the moment: a changed variable is resolved again
    if id(composed) not in _ENV_NAMES:
        _ENV_NAMES[id(composed)] = sorted(set(re.findall(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)",
                                                         OmegaConf.to_yaml(composed))))
    env_names = _ENV_NAMES[id(composed)]
    key = (id(composed), str(model_file), model_file.stat().st_mtime_ns if model_file else 0,
           stable_hash([os.environ.get(n) for n in env_names], 16))
    if key not in _RESOLVED:
        cfg = copy.deepcopy(composed)
        with open_dict(cfg):
            if model_file is not None:
                cfg.model = OmegaConf.load(model_file)
            _fill_option_defaults(cfg)
        from omegaconf.errors import OmegaConfBaseException

        try:
            resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException:  # e.g. a mandatory value (???) the value overrides will set
            resolved = None
        _RESOLVED[key] = {"config": cfg, "resolved": resolved,
                          "referenced": _interpolated_keys(OmegaConf.to_container(cfg, resolve=False))}
    return _RESOLVED[key]


def _fill_option_defaults(cfg) -> None:
    """Every option that has a default (its options model's, ``schema.option_defaults``) into the composed config,
    before value overrides apply: YAML files hold only what differs from the defaults, and
    ``metric.<name>.<option>=value`` works for every option. Values already there are kept."""
    from biasflow.registry import metric_options
    from biasflow.schema import RUN_SECTIONS, option_defaults

    def fill(node, defaults: dict[str, Any]) -> None:
        for k, v in defaults.items():
            if k not in node:
                node[k] = v
            elif isinstance(v, dict) and v and OmegaConf.is_dict(node[k]):
                fill(node[k], v)  # a nested options model (generation, lexicon): its missing keys

    for name in list(cfg.get("metric") or {}):
        options = metric_options(str(name))
        if options is not None and OmegaConf.is_dict(cfg.metric[name]):
            fill(cfg.metric[name], option_defaults(options))
    for section, model in RUN_SECTIONS.items():
        if section not in cfg or cfg[section] is None:
            cfg[section] = {}
        fill(cfg[section], option_defaults(model))


def _interpolated_keys(raw: Any) -> set[str] | None:
    """Dotted keys that interpolations read (``${paths.results}``, ``${oc.select:generator,null}``); None when some
    interpolation cannot be analysed (then every value override takes Hydra's own path)."""
    found: set[str] = set()
    stack = [raw]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack += list(node.values())
        elif isinstance(node, list):
            stack += node
        elif isinstance(node, str) and "${" in node:
            for inner in re.findall(r"\$\{([^}]*)\}", node):
                if inner.startswith("oc.env:"):
                    continue
                if inner.startswith("oc.select:"):
                    inner = inner[len("oc.select:"):].split(",", 1)[0]
                if not re.fullmatch(r"[A-Za-z_][\w.]*", inner):
                    return None
                found.add(inner)
    return found


def _apply_values_fast(base: dict[str, Any], values: Sequence[str]) -> dict[str, Any] | None:
    """Value overrides set on the resolved config directly, when that gives what Hydra gives: plain changes of
    existing scalar or list values that no interpolation reads, with values that hold no interpolation. None when
    any override needs Hydra's own path (adds, deletes, dict merges, interpolations)."""
    import copy

    referenced = base["referenced"]
    if referenced is None:
        return None
    out = None
    for o in parse_overrides(list(values)):
        key, value = o.key_or_group, o.value()
        if o.package is not None or o.is_delete() or o.is_add() or o.is_force_add():
            return None
        if any(r == key or r.startswith(key + ".") or key.startswith(r + ".") for r in referenced):
            return None
        if isinstance(value, dict) or "${" in json.dumps(value, default=str):
            return None
        if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
            return None
        parts = key.split(".")
        node = (out or base["resolved"])
        for p in parts[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict) or parts[-1] not in node or isinstance(node[parts[-1]], dict):
            return None  # missing keys and dict values: Hydra's path gives its own error or merge
        if out is None:
            out = copy.deepcopy(base["resolved"])
            node = out
            for p in parts[:-1]:
                node = node[p]
        node[parts[-1]] = value
    return out


def with_every_benchmark(overrides: Sequence[str], names: Sequence[str]) -> list[str]:
    """Every dataset description is always composed, so ``benchmark.<name>.*`` can be overridden for any metric and
    jobs that need another dataset (the demo model trains on BOLD) find it. A user's ``benchmark=[a,b]`` list (or an
    experiment's) only adds to that set: it can never drop a description another job needs."""
    out, given = [], False
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and key.lstrip("+") == "benchmark":
            given = True
            wanted = [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]
            unknown = [w for w in wanted if w not in names]
            if unknown:
                raise ConfigError(f"benchmark={value}: no dataset config {unknown} in conf/benchmark/ "
                                  f"(known: {', '.join(names)})")
            o = f"{key}=[{','.join(dict.fromkeys([*wanted, *names]))}]"
        out.append(o)
    return out if given else [f"benchmark=[{','.join(names)}]", *out]


def load_model_config(name: str, root_cfg: dict[str, Any]) -> dict[str, Any]:
    """A metric's ``default_model`` config, resolved against the job's root config (paths, run settings)."""
    import copy

    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"model config {name!r} not found ({path})")
    # the large groups cannot be referenced by a model config; leaving them out makes this cheap
    root = {k: v for k, v in root_cfg.items() if k not in ("model", "metric", "benchmark", "generator")}
    key = (str(path), path.stat().st_mtime_ns, stable_hash(root, 16))
    if key not in _DEFAULT_MODELS:
        merged = OmegaConf.merge(OmegaConf.create(root), {"model": OmegaConf.load(path)})
        _DEFAULT_MODELS[key] = OmegaConf.to_container(merged, resolve=True)["model"]
    return copy.deepcopy(_DEFAULT_MODELS[key])


_DEFAULT_MODELS: dict[tuple, dict[str, Any]] = {}


def model_key(model_cfg: dict[str, Any]) -> str:
    return f"{model_cfg['name']}-{config_fingerprint(model_cfg)[:8]}"


@dataclass
class Job:
    metric: str
    model: dict[str, Any]
    metric_cfg: dict[str, Any]
    benchmark: str | None
    benchmark_cfg: dict[str, Any] | None
    stats: dict[str, Any]
    mode: str
    results: str
    sweep_overrides: list[list[str]] = field(default_factory=list)  # every sweep job that asked for this job
    user_files: dict[str, dict[str, str]] = field(default_factory=dict)  # option -> {path, digest}: see user_files()
    score_keys: tuple[str, ...] = ()  # the metric options that change model outputs (MetricSpec.score_keys)
    # files the metric stage writes beside its tables (MetricSpec.extra_outputs): Snakemake outputs, in no hash
    extra_outputs: tuple[str, ...] = ()
    # option -> the user's path of a file the metric exports (MetricSpec.export_options): each its own rule
    exports: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        # one key order whichever way the job was made (composed, or read from a saved plan): Snakemake compares
        # rule params by their text, and a reordered dict would re-run the stage
        for name in ("model", "metric_cfg", "benchmark_cfg", "stats", "user_files"):
            setattr(self, name, canonical(getattr(self, name)))

    @property
    def model_key(self) -> str:
        return model_key(self.model)

    @property
    def bench_hash(self) -> str:
        return stable_hash(self.benchmark_cfg, 8)

    def score_hash(self, score_keys: Sequence[str] | None = None) -> str:
        score_keys = self.score_keys if score_keys is None else score_keys
        key = {"model": config_fingerprint(self.model), "benchmark": self.benchmark_cfg,
               "mode": self.mode, "score": {k: self.metric_cfg.get(k) for k in score_keys}}
        if self.user_files:  # the content of every user file that feeds the job, not only its path
            key["files"] = {k: v["digest"] for k, v in self.user_files.items()}
        return stable_hash(key, 12)

    @property
    def cfg_hash(self) -> str:
        key = {"model": config_fingerprint(self.model), "model_name": self.model["name"],
               "benchmark": self.benchmark_cfg, "metric": self.metric_cfg, "stats": self.stats, "mode": self.mode}
        if self.user_files:
            key["files"] = {k: v["digest"] for k, v in self.user_files.items()}
        return stable_hash(key, 12)

    @property
    def items_path(self) -> str | None:
        return f"{self.results}/items/{self.benchmark}-{self.bench_hash}.parquet" if self.benchmark else None

    def scores_path(self, score_keys: Sequence[str] | None = None) -> str:
        return f"{self.results}/scores/{self.model_key}/{self.metric}-{self.score_hash(score_keys)}.parquet"

    @property
    def metric_dir(self) -> str:
        return f"{self.results}/metrics/{self.model_key}/{self.metric}/{self.cfg_hash}"

    def score_params(self, score_keys: Sequence[str] | None = None) -> dict[str, Any]:
        """Params of the score stage: only what can change model outputs, so a threshold sweep shares it."""
        score_keys = self.score_keys if score_keys is None else score_keys
        p = self.params()
        p["metric_cfg"] = {k: self.metric_cfg.get(k) for k in score_keys if k in self.metric_cfg}
        p.pop("stats")
        p.pop("cfg_hash")
        p["score_hash"] = self.score_hash(score_keys)
        return p

    def params(self) -> dict[str, Any]:
        """What the stage scripts get: everything that determines the job's numbers, nothing else."""
        return {"metric": self.metric, "model": self.model, "metric_cfg": self.metric_cfg,
                "benchmark": self.benchmark, "benchmark_cfg": self.benchmark_cfg, "stats": self.stats,
                "mode": self.mode, "model_key": self.model_key, "cfg_hash": self.cfg_hash,
                "user_files": self.user_files}


PLAN_FORMAT = "biasflow-plan/1"


def canonical(obj: Any) -> Any:
    """``obj`` with every dict's keys sorted (recursively); lists keep their order."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [canonical(v) for v in obj]
    return obj


@dataclass
class Plan:
    jobs: list[Job]
    sweep: list[dict[str, Any]]  # per sweep job: overrides + resolved config
    tracking: dict[str, Any]
    paths: dict[str, Any]
    skipped: list[str]
    benchmarks: dict[str, Any] = field(default_factory=dict)  # every dataset description (for downloads)

    @property
    def plan_hash(self) -> str:
        return stable_hash({"jobs": sorted(j.metric_dir for j in self.jobs), "tracking": self.tracking}, 12)

    @property
    def run_dir(self) -> str:
        return f"{self.paths['results']}/runs/{self.plan_hash}"

    @property
    def path(self) -> str:
        return f"{self.run_dir}/plan.json"

    def to_json(self) -> str:
        doc = {"format": PLAN_FORMAT, "plan_hash": self.plan_hash, "tracking": self.tracking, "paths": self.paths,
               "sweep": self.sweep, "skipped": self.skipped, "benchmarks": self.benchmarks,
               "jobs": [dict(j.params(), metric_dir=j.metric_dir, items_path=j.items_path,
                             scores_path=j.scores_path(), score_keys=list(j.score_keys),
                             results=j.results, sweep_overrides=j.sweep_overrides,
                             extra_outputs=list(j.extra_outputs), exports=j.exports) for j in self.jobs]}
        return json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n"

    def write(self, path: str | None = None) -> str:
        """Write the plan (read by every stage and by Snakemake re-parses) only if it changed; return its path."""
        path = path or self.path
        write_text_if_changed(self.to_json(), path)
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Plan":
        """The plan saved by ``write``: no Hydra, no composition (a cluster job parses the workflow in well under a
        second). Every job's paths are recomputed and must equal the saved ones, or the file is not this code's."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read the plan {path}: {exc}") from exc
        if doc.get("format") != PLAN_FORMAT:
            raise ConfigError(f"{path} is not a plan of this biasflow version (format {doc.get('format')!r}); "
                              f"plan again with biasflow run / biasflow plan")
        jobs = []
        for j in doc["jobs"]:
            job = Job(metric=j["metric"], model=j["model"], metric_cfg=j["metric_cfg"], benchmark=j["benchmark"],
                      benchmark_cfg=j["benchmark_cfg"], stats=j["stats"], mode=j["mode"], results=j["results"],
                      sweep_overrides=j["sweep_overrides"], user_files=j.get("user_files") or {},
                      score_keys=tuple(j["score_keys"]), extra_outputs=tuple(j.get("extra_outputs") or ()),
                      exports=dict(j.get("exports") or {}))
            if job.metric_dir != j["metric_dir"] or job.scores_path() != j["scores_path"]:
                raise ConfigError(f"{path}: job {j['metric_dir']} does not match this biasflow version; plan again")
            jobs.append(job)
        plan = cls(jobs=jobs, sweep=doc["sweep"], tracking=doc["tracking"], paths=doc["paths"],
                   skipped=doc["skipped"], benchmarks=canonical(doc.get("benchmarks") or {}))
        if plan.plan_hash != doc["plan_hash"]:
            raise ConfigError(f"{path}: plan hash mismatch; plan again")
        return plan


# Options naming files or folders the user provides: their content is part of the job's identity (a file replaced
# in place gives new results, never the old file's), and files are rule inputs. Paths are relative to the cwd.
USER_FILE_OPTIONS = {
    "metric": ("predictions_file", "responses_file", "stop_words", "groups", "targets", "lexicon.path",
               "generator.path", "generator.model", "classifier.model"),
    "benchmark": ("lists_dir", "templates_file", "attributes_file", "attribute_files"),
    "model": ("path",),
}


def _lookup(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(cfg, dict):
            return None
        cfg = cfg.get(part)
    return cfg


def content_digest(path: Path) -> str:
    """sha256 of a file; for a folder (a model checkpoint) the cheap digest of models.hf.local_weights_digest."""
    from biasflow.io import sha256_file
    from biasflow.models.fingerprint import local_weights_digest

    return local_weights_digest(path) if path.is_dir() else sha256_file(path)[:16]


def user_files(job: "Job", digests: dict[str, str]) -> dict[str, dict[str, str]]:
    """Every user-provided file or folder feeding ``job``: option -> {path, digest}.

    Values of these options may also be names of packaged resources (``targets: adjectives``) or hub ids
    (``generator.model: gpt2``); only values that look like paths are checked, and a path-looking value that does not
    exist is an error naming the option. Models the workflow builds itself are outputs, not user files."""
    sections = {"metric": (f"metric.{job.metric}", job.metric_cfg),
                "benchmark": (f"benchmark.{job.benchmark}", job.benchmark_cfg or {}),
                "model": ("model", {} if job.model.get("build") else job.model)}
    found: dict[str, dict[str, str]] = {}
    for section, keys in USER_FILE_OPTIONS.items():
        prefix, cfg = sections[section]
        for key in keys:
            value = _lookup(cfg, key)
            if is_ordered_list(value):  # [{group: file}, ...] (biasflow.ordered)
                value = dict(ordered_items(value, f"{prefix}.{key}"))
            values = value.items() if isinstance(value, dict) else [("", value)]
            for sub, v in values:
                if not isinstance(v, str) or not v:
                    continue
                option = f"{prefix}.{key}" + (f".{sub}" if sub else "")
                path = Path(v).expanduser()
                looks_like_path = path.is_absolute() or v.startswith(".") or path.suffix != "" or os.sep in v
                if not path.exists():
                    is_hub_id = key in ("generator.model", "classifier.model") and not path.is_absolute() \
                        and not v.startswith(".")
                    if looks_like_path and not is_hub_id and section != "model":
                        raise ConfigError(f"{option}={v!r}: no such file or folder")
                    if section == "model" and job.model.get("path") and not job.model.get("hub_id"):
                        raise ConfigError(f"{option}={v!r}: no such model folder")
                    continue
                real = str(path.resolve())
                if real not in digests:
                    digests[real] = content_digest(path)
                found[option] = {"path": real, "digest": digests[real]}
    return found


def reject_secret_overrides(overrides: Sequence[str]) -> None:
    """Secrets never come from the command line: it lands in the plan, shell history, process lists and logs."""
    for o in overrides:
        key, _, value = o.partition("=")
        if uri_has_secret(value) or redact_text(value) != value:
            hint = ("set MLFLOW_TRACKING_URI in the environment and use tracking=server"
                    if key.lstrip("+~").startswith("tracking") else
                    "put the key in an environment variable and set generator.api_key_env=<VARIABLE NAME>, or in "
                    "a file and set generator.api_key_file=<path>")
            raise ConfigError(f"{key.lstrip('+~')} is not accepted: the value holds a password or key, and the "
                              f"command line is written to the plan and logs; {hint}")


def without_secrets(cfg: dict[str, Any]) -> dict[str, Any]:
    """The composed config with the tracking URI's credentials removed (the stages reconnect with the environment's
    URI, see biasflow.secrets.tracking_uri; user names stay out too, so a team's runs of one plan share its hash);
    any other secret-bearing URI is an error naming the option."""
    tracking = dict(cfg.get("tracking") or {})
    if tracking.get("uri"):
        tracking["uri"] = public_uri(tracking["uri"])
    cfg = dict(cfg, tracking=tracking)

    env = environ_snapshot()
    # values of secret-named variables (API keys, tokens), e.g. resolved into the config by ${oc.env:OPENAI_API_KEY}
    secrets = {v: k for k, v in sorted(env.items()) if v in secret_env_values(env)}

    def walk(obj: Any, where: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{where}.{i}")
        elif isinstance(obj, str):
            if where != "tracking.uri" and uri_has_secret(obj):
                raise ConfigError(f"{where}={redact_uri(obj)!r} holds a password: give credentials through the "
                                  f"environment instead")
            leaked = [name for value, name in secrets.items() if value in obj]
            if leaked:
                raise ConfigError(f"{where} holds the value of the secret environment variable {leaked[0]} (e.g. "
                                  f"through ${{oc.env:{leaked[0]}}}); it would be written to the plan, logs and MLflow. "
                                  f"Options that need a key name its variable instead (api_key_env={leaked[0]})")

    walk(cfg, "")
    return cfg


def display_name(model: dict[str, Any]) -> str | None:
    """The name a model without ``model.name`` goes by: its local folder's name, else the last part of its hub id or
    the server's name for it, made folder-safe; None when there is nothing to name it after."""
    source = model.get("path") or model.get("hub_id") or model.get("served_model_name")
    if not isinstance(source, str) or not source.strip("/"):
        return None
    base = source.rstrip("/").replace("\\", "/").split("/")[-1]
    slug = re.sub(r"[^A-Za-z0-9._+-]+", "_", base).strip("._-+")[:120]
    return slug or None


def with_display_names(models: list[dict[str, Any]]) -> None:
    """Give every model of a plan without ``model.name`` its ``display_name`` (in place), unique within the plan:
    two different models that would share one (two checkpoints in folders of one name) get a short suffix, the
    first hex of their fingerprints; the report's provenance lists each one's source."""
    derived = [(m, display_name(m)) for m in models if not m.get("name")]
    for model, name in derived:
        if name is None:
            raise ConfigError("model.name is not set and the model has no path, hub id or served name to be named "
                              "after: set model.name=<name>")
    fingerprints: dict[str, set[str]] = {}
    for model, name in derived:
        fingerprints.setdefault(name, set()).add(config_fingerprint(model))
    for model, name in derived:
        model["name"] = name if len(fingerprints[name]) == 1 else f"{name}-{config_fingerprint(model)[:4]}"


def with_option_dumps(cfg: dict[str, Any]) -> dict[str, Any]:
    """The composed config validated (``schema.validate_job_config``: every problem at once) and, where a section has
    an options model (every metric, ``stats``, ``run``), replaced by the validated options with every default
    filled in: the plan holds the options the stages read, nothing else decides them."""
    from biasflow.registry import metric_options
    from biasflow.schema import RUN_SECTIONS, filled_options

    validate_job_config(cfg, metric_options)
    out = dict(cfg)
    out["metric"] = {name: filled_options(metric_options(name), mcfg) if isinstance(mcfg, dict) else mcfg
                     for name, mcfg in (cfg.get("metric") or {}).items()}
    for section, model in RUN_SECTIONS.items():
        out[section] = model.model_validate(cfg.get(section) or {}).model_dump()
    return out


def with_ordered_options(cfg: dict[str, Any]) -> dict[str, Any]:
    """Options whose mapping order changes the numbers (``LOADER_ORDERED_OPTIONS``, ``MetricSpec.ordered_options``)
    as ordered lists of one-key mappings: the plan, its hashes and Snakemake's params sort dict keys."""
    from biasflow.ordered import as_ordered_list
    from biasflow.registry import LOADER_ORDERED_OPTIONS, METRICS, load_all

    load_all()
    sections = [("benchmark", name, LOADER_ORDERED_OPTIONS.get(str((sub or {}).get("loader")), ()))
                for name, sub in (cfg.get("benchmark") or {}).items()]
    sections += [("metric", name, getattr(METRICS.get(name), "ordered_options", ()))
                 for name in (cfg.get("metric") or {})]
    out = dict(cfg)
    for section, name, options in sections:
        sub = (out.get(section) or {}).get(name)
        if not options or not isinstance(sub, dict) or not any(isinstance(sub.get(o), dict) for o in options):
            continue
        out[section] = dict(out[section])
        out[section][name] = {k: as_ordered_list(v) if k in options else v for k, v in sub.items()}
    return out


def check_exports(jobs: Sequence[Job], paths: dict[str, Any], benchmarks: dict[str, Any]) -> None:
    """An exported file is its own rule's output, written where the user said: refused where it would overwrite
    something (a file another job of the plan exports, a file the plan reads: a dataset source, a predictions file,
    a model) or land among the pipeline's own files (results, resources, the cache), or where a folder is."""
    from urllib.parse import unquote, urlparse

    norm = lambda p: os.path.normpath(os.path.abspath(str(p)))  # noqa: E731
    read = {norm(f["path"]): f"the input {option}" for j in jobs for option, f in j.user_files.items()}
    for bname, bcfg in benchmarks.items():
        for key, spec in (bcfg.get("files") or {}).items():
            for src in spec.get("sources") or []:
                url = str(src.get("url", ""))
                if url.startswith("file://"):
                    read[norm(unquote(urlparse(url).path))] = f"the source of benchmark.{bname}.files.{key}"
    managed = {norm(paths[k]): f"paths.{k}" for k in ("results", "resources", "cache") if paths.get(k)}
    seen: dict[str, Job] = {}
    for job in jobs:
        for option, path in job.exports.items():
            where, target = f"metric.{job.metric}.{option}={path}", norm(path)
            first = seen.setdefault(target, job)
            if first is not job:
                raise ConfigError(f"{where}: two jobs of this plan would write that file ({first.metric_dir} and "
                                  f"{job.metric_dir}); give each sweep value its own path, e.g. one per model")
            if target in read:
                raise ConfigError(f"{where}: that file is {read[target]} of this plan; exporting there would "
                                  f"overwrite it. Choose another path")
            inside = [name for folder, name in managed.items()
                      if target == folder or target.startswith(folder + os.sep)]
            if inside:
                raise ConfigError(f"{where}: that is inside {inside[0]} ({paths[inside[0].split('.')[1]]}), where "
                                  f"the pipeline keeps its own files; export to a path outside it (e.g. exports/)")
            if os.path.isdir(target):
                raise ConfigError(f"{where}: that is a folder; give the file's path (e.g. {path}/predictions.json)")


def check_generator_settings(gen_cfg: Mapping[str, Any] | None, metric: str, spec, metric_cfg: Mapping[str, Any]):
    """Generator keys that would be ignored are refused: keys its kind never reads, and sampling settings a metric
    with its own generation settings overrides (the defaults: conf/generator/<kind>.yaml)."""
    from biasflow.generation.config import check_generator_keys, check_metric_overrides

    if not gen_cfg:
        return
    check_generator_keys(gen_cfg)
    fields = getattr(spec.options, "model_fields", {}) if spec.options else {}
    settings = fields.get("generation")
    if settings is None or not getattr(settings.annotation, "overrides_generator", False):
        return
    import yaml

    path = conf_dir() / "generator" / f"{gen_cfg.get('kind')}.yaml"
    defaults = yaml.safe_load(path.read_text()) if path.exists() else {}
    check_metric_overrides(gen_cfg, defaults or {}, metric, metric_cfg.get("generation") or {})


def build_plan(overrides: Sequence[str] = (), multirun: bool = False) -> Plan:
    from biasflow.registry import check_loader_options, get_metric

    sweep = []
    jobs: dict[str, Job] = {}
    skipped: list[str] = []
    tracking = paths = None
    benchmarks: dict[str, Any] = {}
    digests: dict[str, str] = {}  # path -> content digest, once per plan
    composed = []
    for job_overrides in expand_sweep(overrides, multirun):
        reject_secret_overrides(job_overrides)
        composed.append((job_overrides, compose(job_overrides)))
    with_display_names([cfg["model"] for _, cfg in composed])
    for job_overrides, cfg in composed:
        cfg = with_option_dumps(cfg)
        cfg = with_ordered_options(without_secrets(cfg))
        sweep.append({"overrides": job_overrides, "config": cfg})
        tracking = tracking or cfg.get("tracking", {})
        paths = paths or cfg["paths"]
        for bname, bcfg in (cfg.get("benchmark") or {}).items():
            if bname not in benchmarks:  # what the loader can check without data: before any download
                check_loader_options(str((bcfg or {}).get("loader") or bname), bcfg or {})
            benchmarks.setdefault(bname, bcfg)
        metrics = cfg.get("metric") or {}
        if not metrics:
            raise ConfigError("no metric selected: set metric=[crows_pairs,...]")
        for name, mcfg in metrics.items():
            try:
                spec = get_metric(name)
            except KeyError as exc:
                raise ConfigError(f"metric.{name}: {exc.args[0]}") from exc
            model = cfg["model"]
            check_generator_settings(cfg.get("generator"), name, spec, mcfg)
            generated_by = generation_job_model(cfg, name, mcfg)  # text from +generator: filed under its model
            reason = (spec.model_check(model) if generated_by is None and spec.model_check
                      and accepts_kind(spec.model_kinds, model.get("kind")) else None)
            if reason:
                msg = f"metric {name} skipped for model {model.get('name')}: {reason}"
                log.warning(msg)
                skipped.append(msg)
                continue
            if generated_by is not None:
                model = generated_by
            elif not accepts_kind(spec.model_kinds, model.get("kind")):  # listed, or declared like a listed kind
                fallback = mcfg.get("default_model")
                if not fallback:
                    msg = (f"metric {name} skipped for model {model.get('name')}: it needs a model of kind "
                           f"{list(spec.model_kinds)}, got {model.get('kind')!r}")
                    log.warning(msg)
                    skipped.append(msg)
                    continue
                model = load_model_config(fallback, cfg)
                validate_model_config(model, f"metric.{name}.default_model={fallback}: model")
            model = with_generation_options(model, mcfg)  # hf_generate's chat template / generate kwargs
            bench = mcfg.get("benchmark", spec.benchmark)
            bcfg = None
            if bench:
                if bench not in (cfg.get("benchmark") or {}):
                    raise ConfigError(f"metric.{name}.benchmark={bench!r} has no config conf/benchmark/{bench}.yaml")
                bcfg = cfg["benchmark"][bench]
            job = Job(metric=name, model=model, metric_cfg=mcfg, benchmark=bench, benchmark_cfg=bcfg,
                      stats=cfg["stats"], mode=cfg["run"]["mode"],  # filled in (with_option_dumps)
                      results=cfg["paths"]["results"], score_keys=tuple(spec.score_keys),
                      extra_outputs=tuple(spec.extra_outputs),
                      exports={o: str(mcfg[o]) for o in spec.export_options if mcfg.get(o)})
            job.user_files = canonical(user_files(job, digests))
            job = jobs.setdefault(job.metric_dir, job)
            job.sweep_overrides.append(job_overrides)
    if not jobs:
        raise ConfigError("the configuration selects no runnable job: " + "; ".join(skipped))
    check_exports(list(jobs.values()), paths or {}, benchmarks)
    return Plan(jobs=list(jobs.values()), sweep=sweep, tracking=tracking or {}, paths=paths or {}, skipped=skipped,
                benchmarks=canonical(benchmarks))


__all__ = ["build_plan", "expand_sweep", "compose", "Plan", "Job", "write_json"]
