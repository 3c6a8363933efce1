"""Log a finished plan to MLflow: one parent run per plan, one child run per job.

Idempotent: runs are found again by their tags (``biasflow.plan_hash``, ``biasflow.job``), so logging the same plan
twice updates the same runs instead of creating duplicates. The default store is the embedded sqlite file under
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
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.io import sha256_file

log = logging.getLogger(__name__)

PACKAGES = ("biasflow", "torch", "transformers", "tokenizers", "pandas", "pyarrow", "snakemake", "hydra-core",
            "mlflow", "numpy", "scipy")


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
    tags = {}
    bcfg = job.get("benchmark_cfg") or {}
    for key, spec in (bcfg.get("files") or {}).items():
        raw = Path(resources) / "datasets" / job["benchmark"] / spec["filename"]
        rec = Path(f"{raw}.source.json")
        if rec.exists():
            info = json.loads(rec.read_text())
            tags[f"dataset.{key}.sha256"] = info["sha256"]
            tags[f"dataset.{key}.source"] = info["source"]
        elif raw.exists():  # placed by hand: still record what was measured
            tags[f"dataset.{key}.sha256"] = sha256_file(raw)
            tags[f"dataset.{key}.source"] = f"local file {raw}"
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


def log_plan(plan: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    import mlflow
    from mlflow.tracking import MlflowClient

    tracking = plan.get("tracking") or {}
    if not tracking.get("enabled", True):
        return {"logged": False}
    mlflow.set_tracking_uri(tracking["uri"])
    client = MlflowClient()
    exp = client.get_experiment_by_name(tracking.get("experiment", "biasflow"))
    if exp is None:
        loc = tracking.get("artifact_location")
        exp_id = client.create_experiment(tracking.get("experiment", "biasflow"),
                                          artifact_location=Path(loc).resolve().as_uri() if loc else None)
    else:
        exp_id = exp.experiment_id
    common_tags = {"git.commit": git_commit(), **package_versions()}
    plan_hash = plan["plan_hash"]
    parent_id = _find_run(client, exp_id, f"tags.`biasflow.plan_hash` = '{plan_hash}' "
                                          f"and tags.`biasflow.role` = 'parent'")
    record: dict[str, Any] = {"tracking_uri": tracking["uri"], "experiment_id": exp_id, "children": {}}
    with mlflow.start_run(run_id=parent_id, experiment_id=exp_id,
                          run_name=None if parent_id else f"plan-{plan_hash}") as parent:
        mlflow.set_tags({"biasflow.plan_hash": plan_hash, "biasflow.role": "parent", **common_tags})
        mlflow.log_param("sweep.jobs", len(plan["sweep"]))
        for i, s in enumerate(plan["sweep"]):
            mlflow.log_param(f"sweep.{i}.overrides", " ".join(s["overrides"]) or "(defaults)")
        for name in ("aggregate.csv", "aggregate.parquet", "per_item.parquet", "report.md", "plan.json",
                     "comparison.csv"):
            if (run_dir / name).exists():
                mlflow.log_artifact(str(run_dir / name))
        if (run_dir / "plots").exists():
            mlflow.log_artifacts(str(run_dir / "plots"), artifact_path="plots")
        record["parent_run_id"] = parent.info.run_id
        for job in plan["jobs"]:
            job_id = f"{job['model_key']}/{job['metric']}/{job['cfg_hash']}"
            child_id = _find_run(client, exp_id, f"tags.`biasflow.job` = '{job_id}' and "
                                                 f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
            mdir = Path(job["metric_dir"])
            agg = pd.read_parquet(mdir / "aggregate.parquet")
            with mlflow.start_run(run_id=child_id, experiment_id=exp_id, nested=True,
                                  run_name=None if child_id else f"{job['model']['name']}/{job['metric']}") as child:
                tags = {"biasflow.job": job_id, "biasflow.role": "job", "biasflow.plan_hash": plan_hash, "model.id": job["model"].get(
                    "hub_id") or job["model"].get("path") or job["model"].get("model_id"), "model.demo": str(bool(job["model"].get("demo"))),
                    **common_tags, **dataset_tags(job, plan.get("paths", {}).get("resources", "resources"))}
                meta = mdir / "score_meta.json"
                if meta.exists():
                    tags.update(json.loads(meta.read_text()).get("provenance", {}))
                mlflow.set_tags(tags)
                params = flatten({"model": job["model"], "metric": job["metric_cfg"],
                                  "benchmark": job.get("benchmark_cfg") or {}, "stats": job["stats"],
                                  "mode": job["mode"], "config_hash": job["cfg_hash"]})
                params = {k: v[:6000] for k, v in params.items()}
                for start in range(0, len(params), 90):
                    mlflow.log_params(dict(list(params.items())[start:start + 90]))
                mlflow.log_metrics(job_metrics(agg))
                for name in ("aggregate.parquet", "per_item.parquet", "config.yaml"):
                    mlflow.log_artifact(str(mdir / name))
                record["children"][job_id] = child.info.run_id
    log.info("logged plan %s to %s (parent run %s)", plan_hash, tracking["uri"], record["parent_run_id"])
    return record
