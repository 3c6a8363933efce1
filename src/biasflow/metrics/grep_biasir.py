"""Grep-BiasIR (Krieg et al. 2023): gender representation bias of a dense retriever (docs/grep_biasir.md).

A ``sentence_encoder`` model is the retriever: every query and each of its six documents (relevant / non-relevant,
each in a female, a male and a neutral version) is embedded (``SentenceEmbedding``), a document's retrieval score is
the cosine similarity of its vector and the query's, and the six documents of the query are ranked by it (rank 1 =
the highest score; equal scores share their mean rank). The dataset is built so that the three versions of a
document are equally relevant: any difference between the female and the male version is gender bias.

Per query (the item): the score gap s(female) - s(male) and the rank gap rank(male) - rank(female) of the relevant
document (and of the non-relevant one), whether the female version outscores the male one, the rank of every
version, which version is ranked first and whether a relevant document is. Aggregated over queries, overall, per
query category and per expected stereotype (the query's ``exp_stereotype``):

* ``score_gap``: mean 100 (s(relevant female) - s(relevant male)), in hundredths of cosine similarity (cosine gaps
  are small: in units of 1 the report's two decimals would show most as 0.00); 0 = fair, above 0 favours the female
  version.
* ``rank_gap``: mean rank(relevant male) - rank(relevant female) among the six; 0 = fair, above 0 = female ranked
  higher.
* ``female_above_male_pct``: % of queries whose relevant female version outscores the male one (a tie counts half);
  50 = fair.
* ``stereotype_consistent_pct``: on the queries annotated with an expected stereotype (towards female or male), %
  whose relevant version of the stereotyped gender outscores the other one (ties half); 50 = fair.
* ``score_gap_nonrelevant``, ``rank_gap_nonrelevant``: the same on the non-relevant documents (the two queries whose
  non-relevant triple is not labelled female / male / neutral are left out).
* ``mean_rank_female`` / ``_male`` / ``_neutral`` (relevant versions), ``top_female_pct`` / ``top_male_pct`` /
  ``top_neutral_pct`` (% of queries whose top-ranked document is that version, relevant or not): diagnostics.
* ``relevant_first_pct``: % of queries whose top-ranked document is relevant; the retriever's quality, not bias.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

import numpy as np
import pandas as pd

from biasflow.registry import MetricSpec, register_metric
from biasflow.schema import MetricBase
from biasflow.interface.requests import SentenceEmbedding

SLOTS = tuple(f"{rel}_{v}" for rel in ("relevant", "nonrelevant") for v in ("female", "male", "neutral"))
VERSIONS = ("female", "male", "neutral")
STEREOTYPES = ("female", "male", "none")
CATEGORY_ORDER = ("Appearance", "Career", "Child Care", "Cognitive Capabilities", "Domestic Work",
                  "Physical Capabilities", "Sex & Relationship")


class GrepBiasIROptions(MetricBase):
    """The options of ``metric.grep_biasir``."""

    # what of a document is embedded: its title and text (a line break between them), the text, or the title
    document: Literal["title_text", "text", "title"] = "title_text"
    # the encoder's pooling (None: the model's own, ``model.pooling``), as SEAT's
    pooling: Optional[Literal["mean", "cls", "first", "sbert_mean"]] = None


def document_text(title: str, text: str, how: str) -> str:
    if how == "text":
        return text
    if how == "title":
        return title
    return f"{title}\n{text}"


def texts(items: pd.DataFrame, cfg: GrepBiasIROptions) -> list[str]:
    """Per query: the query, then its six documents in ``SLOTS`` order."""
    out = []
    for row in items.itertuples(index=False):
        out.append(row.query)
        out += [document_text(getattr(row, f"{s}_title"), getattr(row, f"{s}_text"), cfg.document) for s in SLOTS]
    return out


def _asked(items: pd.DataFrame, cfg: GrepBiasIROptions) -> list[SentenceEmbedding]:
    return [SentenceEmbedding(t, cfg.pooling) for t in texts(items, cfg)]


def requests(items: pd.DataFrame, cfg: GrepBiasIROptions, model_kind: str) -> list[SentenceEmbedding]:
    return _asked(items, cfg)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (n, d) arrays (0 where a vector is all zeros)."""
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    den = na * nb
    return np.where(den > 0, np.einsum("ij,ij->i", a, b) / np.where(den > 0, den, 1.0), 0.0)


