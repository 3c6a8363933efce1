"""Log LM Challenge results to MLflow: one run per (model, game) log, stats as metrics, HTML page as artifact."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from .stats import flatten


def metrics_of(stats: Mapping[str, Any]) -> dict[str, float]:
    """Numeric statistics, flattened (``prediction.hit1``); fingerprints and counts of nothing are left out."""
    out = {}
    for k, v in flatten(dict(stats)).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v is None:
            continue
        out[re.sub(r"[^A-Za-z0-9_\-./ ]", "_", k)] = float(v)
    return out


def log_run(stats: Mapping[str, Any], *, model: str, game: str, data: str, params: Mapping[str, Any] | None = None,
            artifacts: list[str | Path] = (), tracking_uri: str | None = None, experiment: str = "lmchallenge",
            run_name: str | None = None) -> str:
    """Create one MLflow run and return its id. Fingerprints go to tags, so comparable runs can be filtered.

    ``tracking_uri`` is the configured (redacted) URI: the connection uses the real one (see biasflow.secrets), and
    params and artifacts are redacted; an unreachable or broken store raises TrackingError within seconds."""
    import mlflow

    from biasflow.errors import TrackingError
    from biasflow.secrets import redact_uri
    from biasflow.tracking.store import Redactor, connect_uri, mlflow_env, open_store, safe_artifacts

    real_uri = connect_uri(tracking_uri) if tracking_uri else mlflow.get_tracking_uri()
    redactor = Redactor(real_uri)
    try:
        with mlflow_env():
            open_store(real_uri)
            mlflow.set_tracking_uri(real_uri)
            mlflow.set_experiment(experiment)
            with mlflow.start_run(run_name=run_name or f"{model}.{game}") as run:
                mlflow.log_params(redactor.config({"model": model, "game": game, "data": data,
                                                   **{k: str(v) for k, v in (params or {}).items()}}))
                mlflow.set_tags({"lmchallenge.fingerprint": stats.get("fingerprint", ""),
                                 "lmchallenge.entropy_fingerprint": (stats.get("entropy") or {}).get("fingerprint", "")})
                mlflow.log_metrics(metrics_of(stats))
                with safe_artifacts([Path(a) for a in artifacts], redactor) as files:
                    for f in files:
                        mlflow.log_artifact(str(f))
                return run.info.run_id
    except TrackingError:
        raise
    except Exception as exc:  # MLflow's messages may quote the URI with its password
        raise TrackingError(f"logging {model}.{game} to the MLflow store {redact_uri(real_uri)} failed: "
                            f"{type(exc).__name__}: {redactor(str(exc))}") from None
