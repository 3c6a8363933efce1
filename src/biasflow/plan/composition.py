"""One job's configuration composed from ``conf/`` and its overrides: Hydra's composition, or the fast path that applies
value overrides to a cached composition of the config groups (equal to Hydra's parse: ``tests/test_plan.py``)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from omegaconf import OmegaConf

from biasflow.errors import ConfigError
from biasflow.io import stable_hash
from biasflow.plan.conf import conf_dir, yaml_error_text
from biasflow.plan.overrides import parse_overrides

log = logging.getLogger(__name__)


def _config_groups(cdir: Path) -> frozenset[str]:
    return frozenset(p.name for p in cdir.iterdir() if p.is_dir())


def _is_group_override(override: str, groups: frozenset[str]) -> bool:
    """``model=gpt2``, ``+experiment=x``, ``benchmark=[a,b]``: they choose config files (the defaults list); every
    other override (``metric.crows_pairs.diff_threshold=0.1``) sets a value in the composed config."""
    key = override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]
    return "." not in key and key in groups


# Composed (unresolved) configs by (conf dir, group overrides): a sweep over values composes its defaults once.
_COMPOSED: dict[tuple[str, str, tuple[str, ...]], Any] = {}


# While a plan is built (``conf_snapshot``): conf dir -> the state of its files, read once, not once per sweep job.
_CONF_STATE: dict[str, str] | None = None


@contextlib.contextmanager
def conf_snapshot():
    """Read the state of the config files once inside the block (one ``build_plan``); outside it every composition
    checks them, so a config file edited between two calls is composed again."""
    global _CONF_STATE
    outer, _CONF_STATE = _CONF_STATE, ({} if _CONF_STATE is None else _CONF_STATE)
    try:
        yield
    finally:
        _CONF_STATE = outer


def _conf_state(cdir: Path) -> str:
    if _CONF_STATE is not None and str(cdir) in _CONF_STATE:
        return _CONF_STATE[str(cdir)]
    files = sorted((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in cdir.rglob("*.yaml"))
    state = stable_hash(files, 16)
    if _CONF_STATE is not None:
        _CONF_STATE[str(cdir)] = state
    return state


def _composed(cdir: Path, group_overrides: tuple[str, ...]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    key = (str(cdir), _conf_state(cdir), group_overrides)  # an edited config file is composed again
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


def hydra_internals_changed() -> bool:
    """Whether Hydra's ``ConfigLoaderImpl._apply_overrides_to_config`` (private: Hydra has no public call that applies
    parsed overrides to a composed config) is not the code ``compose`` was written for (``biasflow.upstream``)."""
    if "changed" not in _HYDRA:
        from biasflow.upstream import changed

        _HYDRA["changed"] = bool(changed("hydra"))
    return _HYDRA["changed"]


_HYDRA: dict[str, bool] = {}


def compose(overrides: Sequence[str]) -> dict[str, Any]:
    """The resolved config of one job, as plain containers (the caller's own)."""
    import copy

    return copy.deepcopy(compose_shared(overrides))


def compose_shared(overrides: Sequence[str]) -> dict[str, Any]:
    """``compose``, for a caller that only reads the result (``build_plan``): on the fast path the sections no
    override touched are shared with the cached composition (and with other jobs' configs), not copied: a
    1,000-model sweep copied each job's whole config before, most of its benchmark descriptions. Never mutate it.

    The same as Hydra's compose with all ``overrides``, computed in two steps so sweeps plan fast: the defaults list
    (config groups) is composed once per distinct choice of groups, and value overrides are applied to a copy with
    Hydra's own override code, in the order given, after composition (as Hydra does). That code is private to Hydra
    (``hydra_internals_changed``); on a Hydra where it differs, Hydra's public compose does the whole job."""
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
        values = _adding_known_options(values, base)
        fast = None
        if base["resolved"] is not None:
            fast = _apply_values_fast(base, values) if values else dict(base["resolved"])
        if fast is not None:
            return fast
        if hydra_internals_changed():
            # the one private Hydra function this path uses differs from the code it was written for
            # (biasflow.upstream): Hydra composes everything itself, slower but the same config
            from omegaconf import open_dict

            chosen = tuple(o for o in overrides if _is_group_override(o, groups))
            typed_values = [o for o in overrides if not _is_group_override(o, groups)]
            added = _adding_known_options(typed_values, _composed(cdir, chosen))  # before the defaults are filled
            cfg = copy.deepcopy(_composed(cdir, chosen + tuple(added)))
            with open_dict(cfg):
                _fill_option_defaults(cfg)
            return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        cfg = copy.deepcopy(base_config(base))
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
    from biasflow.schema import GeneratorConfig, every_model_option

    parts = parent.split(".")
    if parts == ["model"]:
        return every_model_option()
    if parts == ["generator"]:
        return set(GeneratorConfig.model_fields)
    if len(parts) == 2 and parts[0] == "benchmark":  # its loader's model validates it: here any loader's option
        from biasflow.registry import every_loader_option

        return every_loader_option()
    if len(parts) == 2 and parts[0] == "metric":
        from biasflow.registry import metric_options

        options = metric_options(parts[1])
        return set(options.model_fields) if options is not None else set()
    return set()


def _adding_known_options(values: Sequence[str], config) -> list[str]:
    """``model.path=DIR`` on a config whose file does not list ``path``: an option the schema declares is added (as
    ``+model.path=DIR``), so the user never needs Hydra's ``+`` for a documented option. ``config``: a composed
    OmegaConf config, or a ``_resolved_base`` entry (read in its resolved form where there is one)."""
    from omegaconf import DictConfig, OmegaConf

    def section(parent: str):
        if isinstance(config, dict) and config.get("resolved") is not None:
            node = config["resolved"]
            for part in parent.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            return node if isinstance(node, dict) else None
        node = OmegaConf.select(base_config(config) if isinstance(config, dict) else config, parent)
        return node if isinstance(node, DictConfig) else None

    out = []
    for o in values:
        key = o.split("=", 1)[0]
        if "=" in o and not key.startswith(("+", "~")) and "." in key:
            parent, _, name = key.rpartition(".")
            node = section(parent)
            if node is not None and name not in node and name in _section_options(parent):
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
        config = base_config(base)
        node = OmegaConf.select(config, parent) if parent else config
        known = sorted({str(k) for k in node.keys()} | _section_options(parent)) if node is not None and hasattr(
            node, "keys") else []
        if parent == "model" and node is not None:  # the options of this model's kind, not of every kind
            from biasflow import model_kinds

            options = model_kinds.config_model(str(node.get("kind")))
            if options is not None:
                known = sorted({str(k) for k in node.keys()} | set(options.model_fields))
        given = next((o for o in typed if o.lstrip("+~").split("=", 1)[0] == path), path)
        if known:
            return (f"{given}: {parent or 'the configuration'} has no option {key!r}{did_you_mean(key, known)}; its "
                    f"options: {', '.join(known)}")
        return f"{given}: {parent or 'the configuration'} is not a section of this run's configuration"
    return f"invalid configuration {list(typed)}: {exc}"


_RESOLVED: dict[tuple, dict[str, Any]] = {}
_ENV_NAMES: dict[int, list[str]] = {}  # composed config (by id; kept alive by _COMPOSED) -> variables it reads


def base_config(base: dict[str, Any]):
    """The composed OmegaConf config of ``base`` (model node swapped in), built on first use: a model sweep whose
    jobs all take the fast path never needs it."""
    if base["config"] is None:
        base["config"] = base.pop("build_config")()
    return base["config"]


def _resolved_base(cdir: Path, group_overrides: tuple[str, ...], model_file: Path | None) -> dict[str, Any]:
    """The composed config (model node swapped in) and its resolved form, with the keys interpolations read."""
    import copy

    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    composed = _composed(cdir, group_overrides)
    # ${oc.env:VAR} resolves to the environment of the moment: a changed variable is resolved again
    if id(composed) not in _ENV_NAMES:
        _ENV_NAMES[id(composed)] = env_names_read(OmegaConf.to_yaml(composed))
    # the swapped-in model file's own ${oc.env:...} too: a changed variable gives another model config
    env_names = _ENV_NAMES[id(composed)] + (env_names_read(model_file.read_text()) if model_file else [])
    key = (id(composed), str(model_file), model_file.stat().st_mtime_ns if model_file else 0,
           stable_hash([os.environ.get(n) for n in env_names], 16))
    if key in _RESOLVED:
        return _RESOLVED[key]

    def build_config():
        cfg = copy.deepcopy(composed)
        with open_dict(cfg):
            if model_file is not None:
                cfg.model = OmegaConf.load(model_file)
            _fill_option_defaults(cfg)
        return cfg

    swapped = _with_model_swapped(_resolved_base(cdir, group_overrides, None), model_file) if model_file else None
    if swapped is not None:
        _RESOLVED[key] = {**swapped, "config": None, "build_config": build_config}
        return _RESOLVED[key]
    cfg = build_config()
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException:  # e.g. a mandatory value (???) the value overrides will set
        resolved = None
    _RESOLVED[key] = {"config": cfg, "resolved": resolved,
                      "referenced": _interpolated_keys(OmegaConf.to_container(cfg, resolve=False))}
    return _RESOLVED[key]


def env_names_read(text: str) -> list[str]:
    """The environment variables a config text reads (``${oc.env:NAME}`` / ``${oc.env:NAME,default}``)."""
    return sorted(set(re.findall(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)", text)))


def _with_model_swapped(plain: dict[str, Any], model_file: Path) -> dict[str, Any] | None:
    """``plain``'s resolved config with the ``model`` node of ``model_file``, resolved on its own against the root
    sections (as ``load_model_config``): what composing with the model swapped in gives when nothing outside the model
    reads a model value and the model reads only the root sections. A model sweep then resolves each model's few
    lines instead of deep-copying and resolving the whole config per model (most of a 1,000-model plan's time).
    None when that does not hold: the caller composes the whole config."""
    from omegaconf.errors import OmegaConfBaseException

    resolved, referenced = plain["resolved"], plain["referenced"]
    if resolved is None or referenced is None or any(r == "model" or r.startswith("model.") for r in referenced):
        return None
    raw = OmegaConf.to_container(OmegaConf.load(model_file), resolve=False)
    if not isinstance(raw, dict):
        return None
    model_reads = _interpolated_keys(raw)
    root_sections = {k for k in resolved if k not in ("model", "metric", "benchmark", "generator")}
    if model_reads is None or any(r.split(".", 1)[0] not in root_sections for r in model_reads):
        return None  # reads another section, or itself: the whole composition decides
    try:
        root = {k: resolved[k] for k in root_sections}
        model = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(root), {"model": raw}),
                                       resolve=True, throw_on_missing=True)["model"]
    except OmegaConfBaseException:
        return None
    return {"resolved": {**resolved, "model": model},
            "referenced": referenced | model_reads}


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
            out = dict(base["resolved"])
        node = out
        for p in parts[:-1]:  # copied along the key's path only; the rest is shared (compose_shared)
            node[p] = dict(node[p])
            node = node[p]
        node[parts[-1]] = copy.deepcopy(value)
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
