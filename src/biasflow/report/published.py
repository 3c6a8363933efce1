"""Published numbers of an experiment config (``conf/experiment/*.yaml``) beside ours.

An experiment's ``published`` list holds, per model, ``values`` in one of these shapes:
  {category: number}                      with ``experiment.metric`` naming the metric
  {metric: {category: number}}
  {group: {category: [n1, n2, ...]}}      with ``experiment.value_columns`` naming the list entries; the metric is
                                          ``<group>_<column>`` (e.g. StereoSet's intrasentence_lms/ss/icat)

A published value is identified by (experiment, hub_id, split, metric family, metric, category): ``hub_id`` names
the published model even where no ``conf/model`` file exists (``model: null``); an entry without a hub id (e.g.
word vectors) is identified by its ``model`` name. ``split`` is the entry's or the experiment's split (``all`` when
neither states one). It is compared with our value of the same model config name, metric and category, computed on
the same split.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import pandas as pd

from biasflow.errors import ConfigError

DEFAULT_SPLIT = "all"
VALUE_KEY = ["experiment", "hub_id", "split", "metric_family", "metric", "category"]
JOIN_KEY = ["model", "split", "metric_family", "metric", "category"]


def published_rows(experiment: Mapping[str, Any]) -> pd.DataFrame:
    family = experiment.get("metric_family")
    name = experiment.get("name", "?")
    columns = experiment.get("value_columns")
    rows = []
    for i, entry in enumerate(experiment.get("published") or []):
        model, hub_id = entry.get("model"), entry.get("hub_id")
        if not (model or hub_id):
            raise ConfigError(f"experiment {name}: published entry {i} needs a hub_id or a model")
        ident = (model, hub_id or model, str(entry.get("split") or experiment.get("split") or DEFAULT_SPLIT))
        for k1, v1 in (entry.get("values") or {}).items():
            if isinstance(v1, (int, float)):
                if not experiment.get("metric"):
                    raise ConfigError(f"experiment {name}: values {{{k1}: {v1}}} need experiment.metric")
                rows.append((*ident, experiment["metric"], k1, float(v1)))
                continue
            for k2, v2 in (v1 or {}).items():
                if isinstance(v2, (int, float)):
                    rows.append((*ident, k1, k2, float(v2)))
                elif isinstance(v2, (list, tuple)):
                    if not columns or len(columns) != len(v2):
                        raise ConfigError(f"experiment {name}: list values for {k1}.{k2} need experiment."
                                          f"value_columns with {len(v2)} names")
                    rows += [(*ident, f"{k1}_{c}", k2, float(x)) for c, x in zip(columns, v2)]
    df = pd.DataFrame(rows, columns=["model", "hub_id", "split", "metric", "category", "published"])
    df.insert(3, "metric_family", family)
    df.insert(0, "experiment", name)
    twice = df[df.duplicated(VALUE_KEY, keep=False)]
    if not twice.empty:
        r = twice.iloc[0]
        raise ConfigError(f"experiment {name}: {r.hub_id} ({r.split}) publishes {r.metric}/{r.category} more than "
                          "once; give each published entry its own hub_id")
    return df


def job_splits(jobs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``{config_hash: split}`` of a plan's jobs: the split of the benchmark each job ran on."""
    return {j["cfg_hash"]: str((j.get("benchmark_cfg") or {}).get("split") or DEFAULT_SPLIT) for j in jobs}


def compare(agg: pd.DataFrame, experiments: Iterable[Mapping[str, Any]],
            splits: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Published vs ours: delta and whether the published value lies inside our bootstrap CI.

    ``splits`` maps our rows' ``config_hash`` to the split they ran on (``job_splits``); a published value is
    matched only by a run on its split. Without it (and without a ``split`` column in ``agg``) splits are not
    checked.
    """
    pub = [published_rows(e) for e in experiments]
    pub = [p for p in pub if not p.empty]
    if not pub:
        return pd.DataFrame()
    # the same experiment appears once per sweep job that selects it
    pub = pd.concat(pub, ignore_index=True).drop_duplicates(VALUE_KEY)
    ours = agg.rename(columns={"value": "ours"})
    if "split" not in ours and splits is not None:
        ours = ours.assign(split=ours["config_hash"].map(splits).fillna(DEFAULT_SPLIT))
    key = JOIN_KEY if "split" in ours else [k for k in JOIN_KEY if k != "split"]
    ours = ours[key + ["ours", "ci_low", "ci_high", "n"]]
    out = pub.merge(ours, on=key, how="left")
    out["delta"] = out["ours"] - out["published"]
    out["published_in_ci"] = (out["published"] >= out["ci_low"]) & (out["published"] <= out["ci_high"])
    return out