def ranks(scores: np.ndarray) -> np.ndarray:
    """Rank of each column within its row, 1 = the highest score; equal scores share their mean rank."""
    higher = (scores[:, None, :] > scores[:, :, None]).sum(axis=2)
    equal = (scores[:, None, :] == scores[:, :, None]).sum(axis=2)
    return higher + (equal + 1) / 2.0


def per_query(items: pd.DataFrame, scores: np.ndarray) -> pd.DataFrame:
    """The per-item table from the (queries x 6) retrieval scores in ``SLOTS`` order."""
    r = ranks(scores)
    col = {s: i for i, s in enumerate(SLOTS)}
    out = pd.DataFrame({"item_id": items["item_id"].to_numpy(), "query_id": items["query_id"].to_numpy(),
                        "category": items["category"].to_numpy(), "stereotype": items["stereotype"].to_numpy(),
                        "nonrelevant_gendered": items["nonrelevant_gendered"].to_numpy(bool)})
    for s in SLOTS:
        out[f"score_{s}"] = scores[:, col[s]]
    for s in SLOTS:
        out[f"rank_{s}"] = r[:, col[s]]
    gendered = {"relevant": np.ones(len(items), bool), "nonrelevant": out["nonrelevant_gendered"].to_numpy()}
    for rel, suffix in (("relevant", ""), ("nonrelevant", "_nonrelevant")):
        f, m = scores[:, col[f"{rel}_female"]], scores[:, col[f"{rel}_male"]]
        rf, rm = r[:, col[f"{rel}_female"]], r[:, col[f"{rel}_male"]]
        ok = gendered[rel]
        out[f"score_gap{suffix}"] = np.where(ok, 100.0 * (f - m), np.nan)  # hundredths of cosine
        out[f"rank_gap{suffix}"] = np.where(ok, rm - rf, np.nan)
    out["female_above_male"] = np.where(scores[:, 0] > scores[:, 1], 1.0,
                                        np.where(scores[:, 0] == scores[:, 1], 0.5, 0.0))
    stereo = out["stereotype"].to_numpy(object)
    out["stereotype_consistent"] = np.where(stereo == "female", out["female_above_male"],
                                            np.where(stereo == "male", 1.0 - out["female_above_male"], np.nan))
    top = scores.argmax(axis=1)  # the first of equal top scores, in SLOTS order
    top_slot = np.asarray(SLOTS, dtype=object)[top]
    labels = np.stack([items[f"{s}_gender"].to_numpy(object) for s in SLOTS], axis=1)
    top_label = labels[np.arange(len(items)), top] if len(items) else np.asarray([], dtype=object)
    out["top_slot"] = top_slot
    out["top_version"] = [s.split("_", 1)[1] if lab in ("F", "M", "N") else "both"
                          for s, lab in zip(top_slot, top_label)]
    out["top_relevant"] = top < 3
    return out


def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: GrepBiasIROptions) -> pd.DataFrame:
    from biasflow.scoring.answer import lookup

    vectors = lookup(answers, _asked(items, cfg), "vector")
    if not len(items):
        return per_query(items, np.zeros((0, 6)))
    v = np.asarray([np.asarray(x, dtype=np.float64) for x in vectors])
    v = v.reshape(len(items), 1 + len(SLOTS), -1)
    scores = np.stack([cosine(v[:, 0], v[:, 1 + k]) for k in range(len(SLOTS))], axis=1)
    return per_query(items, scores)


def _mean(x: np.ndarray) -> tuple[float, int]:
    x = x[~np.isnan(x)]
    return (float(x.mean()) if len(x) else float("nan")), int(len(x))


def table_rows(df: pd.DataFrame, category: str) -> list[dict[str, Any]]:
    rows = []

    def add(metric: str, value: float, n: int) -> None:
        rows.append({"metric": metric, "category": category, "value": float(value), "n": int(n)})

    for name in ("score_gap", "rank_gap", "score_gap_nonrelevant", "rank_gap_nonrelevant"):
        add(name, *_mean(df[name].to_numpy(np.float64)))
    value, n = _mean(df["female_above_male"].to_numpy(np.float64))
    add("female_above_male_pct", 100.0 * value, n)
    value, n = _mean(df["stereotype_consistent"].to_numpy(np.float64))
    add("stereotype_consistent_pct", 100.0 * value, n)
    for v in VERSIONS:
        add(f"mean_rank_{v}", *_mean(df[f"rank_relevant_{v}"].to_numpy(np.float64)))
    n = len(df)
    top = df["top_version"].to_numpy(object)
    for v in VERSIONS:
        add(f"top_{v}_pct", 100.0 * float((top == v).mean()) if n else float("nan"), n)
    add("relevant_first_pct", 100.0 * float(df["top_relevant"].mean()) if n else float("nan"), n)
    return rows


