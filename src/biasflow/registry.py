"""Registries that connect configuration names to code.

* ``LOADERS[name] -> LoaderSpec``: one per dataset (``benchmark.<name>.loader``); ``get_loader(name)(files, cfg)``
  gives the items DataFrame.
* ``METRICS[name] -> MetricSpec``: one per metric family (``metric.<name>``).

Both are ``biasflow.declared.Registry``s (the mechanism of every registry, model kinds' too): the modules of
``biasflow.data`` and ``biasflow.metrics``, and those an installed package names under the entry-point group
``biasflow.benchmarks``, register on import, and reading either registry imports them all once (``load_all()`` does
it up front).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from biasflow.declared import Registry

Loader = Callable[[Mapping[str, Path], Mapping[str, Any]], pd.DataFrame]
# (items, files, cfg) -> {file key: rows that file contributed to the items, or None for a file read beside them that
# gives no rows of its own (metadata, templates)}; a key left out is a file the loader did not read
FileRows = Callable[[pd.DataFrame, Mapping[str, Path], Mapping[str, Any]], Mapping[str, "int | None"]]


@dataclass(frozen=True)
class LoaderSpec:
    """A dataset loader (``register_loader``). ``load(files, cfg) -> items``; ``options``: its options model (a
    ``schema.BenchmarkConfig`` subclass); ``ordered_options``: options whose mapping order carries meaning
    (``biasflow.ordered``: kept as ordered lists in plans); ``splits``: the values its ``split`` option takes (empty:
    any, or no splits); ``check`` / ``check_use``: plan-time checks of its config; ``file_rows``: the rows each file
    contributed (None: not declared)."""

    name: str
    load: Loader
    options: type
    ordered_options: tuple[str, ...] = ()
    splits: tuple[str, ...] = ()
    check: Callable[[Mapping[str, Any]], None] | None = None
    check_use: Callable[[Mapping[str, Any]], None] | None = None
    file_rows: FileRows | None = None


# Every module of these packages is imported on the first read of a registry (so a new metric needs no edit here),
# and the modules installed packages name under the entry-point group (their pyproject.toml:
# [project.entry-points."biasflow.benchmarks"] mine = "my_project.benchmarks")
DISCOVERED_PACKAGES = ["biasflow.data", "biasflow.metrics"]
ENTRY_POINT_GROUP = "biasflow.benchmarks"
METRICS: dict[str, "MetricSpec"] = Registry("metric", DISCOVERED_PACKAGES, ENTRY_POINT_GROUP)
LOADERS: dict[str, LoaderSpec] = Registry("dataset loader", filled_with=METRICS)
# a metric's options model (its ``MetricSpec.options``, a ``schema.MetricBase`` subclass), built once per job by the
# stages (``metric_options_from``) and passed to every callable of the metric below
Options = Any


@dataclass(frozen=True)
class MetricSpec:
    """A metric family.

    ``requests`` says what the expensive, model-dependent stage must answer (the generic score stage answers it
    through ``scoring.answer``); ``compute`` (reading the answers by request key) and ``aggregate`` are pure and
    cheap. ``score_keys`` lists the metric options that change the
    model outputs: only those enter the hash of the score stage, so sweeping any other option (thresholds)
    never re-runs a model.
    """

    name: str
    benchmark: str | None
    model_kinds: tuple[str, ...]
    compute: Callable[[pd.DataFrame, pd.DataFrame, Options], pd.DataFrame]
    aggregate: Callable[[pd.DataFrame, Options], pd.DataFrame]
    # what the metric asks of the model: (items, cfg, model kind) -> [interface.requests.Request]; the score stage
    # answers them (scoring.answer) and ``compute(items, answers, cfg)`` reads the answers by request key
    requests: Callable[[pd.DataFrame, Options, str], list]
    score_keys: tuple[str, ...] = ()
    headline: tuple[str, ...] = ()  # metric names shown first in tables and logged as the run's headline
    plot_metric: str | None = None  # the per-category metric drawn as a bar plot
    plot_reference: float | None = 50.0  # the unbiased value drawn as a line on that plot (None: no line)
    bootstrap: bool = True  # False: point values only (CI columns empty), for aggregates too slow to resample
    # why a model of an accepted kind still cannot run this metric (None: it can); the plan skips it with the reason
    model_check: Callable[[Mapping[str, Any]], str | None] | None = None
    # plan time, (the config of the benchmark a job reads) -> raises ConfigError when this metric cannot read that
    # form of the data (UnQover's masked-LM scoring needs its masked templates), before any download
    check_benchmark: Callable[[Mapping[str, Any]], None] | None = None
    # benchmark options this metric's items are always made with, over the benchmark's config (UnQover's QA metric
    # reads the question form while the masked-LM metrics of the same plan read the masked statements): its jobs'
    # items are a table of their own (their own hash), and the plan logs where the config said otherwise
    benchmark_settings: Mapping[str, Any] = field(default_factory=dict)
    # files the metric stage writes beside its tables (the original tool's log, pages): ``write_extras`` writes
    # exactly the files named in ``extra_outputs`` (the metric rule declares them, so Snakemake rebuilds a deleted one)
    write_extras: Callable[[pd.DataFrame, Options, Path], None] | None = None
    extra_outputs: tuple[str, ...] = ()
    # files the user asked for beyond the metric's tables (e.g. StereoSet's predictions file): ``export(items,
    # scores, options, option)`` writes the file the option ``option`` names (one of ``export_options``); each set
    # option is its own rule, whose output is that file
    export: Callable[[pd.DataFrame, pd.DataFrame, Options, str], str] | None = None
    export_options: tuple[str, ...] = ()
    # every bootstrap replicate at once: (per_item, cfg, stats.bootstrap.Resamples) -> {(metric, category): values
    # per replicate}, the same numbers as ``aggregate`` on each resampled table (None: use that generic path)
    bootstrap_statistic: Callable[[pd.DataFrame, Options, Any], Mapping | None] | None = None
    # True where ``bootstrap_statistic`` equals ``aggregate`` on every resample bit for bit, for every headline
    # metric (tests/test_bootstrap.py checks it): the paired tests between models then use it too, with results
    # identical to the generic path's. False where it agrees only to rounding or leaves a headline metric out
    exact_replicates: bool = False
    # the metric's options as a pydantic model (a ``schema.MetricBase`` subclass defined in the metric's module):
    # every option's type, range and default, checked for every job at plan time. Required: ``register_metric``
    # refuses a spec without it (None is only the unset value, so the error can name the module)
    options: type | None = None
    # (answers, cfg) -> None, in the score stage before it writes its answers: raises when they are unusable (more
    # failed generations than allowed), so the stage fails and a re-run asks the failed requests again
    check_answers: Callable[[pd.DataFrame, Options], None] | None = None
    # (items, answers to ``requests``, cfg) -> [(model config, [Request])]: requests that read those answers (a
    # classifier scoring generated text), answered next in the score stage by the model config given with them
    followup_requests: Callable[[pd.DataFrame, pd.DataFrame, Options], list] | None = None
    # options given as a mapping whose order changes the numbers (group 1 vs group 2): the plan keeps them as
    # ordered lists of one-key mappings (biasflow.ordered), since plans and hashes sort dict keys
    ordered_options: tuple[str, ...] = ()
    # what the report says beside the metric's tables: one line per headline metric, what the number measures and
    # which way is fair or better (the "unbiased value" row gives the number), e.g. {"metric_score": "% of pairs
    # where the more stereotypical sentence is more likely; 50 = no preference, above 50 = stereotypical"}
    meanings: Mapping[str, str] = field(default_factory=dict)
    # options that choose which definition of the numbers is computed (BBQ's ``definition``): the report names
    # their values in the headings of the metric's tables, since the same answers give different numbers
    definition_options: tuple[str, ...] = ()
    # the published definition the numbers follow, named in the heading of every table of the family
    # ("Nangia et al. 2020, the authors' metric.py"); its departures are in the family's docs page
    follows: str = ""
    # a rate computed on the items a filter kept: {rate metric: (metric with the kept %, what an item is, the
    # filter's rule with {option} fields)}; where the filter kept none the report says so instead of "no items":
    # ("fill_mask_kept_pct", "one-word pairs", "filter_threshold {filter_threshold}") gives "0 of 1,018 one-word
    # pairs kept by filter_threshold 0.15"
    kept_by: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    # the option naming a table of the user's own system outputs that the metric scores, asking the model nothing
    # (LangFair's classification and recommendation metrics): ``api.evaluate`` takes that table as a DataFrame
    user_table: str | None = None
    # why a value is undefined where its items exist, per metric (name or fnmatch pattern): the report says it
    # instead of "undefined on its N items" ({"representation_race": "no response has a word of any group's list"})
    undefined: Mapping[str, str] = field(default_factory=dict)
    # scored on a table of responses, the metric reads only them: ``api.evaluate`` takes the responses' own prompts
    # as the items (benchmark prompts_file) instead of fetching the benchmark
    items_are_prompts: bool = False
    # what "unbiased" (or "better", for quality metrics) is for each of the metric's numbers: a value to be close to,
    # "max" or "min", or None (shown but not ranked, e.g. p-values); keys may be glob patterns ("*_ss"). The
    # leaderboard ranks and marks by it (``report.leaderboard.goals``)
    goals: Mapping[str, float | str | None] = field(default_factory=dict)
    # headline metric -> per_item -> a bool Series by item_id, the per-item outcome whose rate the metric is
    # (``stats.paired.binary_outcome``): paired model comparisons of that metric use the exact McNemar test on it
    binary_outcomes: Mapping[str, Callable[[pd.DataFrame], pd.Series]] = field(default_factory=dict)


def register_loader(name: str, ordered_options: tuple[str, ...] = (),
                    check: Callable[[Mapping[str, Any]], None] | None = None, splits: tuple[str, ...] = (),
                    options: type | None = None, file_rows: FileRows | None = None,
                    check_use: Callable[[Mapping[str, Any]], None] | None = None):
    """Register a dataset loader. ``check(benchmark_cfg)``: the options it can check without data (category names),
    raising ConfigError; the plan runs it, so a typo fails before any download. ``splits``: the values of its
    ``split`` option (checked at plan time). ``options``: its options model, a ``schema.BenchmarkConfig`` subclass
    declaring the options it reads beyond every dataset's (None: it reads none). ``file_rows(items, files, cfg)``:
    the rows each configured file contributed to the prepared items (``LoaderSpec.file_rows``), for the provenance of
    the report and of MLflow; without it a loader of one file gives it every row, and the files of a loader of
    several are listed without counts (``biasflow.provenance.file_rows``). ``check_use(benchmark_cfg)``: what must
    hold when a job reads the benchmark (a file of the user's named), checked for the benchmarks the plan uses."""
    from biasflow.schema import BenchmarkConfig

    if options is not None and not (isinstance(options, type) and issubclass(options, BenchmarkConfig)):
        raise ValueError(f"dataset loader {name!r}: options must be a biasflow.schema.BenchmarkConfig subclass, "
                         f"got {options!r}")

    def deco(fn: Loader) -> Loader:
        old = LOADERS.registered(name)
        LOADERS.add(name, LoaderSpec(name=name, load=fn, options=options or BenchmarkConfig,
                                     ordered_options=tuple(ordered_options), splits=tuple(splits), check=check,
                                     check_use=check_use, file_rows=file_rows),
                    fn.__module__, old.load.__module__ if old is not None else None)
        return fn

    return deco


def _loader(name: str) -> LoaderSpec | None:
    return LOADERS.get(name)


def loader_splits(loader: str) -> tuple[str, ...] | None:
    """The values ``loader``'s ``split`` option takes (None: not declared)."""
    spec = _loader(loader)
    return spec.splits if spec is not None and spec.splits else None


def loader_ordered_options(loader: str) -> tuple[str, ...]:
    """``loader``'s options whose mapping order carries meaning (none for an unknown loader)."""
    spec = _loader(loader)
    return spec.ordered_options if spec is not None else ()


def loader_file_rows(loader: str) -> FileRows | None:
    """``loader``'s count of the rows each of its files contributed (None: not declared)."""
    spec = _loader(loader)
    return spec.file_rows if spec is not None else None


def loader_options(loader: str) -> type:
    """The options model of ``loader`` (``schema.BenchmarkConfig`` for an unknown loader or one that declares none:
    the unknown loader is reported where it is looked up)."""
    from biasflow.schema import BenchmarkConfig

    spec = _loader(loader)
    return spec.options if spec is not None else BenchmarkConfig


def every_loader_option() -> set[str]:
    """Every option some loader reads (the names ``benchmark.<name>.<option>=v`` may add without Hydra's ``+``)."""
    return {name for model in {spec.options for spec in LOADERS.values()} for name in model.model_fields}


def check_benchmark_use(loader: str, benchmark_cfg: Mapping[str, Any]) -> None:
    """Plan time, for a benchmark a job reads: the loader's ``check_use`` (``register_loader(check_use=...)``)."""
    spec = _loader(loader)
    if spec is not None and spec.check_use is not None:
        spec.check_use(benchmark_cfg)


def check_loader_options(loader: str, benchmark_cfg: Mapping[str, Any]) -> None:
    """Plan time: the loader's own checks of ``benchmark_cfg`` that need no data (``register_loader(check=...)``)."""
    spec = _loader(loader)
    if spec is not None and spec.check is not None:
        spec.check(benchmark_cfg)


def metric_options_from(name: str, cfg: Any, mode: str | None = None) -> Any:
    """Metric ``name``'s options model built from ``cfg``: a mapping of the plan's options or only what differs from
    the defaults (a test, a notebook), or already the options model (returned as is); ``mode``: the job's run.mode,
    given to the metric as its ``run_mode`` (it decides what some options default to). What the stages and the
    report's paired tests build once per job and pass to every callable of the metric; a ConfigError names the
    metric and the option."""
    options = get_metric(name).options
    if isinstance(cfg, options):
        return cfg
    if mode is not None:
        cfg = {**cfg, "run_mode": mode}
    from pydantic import ValidationError

    from biasflow.errors import ConfigError
    from biasflow.schema import options_problems

    try:
        return options.model_validate(dict(cfg))
    except ValidationError as err:
        raise ConfigError("invalid options:\n  " + "\n  ".join(options_problems(options, f"metric.{name}", err))) \
            from None


def register_metric(spec: MetricSpec) -> MetricSpec:
    """Register ``spec`` under its name; its callables take its options model (``metric_options_from``)."""
    old = METRICS.registered(spec.name)
    METRICS.refuse_taken(spec.name, spec.compute.__module__, old.compute.__module__ if old is not None else None)
    from biasflow.schema import MetricBase

    options = spec.options
    if not (isinstance(options, type) and issubclass(options, MetricBase)):
        raise ValueError(f"metric {spec.name!r} ({spec.compute.__module__}) has no options model: give "
                         f"MetricSpec(options=...), a biasflow.schema.MetricBase subclass defined in "
                         f"{spec.compute.__module__} (got {options!r})")
    if bool(spec.write_extras) != bool(spec.extra_outputs):
        raise ValueError(f"metric {spec.name!r} ({spec.compute.__module__}): write_extras and extra_outputs go "
                         f"together (the files it writes are the metric rule's declared outputs)")
    if bool(spec.export) != bool(spec.export_options):
        raise ValueError(f"metric {spec.name!r} ({spec.compute.__module__}): export and export_options go together")
    return METRICS.add(spec.name, spec, spec.compute.__module__)


def load_all() -> None:
    """Import every loader and metric module once (they register themselves); reading a registry does it too."""
    METRICS.load()


def metric_options(name: str) -> type | None:
    """The options model of metric ``name`` (its ``MetricSpec.options``); None for an unknown metric."""
    spec = METRICS.get(name)
    return spec.options if spec is not None else None


def get_metric(name: str) -> MetricSpec:
    if name not in METRICS:
        raise KeyError(f"unknown metric {name!r}; known: {sorted(METRICS)}")
    return METRICS[name]


def get_loader(name: str) -> Loader:
    if name not in LOADERS:
        raise KeyError(f"unknown dataset loader {name!r}; known: {sorted(LOADERS)}")
    return LOADERS[name].load
