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

The work is split by job: ``conf`` (where the configuration comes from), ``overrides`` (parsing, sweeps),
``composition`` (one job's configuration), ``options`` (metric options validated once), ``screening`` (secrets kept
out), ``names`` (display names), ``user_files`` (the user's files and their digests), ``jobs`` (``Job`` and
``Plan``), ``checks`` (whole-plan checks); ``build_plan`` here puts them together.
"""
from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from biasflow.errors import ConfigError
from biasflow.generator_config import job_model as generation_job_model
from biasflow.generator_config import with_generation_options
from biasflow.io import write_json
from biasflow.model_kinds import accepts as accepts_kind
from biasflow.plan.checks import check_exports, check_generator_settings
from biasflow.plan.composition import compose, compose_shared, conf_snapshot, load_model_config, with_every_benchmark
from biasflow.plan.conf import conf_dir, layered_conf, source_file, yaml_error_text
from biasflow.plan.jobs import PLAN_FORMAT, Job, Plan, canonical, model_key
from biasflow.plan.names import display_name, with_display_names
from biasflow.plan.options import with_option_dumps, with_ordered_options
from biasflow.plan.overrides import LIST_CHUNK, expand_sweep, parse_overrides
from biasflow.plan.screening import reject_secret_overrides, without_secrets
from biasflow.plan.user_files import content_digest, lookup, user_file_options, user_files
from biasflow.schema import StatsConfig, validate_model_config

log = logging.getLogger(__name__)


def responses_as_items(metric: str, spec: Any, generated_by: Mapping[str, Any] | None, job_overrides: Sequence[str],
                       cfg: Mapping[str, Any], digests: dict[str, str]) -> tuple[str, dict[str, Any]] | None:
    """(benchmark, its config) where a metric that reads the responses alone (``MetricSpec.items_are_prompts``) is
    given a responses file: the ``prompts_file`` benchmark on that file, one item per distinct prompt, pinned by
    the file's sha256 and named by it, so the tables name the user's data and nothing else is fetched (before: BOLD's
    prompts downloaded and listed as the data read). None otherwise, or where the user chose the metric's benchmark
    (``metric.<name>.benchmark=...``)."""
    from biasflow.io import sha256_file

    if not (generated_by and generated_by.get("generator") == "responses_file" and spec.items_are_prompts):
        return None
    if any(o.split("=", 1)[0].lstrip("+~") == f"metric.{metric}.benchmark" for o in job_overrides):
        return None
    path = Path(str(generated_by["path"])).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"generator.path={generated_by['path']!r}: no such file (the responses, CSV / JSONL / "
                          "Parquet with prompt, response)")
    key = f"sha256:{path}"  # beside user_files' content digests of the same cache
    digest = digests.get(key) or digests.setdefault(key, sha256_file(path))
    base = dict((cfg.get("benchmark") or {}).get("prompts_file") or {"loader": "prompts_file", "split": "all"})
    return "prompts_file", {**base, "distinct": True, "files": {"responses": {
        "filename": f"responses-{digest[:16]}{path.suffix.lower()}",  # two files of one name never meet
        "sources": [{"url": path.as_uri(), "sha256": digest}]}}}


def build_plan(overrides: Sequence[str] = (), multirun: bool = False) -> Plan:
    """Every job of the run or sweep ``overrides`` selects. Within one plan the config files are read once and each
    distinct section is validated once (a 1,000-model sweep repeats the same benchmarks and options 3,000 times)."""
    from biasflow.schema import memoized_validation

    with conf_snapshot(), memoized_validation():
        return _build_plan(overrides, multirun)


def _build_plan(overrides: Sequence[str], multirun: bool) -> Plan:
    from biasflow.registry import check_benchmark_use, check_loader_options, get_metric

    sweep = []
    jobs: dict[str, Job] = {}
    skipped: list[str] = []
    seen: set[str] = set()
    own_models: dict[str, bool] = {}  # metric folder -> whether its job runs a sweep job's own model config
    clean: dict[int, Any] = {}  # config sections without secrets, shared by the sweep's jobs (without_secrets)
    tracking = paths = None
    benchmarks: dict[str, Any] = {}
    digests: dict[str, str] = {}  # path -> content digest, once per plan
    composed = []

    def skip(message: str) -> None:  # once per message: a threshold sweep skips the same pair once per threshold
        if message not in seen:
            seen.add(message)
            log.warning(message)
            skipped.append(message)

    def note(message: str) -> None:
        if message not in seen:
            seen.add(message)
            log.info(message)

    for job_overrides in expand_sweep(overrides, multirun):
        reject_secret_overrides(job_overrides)
        cfg = compose_shared(job_overrides)  # read only, but the model's display name is set in place: its own copy
        composed.append((job_overrides, dict(cfg, model=dict(cfg["model"]))))
    with_display_names([cfg["model"] for _, cfg in composed])
    for job_overrides, cfg in composed:
        cfg = with_option_dumps(cfg)
        cfg = with_ordered_options(without_secrets(cfg, clean))
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
                skip(f"metric {name} skipped for model {model.get('name')}: {reason}")
                continue
            own_model = True  # the job runs the sweep job's own model config (not a generator's, not a default)
            if generated_by is not None:
                model, own_model = generated_by, False
            elif not accepts_kind(spec.model_kinds, model.get("kind")):  # listed, or declared like a listed kind
                fallback = mcfg.get("default_model")
                if not fallback:
                    skip(f"metric {name} skipped for model {model.get('name')}: it needs a model of kind "
                         f"{list(spec.model_kinds)}, got {model.get('kind')!r}")
                    continue
                model, own_model = load_model_config(fallback, cfg), False
                validate_model_config(model, f"metric.{name}.default_model={fallback}: model")
            model = with_generation_options(model, mcfg)  # hf_generate's chat template / generate kwargs
            bench = mcfg.get("benchmark", spec.benchmark)
            bcfg = None
            own = responses_as_items(name, spec, generated_by, job_overrides, cfg, digests)
            if own is not None:  # the user's responses are the items: nothing of the benchmark is read or fetched
                bench, bcfg = own
            elif bench:
                if bench not in (cfg.get("benchmark") or {}):
                    raise ConfigError(f"metric.{name}.benchmark={bench!r} has no config conf/benchmark/{bench}.yaml")
                bcfg = cfg["benchmark"][bench]
                changed = {k: v for k, v in spec.benchmark_settings.items() if (bcfg or {}).get(k) != v}
                if changed:
                    bcfg = {**(bcfg or {}), **changed}
                    note(f"metric {name} reads benchmark {bench} with "
                         + ", ".join(f"{k}={v}" for k, v in changed.items()) + " (what it scores), whatever "
                         + f"benchmark.{bench} says")
                check_benchmark_use(str((bcfg or {}).get("loader") or bench), bcfg or {})
                if spec.check_benchmark is not None:
                    spec.check_benchmark(bcfg or {})
            job = Job(metric=name, model=model, metric_cfg=mcfg, benchmark=bench, benchmark_cfg=bcfg,
                      stats=StatsConfig.model_validate(cfg["stats"]).bootstrap(),  # filled in (with_option_dumps)
                      mode=cfg["run"]["mode"],
                      results=cfg["paths"]["results"], score_keys=tuple(spec.score_keys),
                      extra_outputs=tuple(spec.extra_outputs),
                      exports={o: str(mcfg[o]) for o in spec.export_options if mcfg.get(o)})
            job.user_files = canonical(user_files(job, digests))
            same = jobs.setdefault(job.metric_dir, job)
            if same is not job and same.model != job.model and own_models.get(job.metric_dir) and own_model:
                _refuse_collapsed_settings(same.model, job.model)
            own_models.setdefault(job.metric_dir, own_model)
            same.sweep_overrides.append(job_overrides)
    if not jobs:
        raise ConfigError("the configuration selects no runnable job: " + "; ".join(skipped))
    _refuse_swept_run_settings([entry["config"] for entry in sweep])
    _check_paired_reference(sweep[0]["config"].get("stats") or {}, [job.model["name"] for job in jobs.values()])
    check_exports(list(jobs.values()), paths or {}, benchmarks)
    # a sweep job's dataset descriptions are the plan's (``benchmarks``) unless it overrode one: written once, not
    # once per sweep job (four fifths of a 1,000-model plan's size before)
    for entry in sweep:
        if entry["config"].get("benchmark") == benchmarks:
            entry["config"] = {k: v for k, v in entry["config"].items() if k != "benchmark"}
    # the plan's own copies: its sweep jobs' configs share sections with the composition cache (compose_shared)
    return Plan(jobs=list(jobs.values()), sweep=copy.deepcopy(sweep), tracking=copy.deepcopy(tracking or {}),
                paths=copy.deepcopy(paths or {}), skipped=skipped, benchmarks=canonical(benchmarks))


def _differences(a: Any, b: Any, where: str) -> list[str]:
    """Dotted keys whose values differ between two configs."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _differences(a.get(k), b.get(k), f"{where}.{k}")]
    return [] if a == b else [where]


