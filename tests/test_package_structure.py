"""The package's shape: no import circles between its modules (lazy imports inside functions count: they are
circles all the same, only deferred), and every third-party package it imports is declared in pyproject.toml."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from conftest import ROOT

SRC = ROOT / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "biasflow").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module name, at module level?) for every import statement of the file."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body} | {id(c) for n in tree.body if isinstance(n, ast.If | ast.Try)
                                        for c in ast.walk(n)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        found += [(n, id(node) in top) for n in names]
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name or None

    graph = {}
    for module, path in modules.items():
        deps = {resolve(n) for n, _ in _imports(module, path) if n.startswith("biasflow")}
        graph[module] = {d for d in deps if d and d != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_package():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The package's folders and top-level modules from the bottom up, as docs/architecture.md draws them ("At a glance",
# "Package layers"); a folder imports only what is below it. The app layer above ``plan`` (stages, workflow, runner,
# report, tracking, cli, api) is checked by the module-level circle test.
LAYERS = ("errors", "io", "secrets", "ordered", "upstream", "installed", "bars", "part_store", "openai_http",
          "declared", "model_kinds", "generator_kinds", "generator_config", "schema", "kinds", "registry",
          "provenance", "score_kinds", "interface", "models", "scoring", "generation", "lmchallenge", "data", "stats",
          "metrics", "plan")
# Imports that still climb (issue 47, open): the LM Challenge command (``python -m biasflow.lmchallenge``) composes
# model configs with the plan's compose.
CLIMBING = {("lmchallenge", "biasflow.plan")}


def folder_imports() -> set[tuple[str, str]]:
    """(folder or top-level module of src/biasflow, biasflow module it imports) for every import, inside functions
    too; ``from biasflow import x`` counts as importing ``biasflow.x``."""
    src = ROOT / "src" / "biasflow"
    found = set()
    for path in sorted(src.rglob("*.py")):
        own = path.relative_to(src).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "biasflow" else [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {(own, name) for name in names if name.startswith("biasflow.")}
    return found


def climbing_imports() -> set[tuple[str, str]]:
    """The imports of ``folder_imports`` of a module of a higher LAYERS entry."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return {(own, name) for own, name in folder_imports()
            if own in rank and rank.get(name.split(".")[1], -1) > rank[own]}


def test_folders_import_only_the_layers_below_them():
    """A new import that climbs the layers fails here; an import in CLIMBING that is gone must leave the list."""
    found = climbing_imports()
    assert found - CLIMBING == set(), "imports that climb the layers of docs/architecture.md"
    assert CLIMBING - found == set(), "no longer climbing: remove from CLIMBING"


