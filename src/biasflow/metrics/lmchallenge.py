"""The LM Challenge games as metrics (docs/lmchallenge.md): ``lmc_wc``, ``lmc_we``, ``lmc_ce``, ``lmc_wr``.

Planned, run and logged like every other metric (one Snakemake DAG, one MLflow parent):
``biasflow run -m +experiment=lmchallenge_bold model=ngram2,ngram3,char3``. The score stage plays the game (the
expensive, model-dependent part) and stores its log; the metric stage computes the original tool's statistics per
BOLD domain and overall, and writes ``<game>.log``, ``stats.json`` and ``<game>.html`` beside its tables.
No bootstrap: the statistics are the original tool's point values (their CI columns are empty).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from biasflow.lmchallenge import pipeline
from biasflow.registry import MetricSpec, ScoreContext, register_metric

GAME_METRICS = {"wc": ("prediction.hit1", "prediction.mrr", "completion.characters"),
                "we": ("entropy.mean", "entropy.hit"), "ce": ("entropy.mean", "entropy.hit"),
                "wr": ("reranking.accuracy", "reranking.base_accuracy")}
# char-level n-gram models play the character game; word-level models the word games
CHAR_GAMES = ("ce",)


def _score(game: str):
    def score(ctx: ScoreContext) -> pd.DataFrame:
        data = pipeline.play(game, ctx.items, ctx.model_cfg, ctx.metric_cfg, ctx.cache_dir,
                             load_adapter=lambda: ctx.model)
        return pipeline.log_table(data, ctx.items)
    return score


def _compute(items: pd.DataFrame, scores: pd.DataFrame, cfg: Mapping[str, Any]) -> pd.DataFrame:
    return scores.copy()


def _stats_rows(table: pd.DataFrame, category: str) -> list[dict]:
    from biasflow.lmchallenge.stats import flatten, stats

    rows = []
    for key, value in flatten(stats(pipeline.data_of(table))).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # fingerprints and absent statistics
        rows.append({"metric": key, "category": category, "value": float(value), "n": len(table)})
    return rows


def _aggregate(per_item: pd.DataFrame, cfg: Mapping[str, Any]) -> pd.DataFrame:
    rows = _stats_rows(per_item, "overall")
    for category, group in per_item.groupby("category", sort=True):
        rows += _stats_rows(group, str(category))
    out = pd.DataFrame(rows, columns=["metric", "category", "value", "n"])
    out["value"] = out["value"].astype(float).replace([np.inf, -np.inf], np.nan)
    return out


def _model_check(game: str):
    def check(model_cfg: Mapping[str, Any]) -> str | None:
        if model_cfg.get("kind") != "ngram":
            return None
        level = model_cfg.get("level", "word")
        if (game in CHAR_GAMES) != (level == "char"):
            return f"the {game} game is played by {'char' if game in CHAR_GAMES else 'word'}-level n-gram models"
        return None
    return check


def _extras(game: str):
    def write(per_item: pd.DataFrame, cfg: Mapping[str, Any], out_dir) -> None:
        from pathlib import Path

        pipeline.write_outputs(per_item, game, Path(out_dir), title=f"LM Challenge {game}: {out_dir}")
    return write


for _game, _headline in GAME_METRICS.items():
    register_metric(MetricSpec(
        name=f"lmc_{_game}", benchmark="lmchallenge_bold",
        model_kinds=("ngram", "lmc_process", "masked_lm", "causal_lm"),
        score=_score(_game), compute=_compute, aggregate=_aggregate,
        score_keys=("shards", "timeout", "next_word_only", "num_candidates", "seed", "p_anykey"),
        headline=_headline, plot_metric=None, plot_reference=None, bootstrap=False,
        model_check=_model_check(_game), write_extras=_extras(_game)))
