"""Every metric's options validated once and filled with their defaults, and ordered options in one order."""
from __future__ import annotations

from typing import Any

from biasflow.schema import validate_job_config


def with_option_dumps(cfg: dict[str, Any]) -> dict[str, Any]:
    """The composed config validated (``schema.validate_job_config``: every problem at once) and, where a section has
    an options model (every metric, ``stats``, ``run``), replaced by the validated options with every default
    filled in: the plan holds the options the stages read, nothing else decides them."""
    from biasflow.registry import loader_options, loader_splits, metric_options
    from biasflow.schema import RUN_SECTIONS, filled_options

    validate_job_config(cfg, metric_options, loader_splits, loader_options)
    out = dict(cfg)
    # the run mode is stored once per job (Job.mode, the value used); the stages set it on the options they pass
    out["metric"] = {name: _without_stage_fields(filled_options(metric_options(name), mcfg))
                     if isinstance(mcfg, dict) else mcfg for name, mcfg in (cfg.get("metric") or {}).items()}
    for section, model in RUN_SECTIONS.items():
        out[section] = model.model_validate(cfg.get(section) or {}).model_dump()
    return out


def _without_stage_fields(options: dict[str, Any]) -> dict[str, Any]:
    from biasflow.schema import STAGE_FIELDS

    return {k: v for k, v in options.items() if k not in STAGE_FIELDS}


def with_ordered_options(cfg: dict[str, Any]) -> dict[str, Any]:
    """Options whose mapping order changes the numbers (``LoaderSpec.ordered_options``, ``MetricSpec.ordered_options``)
    as ordered lists of one-key mappings: the plan, its hashes and Snakemake's params sort dict keys."""
    from biasflow.ordered import as_ordered_list
    from biasflow.registry import METRICS, loader_ordered_options

    sections = [("benchmark", name, loader_ordered_options(str((sub or {}).get("loader"))))
                for name, sub in (cfg.get("benchmark") or {}).items()]
    sections += [("metric", name, getattr(METRICS.get(name), "ordered_options", ()))
                 for name in (cfg.get("metric") or {})]
    out = dict(cfg)
    for section, name, options in sections:
        sub = (out.get(section) or {}).get(name)
        if not options or not isinstance(sub, dict) or not any(isinstance(sub.get(o), dict) for o in options):
            continue
        out[section] = dict(out[section])
        out[section][name] = {k: as_ordered_list(v) if k in options else v for k, v in sub.items()}
    return out
