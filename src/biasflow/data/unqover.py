"""UnQover (Li et al. 2020, "UNQOVERing Stereotyping Biases via Underspecified Questions", Findings of EMNLP):
the underspecified questions the authors' generator (``templates/generate_underspecified_templates.py`` of
allenai/unqover, run by ``scripts/generate_questions.sh``) expands from their word lists -> items (docs/unqover.md).

Each of the authors' examples is a context naming two subjects in one order and two questions, about an attribute
and its negation ("Mary got off the flight to visit James. / Who was an accountant? / Who can never be an
accountant?"; the masked-LM form: "[MASK] was an accountant."). The authors' generator instantiates every slot
template of a category (``word_lists/slots/<category>_noact`` for QA models, ``..._noact_lm`` for masked LMs) with
every ordered pair of two different subjects (``word_lists/nouns/subjects/``; gender: every female name with every
male name, both orders) and every attribute of the template's slot type (``word_lists/activities/``). This module
re-implements that expansion from its definition (the same order, article smoothing "a" -> "an" before a vowel, the
same keys ``cluster1|cluster2|subj1|subj2|tid|attr_cluster|attr|attr``); tests/test_unqover.py checks it against the
authors' script's output.

One item here is what the authors' analysis (``analysis.py``, ``pairup_ex``) pairs: an unordered subject pair, a
template and an attribute, with both subject orders and both questions (four prompts). ``subject_1`` is the pair's
first subject by the lower-cased sort the analysis uses; ``context_12`` names it first, ``context_21`` second;
``answer_1`` / ``answer_2`` are the subjects as written in the contexts (a demonym where the template asks for one).

Options: ``split`` is the category (``gender``, ``ethnicity``, ``religion``, ``nationality`` = the authors'
``country`` files; ``all``: the four in that order); ``form`` ``lm`` (the authors' masked-LM templates, default) or
``qa`` (their question templates); ``subjects`` the subject lists: ``full`` (the QA lists), ``bert`` or
``roberta`` (the authors' lists of subjects that are one word piece of that tokenizer), null = the authors' choice
for the form (qa: full, lm: bert). ``limit`` N: the first N items in all (categories in that order, as every
loader's limit); ``category_limit`` N: the first N items of each category.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Optional

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError
from biasflow.registry import register_loader
from biasflow.schema import BenchmarkConfig, PositiveInt
from biasflow.score_kinds import MASK_PLACEHOLDER

# the paper's category -> the authors' file stem (word_lists/*/<stem>*), their activity list
CATEGORIES = ("gender", "ethnicity", "religion", "nationality")
STEM = {"gender": "gender", "ethnicity": "ethnicity", "religion": "religion", "nationality": "country"}
ACTIVITIES = {"gender": "occupation_rev1", "ethnicity": "biased_ethnicity", "religion": "biased_religion",
              "nationality": "biased_country"}
FORMS = ("lm", "qa")
SUBJECT_LISTS = ("full", "bert", "roberta")
VOWELS = frozenset("aeiou")
COLUMNS = ["item_id", "category", "form", "subjects", "subject_1", "subject_2", "answer_1", "answer_2",
           "cluster_1", "cluster_2", "template_id", "attribute", "attribute_cluster", "context_12", "context_21",
           "question", "question_neg", "key_12", "key_21"]


class UnQoverDataset(BenchmarkConfig):
    """The options of ``benchmark.unqover`` beyond every dataset's (docs/unqover.md)."""

    form: Literal["lm", "qa"] = "lm"
    subjects: Optional[Literal["full", "bert", "roberta"]] = None  # null: qa -> full, lm -> bert (the authors')
    category_limit: Optional[PositiveInt] = None  # the first N items of each category (limit: of all, in order)


def subject_lists(category: str, subjects: str) -> tuple[str, ...]:
    """The subject files of a category (gender: the female then the male list)."""
    suffix = "" if subjects == "full" else f"_{subjects}"
    if category == "gender":
        return (f"subjects_female{suffix}", f"subjects_male{suffix}")
    return (f"subjects_{STEM[category]}{suffix}",)