def _refuse_swept_run_settings(configs: Sequence[Mapping[str, Any]]) -> None:
    """One plan has one results folder, one resources folder, one MLflow experiment and one report: a sweep over
    ``paths.*``, ``tracking.*`` or the report's paired-test design (``stats.paired*``) would silently keep its first
    value (every job would write where the first says)."""
    for section in ("paths", "tracking", "stats"):
        for cfg in configs[1:]:
            differ = _differences(configs[0].get(section), cfg.get(section), section)
            if section == "stats":  # a metric option: each value is its own job; the paired design is the plan's
                differ = [d for d in differ if d.split(".", 1)[1] not in StatsConfig().bootstrap()]
            if differ:
                values = sorted({str(lookup(c, differ[0])) for c in configs})
                raise ConfigError(f"{differ[0]} is swept ({', '.join(values)}), but a plan writes to one place and "
                                  f"logs to one experiment: run each value as its own plan")


def _check_paired_reference(stats: Mapping[str, Any], models: Sequence[str]) -> None:
    """``stats.paired_reference`` names the model every other is compared with (``stats.paired=reference``, or beside
    the adjacent pairs): a name no model of the plan has would leave those tests out, saying only that they are."""
    reference = stats.get("paired_reference")
    if reference is not None and reference not in models:
        raise ConfigError(f"stats.paired_reference={reference!r} is not a model of this plan; its models: "
                          f"{', '.join(sorted(set(models)))}")


