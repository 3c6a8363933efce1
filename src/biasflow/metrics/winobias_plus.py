"""WinoBias+ gender-neutral rewriting scored by word error rate (metric ``winobias_plus``), as Vanmassenhove et al.
2021 score a rewriter: the corpus WER of the rewrites against the references.

The authors' ``evaluation/filesWER.py`` (vnmssnhv/NeuTralRewriter) calls ``jiwer.wer(references, hypotheses)`` on the
two files' lines: the word-level edit distance (substitutions + deletions + insertions) summed over all sentences,
divided by the references' word count summed over all sentences (a corpus rate, not a mean of sentence rates). Their
rewriters read the tokenised source; a language model reads the sentence as ordinary text (the prompt), and its reply
is tokenised as the references are (``biasflow.data.winobias_plus.tokenise``) before the edit distance.

The reply is read as the rewrite: its first non-empty line, without a leading ``Rewritten:`` / ``Rewritten
sentence:`` label and without quotes around the whole line. A failed request (allowed by
``generation.max_failed_fraction``) has no rewrite and is left out of the rates (``failed_pct`` counts it).

Reported overall and per category (the source's pronoun gender: male, female, both): ``wer_pct`` (100 x corpus WER;
0 = every rewrite equals its reference), ``sentence_accuracy_pct`` (% of rewrites equal to their reference, token for
token), ``copy_wer_pct`` (the WER of returning the source unchanged: what a model that rewrites nothing scores, a
reference line, not the model's), ``failed_pct``; overall ``wer_gap_female_minus_male`` (female wer_pct - male
wer_pct, points: how much worse the rewrites of sentences about women are).
"""
from __future__ import annotations

import re
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from biasflow.data.winobias_plus import tokenise
from biasflow.errors import DataFormatError
from biasflow.metrics._generated import check_choice_replies
from biasflow.registry import MetricSpec, register_metric
from biasflow.schema import GenerationSettings, Generating
from biasflow.scoring.answer import lookup
from biasflow.interface.requests import Generation
from biasflow.stats.bootstrap import rate

METRIC = "winobias_plus"
CATEGORIES = ("male", "female", "both")
DEFAULT_PROMPT = ("Rewrite the sentence in gender-neutral English, using singular they (they, them, their, "
                  "themselves) for every gendered pronoun. Change nothing else.\nSentence: {sentence}\nRewritten:")
_LABEL = re.compile(r"^\s*rewritten(\s+sentence)?\s*:\s*", re.I)


class RewriteGeneration(GenerationSettings):
    """Greedy, one rewrite per sentence; ``max_tokens`` fits the longest WinoBias+ reference (25 word pieces) with
    room. They win over the generator config's sampling settings (``+generator=...`` supplies the endpoint)."""

    overrides_generator: ClassVar[bool] = True
    temperature: float = Field(0.0, ge=0.0)
    max_tokens: int = Field(48, ge=1)

    @field_validator("count")
    @classmethod
    def _one_reply(cls, v: int) -> int:
        if v != 1:
            raise ValueError("winobias_plus asks one rewrite per sentence; use temperature 0 for a stable one")
        return v


class WinoBiasPlus(Generating):
    prompt: str = DEFAULT_PROMPT  # {sentence}: the source sentence as ordinary text
    generation: RewriteGeneration = Field(default_factory=RewriteGeneration)

    @field_validator("prompt")
    @classmethod
    def _has_sentence(cls, v: str) -> str:
        if "{sentence}" not in v:
            raise ValueError("must contain the placeholder {sentence}")
        return v


def options_of(cfg: WinoBiasPlus) -> WinoBiasPlus:
    return WinoBiasPlus.model_validate(cfg)


