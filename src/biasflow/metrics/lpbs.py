"""LPBS, the log-probability bias score of Kurita et al. (2019), for masked LMs.

For a template ("[TARGET] is a [ATTRIBUTE].") and an attribute ("programmer"):
  p_tgt(t)   = P(target word t at the [TARGET] masks | template with the attribute filled in)
  p_prior(t) = P(t at the [TARGET] masks | template with the attribute masked too)
  LPBS       = log(p_tgt(t1)/p_prior(t1)) - log(p_tgt(t2)/p_prior(t2))
A group of several words (``targets.yaml``) has the sum of its words' probabilities (the reference's
``bias_calculator.py``). Positive LPBS = the attribute raises the first group (he) more than the second (she).

A target of n word pieces gets n masks; an attribute of m pieces gets m masks in the prior sentence (the metric asks
``MultiMaskLogprobs`` of the sentences with one ``[MASK]`` per word; the model's tokenizer counts the pieces when it
answers). How a multi-piece target's probability is read, and where, are the two options shared with CBS
(``metrics/cbs.py``):
  * ``piece_product``: ``aligned`` = product of piece j's probability at mask j; ``reference`` = Ahn & Oh's
    product over every piece at every target mask (their ``score.py``). Equal for one-piece targets.
  * ``target_positions``: ``aligned`` = the masks of the [TARGET] slot; ``reference`` = Ahn & Oh's
    ``find_mask_token``: when [TARGET] comes after the attribute, the prior is read from the second mask token of
    the sentence on (off target when the attribute has several pieces).
Kurita et al.'s released code reads the prior of a target-first template one position before the attribute's mask
(``get_index(last=True)`` omits the [CLS] offset) and masks a multi-piece attribute with one [MASK]; neither is
reproduced: the paper's definition (prior at the target's own masks) is (docs/winobias_lpbs_cbs.md says why).
Reported per template (category) and overall: ``mean_lpbs``, ``mean_abs_lpbs``, ``pct_positive``.
"""
from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import pandas as pd

from biasflow.data.templates import ATTRIBUTE, ATTRIBUTES, TARGET
from biasflow.errors import ConfigError
from biasflow.schema import MetricBase
from biasflow.registry import MetricSpec, register_metric
from biasflow.score_kinds import MASK_PLACEHOLDER
from biasflow.interface.requests import MultiMaskLogprobs


class MultiMask(MetricBase):
    """The options of ``metric.lpbs``; CBS (metrics/cbs.py) takes them with the reference code's defaults."""

    piece_product: Literal["reference", "aligned"] = "aligned"
    target_positions: Literal["reference", "aligned"] = "aligned"
    attribute_mask_count: Literal["singular", "filled"] = "filled"


RULES = ("aligned", "reference")


def _attr_slot(template: str) -> str:
    return ATTRIBUTES if ATTRIBUTES in template else ATTRIBUTE


def fill(template: str, target: str, attribute: str) -> str:
    return template.replace(TARGET, target).replace(_attr_slot(template), attribute)


def target_first(template: str) -> bool:
    return template.index(TARGET) < template.index(_attr_slot(template))


def combine(matrix: np.ndarray, rule: str) -> float:
    """log P(word) from the positions x pieces log-prob matrix."""
    if rule == "aligned":
        return float(np.trace(matrix))
    return float(matrix.sum())


def word_requests(items: pd.DataFrame, words_col: str, cfg: MultiMask) -> list[tuple]:
    """(item_id, column, word, tgt|prior, MultiMaskLogprobs) for every target word of every item: the sentence with
    the attribute filled in (tgt) and with it masked too (prior); the model counts each word's masks."""
    rule = cfg.target_positions
    if rule not in RULES:
        raise ConfigError(f"target_positions={rule!r}: expected one of {RULES}")
    count_from = cfg.attribute_mask_count
    out = []
    for it in items.itertuples(index=False):
        first = target_first(it.template)
        attr_form = it.attribute_singular if count_from == "singular" else it.attribute
        tgt_text = fill(it.template, MASK_PLACEHOLDER, it.attribute)
        prior_text = fill(it.template, MASK_PLACEHOLDER, MASK_PLACEHOLDER)
        for col in words_col.split(","):
            for word in getattr(it, col):
                prior = MultiMaskLogprobs(prior_text, (word, attr_form) if first else (attr_form, word),
                                          target=0 if first else 1, position_rule=rule)
                out.append((it.item_id, col, word, "tgt", MultiMaskLogprobs(tgt_text, (word,))))
                out.append((it.item_id, col, word, "prior", prior))
    return out


def requests_for(words_col: str):
    """The ``requests(items, cfg, model_kind)`` of a metric scoring the words of ``words_col``."""
    return lambda items, cfg, model_kind: [r for *_, r in word_requests(items, words_col, cfg)]


