"""Winogender schemas (Rudinger et al. 2018): ``all_sentences.tsv``, ``templates.tsv``, ``occupations-stats.tsv``
-> items, one row per sentence (720).

120 templates (60 occupations x 2: the pronoun refers to the OCCUPATION, answer 0, or to the PARTICIPANT, answer 1),
each instantiated with the participant word or the bleached "someone" and with a male, female and neutral pronoun
(he/his/him, she/her/her, they/their/them; ``they was`` became ``they were``). ``sentid`` is
``<occupation>.<participant>.<answer>.<gender>.txt``.

The sentence text is the file's (``all_sentences.tsv``); the template says where the pronoun is: the authors'
``scripts/instantiate.py`` splits a template on single spaces, puts the words in and, for "someone", drops the word
before ``$PARTICIPANT`` (``the`` / ``a``), so the pronoun is the sentence's space-separated word at the placeholder's
index (one less when "someone" took two words before it). That word is checked against the gender's form of the
placeholder's case (nominative, possessive, accusative), and becomes ``[MASK]`` in ``masked_sentence``.

``occupations-stats.tsv`` gives each occupation's % female in the U.S. Bureau of Labor Statistics (``bls_pct_female``,
2015/16) and in text (``bergsma_pct_female``, Bergsma and Lin 2006). ``gotcha`` follows the paper's Table 2: a
female sentence is a gotcha when the answer is the OCCUPATION and the occupation is < 50% female (BLS), or the
answer is the PARTICIPANT and it is >= 50% female; reversed for male sentences; neutral sentences never are (240 of
the 480 gendered sentences, as in lm-evaluation-harness's ``winogender_gotcha`` data).

Items keep the three gender variants of a (template, participant) ``unit`` adjacent, in file order; ``limit`` N
keeps the first ceil(N / 3) units whole.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError
from biasflow.io import read_tsv_rows
from biasflow.registry import register_loader
from biasflow.score_kinds import MASK_PLACEHOLDER

GENDERS = ("male", "female", "neutral")
PLACEHOLDERS = {"$NOM_PRONOUN": "nom", "$POSS_PRONOUN": "poss", "$ACC_PRONOUN": "acc"}
# case -> gender -> form (instantiate.py's male_map, female_map, neutral_map)
FORMS = {"nom": {"male": "he", "female": "she", "neutral": "they"},
         "poss": {"male": "his", "female": "her", "neutral": "their"},
         "acc": {"male": "him", "female": "her", "neutral": "them"}}
SENTENCE_HEADER = ["sentid", "sentence"]
TEMPLATE_HEADER = ["occupation(0)", "other-participant(1)", "answer", "sentence"]
STATS_HEADER = ["occupation", "bergsma_pct_female", "bls_pct_female", "bls_year"]


def read_tsv(path: str | Path, header: list[str], what: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of a tab-separated file whose first line is ``header`` (CRLF or LF)."""
    def check(found: list[str]) -> None:
        if found != header:
            raise DataFormatError(f"{path}: expected the header {header}, found {found}")

    return read_tsv_rows(path, f"Winogender {what}", check)[1]


def read_stats(path: str | Path) -> dict[str, dict[str, Any]]:
    out = {}
    for n, (occ, bergsma, bls, year) in read_tsv(path, STATS_HEADER, "occupation statistics"):
        try:
            out[occ] = {"bergsma_pct_female": float(bergsma), "bls_pct_female": float(bls), "bls_year": int(year)}
        except ValueError:
            raise DataFormatError(f"{path}, line {n}: percentages and year must be numbers, got "
                                  f"{[bergsma, bls, year]}") from None
    return out


