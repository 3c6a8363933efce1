"""Log a finished plan to MLflow: one parent run per plan, one child run per job.

Idempotent: runs are found again by their tags (``biasflow.plan_hash``, ``biasflow.job``), so logging the same plan
twice updates the same runs instead of creating duplicates. Params (which MLflow never lets change) hold only what
the plan's hash covers; how the plan was asked for (the literal overrides) and settings that do not change the
numbers go to tags and artifacts, which may change, so equivalent invocations log to the same runs. The default store is the embedded sqlite file under
``results/``; any tracking URI (a server backed by PostgreSQL, say) works the same way.
"""
from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import platform
import re
import subprocess
import traceback
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.errors import TrackingError
from biasflow.secrets import redact_uri
from biasflow.tracking.store import Redactor, connect_uri, mlflow_env, open_store, safe_artifacts

log = logging.getLogger(__name__)

PACKAGES = ("biasflow", "torch", "transformers", "tokenizers", "pandas", "pyarrow", "snakemake", "hydra-core",
            "mlflow", "numpy", "scipy")


# the comparison tables and the HTML report of the aggregate stage (report/tables.py), when the run has them
RUN_REPORT_FILES = ("report.html", "leaderboard.md", "leaderboard.csv", "leaderboard.tex", "paired_tests.md",
                    "paired_tests.csv", "curves.csv", "paper_tables.md", "paper_tables.tex")


def metric_key(metric: str, category: str, suffix: str = "") -> str:
    key = f"{metric}.{category}{suffix}"
    return re.sub(r"[^A-Za-z0-9_\-. /:]", "_", key)


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # not a git checkout
        return "unknown"


def package_versions() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        try:
            out[f"version.{p}"] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            pass
    out["version.python"] = platform.python_version()
    return out


def dataset_tags(job: Mapping[str, Any], resources: str) -> dict[str, str]:
    """The raw files the job's items were actually prepared from (verified sha256 recorded by the prepare stage)."""
    tags = {}
    meta = Path(f"{job['items_path']}.meta.json") if job.get("items_path") else None
    if meta is not None and meta.exists():
        for key, info in json.loads(meta.read_text()).get("files", {}).items():
            tags[f"dataset.{key}.sha256"] = info["sha256"]
            tags[f"dataset.{key}.source"] = info["source"]
    for option, info in (job.get("user_files") or {}).items():
        tags[f"input.{option}.digest"] = info["digest"]
    return tags


def job_metrics(agg: pd.DataFrame) -> dict[str, float]:
    out = {}
    for row in agg.itertuples(index=False):
        for suffix, val in (("", row.value), ("_ci_low", row.ci_low), ("_ci_high", row.ci_high)):
            if val is not None and not (isinstance(val, float) and math.isnan(val)):
                out[metric_key(row.metric, row.category, suffix)] = float(val)
    return out


def _find_run(client, exp_id: str, filt: str):
    runs = client.search_runs([exp_id], filter_string=filt, max_results=1)
    return runs[0].info.run_id if runs else None