def folder_graph() -> dict[str, set[str]]:
    """Folder (or top-level module) of src/biasflow -> the ones its modules import."""
    src = ROOT / "src" / "biasflow"
    units = {p.name.removesuffix(".py") for p in src.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    graph: dict[str, set[str]] = {u: set() for u in units}
    for own, name in folder_imports():
        other = name.split(".")[1]
        if other in units and other != own:
            graph[own].add(other)
    return graph


def test_no_import_circle_between_folders():
    """The folders and top-level modules of the package import each other without a loop (imports inside functions
    included), which the module-level check cannot see: a loop through lazy imports between folders is one."""
    assert cycles(folder_graph()) == []


def _declared() -> tuple[set[str], set[str]]:
    """Distribution names (normalised) of the core dependencies and of the extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(specs):
        return {re.split(r"[\s<>=!~;\[]", s, maxsplit=1)[0].lower().replace("_", "-") for s in specs}

    extras = set().union(*map(names, project.get("optional-dependencies", {}).values()))
    return names(project["dependencies"]), extras


def test_every_imported_package_is_declared():
    core, extras = _declared()
    distributions = importlib.metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    undeclared, core_needs_extra = [], []
    for module, path in _modules().items():
        for name, module_level in _imports(module, path):
            top = name.split(".")[0]
            if not top or top in stdlib or top == "biasflow":
                continue
            dists = {d.lower().replace("_", "-") for d in distributions.get(top, [])} or {top.replace("_", "-")}
            if not dists & (core | extras):
                undeclared.append(f"{module}: {top} ({'/'.join(sorted(dists))})")
            elif module_level and not dists & core:
                core_needs_extra.append(f"{module}: {top} is imported at module level but only an extra has it")
    assert sorted(set(undeclared)) == [], "imported but not declared in pyproject.toml"
    assert sorted(set(core_needs_extra)) == []


def test_a_second_metric_or_loader_under_a_taken_name_is_refused(restore_registries):
    import dataclasses

    from biasflow import registry

    crows = registry.METRICS["crows_pairs"]

    def compute(items, answers, cfg):
        return items

    compute.__module__ = "my_project.metrics"
    import pytest

    with pytest.raises(ValueError, match="metric 'crows_pairs' is registered twice: by biasflow.metrics.crows_pairs "
                                         "and by my_project.metrics"):
        registry.register_metric(dataclasses.replace(crows, compute=compute))
    registry.register_metric(crows)  # the same module again (a re-import): fine
    with pytest.raises(ValueError, match="dataset loader 'crows_pairs' is registered twice"):
        registry.register_loader("crows_pairs")(compute)


def test_an_installed_package_adds_metrics_and_loaders_by_an_entry_point(tmp_path, monkeypatch, restore_registries):
    """biasflow installed from a wheel: a package of one's own names its module under the entry-point group
    ``biasflow.benchmarks`` (no file of biasflow edited) and its metric and loader are known wherever the registries
    are read; a module that fails to import is an error naming it, and the registries are read again once mended."""
    import sys

    import pytest

    from biasflow import registry

    module = tmp_path / "my_benchmarks.py"
    module.write_text(
        "import dataclasses\n"
        "from biasflow.registry import METRICS, register_loader, register_metric\n"
        "@register_loader('my_pairs')\n"
        "def load(files, cfg):\n"
        "    return None\n"
        "register_metric(dataclasses.replace(METRICS['crows_pairs'], name='my_metric'))\n")
    dist = tmp_path / "my_benchmarks-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-benchmarks\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nmine = my_benchmarks\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "my_metric" not in dict.keys(registry.METRICS)
    monkeypatch.setattr(registry.METRICS, "_state", "no")  # read again: the built-ins and the entry point's module
    assert registry.get_metric("my_metric").options is registry.METRICS["crows_pairs"].options
    assert registry.get_loader("my_pairs") is sys.modules["my_benchmarks"].load
    assert {"crows_pairs", "my_metric"} <= set(registry.METRICS) and "my_pairs" in registry.LOADERS
    module.write_text("register_metric(\n")
    del sys.modules["my_benchmarks"]
    monkeypatch.setattr(registry.METRICS, "_state", "no")
    with pytest.raises(ImportError, match="the metrics declared in my_benchmarks could not be read: SyntaxError"):
        registry.get_metric("crows_pairs")
    assert registry.METRICS.state == registry.LOADERS.state == "no"
    monkeypatch.delitem(sys.modules, "my_benchmarks", raising=False)


# the names metric code gives its options (the metric's options model, or a nested options model of it)
OPTION_NAMES = {"cfg", "metric_cfg", "opts", "options", "clf", "lex"}


def test_metrics_read_their_options_as_attributes():
    """A metric receives its validated options model (``registry.metric_options_from``): its code reads ``cfg.option``, never
    ``cfg["option"]`` or ``cfg.get("option", fallback)`` (a key read would bypass the model's types and defaults;
    a fallback would repeat a default the model already holds)."""
    found = []
    for path in sorted((SRC / "biasflow" / "metrics").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, ast.Subscript):
                target = node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
                target = node.func.value
            if isinstance(target, ast.Name) and target.id in OPTION_NAMES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "options read as a mapping:\n" + "\n".join(found)


# the names a model config goes by in the adapters, scorers and generation backends (as a variable, or an attribute:
# ``self.cfg``, ``adapter.cfg``)
MODEL_CONFIG_NAMES = {"cfg", "model_cfg", "opts", "options"}
# files of those packages that read a model config as a mapping, each with why
MODEL_CONFIG_MAPPING_READS = {
    "src/biasflow/models/fingerprint.py": "hashes the config as written (a cache key: a key left out is not one set "
                                          "to its default), so it reads the dict, never the filled-in options",
    "src/biasflow/generation/backends.py": "GenerationSettings.from_cfg reads a metric's filled generation settings "
                                           "(a dict of metrics._generated), not a model config",
}


def _mapping_reads(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        target = None
        if isinstance(node, ast.Subscript):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            called = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if called == "model_value":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            elif called == "config_value" and len(node.args) > 1:
                target = node.args[1]
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) \
            else None
        if name in names:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_adapters_scorers_and_backends_read_model_configs_as_attributes():
    """``models.load_model`` validates a model config once into its kind's config model (``schema.model_options``;
    an adapter given a plain dict validates it the same way): adapters (``models/``), scorers (``scoring/``) and
    generation backends (``generation/``) read ``opts.option``, never ``cfg["option"]``, ``cfg.get("option")``,
    ``model_value`` or ``config_value`` on a model config. The files listed above are the exceptions, each with its
    reason (and each still needs it)."""
    found, excepted = [], {}
    for package in ("models", "scoring", "generation"):
        for path in sorted((SRC / "biasflow" / package).glob("*.py")):
            reads = _mapping_reads(path, MODEL_CONFIG_NAMES)
            rel = str(path.relative_to(ROOT))
            if rel in MODEL_CONFIG_MAPPING_READS:
                excepted[rel] = reads
            else:
                found += reads
    assert not found, "model configs read as a mapping:\n" + "\n".join(found)
    assert {rel for rel, reads in excepted.items() if reads} == set(MODEL_CONFIG_MAPPING_READS), \
        "an exception no longer needed: remove it from MODEL_CONFIG_MAPPING_READS"