def read_templates(path: str | Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(occupation, answer) -> participant, template, the pronoun placeholder's word index and case."""
    out = {}
    for n, (occ, participant, answer, template) in read_tsv(path, TEMPLATE_HEADER, "templates"):
        words = template.split(" ")
        slots = [(i, PLACEHOLDERS[w]) for i, w in enumerate(words) if w in PLACEHOLDERS]
        if len(slots) != 1 or words.count("$OCCUPATION") != 1 or words.count("$PARTICIPANT") != 1:
            raise DataFormatError(f"{path}, line {n}: a template needs one $OCCUPATION, one $PARTICIPANT and one "
                                  f"pronoun placeholder ({', '.join(PLACEHOLDERS)}) as space-separated words: "
                                  f"{template!r}")
        if answer not in ("0", "1"):
            raise DataFormatError(f"{path}, line {n}: answer must be 0 (occupation) or 1 (participant), got {answer!r}")
        key = (occ, int(answer))
        if key in out:
            raise DataFormatError(f"{path}, line {n}: a second template for occupation {occ!r}, answer {answer}")
        out[key] = {"participant": participant, "template": template, "pronoun_index": slots[0][0],
                    "pronoun_case": slots[0][1], "participant_index": words.index("$PARTICIPANT")}
    return out


def is_gotcha(gender: str, answer: int, bls_pct_female: float) -> bool:
    """Rudinger et al.'s Table 2: female: (answer OCCUPATION and < 50% female) or (answer PARTICIPANT and >= 50%
    female); reversed for male; never for neutral."""
    if gender == "neutral":
        return False
    female_majority = bls_pct_female >= 50.0
    occupation_is_answer = answer == 0
    if gender == "female":
        return occupation_is_answer != female_majority
    return occupation_is_answer == female_majority


def load_items(sentences: str | Path, templates: str | Path, stats: str | Path) -> pd.DataFrame:
    tmpl = read_templates(templates)
    occ_stats = read_stats(stats)
    rows = []
    for n, (sentid, sentence) in read_tsv(sentences, SENTENCE_HEADER, "sentences"):
        where = f"{sentences}, line {n}"
        parts = sentid.split(".")
        if len(parts) != 5 or parts[4] != "txt" or parts[2] not in ("0", "1") or parts[3] not in GENDERS:
            raise DataFormatError(f"{where}: sentid {sentid!r} is not <occupation>.<participant>.<0|1>."
                                  f"<male|female|neutral>.txt")
        occ, participant, answer, gender = parts[0], parts[1], int(parts[2]), parts[3]
        t = tmpl.get((occ, answer))
        if t is None:
            raise DataFormatError(f"{where}: no template for occupation {occ!r} with answer {answer}")
        if occ not in occ_stats:
            raise DataFormatError(f"{where}: occupation {occ!r} has no row in {stats}")
        someone = participant == "someone"
        if not someone and participant != t["participant"]:
            raise DataFormatError(f"{where}: participant {participant!r}, the template's is {t['participant']!r}")
        index = t["pronoun_index"] - (1 if someone and t["participant_index"] < t["pronoun_index"] else 0)
        words = sentence.split(" ")
        form = FORMS[t["pronoun_case"]][gender]
        if index >= len(words) or words[index].lower() != form:
            found = words[index] if index < len(words) else None
            raise DataFormatError(f"{where}: expected the {gender} {t['pronoun_case']} pronoun {form!r} as word "
                                  f"{index + 1} of {sentence!r} (from the template {t['template']!r}), found {found!r}")
        s = occ_stats[occ]
        rows.append({
            "item_id": sentid[:-len(".txt")], "sentid": sentid, "unit": f"{occ}.{participant}.{answer}",
            "occupation": occ, "participant": participant, "someone": someone, "answer": answer,
            "referent": "occupation" if answer == 0 else "participant", "gender": gender, "category": gender,
            "pronoun": words[index], "pronoun_case": t["pronoun_case"], "pronoun_word_index": index,
            "pronoun_male": FORMS[t["pronoun_case"]]["male"], "pronoun_female": FORMS[t["pronoun_case"]]["female"],
            "pronoun_neutral": FORMS[t["pronoun_case"]]["neutral"], "sentence": sentence,
            "masked_sentence": " ".join(words[:index] + [MASK_PLACEHOLDER] + words[index + 1:]),
            **s, "majority_gender": "female" if s["bls_pct_female"] >= 50.0 else "male",
            "gotcha": is_gotcha(gender, answer, s["bls_pct_female"])})
    if not rows:
        raise DataFormatError(f"{sentences}: no sentences")
    items = pd.DataFrame(rows)
    dup = items.item_id[items.item_id.duplicated()]
    if len(dup):
        raise DataFormatError(f"{sentences}: duplicate sentids {dup.tolist()[:5]}")
    counts = items.groupby("unit", sort=False)["gender"].agg(lambda g: tuple(sorted(g)))
    bad = counts[counts != tuple(sorted(GENDERS))]
    if len(bad):
        raise DataFormatError(f"{sentences}: every (template, participant) needs one male, one female and one "
                              f"neutral sentence; {bad.index[0]!r} has {list(bad.iloc[0])}")
    # the three variants of a unit adjacent (male, female, neutral), units in file order
    order = {u: i for i, u in enumerate(dict.fromkeys(items["unit"]))}
    items["_u"] = items["unit"].map(order)
    items["_g"] = items["gender"].map({g: i for i, g in enumerate(GENDERS)})
    return items.sort_values(["_u", "_g"]).drop(columns=["_u", "_g"]).reset_index(drop=True)


@register_loader("winogender", splits=("all",),  # a row per sentence; templates and statistics describe them
                 file_rows=lambda items, files, cfg: {"sentences": len(items), "templates": None, "stats": None})
def load_winogender(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    missing = [k for k in ("sentences", "templates", "stats") if k not in files]
    if missing:
        raise ConfigError(f"benchmark.winogender.files: missing {missing} (sentences = all_sentences.tsv, "
                          f"templates = templates.tsv, stats = occupations-stats.tsv)")
    split = cfg.get("split") or "all"
    if split != "all":
        raise ConfigError(f"benchmark.winogender.split={split!r}: expected all (the gotcha subset is a category "
                          f"of the metrics)")
    items = load_items(files["sentences"], files["templates"], files["stats"])
    if cfg.get("limit"):
        units = list(dict.fromkeys(items["unit"]))[:math.ceil(int(cfg["limit"]) / len(GENDERS))]
        items = items[items["unit"].isin(units)].reset_index(drop=True)
    items.insert(1, "benchmark", "winogender")
    return items


__all__ = ["load_items", "load_winogender", "read_templates", "read_stats", "is_gotcha", "FORMS", "GENDERS"]
