"""Checks of a whole plan before anything runs: exports that would overwrite an input or each other, and generator
settings a metric would ignore."""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence


from biasflow.errors import ConfigError
from biasflow.plan.conf import conf_dir
from biasflow.plan.jobs import Job


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
    from biasflow.generator_config import check_generator_keys, check_metric_overrides

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
