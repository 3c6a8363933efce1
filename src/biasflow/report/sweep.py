"""What each job of a run is, for comparisons: its model's label and the options its sweep varies.

Jobs of one metric family that differ only in the model are compared with each other (leaderboard rows, paired
tests). Options that differ between the family's jobs (``metric.crows_pairs.diff_threshold`` in a threshold sweep)
form each job's ``setting``; jobs with equal settings are comparable, and a numeric option gives a curve.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import pandas as pd

from biasflow.io import flatten_mapping


def _job_options(job: Mapping[str, Any]) -> dict[str, Any]:
    return flatten_mapping({"metric": job.get("metric_cfg") or {}, "benchmark": job.get("benchmark_cfg") or {},
                     "stats": job.get("stats") or {}, "mode": job.get("mode")})


def _frozen(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def model_labels(jobs: list[Mapping[str, Any]]) -> dict[str, str]:
    """``{model_key: label}``: the model's name, or its key where two models of the run share a name."""
    names: dict[str, set[str]] = {}
    for j in jobs:
        names.setdefault(j["model"]["name"], set()).add(j["model_key"])
    return {j["model_key"]: (j["model"]["name"] if len(names[j["model"]["name"]]) == 1 else j["model_key"])
            for j in jobs}


def _named_after(model: Mapping[str, Any]) -> str:
    """What a model's name is derived from: the last part of its folder, hub id or served name (``tinyA`` for
    ``/data/run1/tinyA``), else its configured name."""
    source = model.get("path") or model.get("hub_id") or model.get("served_model_name") or model.get("model_id")
    if isinstance(source, str) and source.strip("/"):
        return source.rstrip("/").replace("\\", "/").split("/")[-1]
    return str(model.get("name", ""))


def alike_models(jobs: list[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """What tells apart the models of a run that are named alike: two checkpoints in folders of one name
    (``tinyA-1a2b``, ``tinyA-3c4d``), or two models given one ``model.name``. Returns a table: ``model``,
    ``named after``, then each model setting whose values differ within such a group (``path``, ...); no rows
    when every model's name is its own."""
    labels = model_labels(list(jobs))
    models: dict[str, Mapping[str, Any]] = {}
    for j in jobs:
        models.setdefault(j["model_key"], j["model"])
    groups: dict[tuple[str, str], set[str]] = {}
    for key, m in models.items():
        groups.setdefault(("after", _named_after(m)), set()).add(key)
        groups.setdefault(("name", str(m.get("name", ""))), set()).add(key)
    alike = {frozenset(keys) for keys in groups.values() if len(keys) > 1}
    rows: dict[str, dict[str, Any]] = {}
    differing: list[str] = []
    for keys in sorted(alike, key=lambda ks: sorted(labels[k] for k in ks)):
        flat = {k: flatten_mapping({key: value for key, value in models[k].items() if key != "name"}) for k in keys}
        for option in sorted({o for f in flat.values() for o in f}):
            if len({_frozen(f.get(option)) for f in flat.values()}) > 1 and option not in differing:
                differing.append(option)
        for k in keys:
            rows[k] = flat[k]
    if not rows:
        return [], []
    head = ["model", "named after"] + differing
    body = [[labels[k], _named_after(models[k])] + ["" if rows[k].get(o) is None else str(rows[k].get(o))
                                                   for o in differing]
            for k in sorted(rows, key=lambda k: labels[k])]
    return head, body


# models the summary line names before it counts the rest (a 1,000-model sweep's names are a page of their own)
SUMMARY_MODELS = 12


def summary_line(plan: Mapping[str, Any]) -> str:
    """``4 jobs · models: tinyA, tinyB · metrics: crows_pairs``: every model by the name the report gives it, or
    the first ``SUMMARY_MODELS`` and how many more (leaderboard.csv lists every one)."""
    models = sorted(set(model_labels(list(plan["jobs"])).values()))
    families = sorted({j["metric"] for j in plan["jobs"]})
    shown = ", ".join(models[:SUMMARY_MODELS])
    if len(models) > SUMMARY_MODELS:
        shown += f" and {len(models) - SUMMARY_MODELS:,} more ({len(models):,} models: leaderboard.csv lists each)"
    return f"{len(plan['jobs'])} jobs · models: {shown} · metrics: {', '.join(families)}"


def short_option(key: str, keys: list[str]) -> str:
    """``metric.diff_threshold`` -> ``diff_threshold`` unless another varied option ends the same way."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def job_table(plan: Mapping[str, Any]) -> pd.DataFrame:
    """One row per job: config_hash, family, benchmark, model_key, model (label), demo, setting (text of the
    varied options, '' when none), setting_key, options (dict of the varied options), cfg (what ``aggregate``
    gets, as in the metric stage), mode (run.mode)."""
    jobs = list(plan["jobs"])
    labels = model_labels(jobs)
    rows = []
    by_family: dict[str, list[Mapping[str, Any]]] = {}
    for j in jobs:
        by_family.setdefault(j["metric"], []).append(j)
    for family, fjobs in by_family.items():
        opts = [_job_options(j) for j in fjobs]
        keys = sorted({k for o in opts for k in o})
        varied = [k for k in keys if len({_frozen(o.get(k)) for o in opts}) > 1]
        for j, o in zip(fjobs, opts):
            options = {k: o.get(k) for k in varied}
            setting = ", ".join(f"{short_option(k, varied)}={o.get(k)}" for k in varied)
            rows.append({"config_hash": j["cfg_hash"], "family": family,
                         "benchmark": j.get("benchmark") or family, "model_key": j["model_key"],
                         "model": labels[j["model_key"]], "demo": bool(j["model"].get("demo")),
                         "setting": setting, "setting_key": _frozen(options), "options": options,
                         "cfg": dict(j.get("metric_cfg") or {}), "mode": j.get("mode")})
    return pd.DataFrame(rows, columns=["config_hash", "family", "benchmark", "model_key", "model", "demo", "setting",
                                       "setting_key", "options", "cfg", "mode"])
