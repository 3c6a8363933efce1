"""SEAT: the Sentence Encoder Association Test (May et al. 2019).

Each WEAT word becomes bleached sentences ("This is Adam.", "This is a rose.", "They are happy.", ...) from the
templates in ``resources/seat/templates.yaml`` (sent-bias's ``generate_basic_contexts.py`` rules and templates);
``requests`` asks a ``sentence_encoder`` model for each sentence's vector (``SentenceEmbedding``: text and the
metric's ``pooling``, None = the encoder's own) and ``compute`` runs the WEAT statistics of
:mod:`biasflow.metrics.weat` on the answers. Within a set, a repeated sentence counts
once (sent-bias and bias-bench key encodings by text). When the two target sets get different numbers of
sentences, ``balance: truncate`` keeps a seeded random, order-preserving subset of the longer one (sent-bias's
``truncate_lists``; its script was not seeded, so its shipped ``sent-weatN.jsonl`` files are one such draw).
"""
from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from biasflow.metrics import weat as W
from biasflow.registry import MetricSpec, register_metric
from biasflow.interface.requests import SentenceEmbedding


@lru_cache(maxsize=1)
def templates() -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(resources.files("biasflow").joinpath("resources/seat/templates.yaml").read_text())
    data["_person_re"] = re.compile(data["person_pattern"])
    for key in ("adjectives", "mass_nouns", "plural_noun_terms", "verbs"):
        data[key] = frozenset(data[key])
    return data


def _fill(template: str, term: str) -> str:
    article = "an" if term[:1] in "aeiouAEIOU" and term else "a"
    sentence = template.format(article=article, term=term)
    return sentence[0].upper() + sentence[1:]


def _singularize(term: str) -> str:
    if term == "children":
        return "child"
    return term[:-1] if term.endswith("s") else term


def _pluralize(term: str) -> str:
    if re.search(r"\bwoman\b", term):
        return re.sub(r"\bwoman\b", "women", term)
    if re.search(r"\bman\b", term):
        return re.sub(r"\bman\b", "men", term)
    if term.endswith("y") and len(term) > 1 and term[-2] not in "aeiou":
        return term[:-1] + "ies"
    if term.endswith(("ch", "sh", "s")):
        return term + "es"
    return term + "s"


def word_class(term: str) -> str:
    t = templates()
    if term[:1].isascii() and term[:1].isupper() and not term.endswith("American"):
        return "names"
    if term in t["adjectives"]:
        return "adjectives"
    if term in t["verbs"]:
        return "verbs"
    if term in t["mass_nouns"]:
        return "mass_nouns"
    if term in ("he", "she"):
        return "subject_pronouns"
    if term in ("him", "her"):
        return "object_pronouns"
    if term in ("his", "hers"):
        return "possessive_pronouns"
    return "nouns"


def sentences_for(term: str) -> list[str]:
    """The bleached sentences of one WEAT term, in sent-bias's order."""
    t = templates()
    cls = word_class(term)
    tpl = t["templates"]
    if cls != "nouns":
        return [_fill(x, term) for x in tpl[cls]]
    if term in t["plural_noun_terms"]:
        singular, plural = _singularize(term), term
    else:
        singular, plural = term, _pluralize(term)
    person = t["_person_re"].search(term) is not None
    out = [_fill(x, singular) for x in tpl["singular_nouns"] + tpl["singular_person" if person else "singular_thing"]]
    out += [_fill(x, plural) for x in tpl["plural_nouns"] + tpl["plural_person" if person else "plural_thing"]]
    return out


def expand(items: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct sentence of each (test, set): item_id (``<word item>#<k>``), test, set, position,
    word, text, template_class."""
    rows = []
    for (test, name), group in items.sort_values(["test", "set", "position"]).groupby(["test", "set"], sort=False):
        seen: set[str] = set()
        pos = 0
        for item_id, word in zip(group["item_id"], group["word"]):
            for k, sentence in enumerate(sentences_for(str(word))):
                if sentence in seen:
                    continue
                seen.add(sentence)
                rows.append({"item_id": f"{item_id}#{k}", "word_item_id": item_id, "test": test, "set": name,
                             "position": pos, "word": word, "text": sentence, "template_class": word_class(word)})
                pos += 1
    return pd.DataFrame(rows)


def _asked(units: pd.DataFrame, cfg: W.Association | None) -> list[SentenceEmbedding]:
    pooling = (cfg.pooling if cfg is not None else None) or None  # None: the encoder's own pooling (model.pooling)
    return [SentenceEmbedding(t, pooling) for t in units["text"]]


def requests(items: pd.DataFrame, cfg: W.Association, model_kind: str) -> list[SentenceEmbedding]:
    """The vector of every bleached sentence of every word."""
    return _asked(expand(items), cfg)


def compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: W.Association) -> pd.DataFrame:
    from biasflow.scoring.answer import lookup

    units = expand(items)
    asked = _asked(units, cfg)
    units = units.assign(found=True, pooling=lookup(answers, asked, "pooling_used"),
                         vector=lookup(answers, asked, "vector"))
    return W.compute_units(units, cfg, "association")


def aggregate(per_item: pd.DataFrame, cfg: W.Association) -> pd.DataFrame:
    return W.aggregate(per_item, cfg)


register_metric(MetricSpec(
    follows="May et al. 2019 (sent-bias)",
    name="seat", options=W.Association,
    benchmark="weat",
    model_kinds=("sentence_encoder",),
    requests=requests,
    compute=compute,
    aggregate=aggregate,
    score_keys=("pooling",),
    headline=("avg_abs_effect_size", "effect_size", "p_value"),
    plot_metric="effect_size",
    plot_reference=0.0,
    bootstrap_statistic=W.bootstrap_statistic, exact_replicates=True,
    goals=W.GOALS,
    meanings={**W.MEANINGS,
              "n_partitions": "per test: C(|X|+|Y|, |X|), the ways to split the target sentences into sets of X's and "
                              "Y's sizes (the permutation test's population); a count, not a bias score",
              "n_dropped_oov": "per test: sentences of its four sets without a vector, left out; 0 with a sentence "
                               "encoder (it embeds every sentence); a count, not a bias score"},
))


def sentence_counts(items: pd.DataFrame) -> pd.DataFrame:
    """Sentences per (test, set): handy for checking the expansion against a published sent-weatN.jsonl."""
    units = expand(items)
    return units.groupby(["test", "set"]).size().unstack("set").astype(np.int64)