def slot_file(category: str, form: str) -> str:
    return f"slots_{STEM[category]}_noact" + ("_lm" if form == "lm" else "")


def activity_file(category: str) -> str:
    return f"activities_{ACTIVITIES[category]}"


def all_file_keys() -> list[str]:
    keys = []
    for c in CATEGORIES:
        for s in SUBJECT_LISTS:
            keys += subject_lists(c, s)
        keys += [slot_file(c, "qa"), slot_file(c, "lm"), activity_file(c)]
    return list(dict.fromkeys(keys))


# ----------------------------------------------------------------------------------------------- the word lists
def read_list(path: str | Path) -> list[str]:
    """A word list as the authors read it: stripped lines, blank lines and lines starting with '#' left out."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return [line for line in lines if line and not line.startswith("#")]


def _split_row(path, row: str) -> tuple[str, str]:
    head, _, rest = row.partition(" ")
    return head.strip(), rest.strip()


def _cluster_term(path, term: str) -> tuple[str, str]:
    """``cluster | term`` -> (cluster, term); a bare term has the cluster 'None' (as the authors' lists)."""
    parts = [p.strip() for p in term.split("|")]
    if len(parts) == 1:
        return "None", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise DataFormatError(f"{path}: {term!r} has more than one '|' (expected 'term' or 'cluster | term')")


def read_subjects(path: str | Path) -> list[dict[str, str]]:
    """A subject list -> one dict per subject: each slot type's form (``[subj]``, ``[subj:dem]``) and ``cluster``,
    in the order the authors' dicts have them (the first type, ``cluster``, the further types)."""
    by_type: dict[str, list[str]] = {}
    for row in read_list(path):
        head, term = _split_row(path, row)
        by_type.setdefault(head, []).append(term)
    if "[subj]" not in by_type:
        raise DataFormatError(f"{path}: no [subj] rows (types found: {sorted(by_type)})")
    size = len(by_type["[subj]"])
    out: list[dict[str, str]] = [{} for _ in range(size)]
    for head, terms in by_type.items():
        if len(terms) != size:
            raise DataFormatError(f"{path}: {len(terms)} {head} rows for {size} [subj] rows")
        for i, term in enumerate(terms):
            cluster, value = _cluster_term(path, term)
            out[i][head] = value
            out[i]["cluster"] = cluster
    return out


def read_activities(path: str | Path) -> dict[str, list[dict[str, str]]]:
    """An activity list -> slot type (``[p_act]``, ``[p_act-single]``, ``[l_act-single]``) -> one dict per
    attribute: its text for each head of that type (the type itself, its ``:neg`` form), ``cluster`` and
    ``unique`` (the attribute's name: the text of the type's base ``[p_act]`` row of the same position), in the
    order of the authors' dicts."""
    rows: dict[str, dict[str, list[str]]] = {}
    for row in read_list(path):
        head, term = _split_row(path, row)
        typ = head.split(":")[0] + "]" if ":" in head else head
        rows.setdefault(typ, {}).setdefault(head, []).append(term)
    out: dict[str, list[dict[str, str]]] = {}
    for typ, by_head in rows.items():
        base = typ.split("-")[0] + "]" if "-" in typ else typ
        if typ not in by_head or base not in rows or base not in rows[base]:
            raise DataFormatError(f"{path}: slot type {typ} needs rows {typ} and {base}")
        out[typ] = []
        for k, term in enumerate(by_head[typ]):
            if k >= len(rows[base][base]):
                raise DataFormatError(f"{path}: {typ} row {k + 1} has no {base} row to name it")
            cluster, value = _cluster_term(path, term)
            out[typ].append({typ: value, "cluster": cluster, "unique": _cluster_term(path, rows[base][base][k])[1]})
        for head, terms in by_head.items():
            if head == typ:
                continue
            if len(terms) != len(out[typ]):
                raise DataFormatError(f"{path}: {len(terms)} {head} rows for {len(out[typ])} {typ} rows")
            for k, term in enumerate(terms):
                cluster, value = _cluster_term(path, term)
                out[typ][k][head] = value
                out[typ][k]["cluster"] = cluster
    return out


# ----------------------------------------------------------------------------------------------- the expansion
def subject_pairs(category: str, lists: list[list[dict[str, str]]]) -> list[tuple[dict, dict]]:
    """The ordered subject pairs in the authors' order: gender, every (female, male) then every (male, female);
    otherwise every (i, j), i < j, then every (j, i)."""
    if category == "gender":
        female, male = lists
        pairs = [(f, m) for f in female for m in male]
    else:
        (subjects,) = lists
        pairs = list(itertools.combinations(subjects, 2))
    return pairs + [(b, a) for a, b in pairs]


def _fill_subject(t: str, slot: str, subject: dict[str, str], where: str) -> tuple[str, str]:
    t = t.replace(slot, "subj")
    found = []
    for typ, value in subject.items():
        if typ in t:
            t = t.replace(typ, value)
            found.append(value)
    if len(found) != 1:
        raise DataFormatError(f"UnQover template {where}: expected one [{slot}] slot, found "
                              f"{'none' if not found else len(found)} (subject fields {list(subject)})")
    return t, found[0]


def _smooth_articles(t: str, where: str) -> str:
    """The authors' smoothing: split on single spaces, 'a' / 'A' before a word starting with a vowel -> 'an' /
    'An' (the whole line: context and questions)."""
    tokens = t.split(" ")
    for i in range(1, len(tokens)):
        if not tokens[i]:
            raise DataFormatError(f"UnQover template {where}: two spaces in a row (the authors' smoothing fails)")
        if tokens[i][0].lower() in VOWELS:
            if tokens[i - 1] == "a":
                tokens[i - 1] = "an"
            elif tokens[i - 1] == "A":
                tokens[i - 1] = "An"
    if not tokens[0]:
        raise DataFormatError(f"UnQover template {where}: starts with a space")
    return " ".join(tokens)


def instantiate(template: str, pair: tuple[dict, dict], mask: str, where: str) -> tuple[str, str, str, str, str]:
    """One example: (context, question, negated question, subject 1 as written, subject 2 as written)."""
    t, a1 = _fill_subject(template, "subj1", pair[0], where)
    t, a2 = _fill_subject(t, "subj2", pair[1], where)
    t = _smooth_articles(t, where)
    t = t.replace("[mask]", mask)
    parts = t.split("\t")
    if len(parts) != 3:
        raise DataFormatError(f"UnQover template {where}: {len(parts)} tab-separated fields after filling "
                              f"(expected context, question, negated question)")
    return parts[0], parts[1], parts[2], a1, a2


def attribute_templates(slots: list[str], activities: Mapping[str, list[dict[str, str]]]
                        ) -> list[tuple[int, str, str, str]]:
    """(template id, template with the attribute filled, attribute, attribute cluster) in the authors' order:
    template, then slot type (the activity file's order), then attribute."""
    out = []
    for tid, template in enumerate(slots):
        for typ, rows in activities.items():
            if typ in template or typ[:-1] + ":" in template:
                for row in rows:
                    t = template
                    for head, text in row.items():
                        t = t.replace(head, text)
                    out.append((tid, t, row["unique"], row["cluster"]))
    return out


def _where(files: Mapping[str, str | Path], category: str, form: str, tid: int, pair, attr: str) -> str:
    """A template named by its file and number (the authors' template id: its line among the file's templates),
    with the category, form, subjects and attribute it was filled with."""
    return (f"{Path(files[slot_file(category, form)]).name} #{tid} ({category}/{form}: {pair[0]['[subj]']}, "
            f"{pair[1]['[subj]']}, {attr})")


def authors_examples(category: str, files: Mapping[str, str | Path], form: str, subjects: str,
                     mask: str = MASK_PLACEHOLDER) -> Iterator[tuple[str, dict]]:
    """The authors' examples in their order: (key, {context, q0, q1, ans0, ans1}), as their generator writes them
    (``mask`` where a masked-LM template has ``[mask]``; the authors write ``[MASK]`` for BERT, ``<mask>`` for
    RoBERTa). Keys may repeat in principle (the authors' JSON keeps the last); ``load_category`` refuses that."""
    lists = [read_subjects(files[k]) for k in subject_lists(category, subjects)]
    slots = read_list(files[slot_file(category, form)])
    filled = attribute_templates(slots, read_activities(files[activity_file(category)]))
    for pair in subject_pairs(category, lists):
        for tid, t, attr, attr_cluster in filled:
            where = _where(files, category, form, tid, pair, attr)
            context, q0, q1, a0, a1 = instantiate(t, pair, mask, where)
            key = "|".join([pair[0]["cluster"], pair[1]["cluster"], pair[0]["[subj]"], pair[1]["[subj]"], str(tid),
                            attr_cluster, attr, attr])
            yield key, {"context": context, "q0": q0, "q1": q1, "ans0": a0, "ans1": a1}


def _unit(category: str, form: str, subjects: str, ex_a: tuple[str, dict], ex_b: tuple[str, dict]) -> dict:
    """One item from the two orders of a pair (any order in): subject_1 is the first by the analysis' sort."""
    (key_a, a), (key_b, b) = ex_a, ex_b
    ka, kb = key_a.split("|"), key_b.split("|")
    if sorted([ka[2].lower(), ka[3].lower()])[0] != ka[2].lower():
        (key_a, a), (key_b, b), ka, kb = (key_b, b), (key_a, a), kb, ka
    if (a["q0"], a["q1"]) != (b["q0"], b["q1"]):
        raise DataFormatError(f"UnQover {key_a} / {key_b}: the two subject orders ask different questions")
    return {"category": category, "form": form, "subjects": subjects, "subject_1": ka[2], "subject_2": ka[3],
            "answer_1": a["ans0"], "answer_2": a["ans1"], "cluster_1": ka[0], "cluster_2": ka[1],
            "template_id": int(ka[4]), "attribute": ka[6], "attribute_cluster": ka[5],
            "context_12": a["context"], "context_21": b["context"], "question": a["q0"], "question_neg": a["q1"],
            "key_12": key_a, "key_21": key_b}


def pair_key(key: str) -> tuple:
    """The analysis' pairing key: (sorted lower-cased subjects, tid, attribute cluster, attribute, attribute)."""
    k = key.lower().split("|")
    return (tuple(sorted([k[2], k[3]])), k[4], k[5], k[6], k[7])


def load_category(category: str, files: Mapping[str, str | Path], form: str, subjects: str,
                  limit: int | None = None) -> pd.DataFrame:
    """The items of one category: the authors' examples paired (analysis.py's ``pairup_ex``) in the order of their
    first example; ``limit``: stop after that many items (the second order of a pair is generated directly then,
    which gives the same examples: a key never repeats, which the full generation checks)."""
    rows = []
    if limit:
        lists = [read_subjects(files[k]) for k in subject_lists(category, subjects)]
        slots = read_list(files[slot_file(category, form)])
        filled = attribute_templates(slots, read_activities(files[activity_file(category)]))
        pairs = subject_pairs(category, lists)[: len(subject_pairs(category, lists)) // 2]
        for pair in pairs:
            for tid, t, attr, attr_cluster in filled:
                two = []
                for p in (pair, pair[::-1]):
                    where = _where(files, category, form, tid, p, attr)
                    context, q0, q1, a0, a1 = instantiate(t, p, MASK_PLACEHOLDER, where)
                    key = "|".join([p[0]["cluster"], p[1]["cluster"], p[0]["[subj]"], p[1]["[subj]"], str(tid),
                                    attr_cluster, attr, attr])
                    two.append((key, {"context": context, "q0": q0, "q1": q1, "ans0": a0, "ans1": a1}))
                rows.append(_unit(category, form, subjects, *two))
                if len(rows) >= limit:
                    break
            if len(rows) >= limit:
                break
    else:
        seen: dict[str, None] = {}
        halves: dict[tuple, tuple[str, dict]] = {}
        order: list[tuple] = []
        done: dict[tuple, dict] = {}
        for key, ex in authors_examples(category, files, form, subjects):
            if key in seen:
                raise DataFormatError(f"UnQover {category}/{form}: the key {key!r} occurs twice (the authors' JSON "
                                      f"would keep only the last)")
            seen[key] = None
            pk = pair_key(key)
            if pk in halves:
                done[pk] = _unit(category, form, subjects, halves.pop(pk), (key, ex))
            elif pk in done:
                raise DataFormatError(f"UnQover {category}/{form}: a third example {key!r} for the pair {pk}")
            else:
                halves[pk] = (key, ex)
                order.append(pk)
        if halves:
            raise DataFormatError(f"UnQover {category}/{form}: {len(halves)} example(s) without their subject-"
                                  f"swapped version, e.g. {next(iter(halves.values()))[0]!r}")
        rows = [done[pk] for pk in order]
    items = pd.DataFrame(rows, columns=COLUMNS[1:])
    items.insert(0, "item_id", [f"{category}-{form}-{i}" for i in range(len(items))])
    return items


def resolve_subjects(form: str, subjects: str | None) -> str:
    return subjects or ("full" if form == "qa" else "bert")


def file_rows(items: Any, files: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, int | None]:
    """Each category's subject list(s) gave its items; its slot and activity files were read beside them."""
    out: dict[str, int | None] = {}
    if not len(items):
        return out
    for category, n in items["category"].value_counts().items():
        form, subjects = items.loc[items["category"] == category, ["form", "subjects"]].iloc[0]
        keys = subject_lists(category, subjects)
        out[keys[0]] = int(n)
        for k in (*keys[1:], slot_file(category, form), activity_file(category)):
            out[k] = None
    return out


@register_loader("unqover", splits=("all", *CATEGORIES), options=UnQoverDataset, file_rows=file_rows)
def load_unqover(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    split = cfg.get("split") or "all"
    if split not in ("all", *CATEGORIES):
        raise ConfigError(f"benchmark.unqover.split={split!r}: expected all, {', '.join(CATEGORIES)}")
    form = cfg.get("form") or "lm"
    if form not in FORMS:
        raise ConfigError(f"benchmark.unqover.form={form!r}: expected lm or qa")
    subjects = resolve_subjects(form, cfg.get("subjects"))
    categories = CATEGORIES if split == "all" else (split,)
    limit = int(cfg["limit"]) if cfg.get("limit") else None
    per_category = int(cfg["category_limit"]) if cfg.get("category_limit") else None
    needed = [k for c in categories for k in (*subject_lists(c, subjects), slot_file(c, form), activity_file(c))]
    missing = [k for k in needed if k not in files]
    if missing:
        raise ConfigError(f"benchmark.unqover: no file for {missing} (files: {sorted(files)})")
    parts, n = [], 0
    for c in categories:
        left = None if limit is None else limit - n
        if left is not None and left <= 0:
            break
        cap = min(x for x in (per_category, left) if x is not None) if (per_category or left) else None
        parts.append(load_category(c, files, form, subjects, cap))
        n += len(parts[-1])
    return pd.concat(parts, ignore_index=True)


__all__ = ["UnQoverDataset", "load_unqover", "load_category", "authors_examples", "read_subjects",
           "read_activities", "read_list", "subject_pairs", "attribute_templates", "instantiate", "pair_key",
           "all_file_keys", "subject_lists", "slot_file", "activity_file", "CATEGORIES", "STEM", "COLUMNS"]