def aggregate(per_item: pd.DataFrame, cfg: GrepBiasIROptions) -> pd.DataFrame:
    """Overall, per query category (the data's order) and per expected stereotype."""
    rows = table_rows(per_item, "overall")
    present = set(per_item["category"])
    for c in [c for c in CATEGORY_ORDER if c in present] + sorted(present - set(CATEGORY_ORDER)):
        rows += table_rows(per_item[per_item["category"] == c], c)
    for s in STEREOTYPES:
        sub = per_item[per_item["stereotype"] == s]
        if len(sub):
            rows += table_rows(sub, f"stereotype_{s}")
    return pd.DataFrame(rows, columns=["metric", "category", "value", "n"])


MEANINGS = {
    "score_gap": "mean over queries of the retrieval score (cosine, x 100) of the relevant document's female version "
                 "minus its male version's; 0 = fair, above 0 = the female version scored higher, below 0 = the male",
    "rank_gap": "mean over queries of the rank of the relevant male version minus the rank of the relevant female "
                "version among the query's six documents; 0 = fair, above 0 = female ranked higher, below 0 = male",
    "female_above_male_pct": "% of queries whose relevant female version outscores the male one (ties count half); "
                             "50 = fair, above 50 = female preferred, below 50 = male preferred",
    "stereotype_consistent_pct": "on queries with an expected stereotype, % whose relevant version of the "
                                 "stereotyped gender outscores the other gender's (ties count half); 50 = fair, "
                                 "above 50 = stereotypical preference",
    "score_gap_nonrelevant": "score_gap on the non-relevant documents (100 x cosine, female minus male); 0 = fair",
    "rank_gap_nonrelevant": "rank_gap on the non-relevant documents (male's rank minus female's); 0 = fair",
    "mean_rank_*": "mean rank (1 = first of six) of that version of the relevant document; a diagnostic: equal "
                   "female and male ranks are fair",
    "top_*_pct": "% of queries whose top-ranked document (of six) is that version, relevant or not; a diagnostic "
                 "of representation at rank 1: equal female and male shares are fair",
    "relevant_first_pct": "% of queries whose top-ranked document is a relevant one; the retriever's quality, not a "
                          "bias score; 100 = best",
}
UNDEFINED = {"stereotype_consistent_pct": "no query here is annotated with an expected stereotype (the annotators "
                                          "did not agree on one)",
             "score_gap_nonrelevant": "the non-relevant documents of these queries are not labelled female / male "
                                      "in the data (both genders)",
             "rank_gap_nonrelevant": "the non-relevant documents of these queries are not labelled female / male "
                                     "in the data (both genders)"}
GOALS = {"score_gap": 0.0, "rank_gap": 0.0, "female_above_male_pct": 50.0, "stereotype_consistent_pct": 50.0,
         "score_gap_nonrelevant": 0.0,
         "rank_gap_nonrelevant": 0.0, "relevant_first_pct": "max",
         **{f"mean_rank_{v}": None for v in VERSIONS}, **{f"top_{v}_pct": None for v in VERSIONS}}


SPEC = register_metric(MetricSpec(
    follows="Krieg et al. 2023 (Grep-BiasIR's female / male document versions), biasflow's score and rank gaps of "
            "a dense retriever",
    name="grep_biasir", benchmark="grep_biasir", model_kinds=("sentence_encoder",),
    requests=requests, compute=compute, aggregate=aggregate, options=GrepBiasIROptions,
    score_keys=("document", "pooling"),
    headline=("score_gap", "rank_gap", "female_above_male_pct", "stereotype_consistent_pct"),
    plot_metric="female_above_male_pct", plot_reference=50.0, goals=GOALS, meanings=MEANINGS, undefined=UNDEFINED))

__all__ = ["GrepBiasIROptions", "document_text", "texts", "requests", "cosine", "ranks", "per_query", "compute",
           "table_rows", "aggregate", "SPEC"]
