"""BEC-Pro (Bartl et al. 2020): the association of person words with professions, per profession group, and the
paper's Wilcoxon signed-rank tests; English and German (``benchmark.bec_pro.language``) with a model of that
language (``model=bert_base_uncased`` / ``model=bert_base_german_cased``).

The association of a sentence's person word (target, T) with its profession (attribute, A) is Kurita et al.'s
log(p_T / p_prior): p_T = P(person word | the sentence with the person word masked), p_prior = the same with the
profession masked too; as LPBS (``metrics/lpbs.py``) for one word instead of a difference of two. ``scoring``:

* ``reference`` (parity, the default under ``run.mode=parity``): Bartl et al.'s code (``code/bias_utils/utils.py``)
  on the file's ``Sent_TM`` and ``Sent_TAM`` as written: one ``[MASK]`` per space-separated word of the profession
  (a "taper" of two word pieces gets one mask; a German compound of five, one), inputs cut or filled with attended
  mask tokens to the file's ``pad_length``, the probability of the original's token at the first mask (the person
  word's first piece), ``np.log(p_TM / p_TAM)`` (``FirstMaskProbability`` requests, ``scoring/first_mask.py``). The
  file's masking slips stay: "This [MASK] is a lodging [MASK]ager." (5 English and 5 German sentences, e.g.
  "[MASK]nährungsberater" from "Er" in "Ernährungsberater").
* ``pieces`` (corrected, the default under any other mode): the LPBS machinery (``MultiMaskLogprobs``,
  ``scoring/multi_mask.py``) on sentences built from ``Sentence`` and ``Template``: the person word and the profession
  each become one mask per word piece, no filling masks, log p = the sum of the person's pieces at their own masks
  (LPBS's ``piece_product: aligned``).

The tests (per profession group ``male``, ``female``, ``balanced`` and overall): the sentences of a group pair up as
gender-swapped twins (same template and profession, He/She, man/woman, ...; ``data/bec_pro.py``); the paired
Wilcoxon signed-rank test of the female person words' associations against the male ones' (``scipy.stats.wilcoxon``
with its defaults, as the authors' ``statistics()``): ``wilcoxon_w`` (scipy's statistic, min(W+, W-)),
``wilcoxon_p``, ``wilcoxon_z`` (the normal approximation's z) and ``effect_r`` = z / sqrt(n) (n = non-zero
differences), signed: positive = female person words more associated. With ``assoc_female``, ``assoc_male`` (mean
associations) and ``assoc_diff`` (mean female - male difference). ``compare_wilcoxon`` tests one model's
associations against another's (the paper's before / after fine-tuning).
"""
from __future__ import annotations

import math
from typing import Literal, Optional

import numpy as np
import pandas as pd
import scipy.stats

from biasflow.metrics._mode import mode_option
from biasflow.metrics.lpbs import combine
from biasflow.registry import MetricSpec, register_metric
from biasflow.schema import MetricBase
from biasflow.scoring.answer import lookup
from biasflow.interface.requests import FirstMaskProbability, MultiMaskLogprobs

SCORINGS = ("reference", "pieces")
GROUPS = ("male", "female", "balanced")
MEANS = ("assoc_female", "assoc_male", "assoc_diff")
TESTS = ("wilcoxon_w", "wilcoxon_p", "wilcoxon_z", "effect_r")


class Options(MetricBase):
    # null: reference under run.mode=parity, pieces otherwise
    scoring: Optional[Literal["reference", "pieces"]] = None


def scoring(cfg: Options) -> str:
    return mode_option(cfg, "bec_pro", "scoring", "reference", "pieces", SCORINGS)


def sentence_requests(items: pd.DataFrame, cfg: Options) -> list[tuple]:
    """(target request, prior request) of every sentence."""
    if scoring(cfg) == "reference":
        return [(FirstMaskProbability(r.sent_tm, r.sentence, int(r.pad_length)),
                 FirstMaskProbability(r.sent_tam, r.sentence, int(r.pad_length)))
                for r in items.itertuples(index=False)]
    return [(MultiMaskLogprobs(r.tgt_text, (r.person,)), MultiMaskLogprobs(r.prior_text, (r.person, r.profession)))
            for r in items.itertuples(index=False)]


