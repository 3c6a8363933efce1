"""LPBS, the log-probability bias score of Kurita et al. (2019), for masked LMs.

For a template ("[TARGET] is a [ATTRIBUTE].") and an attribute ("programmer"):
  p_tgt(t)   = P(target word t at the [TARGET] masks | template with the attribute filled in)
  p_prior(t) = P(t at the [TARGET] masks | template with the attribute masked too)
  LPBS       = log(p_tgt(t1)/p_prior(t1)) - log(p_tgt(t2)/p_prior(t2))
A group of several words (``targets.yaml``) has the sum of its words' probabilities (the reference's
``bias_calculator.py``). Positive LPBS = the attribute raises the first group (he) more than the second (she).

A target of n word pieces gets n masks; an attribute of m pieces gets m masks in the prior sentence. How a
multi-piece target's probability is read, and where, are the two options shared with CBS (``metrics/cbs.py``):
  * ``piece_product``: ``aligned`` = product of piece j's probability at mask j; ``reference`` = Ahn & Oh's
    product over every piece at every target mask (their ``score.py``). Equal for one-piece targets.
  * ``target_positions``: ``aligned`` = the masks of the [TARGET] slot; ``reference`` = Ahn & Oh's
    ``find_mask_token``: when [TARGET] comes after the attribute, the prior is read from the second mask token of
    the sentence on (off target when the attribute has several pieces).
Kurita's own notebook reads the prior at the attribute's mask when the target comes first (``use_last_mask``);
that slip is not reproduced: the paper's definition (prior at the target) is.
Reported per template (category) and overall: ``mean_lpbs``, ``mean_abs_lpbs``, ``pct_positive``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from biasflow.data.templates import ATTRIBUTE, ATTRIBUTES, TARGET
from biasflow.errors import ConfigError
from biasflow.registry import MetricSpec, ScoreContext, register_metric
from biasflow.score_kinds import MASK_PLACEHOLDER, MULTI_MASK_KIND

RULES = ("aligned", "reference")


def masks(n: int) -> str:
    return " ".join([MASK_PLACEHOLDER] * n)


def _attr_slot(template: str) -> str:
    return ATTRIBUTES if ATTRIBUTES in template else ATTRIBUTE


def fill(template: str, target: str, attribute: str) -> str:
    return template.replace(TARGET, target).replace(_attr_slot(template), attribute)


def target_first(template: str) -> bool:
    return template.index(TARGET) < template.index(_attr_slot(template))


def read_positions(ids: Sequence[int], mask_id: int, n_target: int, n_attr_masks: int, first: bool,
                   rule: str) -> list[int]:
    """Token positions the target's probability is read from, in a sentence whose masks are the target's n and
    (prior sentence) the attribute's m."""
    mpos = [i for i, t in enumerate(ids) if t == mask_id]
    if len(mpos) != n_target + n_attr_masks:
        raise ValueError(f"expected {n_target + n_attr_masks} masks, found {len(mpos)}")
    if first or n_attr_masks == 0:
        return mpos[:n_target]
    if rule == "aligned":
        return mpos[n_attr_masks:n_attr_masks + n_target]
    # reference (Ahn & Oh find_mask_token with last=True): skip the first mask token, read n positions from the next
    start = mpos[1]
    return list(range(start, start + n_target))


def combine(matrix: np.ndarray, rule: str) -> float:
    """log P(word) from the positions x pieces log-prob matrix."""
    if rule == "aligned":
        return float(np.trace(matrix))
    return float(matrix.sum())


def requests_for(tokenizer, normalise, items: pd.DataFrame, words_col: str, cfg: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (item, target word, tgt|prior) with the text, read positions and piece ids."""
    from biasflow.scoring.multi_mask import encode, word_pieces

    rule = cfg.get("target_positions", "aligned")
    if rule not in RULES:
        raise ConfigError(f"target_positions={rule!r}: expected one of {RULES}")
    count_from = cfg.get("attribute_mask_count", "filled")
    rows = []
    for it in items.itertuples(index=False):
        first = target_first(it.template)
        attr_form = it.attribute_singular if count_from == "singular" else it.attribute
        m = len(word_pieces(tokenizer, normalise(attr_form)))
        for col in words_col.split(","):
            for word in getattr(it, col):
                pieces = word_pieces(tokenizer, normalise(word))
                n = len(pieces)
                for which, attr_text, n_attr in (("tgt", it.attribute, 0), ("prior", masks(m), m)):
                    text = normalise(fill(it.template, masks(n), attr_text)).replace(
                        MASK_PLACEHOLDER.lower(), MASK_PLACEHOLDER)
                    ids = encode(tokenizer, text)
                    pos = read_positions(ids, tokenizer.mask_token_id, n, n_attr, first, rule)
                    rows.append({"item_id": it.item_id, "column": col, "word": word, "which": which,
                                 "text": text, "positions": pos, "token_ids": pieces})
    return pd.DataFrame(rows)


def score_words(ctx: ScoreContext, words_col: str) -> pd.DataFrame:
    """Model stage shared by LPBS and CBS: one row per (item, word, tgt|prior) with its log-prob matrix."""
    from biasflow.scoring.cache import ScoreCache
    from biasflow.scoring.multi_mask import multi_mask_table

    model = ctx.model
    req = requests_for(model.tokenizer, model.normalise, ctx.items, words_col, ctx.metric_cfg)
    cache = ScoreCache(ctx.cache_dir, model.fingerprint, MULTI_MASK_KIND)
    table = multi_mask_table(model, req["text"].tolist(), req["positions"].tolist(), req["token_ids"].tolist(),
                             cache=cache, batch_tokens=int(ctx.model_cfg.get("batch_tokens", 8192)))
    lp = {(t, tuple(p), tuple(i)): v for t, p, i, v in zip(table["text"], table["positions"], table["token_ids"],
                                                          table["logprobs"])}
    req["logprobs"] = [list(lp[(t, tuple(p), tuple(i))]) for t, p, i in
                       zip(req["text"], req["positions"], req["token_ids"])]
    req.insert(0, "kind", MULTI_MASK_KIND)
    return req


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


def compute(items: pd.DataFrame, scores: pd.DataFrame, cfg: Mapping[str, Any]) -> pd.DataFrame:
    wide = word_logprobs(scores, cfg.get("piece_product", "aligned"))
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


def aggregate(per_item: pd.DataFrame, cfg: Mapping[str, Any]) -> pd.DataFrame:
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
    name="lpbs", benchmark="lpbs", model_kinds=("masked_lm",),
    score=lambda ctx: score_words(ctx, "targets_1,targets_2"), compute=compute, aggregate=aggregate,
    score_keys=("target_positions", "attribute_mask_count"), headline=("mean_lpbs", "mean_abs_lpbs"),
    plot_metric="mean_lpbs", plot_reference=0.0))

__all__ = ["lpbs_value", "read_positions", "combine", "requests_for", "score_words", "word_logprobs", "compute",
           "aggregate", "fill", "masks"]
