"""The user's own files a job reads (a predictions file, a word list, a prompts file): each option that names one,
and the content digests that make a changed file a changed job."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from biasflow.errors import ConfigError
from biasflow.ordered import is_ordered_list, ordered_items

if TYPE_CHECKING:
    from biasflow.plan.jobs import Job


def user_file_options(metric: str, loader: str | None = None) -> dict[str, dict[str, str]]:
    """Per config section of a job of ``metric`` (on a dataset read by ``loader``): option -> how its value is read
    (``path``, or ``hub_id``: a hub id when no such file exists), from the ``USER_FILE`` markers of the options
    models (the metric's, the loader's, every model kind's config model)."""
    from biasflow.registry import loader_options, metric_options
    from biasflow.schema import BenchmarkConfig, marked_options, model_marked_options

    options = metric_options(metric)
    return {"metric": marked_options(options, "user_file") if options is not None else {},
            "benchmark": marked_options(loader_options(loader) if loader else BenchmarkConfig, "user_file"),
            "model": model_marked_options("user_file")}


def lookup(cfg: Any, dotted: str) -> Any:
    """``cfg``'s value at a dotted key, None where a part is missing."""
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
    for section, keys in user_file_options(job.metric, (job.benchmark_cfg or {}).get("loader")).items():
        prefix, cfg = sections[section]
        for key, kind in keys.items():
            value = lookup(cfg, key)
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
                    is_hub_id = kind == "hub_id" and not path.is_absolute() and not v.startswith(".")
                    if looks_like_path and not is_hub_id and section != "model":
                        raise ConfigError(f"{option}={v!r}: no such file or folder")
                    if section == "model" and job.model.get("path") and not job.model.get("hub_id"):
                        raise ConfigError(f"{option}={v!r}: no such model folder")
                    continue
                real = str(path.resolve())
                if real not in digests:
                    digests[real] = content_digest(path)
                if section == "metric":
                    check_user_file(job.metric, key, path, option)
                found[option] = {"path": real, "digest": digests[real]}
    return found


def check_user_file(metric: str, key: str, path: Path, option: str) -> None:
    """What a metric can check in a user's file without data (``check_user_file(key, path)`` of its options model:
    BBQ's predictions file, its columns and categories), at plan time: a mistake fails before any download. Its
    error, naming the file and row, becomes a ConfigError naming the option."""
    from biasflow.errors import BiasflowError
    from biasflow.registry import metric_options

    check = getattr(metric_options(metric), "check_user_file", None)
    if check is None or path.is_dir():
        return
    try:
        check(key, path)
    except BiasflowError as exc:
        raise ConfigError(f"{option}: {exc}") from exc
