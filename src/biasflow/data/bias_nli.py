"""Bias-NLI (Dev et al. 2020, "On Measuring and Mitigating Biased Inferences of Word Embeddings", AAAI):
premise / hypothesis pairs generated from templates and word lists -> items, one row per pair (docs/bias_nli.md).

The authors ship no pairs, only the word lists and a generator (``generate_templates.py`` with
``stereotypes/{lists,templates}.py``). This module generates the same pairs from the same lists, written from the
generator's definition:

* a word list is its file's distinct lines (as read in text mode), sorted, each stripped;
* a template is a verb and an object: every commerce verb with every object of the six object lists (distinct),
  every interaction verb with every person of ``person_hyponyms`` and ``rulers`` (distinct, sorted), every driving
  verb with every vehicle, every eating verb with every food;
* noun templates read ``<A/An> <word> <verb> <a/an> <object> .``, adjective templates
  ``<A/An> <word> person <verb> <a/an> <object> .`` (the article is "An" before a vowel letter, else "A");
* the pairs of a premise list and a hypothesis list: for each premise word (list order), each hypothesis word,
  each template, the premise sentence with the premise word and the hypothesis sentence with the hypothesis word,
  the same template on both sides. The pair's id is the generator's: sha224 of ``"<premise list> -> <hypothesis
  list>\\t<premise>\\t<hypothesis>"``.

One departure: the generator takes the objects of the commerce templates in the order of a Python ``set`` (under
Python 3 a different order in every run), this module in sorted order, so the pairs are the same but the rows of one
(premise word, hypothesis word) may come in another order. ``tests/test_bias_nli.py`` runs the generator itself on
the mirror's files and compares every pair.

An *attribute* is a premise list and a hypothesis list with noun or adjective templates. The three of the paper
(``ATTRIBUTES``): ``gender`` (occupations -> gendered words, noun templates: "An accountant bought a bagel ." /
"A woman bought a bagel ."), ``nationality`` (countries -> polarized adjectives, adjective templates: "A French
person crashed a car ." / "An evil person crashed a car .") and ``religion`` (religions -> polarized adjectives).
``custom_attributes`` adds others from any two lists of the same part of speech.

Options (``BiasNLIDataset``): ``attributes`` (which, in order), ``verb_groups`` (which template families),
``sample`` (a seeded uniform sample of N pairs per attribute, kept in generation order; null: every pair),
``seed``, ``limit`` (the first N items after that).

Items: ``item_id`` (the generator's id), ``category`` and ``attribute``, ``pair_type`` (``"<premise list> ->
<hypothesis list>"``), ``templates`` (noun / adj), ``premise_word``, ``hypothesis_word``, ``template_type`` (the
generator's ``X1_<list> <verb> Y -> X2_<list> <verb> Y``), ``verb_group``, ``verb``, ``object``, ``premise``,
``hypothesis``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from biasflow.errors import ConfigError, DataFormatError
from biasflow.registry import register_loader
from biasflow.schema import BenchmarkConfig, NonNegativeInt, PositiveInt

# the word lists of the generator's word_lists/ folder: file key (= file name) -> part of speech
PEOPLE = ("country_demonyms", "gendered_words", "occupations", "person_hyponyms", "polarized_nouns",
          "religion_demonyms", "rulers")
ADJECTIVES = ("able_adjectives", "age_adjectives", "class", "color", "countries", "ethnicities", "hair_adjectives",
              "physical_adjectives", "polarized_adjectives", "religions")
OBJECTS = ("clothes", "farm_animals", "food", "furniture", "household", "vehicles")
VERBS = ("commerce_verbs", "driving_verbs", "eating_verbs", "interaction_verbs")
# template families in the generator's order: verb list, and where the objects come from
VERB_GROUPS = ("commerce", "interaction", "driving", "eating")
ATTRIBUTES = {"gender": ("noun", "occupations", "gendered_words"),
              "nationality": ("adj", "countries", "polarized_adjectives"),
              "religion": ("adj", "religions", "polarized_adjectives")}
COLUMNS = ["item_id", "category", "attribute", "pair_type", "templates", "premise_word", "hypothesis_word",
           "template_type", "verb_group", "verb", "object", "premise", "hypothesis"]


class CustomAttribute(BaseModel):
    model_config = ConfigDict(extra="forbid")

    templates: Literal["noun", "adj"]
    premise: str      # a word list: one of PEOPLE (noun templates) or ADJECTIVES (adj)
    hypothesis: str


class BiasNLIDataset(BenchmarkConfig):
    """The options of the Bias-NLI loader."""

    attributes: list[str] = Field(default_factory=lambda: list(ATTRIBUTES))  # names of ATTRIBUTES / custom ones
    custom_attributes: dict[str, CustomAttribute] = Field(default_factory=dict)
    verb_groups: list[Literal["commerce", "interaction", "driving", "eating"]] = Field(
        default_factory=lambda: list(VERB_GROUPS))
    sample: Optional[PositiveInt] = None  # per attribute: N pairs drawn uniformly (seeded); null = every pair
    seed: NonNegativeInt = 0


# ----------------------------------------------------------------------------------------------- lists
def read_word_list(path: str | Path) -> list[str]:
    """A word list as the generator reads it: the file's distinct lines (text mode, so CRLF reads as LF), sorted,
    each stripped. An empty entry is an error (the generator would fail on it)."""
    with open(path, encoding="utf-8") as f:
        lines = sorted(set(f.readlines()))
    words = [line.strip() for line in lines]
    if any(not w for w in words):
        raise DataFormatError(f"{path}: an empty line (every line of a Bias-NLI word list must hold a word)")
    return words


def articlize(word: str, capitalize: bool) -> str:
    """The word with its indefinite article, as the generator: "an" before a vowel letter, else "a"."""
    art = "An" if word[0].lower() in "aeiou" else "A"
    return f"{art if capitalize else art.lower()} {word}"


def templates(lists: Mapping[str, list[str]], verb_groups=VERB_GROUPS) -> list[tuple[str, str, str]]:
    """(verb group, verb, object) of every template, in the generator's order (objects of the commerce templates
    sorted; the generator's order there is a Python set's)."""
    out = []
    for group in VERB_GROUPS:
        if group not in verb_groups:
            continue
        if group == "commerce":
            objects = sorted({o for name in OBJECTS for o in lists[name]})
        elif group == "interaction":
            objects = sorted(set(lists["person_hyponyms"]) | set(lists["rulers"]))
        else:
            objects = lists["vehicles" if group == "driving" else "food"]
        out += [(group, v, o) for v in lists[f"{group}_verbs"] for o in objects]
    return out


def needed_lists(cfg: Mapping[str, Any]) -> list[str]:
    """The file keys the chosen attributes and verb groups read."""
    specs = attribute_specs(cfg)
    keys = {k for _, p, h in specs.values() for k in (p, h)}
    for g in VERB_GROUPS if cfg.get("verb_groups") is None else cfg["verb_groups"]:
        keys.add(f"{g}_verbs")
        keys |= {"commerce": set(OBJECTS), "interaction": {"person_hyponyms", "rulers"},
                 "driving": {"vehicles"}, "eating": {"food"}}[g]
    return sorted(keys)


def attribute_specs(cfg: Mapping[str, Any]) -> dict[str, tuple[str, str, str]]:
    """Attribute name -> (templates, premise list, hypothesis list), in the configured order; checked."""
    custom = {k: (dict(v) if not isinstance(v, BaseModel) else v.model_dump())
              for k, v in (cfg.get("custom_attributes") or {}).items()}
    names = list(cfg.get("attributes") or ATTRIBUTES)
    out = {}
    for name in names:
        if name in custom:
            c = custom[name]
            spec = (c["templates"], c["premise"], c["hypothesis"])
        elif name in ATTRIBUTES:
            spec = ATTRIBUTES[name]
        else:
            raise ConfigError(f"benchmark.bias_nli.attributes: {name!r} is neither one of {sorted(ATTRIBUTES)} nor "
                              f"a key of custom_attributes ({sorted(custom)})")
        allowed = PEOPLE if spec[0] == "noun" else ADJECTIVES
        bad = [w for w in spec[1:] if w not in allowed]
        if bad:
            raise ConfigError(f"benchmark.bias_nli attribute {name!r}: {bad} not a word list of the {spec[0]} "
                              f"templates; expected one of {list(allowed)}")
        if name in out:
            raise ConfigError(f"benchmark.bias_nli.attributes: {name!r} is listed twice")
        out[name] = spec
    if not out:
        raise ConfigError("benchmark.bias_nli.attributes: empty (choose one or more of "
                          f"{sorted(ATTRIBUTES)} or custom_attributes)")
    return out


# ----------------------------------------------------------------------------------------------- pairs
def pair_id(pair_type: str, premise: str, hypothesis: str) -> str:
    """The generator's id of a pair."""
    return hashlib.sha224(f"{pair_type}\t{premise}\t{hypothesis}".encode("utf-8")).hexdigest()


