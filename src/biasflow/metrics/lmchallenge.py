"""The LM Challenge games as metrics (docs/lmchallenge.md): ``lmc_wc``, ``lmc_we``, ``lmc_ce``, ``lmc_wr``.

Planned, run and logged like every other metric (one Snakemake DAG, one MLflow parent):
``biasflow run -m +experiment=lmchallenge_bold model=ngram2,ngram3,char3``. The metric asks for one
``LMChallengeLine`` per test line (the game, its options and the training text's digest); the score stage has the
model play those lines (biasflow.lmchallenge.pipeline.answer_lmc_line), each answer being the line's log; the
metric stage joins them into the game's log, computes the original tool's statistics per BOLD domain and overall,
and writes ``<game>.log``, ``stats.json`` and ``<game>.html`` beside its tables.
No bootstrap: the statistics are the original tool's point values (their CI columns are empty).
"""
from __future__ import annotations

from typing import Annotated, Any, Mapping

import numpy as np
import pandas as pd
from pydantic import Field

from biasflow.lmchallenge import pipeline
from biasflow.registry import MetricSpec, register_metric
from biasflow.schema import MetricBase, Probability


class LMChallengeGame(MetricBase):
    """The options of ``metric.lmc_we`` and ``metric.lmc_ce``: none beyond every metric's."""


class LMChallengeWC(LMChallengeGame):
    """The options of ``metric.lmc_wc``."""

    next_word_only: bool = False


class LMChallengeWR(LMChallengeGame):
    """The options of ``metric.lmc_wr`` (the LM Challenge command line takes its defaults from here too)."""

    num_candidates: Annotated[int, Field(ge=2)] = 50
    seed: int = 42
    p_anykey: Probability = 0.1


GAME_METRICS = {"wc": ("prediction.hit1", "prediction.mrr", "completion.characters"),
                "we": ("entropy.mean", "entropy.hit"), "ce": ("entropy.mean", "entropy.hit"),
                "wr": ("reranking.accuracy", "reranking.base_accuracy")}
# what the statistics every game's log has mean (counts describing the text, not scores)
LMC_LOG_MEANINGS = {
    "users": "number of users in the log (a new one whenever the user changes: LM Challenge's counting); a count, "
             "not a score",
    "messages": "number of messages (test lines) in the log (a new one whenever the message changes); a count, not a "
                "score",
    "tokens": "number of tokens in the log (words; characters in lmc_ce), deselected ones left out; a count, not a "
              "score",
    "characters": "number of characters of the log's tokens, deselected ones left out; a count, not a score",
    "messages_per_user": "messages / users: describes the test text, not a score",
    "tokens_per_user": "tokens / users: describes the test text, not a score",
    "characters_per_token": "characters / tokens, the mean token length (1 in lmc_ce): describes the test text, not a "
                            "score",
    "skipped": "share (0-1) of the log's tokens deselected (grep) and left out of every statistic; a diagnostic, not "
               "a score",
    "skipped_tokens": "number of tokens deselected (grep) and left out of every statistic; a count, not a score",
}
# what each game's statistics mean (the report prints them beside the game's tables)
GAME_MEANINGS = {
    "wc": {**LMC_LOG_MEANINGS,
           "prediction.hit1": "share (0-1) of words that are the model's first next-word prediction; higher = better",
           "prediction.mrr": "mean reciprocal rank (0-1) of the true next word among the predictions (0 when absent); "
                             "higher = better",
           "completion.characters": "share (0-1) of characters saved by completion (the rest of the word among the top "
                                    "2 continuations); higher = better",
           "completion.tokens": "share (0-1) of words completed before they were typed in full (the rest of the word "
                                "among the top 2 continuations); higher = better",
           "prediction.hit": "share (0-1) of words that are among the model's next-word predictions at any rank; "
                             "higher = better",
           "prediction.hit3": "share (0-1) of words among the model's first 3 next-word predictions; higher = better",
           "prediction.hit10": "share (0-1) of words among the model's first 10 next-word predictions; higher = "
                               "better",
           "prediction.hit20": "share (0-1) of words among the model's first 20 next-word predictions; higher = "
                               "better"},
    "we": {**LMC_LOG_MEANINGS,
           "entropy.mean": "mean -log p per scored word (nats for natural-log models); lower = better, comparable "
                           "only between logs with equal entropy.fingerprint",
           "entropy.hit": "share (0-1) of words the model scored (vocabulary coverage); entropies compare only at "
                          "equal coverage",
           "entropy.bits": "entropy.mean / ln 2 per scored word (bits for natural-log models); lower = better, "
                           "comparable only between logs with equal entropy.fingerprint",
           "entropy.perplexity": "exp(entropy.mean): per-word perplexity over the scored words; lower = better, "
                                 "comparable only between logs with equal entropy.fingerprint",
           "entropy.tokens": "number of words the model scored (entropy.hit's numerator); a count, not a score"},
    "ce": {**LMC_LOG_MEANINGS,
           "entropy.mean": "mean -log p per scored character (nats for natural-log models); lower = better, "
                           "comparable only between logs with equal entropy.fingerprint",
           "entropy.hit": "share (0-1) of characters the model scored (coverage); entropies compare only at equal "
                          "coverage",
           "entropy.bits": "entropy.mean / ln 2 per scored character (bits for natural-log models); lower = better, "
                           "comparable only between logs with equal entropy.fingerprint",
           "entropy.perplexity": "exp(entropy.mean): per-character perplexity over the scored characters; lower = "
                                 "better, comparable only between logs with equal entropy.fingerprint",
           "entropy.tokens": "number of characters the model scored (entropy.hit's numerator); a count, not a score"},
    "wr": {**LMC_LOG_MEANINGS,
           "reranking.accuracy": "share (0-1) of words typed with simulated typos whose true word ranks first when "
                                 "the typo model's and the LM's scores are combined; higher = better",
           "reranking.base_accuracy": "the same share by the typo model alone, without the LM: the baseline "
                                      "reranking.accuracy should beat",
           "reranking.alpha": "fitted LM weight a in (1 - a) x typo score + max(a x LM score, b); a fitted "
                              "parameter, not a score",
           "reranking.beta": "fitted floor b of the LM's part (what a candidate the LM did not score gets); a fitted "
                             "parameter, not a score",
           "reranking.max_candidates": "most candidates any word had (at most num_candidates); a diagnostic, not a "
                                       "score"},
}
# char-level n-gram models play the character game; word-level models the word games
CHAR_GAMES = ("ce",)