def _log_params(params: Mapping[str, str]) -> None:
    import mlflow

    items = [(k, v[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 90):
        mlflow.log_params(dict(items[start:start + 90]))


def _log_files(paths: list[Path], redactor: Redactor, artifact_path: str | None = None) -> None:
    import mlflow

    with safe_artifacts(paths, redactor) as files:
        for f in files:
            mlflow.log_artifact(str(f), artifact_path=artifact_path)


def job_id(job: Mapping[str, Any]) -> str:
    return f"{job['model_key']}/{job['metric']}/{job['cfg_hash']}"


def plan_params(plan: Mapping[str, Any]) -> dict[str, str]:
    """Params of the parent run: a function of the plan's content only (its set of jobs), so equivalent
    invocations (reordered overrides, an experiment preset spelled out) log to the same parent without conflict."""
    jobs = plan["jobs"]
    return {"plan.jobs": str(len(jobs)),
            "plan.metrics": json.dumps(sorted({j["metric"] for j in jobs})),
            "plan.models": json.dumps(sorted({j["model"]["name"] for j in jobs}))}


def invocation_tags(plan: Mapping[str, Any]) -> dict[str, str]:
    """How this plan was asked for: may differ between equivalent invocations, so tags (which may change)."""
    overrides = [" ".join(s["overrides"]) or "(defaults)" for s in plan.get("sweep", [])]
    return {"biasflow.sweep_jobs": str(len(overrides)), "biasflow.overrides": json.dumps(overrides)[:5000]}


def job_params_and_tags(job: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Params: what the job's config hash covers (so equal for every job with the same results folder).
    Model settings that do not change the numbers (device, batch size, ...) go to tags."""
    from biasflow.models.fingerprint import PROCESS_KEYS, SCORING_KEYS

    model = job["model"]
    hashed = {k: v for k, v in model.items() if k == "name" or k in SCORING_KEYS or k in PROCESS_KEYS}
    params = flatten({"model": hashed, "metric": job["metric_cfg"], "benchmark": job.get("benchmark_cfg") or {},
                      "stats": job["stats"], "mode": job["mode"], "config_hash": job["cfg_hash"]})
    settings = flatten({"model": {k: v for k, v in model.items() if k not in hashed}})
    return params, settings


def _required_files(plan: Mapping[str, Any]) -> list[Path]:
    return [Path(job["metric_dir"]) / name for job in plan["jobs"] for name in ("aggregate.parquet",
                                                                                "per_item.parquet")]


def where_results(run_dir: Path) -> str:
    return (f"The results are on disk in {run_dir}/ (report.md, aggregate.csv, per_item.parquet). Log them to MLflow "
            f"once the store works with:  biasflow log {run_dir}  (or re-run the same command).")


def log_plan(plan: Mapping[str, Any], run_dir: Path, uri: str | None = None,
             unfinished: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Log ``plan`` (results in ``run_dir``) to its tracking store, or to ``uri`` when given.

    Fails within seconds with a TrackingError naming the (redacted) store and where the results are when the store
    is unreachable or broken; nothing secret is written to MLflow, to the returned record or to the log."""
    tracking = plan.get("tracking") or {}
    if not tracking.get("enabled", True) and uri is None:
        return {"logged": False}
    configured = uri or tracking["uri"]
    real_uri = connect_uri(configured)
    shown = redact_uri(configured)
    run_dir = Path(run_dir)
    missing = [str(p) for p in _required_files(plan) if not p.exists()]
    if missing:
        raise TrackingError(f"cannot log plan {plan['plan_hash']} to MLflow: its results are incomplete "
                            f"({len(missing)} file(s) missing, e.g. {missing[0]}); run the plan first")
    redactor = Redactor(real_uri)
    try:
        with mlflow_env():
            open_store(real_uri)
            record = _log_plan(plan, run_dir, real_uri, redactor)
            _note_unfinished(record["parent_run_id"], unfinished or [], real_uri, redactor)
    except TrackingError as exc:
        raise TrackingError(f"{redactor(str(exc))}\n{where_results(run_dir)}") from None
    except Exception as exc:  # MLflow's messages may quote the URI with its password: redact, drop the chain
        log.error("MLflow logging failed:\n%s", redactor(traceback.format_exc()))
        raise TrackingError(f"logging to the MLflow store {shown} failed: {type(exc).__name__}: "
                            f"{redactor(str(exc))}\n{where_results(run_dir)}") from None
    record["tracking_uri"] = shown
    log.info("logged plan %s to %s (parent run %s)", plan["plan_hash"], shown, record["parent_run_id"])
    return record


def _note_unfinished(parent_id: str, unfinished: list[dict[str, Any]], real_uri: str, redactor: Redactor) -> None:
    """A partial run's parent lists the jobs that did not finish, with their errors (a later complete run clears
    it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=real_uri)
    client.set_tag(parent_id, "biasflow.unfinished_jobs", str(len(unfinished)))
    if unfinished:
        rows = [{k: redactor(str(v)) if v is not None else None for k, v in u.items()} for u in unfinished]
        client.log_text(parent_id, json.dumps(rows, indent=2), "unfinished_jobs.json")


def _log_plan(plan: Mapping[str, Any], run_dir: Path, real_uri: str, redactor: Redactor) -> dict[str, Any]:
    import mlflow
    from mlflow.tracking import MlflowClient

    tracking = plan.get("tracking") or {}
    mlflow.set_tracking_uri(real_uri)
    client = MlflowClient(tracking_uri=real_uri)
    experiment = tracking.get("experiment", "biasflow")
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        loc = tracking.get("artifact_location")
        exp_id = client.create_experiment(experiment, artifact_location=Path(loc).resolve().as_uri() if loc else None)
    else:
        exp_id = exp.experiment_id
    common_tags = {"git.commit": git_commit(), **package_versions()}
    plan_hash = plan["plan_hash"]
    parent_id = _find_run(client, exp_id, f"tags.`biasflow.plan_hash` = '{plan_hash}' "
                                          f"and tags.`biasflow.role` = 'parent'")
    record: dict[str, Any] = {"experiment_id": exp_id, "children": {}}
    with mlflow.start_run(run_id=parent_id, experiment_id=exp_id,
                          run_name=None if parent_id else f"plan-{plan_hash}") as parent:
        mlflow.set_tags(redactor.config({"biasflow.plan_hash": plan_hash, "biasflow.role": "parent", **common_tags,
                                         **invocation_tags(plan)}))
        _log_params(redactor.config(plan_params(plan)))
        _log_files([run_dir / name for name in ("aggregate.csv", "aggregate.parquet", "per_item.parquet",
                                                 "report.md", "plan.json", "comparison.csv", *RUN_REPORT_FILES)
                    if (run_dir / name).exists()], redactor)
        plots = run_dir / "plots"
        if plots.is_dir():
            _log_files(sorted(p for p in plots.iterdir() if p.is_file()), redactor, artifact_path="plots")
        record["parent_run_id"] = parent.info.run_id
        for job in plan["jobs"]:
            jid = job_id(job)
            child_id = _find_run(client, exp_id, f"tags.`biasflow.job` = '{jid}' and "
                                                 f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
            mdir = Path(job["metric_dir"])
            agg = pd.read_parquet(mdir / "aggregate.parquet")
            params, settings = job_params_and_tags(job)
            with mlflow.start_run(run_id=child_id, experiment_id=exp_id, nested=True,
                                  run_name=None if child_id else f"{job['model']['name']}/{job['metric']}") as child:
                tags = {**settings, "biasflow.job": jid, "biasflow.role": "job", "biasflow.plan_hash": plan_hash,
                        "model.id": (job["model"].get("hub_id") or job["model"].get("path")
                                     or job["model"].get("model_id")),
                        "model.demo": str(bool(job["model"].get("demo"))),
                        **common_tags, **dataset_tags(job, plan.get("paths", {}).get("resources", "resources"))}
                meta = mdir / "score_meta.json"
                if meta.exists():
                    tags.update(json.loads(meta.read_text()).get("provenance", {}))
                mlflow.set_tags(redactor.config({k: str(v) for k, v in tags.items()}))
                _log_params(redactor.config(params))
                mlflow.log_metrics(job_metrics(agg))
                # the tables, the resolved config, and what a metric writes beside them (LM Challenge logs, pages)
                _log_files(sorted(p for p in mdir.iterdir() if p.is_file() and not p.name.startswith(".")
                                  and p.name != "score_meta.json"), redactor)
                record["children"][jid] = child.info.run_id
    return record