def attribute_pairs(name: str, spec: tuple[str, str, str], lists: Mapping[str, list[str]],
                    tmpl: list[tuple[str, str, str]], positions: np.ndarray | None = None) -> pd.DataFrame:
    """The pairs of one attribute in the generator's order (``positions``: only those, ascending)."""
    kind, p_list, h_list = spec
    premise_words, hyp_words = lists[p_list], lists[h_list]
    pair_type = f"{p_list} -> {h_list}"
    person = " person" if kind == "adj" else ""
    tag = "person_" if kind == "adj" else ""
    endings = [f"{v} {articlize(o, False)} ." for _, v, o in tmpl]
    ttype = [f"X1_{p_list} {tag}{v} Y -> X2_{h_list} {tag}{v} Y" for _, v, _o in tmpl]
    n_t, n_h = len(tmpl), len(hyp_words)
    total = len(premise_words) * n_h * n_t
    pos = np.arange(total) if positions is None else np.asarray(positions, dtype=np.int64)
    pi, rest = np.divmod(pos, n_h * n_t)
    hi, ti = np.divmod(rest, n_t)
    p_subj = [f"{articlize(w, True)}{person} " for w in premise_words]
    h_subj = [f"{articlize(w, True)}{person} " for w in hyp_words]
    pi, hi, ti = pi.tolist(), hi.tolist(), ti.tolist()
    premise = [p_subj[a] + endings[t] for a, t in zip(pi, ti)]
    hypothesis = [h_subj[b] + endings[t] for b, t in zip(hi, ti)]
    ids = [pair_id(pair_type, p, h) for p, h in zip(premise, hypothesis)]
    n = len(ids)
    return pd.DataFrame({
        "item_id": ids, "category": [name] * n, "attribute": [name] * n, "pair_type": [pair_type] * n,
        "templates": [kind] * n, "premise_word": [premise_words[a] for a in pi],
        "hypothesis_word": [hyp_words[b] for b in hi], "template_type": [ttype[t] for t in ti],
        "verb_group": [tmpl[t][0] for t in ti], "verb": [tmpl[t][1] for t in ti],
        "object": [tmpl[t][2] for t in ti], "premise": premise, "hypothesis": hypothesis}, columns=COLUMNS)