def word_answers(items: pd.DataFrame, answers: pd.DataFrame, words_col: str, cfg: MultiMask) -> pd.DataFrame:
    """One row per (item, column, word, tgt|prior) with its answer: positions, token_ids, logprobs."""
    rows = word_requests(items, words_col, cfg)
    by_key = answers.drop_duplicates("key").set_index("key")
    keys = [r.key for *_, r in rows]
    missing = [r for (*_, r), k in zip(rows, keys) if k not in by_key.index]
    if missing:
        raise KeyError(f"no answer to {len(missing)} multi_mask requests (first: {missing[0]}); the scores file "
                       f"does not match the items or the metric config")
    got = by_key.loc[keys, ["positions", "token_ids", "logprobs"]].reset_index(drop=True)
    ids = pd.DataFrame([r[:4] for r in rows], columns=["item_id", "column", "word", "which"])
    return pd.concat([ids, got], axis=1)


def word_logprobs(scores: pd.DataFrame, rule: str) -> pd.DataFrame:
    """(item_id, column, word) -> log p_tgt, log p_prior under the piece rule."""
    if rule not in RULES:
        raise ConfigError(f"piece_product={rule!r}: expected one of {RULES}")
    vals = [combine(np.asarray(lp, float).reshape(len(p), len(i)), rule)
            for lp, p, i in zip(scores["logprobs"], scores["positions"], scores["token_ids"])]
    df = scores[["item_id", "column", "word", "which"]].assign(logp=vals)
    wide = df.pivot_table(index=["item_id", "column", "word"], columns="which", values="logp",
                          aggfunc="first").reset_index()
    wide["log_ratio"] = wide["tgt"] - wide["prior"]
    return wide


def lpbs_value(tgt1: Sequence[float], prior1: Sequence[float], tgt2: Sequence[float],
               prior2: Sequence[float]) -> float:
    """LPBS from the log-probabilities of each group's words (a group's probability = sum over its words)."""
    lse = lambda xs: float(np.logaddexp.reduce(np.asarray(xs, float)))  # noqa: E731
    return (lse(tgt1) - lse(prior1)) - (lse(tgt2) - lse(prior2))


def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: MultiMask) -> pd.DataFrame:
    scores = word_answers(items, answers, "targets_1,targets_2", cfg)
    wide = word_logprobs(scores, cfg.piece_product)
    by = {k: g for k, g in wide.groupby(["item_id", "column"])}
    rows = []
    for it in items.itertuples(index=False):
        g1, g2 = by[(it.item_id, "targets_1")], by[(it.item_id, "targets_2")]
        val = lpbs_value(g1["tgt"], g1["prior"], g2["tgt"], g2["prior"])
        rows.append({"item_id": it.item_id, "category": it.category, "template": it.template,
                     "attribute": it.attribute, "attribute_tag": getattr(it, "attribute_tag", ""),
                     "log_ratio_1": float(np.logaddexp.reduce(g1["tgt"])) - float(np.logaddexp.reduce(g1["prior"])),
                     "log_ratio_2": float(np.logaddexp.reduce(g2["tgt"])) - float(np.logaddexp.reduce(g2["prior"])),
                     "value": val})
    return pd.DataFrame(rows)


def aggregate(per_item: pd.DataFrame, cfg: MultiMask) -> pd.DataFrame:
    def block(df: pd.DataFrame, category: str) -> list[dict]:
        v = df["value"].to_numpy(float)
        n = len(v)
        nan = float("nan")
        return [{"metric": "mean_lpbs", "category": category, "value": float(v.mean()) if n else nan, "n": n},
                {"metric": "mean_abs_lpbs", "category": category, "value": float(np.abs(v).mean()) if n else nan,
                 "n": n},
                {"metric": "pct_positive", "category": category,
                 "value": 100.0 * float((v > 0).mean()) if n else nan, "n": n}]

    rows = block(per_item, "overall")
    for cat, df in per_item.groupby("category", sort=True):
        rows += block(df, cat)
    return pd.DataFrame(rows, columns=["metric", "category", "value", "n"])


SPEC = register_metric(MetricSpec(
    follows="Kurita et al. 2019 (log-probability bias score)",
    name="lpbs", options=MultiMask, benchmark="lpbs", model_kinds=("masked_lm",),
    requests=requests_for("targets_1,targets_2"), compute=compute, aggregate=aggregate,
    score_keys=("target_positions", "attribute_mask_count"), headline=("mean_lpbs", "mean_abs_lpbs"),
    plot_metric="mean_lpbs", plot_reference=0.0,
    goals={"mean_lpbs": 0.0, "mean_abs_lpbs": 0.0},
    meanings={
        "mean_lpbs": "mean LPBS: how much the attribute raises the first target group's log-probability (he) over the "
                     "second's (she); 0 = none, + = favours the first",
        "mean_abs_lpbs": "mean |LPBS|: the size of the association whichever group it favours; 0 = none",
        "pct_positive": "% of template x attribute items whose LPBS is above 0 (the attribute favours the first "
                        "target group, he); 50 = as often either way, above 50 = leans to the first",
    },
))

__all__ = ["lpbs_value", "combine", "word_requests", "requests_for", "word_answers", "word_logprobs", "compute",
           "aggregate", "fill"]