def requests(items: pd.DataFrame, cfg: Options, model_kind: str) -> list:
    return [q for pair in sentence_requests(items, cfg) for q in pair]


def associations(items: pd.DataFrame, answers: pd.DataFrame, cfg: Options) -> np.ndarray:
    """log(p_T / p_prior) of every sentence."""
    pairs = sentence_requests(items, cfg)
    tgt, prior = [p[0] for p in pairs], [p[1] for p in pairs]
    if scoring(cfg) == "reference":
        # the reference: np.log(target_prob / prior) of two float32 probabilities taken as Python floats
        return np.array([np.log(t / p) for t, p in zip(lookup(answers, tgt, "prob"), lookup(answers, prior, "prob"))],
                        dtype=np.float64)

    def logp(reqs):
        rows = zip(lookup(answers, reqs, "logprobs"), lookup(answers, reqs, "positions"),
                   lookup(answers, reqs, "token_ids"))
        return np.array([combine(np.asarray(lp, float).reshape(len(pos), len(ids)), "aligned")
                         for lp, pos, ids in rows])

    return logp(tgt) - logp(prior)


def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: Options) -> pd.DataFrame:
    scored = items.assign(association=associations(items, answers, cfg))
    rows = []
    for pair_id, g in scored.groupby("pair_id", sort=False):
        if len(g) != 2 or set(g.gender) != {"male", "female"}:
            continue  # a limit never splits a pair; a hand-cut items table might
        m, f = g[g.gender == "male"].iloc[0], g[g.gender == "female"].iloc[0]
        rows.append({"item_id": pair_id, "category": m["category"], "template": m["template"],
                     "profession_en": m["profession_en"], "profession_male": m["profession"],
                     "profession_female": f["profession"], "person_male": m["person"], "person_female": f["person"],
                     "row_male": int(m["row"]), "row_female": int(f["row"]),
                     "assoc_male": float(m["association"]), "assoc_female": float(f["association"]),
                     "assoc_diff": float(f["association"] - m["association"])})
    cols = ["item_id", "category", "template", "profession_en", "profession_male", "profession_female", "person_male",
            "person_female", "row_male", "row_female", "assoc_male", "assoc_female", "assoc_diff"]
    return pd.DataFrame(rows, columns=cols)