def _requests(game: str):
    def requests(items: pd.DataFrame, cfg: LMChallengeGame, model_kind: str) -> list:
        return pipeline.game_requests(game, items, cfg)
    return requests


def _compute(game: str):
    def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: LMChallengeGame) -> pd.DataFrame:
        """The game's log (one row per datum) from the answers to its lines."""
        return pipeline.log_table(answers, items, pipeline.game_requests(game, items, cfg))
    return compute


def _stats_rows(table: pd.DataFrame, category: str) -> list[dict]:
    from biasflow.lmchallenge.stats import flatten, stats

    rows = []
    for key, value in flatten(stats(pipeline.data_of(table))).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # fingerprints and absent statistics
        rows.append({"metric": key, "category": category, "value": float(value), "n": len(table)})
    return rows


def _aggregate(per_item: pd.DataFrame, cfg: LMChallengeGame) -> pd.DataFrame:
    rows = _stats_rows(per_item, "overall")
    for category, group in per_item.groupby("category", sort=True):
        rows += _stats_rows(group, str(category))
    out = pd.DataFrame(rows, columns=["metric", "category", "value", "n"])
    out["value"] = out["value"].astype(float).replace([np.inf, -np.inf], np.nan)
    return out


def _model_check(game: str):
    def check(model_cfg: Mapping[str, Any]) -> str | None:
        if model_cfg["kind"] != "ngram":
            return None
        level = model_cfg["level"]  # an n-gram model's config names its level
        if (game in CHAR_GAMES) != (level == "char"):
            return f"the {game} game is played by {'char' if game in CHAR_GAMES else 'word'}-level n-gram models"
        return None
    return check


def _extras(game: str):
    def write(per_item: pd.DataFrame, cfg: LMChallengeGame, out_dir) -> None:
        from pathlib import Path

        pipeline.write_outputs(per_item, game, Path(out_dir), title=f"LM Challenge {game}: {out_dir}")
    return write


# the options of each game that change what the model is asked (its metric config's keys)
# what is better for each game's metrics (the leaderboard ranks by it); coverage and the typo model's baseline are
# shown, not ranked
GAME_GOALS = {"wc": {"prediction.hit1": "max", "prediction.mrr": "max", "completion.characters": "max"},
              "we": {"entropy.mean": "min", "entropy.hit": None}, "ce": {"entropy.mean": "min", "entropy.hit": None},
              "wr": {"reranking.accuracy": "max", "reranking.base_accuracy": None}}
GAME_OPTIONS = {"wc": ("next_word_only",), "we": (), "ce": (), "wr": ("num_candidates", "seed", "p_anykey")}
# each game's options model
GAME_OPTIONS_MODELS = {"wc": LMChallengeWC, "we": LMChallengeGame, "ce": LMChallengeGame, "wr": LMChallengeWR}

for _game, _headline in GAME_METRICS.items():
    register_metric(MetricSpec(
        follows="LM Challenge (Microsoft's lmchallenge games)",
        name=f"lmc_{_game}", benchmark="lmchallenge_bold",
        model_kinds=("ngram", "lmc_process", "masked_lm", "causal_lm"),
        requests=_requests(_game), compute=_compute(_game), aggregate=_aggregate,
        score_keys=GAME_OPTIONS[_game], options=GAME_OPTIONS_MODELS[_game],
        headline=_headline, meanings=GAME_MEANINGS[_game], goals=GAME_GOALS[_game],
        plot_metric=None, plot_reference=None, bootstrap=False,
        model_check=_model_check(_game), write_extras=_extras(_game),
        extra_outputs=(f"{_game}.log", "stats.json", f"{_game}.html")))