def attribute_size(spec: tuple[str, str, str], lists: Mapping[str, list[str]], n_templates: int) -> int:
    return len(lists[spec[1]]) * len(lists[spec[2]]) * n_templates


def load_lists(files: Mapping[str, str | Path], keys) -> dict[str, list[str]]:
    missing = [k for k in keys if k not in files]
    if missing:
        raise ConfigError(f"benchmark.bias_nli: no file for the word list(s) {missing} (files: {sorted(files)})")
    return {k: read_word_list(files[k]) for k in keys}


def generate(files: Mapping[str, str | Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    """The items of the configured attributes (each sampled when ``sample`` is set), in generation order."""
    check_options(cfg)
    specs = attribute_specs(cfg)
    lists = load_lists(files, needed_lists(cfg))
    tmpl = templates(lists, VERB_GROUPS if cfg.get("verb_groups") is None else cfg["verb_groups"])
    sample = cfg.get("sample")
    frames = []
    for a, (name, spec) in enumerate(specs.items()):
        size = attribute_size(spec, lists, len(tmpl))
        positions = None
        if sample and sample < size:
            rng = np.random.default_rng([int(cfg.get("seed") or 0), a])
            positions = np.sort(rng.choice(size, size=sample, replace=False))
        frames.append(attribute_pairs(name, spec, lists, tmpl, positions))
    items = pd.concat(frames, ignore_index=True)
    dup = items["item_id"].duplicated()
    if dup.any():
        first = items.loc[dup, "item_id"].iloc[0]
        raise DataFormatError(f"Bias-NLI: {int(dup.sum())} duplicate pair(s) (first {first}): two attributes of "
                              f"the same lists, or a word listed twice under different spacing")
    return items


def check_options(cfg: Mapping[str, Any]) -> None:
    """What the plan can check without the files: the attributes and their lists, a template family chosen."""
    attribute_specs(cfg)
    if cfg.get("verb_groups") is not None and not list(cfg["verb_groups"]):
        raise ConfigError(f"benchmark.bias_nli.verb_groups: empty (choose one or more of {list(VERB_GROUPS)})")


@register_loader("bias_nli", splits=("all",), options=BiasNLIDataset, check=check_options)
def load_bias_nli(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    items = generate(files, cfg)
    return items.head(int(cfg["limit"])).reset_index(drop=True) if cfg.get("limit") else items


__all__ = ["load_bias_nli", "generate", "check_options", "read_word_list", "templates", "attribute_pairs", "attribute_specs",
           "needed_lists", "pair_id", "articlize", "ATTRIBUTES", "VERB_GROUPS", "BiasNLIDataset", "COLUMNS"]