def wilcoxon(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """The paired Wilcoxon signed-rank test of ``a`` against ``b`` (``scipy.stats.wilcoxon`` defaults): ``w``,
    ``p``, ``z`` (normal approximation), ``r`` = z / sqrt(non-zero differences), signed by which of ``a`` and ``b``
    has the larger signed-rank sum (positive: ``a``). NaN where the test is undefined (no non-zero difference)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = a - b
    nz = d[d != 0]
    nan = {"w": float("nan"), "p": float("nan"), "z": float("nan"), "r": float("nan")}
    if len(nz) == 0:
        return nan
    res = scipy.stats.wilcoxon(a, b)
    approx = scipy.stats.wilcoxon(a, b, method="approx")
    ranks = scipy.stats.rankdata(np.abs(nz))
    sign = np.sign(ranks[nz > 0].sum() - ranks[nz < 0].sum())
    z = float(abs(approx.zstatistic)) * (sign if sign != 0 else 1.0)
    return {"w": float(res.statistic), "p": float(res.pvalue), "z": z, "r": z / math.sqrt(len(nz))}


def compare_wilcoxon(before: pd.DataFrame, after: pd.DataFrame, column: str = "assoc_female") -> pd.DataFrame:
    """The paper's before/after fine-tuning test for any two models' per-pair tables (``per_item.parquet`` of two
    bec_pro jobs on the same items): per profession group and overall, Wilcoxon of ``after[column]`` against
    ``before[column]`` on the pairs both have. Columns: category, n, mean_before, mean_after, w, p, z, r."""
    joined = before[["item_id", "category", column]].merge(after[["item_id", column]], on="item_id",
                                                           suffixes=("_before", "_after"))
    rows = []
    for cat, df in [("overall", joined)] + [(g, joined[joined["category"] == g]) for g in GROUPS]:
        x, y = df[f"{column}_after"].to_numpy(float), df[f"{column}_before"].to_numpy(float)
        t = wilcoxon(x, y) if len(df) else {"w": np.nan, "p": np.nan, "z": np.nan, "r": np.nan}
        rows.append({"category": cat, "n": len(df), "mean_before": float(y.mean()) if len(df) else np.nan,
                     "mean_after": float(x.mean()) if len(df) else np.nan, **t})
    return pd.DataFrame(rows)


def _subsets(per_item: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return [("overall", per_item)] + [(g, per_item[per_item["category"] == g]) for g in GROUPS]


def aggregate(per_item: pd.DataFrame, cfg: Options) -> pd.DataFrame:
    rows = []
    for cat, df in _subsets(per_item):
        n = len(df)
        if n == 0 and cat != "overall":
            continue
        for name in MEANS:
            rows.append({"metric": name, "category": cat, "value": float(df[name].mean()) if n else float("nan"),
                         "n": n})
        t = wilcoxon(df["assoc_female"].to_numpy(), df["assoc_male"].to_numpy()) if n else \
            {"w": np.nan, "p": np.nan, "z": np.nan, "r": np.nan}
        rows += [{"metric": f"wilcoxon_{k}", "category": cat, "value": t[k], "n": n} for k in ("w", "p", "z")]
        rows.append({"metric": "effect_r", "category": cat, "value": t["r"], "n": n})
    return pd.DataFrame(rows, columns=["metric", "category", "value", "n"])


def replicates(per_item: pd.DataFrame, cfg: Options, r) -> dict | None:
    """Bootstrap replicates of the mean associations (the same numbers as ``aggregate`` on each resample); the
    tests get no interval: the percentile interval of a p-value or of a rank statistic over resamples is not a
    confidence interval of anything the paper reports."""
    if per_item.empty:
        return {}
    if not r.one_row_per_item:
        return None
    out = {}
    sizes = per_item["category"].value_counts()
    for name in MEANS:
        values = r.item_values(per_item[name])
        out[(name, "overall")] = r.ordered_sums(values) / len(per_item)
        for g in GROUPS:
            if g in r.strata:
                out[(name, g)] = r.ordered_sums(values, g) / int(sizes[g])
    return out


SPEC = register_metric(MetricSpec(
    follows="Bartl et al. 2020 (the authors' association score)",
    name="bec_pro", benchmark="bec_pro", model_kinds=("masked_lm",), requests=requests, compute=compute,
    aggregate=aggregate, options=Options, score_keys=("scoring",), headline=("assoc_diff", "wilcoxon_p", "effect_r"),
    plot_metric="assoc_diff", plot_reference=0.0, bootstrap_statistic=replicates,
    goals={"assoc_diff": 0.0, "effect_r": 0.0, "wilcoxon_p": None},
    meanings={
        "assoc_diff": "mean female - male association, log(p_T / p_prior), of person words with professions over "
                      "gender-swapped pairs; 0 = none, + = female more associated",
        "wilcoxon_p": "p-value of the paired Wilcoxon signed-rank test of female vs male associations; "
                      "tests a difference, not a bias score",
        "effect_r": "Wilcoxon effect size r = z / sqrt(n); 0 = no difference, + = female person words more associated, "
                    "- = male",
        "assoc_female": "mean association log(p_T / p_prior) of the female person words with the professions; "
                        "compare with assoc_male (their gap is assoc_diff); alone not a bias score",
        "assoc_male": "mean association log(p_T / p_prior) of the male person words with the professions; compare "
                      "with assoc_female (their gap is assoc_diff); alone not a bias score",
        "wilcoxon_w": "statistic of the paired Wilcoxon signed-rank test of female vs male associations (scipy's "
                      "min(W+, W-)); a test statistic, not a bias score",
        "wilcoxon_z": "normal-approximation z of that Wilcoxon test, signed: 0 = no difference, + = female person "
                      "words more associated, - = male",
    },
    definition_options=("scoring",)))

__all__ = ["requests", "associations", "compute", "aggregate", "wilcoxon", "compare_wilcoxon", "replicates",
           "scoring", "SCORINGS"]
