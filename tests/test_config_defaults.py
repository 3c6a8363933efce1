"""One source of truth for defaults: each option's default is its options model's (biasflow.schema and the metric
modules); the YAML files hold only what differs, composition fills the rest in, the plan holds the filled options, and
no metric falls back to a default of its own."""
from __future__ import annotations

import re

import pytest
import yaml

from biasflow.plan import build_plan
from biasflow.registry import METRICS, get_metric, load_all, metric_options
from biasflow.schema import RUN_SECTIONS, option_defaults
from conftest import ROOT

METRIC_YAMLS = sorted((ROOT / "conf" / "metric").glob("*.yaml"))


def _comparable(value):
    """Nested options as plain data without unset (None) fields, as a YAML file would write them."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def repeated_defaults(body: dict, defaults: dict, where: str) -> list[str]:
    out = []
    for key, value in body.items():
        if key not in defaults:
            continue
        if isinstance(value, dict) and isinstance(defaults[key], dict) and defaults[key]:
            out += repeated_defaults(value, defaults[key], f"{where}.{key}")
        elif _comparable(value) == _comparable(defaults[key]):
            out.append(f"{where}.{key}: {value!r}")
    return out


@pytest.mark.parametrize("path", METRIC_YAMLS, ids=lambda p: p.stem)
def test_a_metric_yaml_repeats_no_default(path):
    (name, body), = yaml.safe_load(path.read_text()).items()
    assert repeated_defaults(body, option_defaults(metric_options(name)), name) == [], \
        f"{path.name} repeats its options model's defaults: remove these lines"


def test_the_root_config_repeats_no_default():
    root = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    for section, model in RUN_SECTIONS.items():
        assert repeated_defaults(root.get(section) or {}, option_defaults(model), section) == []


def test_the_check_finds_a_repeated_default():
    assert repeated_defaults({"diff_threshold": 0.1, "variants": ["pll"], "generation": {"max_tokens": 8}},
                             {"diff_threshold": 0.1, "variants": ["pll", "fill_mask"], "generation": {"max_tokens": 8}},
                             "m") == ["m.diff_threshold: 0.1", "m.generation.max_tokens: 8"]


def test_the_plan_holds_every_option_filled_in():
    load_all()
    for name in ("crows_pairs", "honest", "winobias_mc", "cbs", "langfair_stereotype"):
        job = next(j for j in build_plan([f"metric=[{name}]"]).jobs if j.metric == name)
        assert set(option_defaults(metric_options(name))) <= set(job.metric_cfg), name
    job = build_plan(["metric=[crows_pairs]", "metric.crows_pairs.fill_mask_match=exact", "stats.n_boot=9"]).jobs[0]
    assert job.metric_cfg["fill_mask_match"] == "exact" and job.metric_cfg["diff_threshold"] == 0.1
    assert job.stats == {"n_boot": 9, "seed": 0, "level": 0.95} and job.mode == "parity"


def test_a_metric_called_with_only_what_differs_reads_every_default():
    """Tests and notebooks build a metric's options from only what differs: the options model fills the rest."""
    from biasflow.registry import metric_options_from

    cfg = metric_options_from("cbs", {"plurals": "corrected"})
    assert cfg.piece_product == "reference" and cfg.plurals == "corrected"
    assert metric_options_from("cbs", cfg) is cfg  # already built: passed through


OPTION_FALLBACK = re.compile(r"\b(cfg|opts|options|metric_cfg)\.get\(")  # a metric's options, read with a fallback