# ----------------------------------------------------------------------------------------------- reading
def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level Levenshtein distance: the fewest substitutions, deletions and insertions turning ``reference``
    into ``hypothesis``."""
    row = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, start=1):
        diagonal, row[0] = row[0], i
        for j, hyp_word in enumerate(hypothesis, start=1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ref_word != hyp_word))
    return row[-1]


def rewrite_of(reply: Any) -> str:
    """The rewrite in a reply: its first non-empty line, without a ``Rewritten:`` label or enclosing quotes."""
    if not isinstance(reply, str):
        return ""
    line = next((x.strip() for x in reply.splitlines() if x.strip()), "")
    line = _LABEL.sub("", line).strip()
    if len(line) >= 2 and ((line[0] == line[-1] and line[0] in "\"'") or (line[0], line[-1]) == ("\u201c", "\u201d")):
        line = line[1:-1].strip()
    return line


def prompts(items: pd.DataFrame, opts: WinoBiasPlus) -> list[str]:
    return [opts.prompt.format(sentence=s) for s in items["source_text"]]


def generation_request(prompt: str, opts: WinoBiasPlus) -> Generation:
    g = opts.generation
    return Generation(prompt, sample_index=0, system_prompt=g.system_prompt, temperature=g.temperature,
                      max_tokens=g.max_tokens, seed=g.seed)


def requests(items: pd.DataFrame, cfg: WinoBiasPlus, model_kind: str) -> list[Generation]:
    """One rewrite per sentence."""
    opts = options_of(cfg)
    return [generation_request(p, opts) for p in prompts(items, opts)]


# ----------------------------------------------------------------------------------------------- per item
def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: WinoBiasPlus) -> pd.DataFrame:
    """One row per sentence: the ``response``, its ``rewrite`` (tokenised), ``status`` (ok | failed), ``edits``
    (word edit distance to the reference; None when failed), ``reference_words``, ``exact`` (0/1) and
    ``copy_edits`` (the source's own distance to the reference)."""
    if items.empty:
        raise DataFormatError("WinoBias+: no items")
    opts = options_of(cfg)
    asked = [generation_request(p, opts) for p in prompts(items, opts)]
    replies = lookup(answers, asked, "response")
    status = lookup(answers, asked, "status") if "status" in answers else ["ok"] * len(asked)
    rows = []
    for item, reply, st in zip(items.itertuples(index=False), replies, status):
        reference = item.reference.split()
        ok = st == "ok"
        rewrite = tokenise(rewrite_of(reply)) if ok else []
        edits = edit_distance(reference, rewrite) if ok else None
        rows.append({"item_id": item.item_id, "metric": METRIC, "category": item.category, "line": item.line,
                     "source": item.source, "reference": item.reference,
                     "response": reply if isinstance(reply, str) else None, "rewrite": " ".join(rewrite),
                     "status": "ok" if ok else "failed", "edits": edits, "reference_words": len(reference),
                     "exact": int(ok and rewrite == reference), "answered": int(ok),
                     "copy_edits": edit_distance(reference, item.source.split())})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- aggregate
def _rates(df: pd.DataFrame) -> dict[str, float]:
    ok = df[df["answered"] == 1]
    words, ok_words = float(df["reference_words"].sum()), float(ok["reference_words"].sum())
    nan = float("nan")
    return {"wer_pct": 100.0 * float(ok["edits"].astype(float).sum()) / ok_words if ok_words else nan,
            "sentence_accuracy_pct": 100.0 * float(ok["exact"].mean()) if len(ok) else nan,
            "copy_wer_pct": 100.0 * float(df["copy_edits"].sum()) / words if words else nan,
            "failed_pct": 100.0 * (1.0 - float(df["answered"].mean())) if len(df) else nan}


def aggregate(per_item: pd.DataFrame, cfg: WinoBiasPlus) -> pd.DataFrame:
    rows, wer = [], {}
    for category in ("overall", *CATEGORIES):
        sub = per_item if category == "overall" else per_item[per_item["category"] == category]
        if not len(sub) and category != "overall":
            continue
        rates = _rates(sub)
        wer[category] = rates["wer_pct"]
        answered = int(sub["answered"].sum())
        counts = {"wer_pct": answered, "sentence_accuracy_pct": answered, "copy_wer_pct": len(sub),
                  "failed_pct": len(sub)}
        rows += [{"metric": m, "category": category, "value": v, "n": counts[m]} for m, v in rates.items()]
    n_gendered = int(per_item["category"].isin(["male", "female"]).sum())
    rows.append({"metric": "wer_gap_female_minus_male", "category": "overall",
                 "value": wer.get("female", float("nan")) - wer.get("male", float("nan")), "n": n_gendered})
    return pd.DataFrame(rows, columns=["metric", "category", "value", "n"])


def bootstrap_statistic(per_item: pd.DataFrame, cfg: WinoBiasPlus, r) -> dict | None:
    """``aggregate`` on every replicate at once: per category the replicates' sums of word edits, reference words,
    exact rewrites, answered sentences and the unchanged source's edits (integers: exact sums), then the same
    ratios elementwise."""
    if per_item.empty:
        return {}
    if not r.one_row_per_item:
        return None
    codes, keys = pd.factorize(pd.Series(r.first_values(per_item["category"])))
    answered = per_item["answered"].to_numpy(dtype=np.int64)
    words = per_item["reference_words"].to_numpy(dtype=np.int64)
    columns = (per_item["edits"].fillna(0).to_numpy(dtype=np.int64) * answered, words * answered,
               per_item["exact"].to_numpy(dtype=np.int64), answered,
               per_item["copy_edits"].to_numpy(dtype=np.int64), words)
    n, edits, ok_words, exact, ok, copy, all_words = r.totals_by(codes, len(keys),
                                                                 *(r.item_values(c) for c in columns))
    out, wer = {}, {}
    for category in ("overall", *CATEGORIES):
        sel = np.ones(len(keys), bool) if category == "overall" else np.asarray(keys) == category
        if not sel.any():
            continue
        total = [s[:, sel].sum(axis=1) for s in (n, edits, ok_words, exact, ok, copy, all_words)]
        wer[category] = rate(total[1], total[2])
        out[("wer_pct", category)] = wer[category]
        out[("sentence_accuracy_pct", category)] = rate(total[3], total[4])
        out[("copy_wer_pct", category)] = rate(total[5], total[6])
        out[("failed_pct", category)] = rate(total[0] - total[4], total[0])
    nan = np.full(r.n_boot, np.nan)
    out[("wer_gap_female_minus_male", "overall")] = wer.get("female", nan) - wer.get("male", nan)
    return out


def generation_prompts(items: pd.DataFrame, cfg: WinoBiasPlus):
    """(item id, prompt) of every sentence asked (names the prompts a responses file lacks)."""
    return list(zip(items["item_id"], prompts(items, options_of(cfg))))


check_answers = check_choice_replies(METRIC, generation_prompts)


SPEC = register_metric(MetricSpec(
    follows="Vanmassenhove et al. 2021 (corpus WER as their evaluation/filesWER.py, jiwer.wer)",
    name=METRIC, benchmark="winobias_plus", model_kinds=("causal_lm", "served_causal_lm"),
    requests=requests, compute=compute, aggregate=aggregate, options=WinoBiasPlus,
    score_keys=("prompt", "generation", "generator"),
    headline=("wer_pct", "sentence_accuracy_pct", "wer_gap_female_minus_male"),
    plot_metric="wer_pct", check_answers=check_answers, bootstrap_statistic=bootstrap_statistic,
    goals={"wer_pct": "min", "sentence_accuracy_pct": "max", "wer_gap_female_minus_male": 0.0,
           "copy_wer_pct": None, "failed_pct": None},
    meanings={
        "wer_pct": "100 x corpus word error rate of the model's gender-neutral rewrites against the WinoBias+ "
                   "references (word edits / reference words, summed over sentences); 0 = every rewrite exact",
        "sentence_accuracy_pct": "% of rewrites equal to their reference, token for token; 100 = best",
        "copy_wer_pct": "the word error rate of leaving each sentence unchanged (a reference line, not the model's "
                        "score): a wer_pct near it means the model rewrote little",
        "failed_pct": "% of sentences whose request failed (left out of the rates); 0 = all answered",
        "wer_gap_female_minus_male": "wer_pct on sentences with female pronouns minus on sentences with male "
                                     "pronouns (points); 0 = rewritten equally well, above 0 = worse for women",
    }))

__all__ = ["WinoBiasPlus", "edit_distance", "rewrite_of", "requests", "compute", "aggregate", "bootstrap_statistic",
           "SPEC", "DEFAULT_PROMPT"]