def _refuse_collapsed_settings(kept: Mapping[str, Any], other: Mapping[str, Any]) -> None:
    """Two sweep jobs whose own model configs differ only in settings outside the model's identity (``model.device``,
    ``model.batch_tokens``, ``model.resources``) are one job with one set of results: the plan would run one of them
    and silently drop the other's setting. Refused, naming the setting. (A metric's ``default_model`` or a generator's
    model reached from several sweep jobs is the first one's, as before.)"""
    differ = _differences(dict(kept), dict(other), "model")
    raise ConfigError(f"{differ[0]} is swept ({lookup({'model': kept}, differ[0])}, "
                      f"{lookup({'model': other}, differ[0])}) but does not change the model's results: the sweep's "
                      f"jobs would be one job run with one of the values; run each value as its own plan")


__all__ = ["build_plan", "expand_sweep", "parse_overrides", "compose", "conf_dir", "layered_conf", "source_file",
           "yaml_error_text", "load_model_config", "with_every_benchmark", "model_key", "Plan", "Job", "PLAN_FORMAT",
           "canonical", "user_file_options", "content_digest", "user_files", "reject_secret_overrides",
           "without_secrets", "display_name", "with_display_names", "with_option_dumps", "with_ordered_options",
           "check_exports", "check_generator_settings", "LIST_CHUNK", "write_json"]