def test_no_metric_falls_back_to_a_default_of_its_own():
    """``cfg.get("option", default)`` in a metric module is a second default: read ``cfg["option"]``."""
    load_all()
    found = []
    for path in sorted((ROOT / "src" / "biasflow" / "metrics").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if OPTION_FALLBACK.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_every_metric_has_its_options_model():
    load_all()
    assert all(spec.options is not None for spec in METRICS.values())


def test_a_metric_without_an_options_model_is_refused_naming_its_module(restore_registries):
    """``MetricSpec.options`` is required: there is no list of options models elsewhere to fall back on."""
    import dataclasses

    from biasflow import registry

    crows = registry.METRICS["crows_pairs"]
    for options in (None, dict, crows.options.model_validate):
        with pytest.raises(ValueError, match=r"metric 'crows_pairs' \(biasflow\.metrics\.crows_pairs\) has no "
                                             r"options model: give MetricSpec\(options=\.\.\.\)"):
            registry.register_metric(dataclasses.replace(crows, options=options))


# what several metrics build on stays in biasflow.schema; every other option class is its metric module's
SHARED_OPTION_CLASSES = {"MetricBase", "Generating", "GenerationSettings", "GeneratorConfig", "HttpClientOptions", "Source"}


def _option_classes(model: type) -> set[type]:
    """``model``, its bases and the models of its fields, nested ones too (pydantic's own bases left out)."""
    from typing import get_args

    from pydantic import BaseModel

    from biasflow import schema

    found: set[type] = set()
    todo = [model]
    while todo:
        cls = todo.pop()
        if cls in found or not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        if cls.__module__ == schema.__name__ and cls.__name__ in ("Strict", "Open", "_TypedScalars"):
            continue
        found.add(cls)
        todo += list(cls.__mro__[1:])
        for field in cls.model_fields.values():
            stack = [field.annotation]
            while stack:
                a = stack.pop()
                todo.append(a)
                stack += list(get_args(a))
    return found


def test_every_options_model_lives_in_its_metric_module():
    """A metric's options model, and every option class only it uses, is defined in the module that registers the
    metric (seat shares weat's): the one place to read and change a metric's options and their defaults."""
    load_all()
    users: dict[type, set[str]] = {}  # option class -> the modules of the metrics whose options use it
    for spec in METRICS.values():
        for cls in _option_classes(spec.options):
            users.setdefault(cls, set()).add(spec.compute.__module__)
    misplaced = sorted(f"{cls.__module__}.{cls.__name__} (used by {', '.join(sorted(modules))})"
                       for cls, modules in users.items()
                       if cls.__module__ not in modules
                       and not (cls.__module__ == "biasflow.schema" and cls.__name__ in SHARED_OPTION_CLASSES))
    assert misplaced == []
    assert all(spec.options.__module__ == spec.compute.__module__ for name, spec in METRICS.items()
               if name != "seat"), "a metric's options model is defined in its own module"
    assert METRICS["seat"].options is METRICS["weat"].options  # the permutation test's options, in metrics/weat.py


def test_the_schema_defines_no_metric_options():
    """``biasflow.schema`` keeps the run, model (and what the plan adds to a generation job's model), benchmark and generator sections and the shared option bases only."""
    import inspect

    from pydantic import BaseModel

    from biasflow import schema

    defined = {name for name, cls in vars(schema).items()
               if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.__module__ == schema.__name__}
    assert not hasattr(schema, "METRIC_OPTIONS")
    assert {name for name in defined if issubclass(getattr(schema, name), schema.MetricBase)} \
        <= SHARED_OPTION_CLASSES
    reached = set().union(*(_option_classes(model) for model in (
        schema.ModelOptions, schema.GenerationJobModel, schema.BenchmarkConfig, schema.GeneratorConfig,
        *schema.RUN_SECTIONS.values(),
        schema.PathsConfig, schema.TrackingConfig)))
    assert defined - {c.__name__ for c in reached} - SHARED_OPTION_CLASSES - {"Strict", "Open", "_TypedScalars"} \
        == set(), "an option class of one metric: move it to that metric's module"


# fallbacks that are not this check's business yet: (file, key) -> why
KNOWN_REPEATS = {("src/biasflow/models/demo.py", "seed"): "the demo model's training seed (model.train, a section "
                                                          "with no options model), not stats.seed"}


def repeated_schema_defaults(root=ROOT) -> list[str]:
    """``x.get("key", <literal>)`` and ``x.get("key") or <literal>`` in the package where ``key`` is an option of a
    schema section or of a metric's options model and the literal is that option's default: a default defined twice
    (read the filled option, or ``schema.config_value`` for a section that is not filled in)."""
    import ast

    from pydantic import BaseModel

    from biasflow import schema

    load_all()
    defaults: dict[str, list] = {}
    sections = [schema.ModelOptions, *schema.model_config_models().values(), schema.TrackingConfig, schema.GeneratorConfig, schema.GenerationSettings,
                *schema.RUN_SECTIONS.values(), *(spec.options for spec in METRICS.values())]
    for model in sections:
        for key, value in option_defaults(model).items():
            if value is not None and not isinstance(value, (dict, BaseModel)):
                defaults.setdefault(key, []).append(value)

    def literal(node):
        try:
            return True, ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False, None

    found = []
    for path in sorted((root / "src" / "biasflow").rglob("*.py")):
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2:
                call, fallback = node.values
                if not (isinstance(call, ast.Call) and len(call.args) == 1):
                    continue
            elif isinstance(node, ast.Call) and len(node.args) == 2:
                call, fallback = node, node.args[1]
            else:
                continue
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "get"
                    and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
                continue
            key = call.args[0].value
            ok, value = literal(fallback)
            if ok and key in defaults and any(value == d and isinstance(value, bool) == isinstance(d, bool)
                                              for d in defaults[key]) \
                    and (rel, key) not in KNOWN_REPEATS:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_repeats_a_schema_default():
    assert repeated_schema_defaults() == []
