"""Grep-BiasIR (Krieg et al. 2023, "Grep-BiasIR: A Dataset for Investigating Gender Representation Bias in
Information Retrieval Results", CHIIR): ``queries.csv`` and the seven ``queries-documents_<category>.csv`` files ->
items, one row per query (117).

``queries.csv``: ``q_id``, ``category``, ``query`` (gender-neutral search queries, seven categories). Each category
file (KlaraKrieg/GrepBiasIR's README): ``q_id``, ``d_id``, ``relevant`` (1 / 0), ``query``, ``doc_title``,
``document``, ``content_gender`` (F / M / N), ``exp_stereotype`` (the expected stereotype annotation: ``Towards
Female``, ``Towards Male`` or ``No Annotation Agreement``). Every query has six documents: a relevant and a
non-relevant document, each written in a female, a male and a neutral version.

Two non-relevant triples are not labelled F / M / N in the data: query 107's (``both``, ``botrh``, ``both``) and
query 112's (``both``, ``both``, ``N``): their documents mention both genders (docs/grep_biasir.md). They are kept,
labelled ``both`` (``botrh`` read as its typo), in file order in the non-relevant slots, with
``nonrelevant_gendered`` False; the metric compares no female / male version there.

Items: ``item_id`` (``grep-q<q_id>``), ``query_id``, ``query``, ``category``, ``exp_stereotype`` (as written) and
``stereotype`` (``female`` / ``male`` / ``none``: towards female, towards male, no annotation agreement), and per
document slot (``relevant_female``, ``relevant_male``, ``relevant_neutral``, ``nonrelevant_female``,
``nonrelevant_male``, ``nonrelevant_neutral``; the slot names the relevance label and the version) ``<slot>_id`` (the
``d_id``), ``<slot>_title``, ``<slot>_text`` and ``<slot>_gender`` (the label: F, M, N or both); ``relevant_gendered``
/ ``nonrelevant_gendered``: the triple is labelled F, M and N. Every row is checked (header, integer ids, a known
category, the query text and category agreeing with ``queries.csv``, a 0 / 1 label, a known gender and stereotype,
non-empty text, unique document ids, three relevant and three non-relevant documents per query); an error names the
file and line.

``split``: ``all`` only. ``limit`` N: the first N queries (by ``q_id``).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.errors import ConfigError, DataFormatError
from biasflow.io import read_text_utf8
from biasflow.registry import register_loader

# file key -> the category its file holds (the file name's [CATEGORY]), in the data's order
CATEGORY_FILES = {
    "appearance": "Appearance", "career": "Career", "child_care": "Child Care",
    "cognitive_capabilities": "Cognitive Capabilities", "domestic_work": "Domestic Work",
    "physical_capabilities": "Physical Capabilities", "sex_relationship": "Sex & Relationship",
}
CATEGORIES = tuple(CATEGORY_FILES.values())
QUERY_HEADER = ["q_id", "category", "query"]
DOC_HEADER = ["q_id", "d_id", "relevant", "query", "doc_title", "document", "content_gender", "exp_stereotype"]
GENDER_LABELS = {"F": "F", "M": "M", "N": "N", "both": "both", "botrh": "both"}  # botrh: the data's typo of both
VERSIONS = {"F": "female", "M": "male", "N": "neutral"}
STEREOTYPES = {"towards female": "female", "towards male": "male", "no annotation agreement": "none"}
RELEVANCE = {"1": "relevant", "0": "nonrelevant"}
SLOTS = tuple(f"{rel}_{v}" for rel in ("relevant", "nonrelevant") for v in ("female", "male", "neutral"))
SLOT_FIELDS = ("id", "title", "text", "gender")
COLUMNS = ["item_id", "query_id", "query", "category", "exp_stereotype", "stereotype",
           *[f"{s}_{f}" for s in SLOTS for f in SLOT_FIELDS], "relevant_gendered", "nonrelevant_gendered"]


def read_csv_rows(path: str | Path, what: str, header: list[str]) -> list[tuple[int, list[str]]]:
    """[(line number, fields)] of a UTF-8 CSV file (CRLF or LF, quoted fields) whose header is ``header``; the line
    is where the record ends. Line breaks inside a field are read as LF whatever the file has (the PyPI mirror has
    CRLF, the authors' copy LF: both give the same items). A wrong header or field count is an error naming the file
    and line."""
    text = read_text_utf8(path, what).replace("\r\n", "\n")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        found = next(reader)
    except StopIteration:
        raise DataFormatError(f"{path}: empty file (expected the header {header})") from None
    except csv.Error as exc:
        raise DataFormatError(f"{path}, line 1: {exc}") from None
    if found != header:
        raise DataFormatError(f"{path}: expected the header {header}, found {found}")
    rows = []
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise DataFormatError(f"{path}, line {reader.line_num}: {exc}") from None
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        if len(fields) != len(header):
            raise DataFormatError(f"{path}, line {reader.line_num}: expected {len(header)} comma-separated fields, "
                                  f"got {len(fields)}")
        rows.append((reader.line_num, fields))
    return rows


def _int(path, line: int, column: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DataFormatError(f"{path}, line {line}: {column} must be an integer, got {value!r}") from None


def read_queries(path: str | Path) -> pd.DataFrame:
    """``queries.csv``: query_id, category, query, checked row by row."""
    rows, seen = [], {}
    for line, (q_id, category, query) in read_csv_rows(path, "Grep-BiasIR queries", QUERY_HEADER):
        qid = _int(path, line, "q_id", q_id)
        if qid in seen:
            raise DataFormatError(f"{path}, line {line}: q_id {qid} repeated (first on line {seen[qid]})")
        seen[qid] = line
        if category not in CATEGORIES:
            raise DataFormatError(f"{path}, line {line}: category {category!r} is none of {list(CATEGORIES)}")
        if not query.strip():
            raise DataFormatError(f"{path}, line {line}: empty query")
        rows.append({"query_id": qid, "category": category, "query": query, "line": line})
    if not rows:
        raise DataFormatError(f"{path}: no queries")
    return pd.DataFrame(rows)


def read_documents(path: str | Path, category: str, queries: pd.DataFrame) -> list[dict[str, Any]]:
    """One category file's documents, each checked against ``queries.csv`` (its query text and category)."""
    by_id = queries.set_index("query_id")
    out = []
    for line, fields in read_csv_rows(path, f"Grep-BiasIR {category} documents", DOC_HEADER):
        q_id, d_id, relevant, query, title, document, gender, stereotype = fields
        qid, did = _int(path, line, "q_id", q_id), _int(path, line, "d_id", d_id)
        if qid not in by_id.index:
            raise DataFormatError(f"{path}, line {line}: q_id {qid} is not in queries.csv")
        q = by_id.loc[qid]
        if q["category"] != category:
            raise DataFormatError(f"{path}, line {line}: query {qid} is in category {q['category']!r} in "
                                  f"queries.csv, but in the {category!r} file")
        if query != q["query"]:
            raise DataFormatError(f"{path}, line {line}: query text {query!r} differs from queries.csv's "
                                  f"{q['query']!r} for q_id {qid}")
        if relevant not in RELEVANCE:
            raise DataFormatError(f"{path}, line {line}: relevant must be 1 or 0, got {relevant!r}")
        if gender not in GENDER_LABELS:
            raise DataFormatError(f"{path}, line {line}: content_gender {gender!r} is none of F, M, N, both")
        if stereotype.strip().lower() not in STEREOTYPES:
            raise DataFormatError(f"{path}, line {line}: exp_stereotype {stereotype!r} is none of Towards Female, "
                                  f"Towards Male, No Annotation Agreement")
        if not document.strip() or not title.strip():
            raise DataFormatError(f"{path}, line {line}: empty doc_title or document (d_id {did})")
        out.append({"path": str(path), "line": line, "query_id": qid, "d_id": did,
                    "relevance": RELEVANCE[relevant], "title": title, "text": document,
                    "gender": GENDER_LABELS[gender], "exp_stereotype": stereotype})
    return out


def _query_item(q, docs: list[dict[str, Any]]) -> dict[str, Any]:
    first = docs[0]
    where = f"{first['path']}, line {first['line']}"
    stereotypes = {d["exp_stereotype"].strip().lower() for d in docs}
    if len(stereotypes) != 1:
        raise DataFormatError(f"{where}: query {q.query_id}'s documents disagree on exp_stereotype "
                              f"({sorted(stereotypes)})")
    row = {"item_id": f"grep-q{q.query_id}", "query_id": int(q.query_id), "query": q.query,
           "category": q.category, "exp_stereotype": first["exp_stereotype"],
           "stereotype": STEREOTYPES[stereotypes.pop()]}
    for rel in ("relevant", "nonrelevant"):
        triple = [d for d in docs if d["relevance"] == rel]
        if len(triple) != 3:
            raise DataFormatError(f"{where}: query {q.query_id} has {len(triple)} {rel} document(s) (lines "
                                  f"{[d['line'] for d in triple]}), expected 3 (female, male, neutral)")
        labels = sorted(d["gender"] for d in triple)
        gendered = labels == ["F", "M", "N"]
        if not gendered and "both" not in labels:
            raise DataFormatError(f"{where}: query {q.query_id}'s {rel} documents are labelled {labels} "
                                  f"(lines {[d['line'] for d in triple]}), expected F, M and N once each")
        if gendered:
            triple = sorted(triple, key=lambda d: "FMN".index(d["gender"]))
        for version, d in zip(("female", "male", "neutral"), triple):
            slot = f"{rel}_{version}"
            row.update({f"{slot}_id": d["d_id"], f"{slot}_title": d["title"], f"{slot}_text": d["text"],
                        f"{slot}_gender": d["gender"]})
        row[f"{rel}_gendered"] = gendered
    return row


def load_items(files: Mapping[str, str | Path]) -> pd.DataFrame:
    """Every query with its six documents, by ``q_id``."""
    missing = [k for k in ("queries", *CATEGORY_FILES) if k not in files]
    if missing:
        raise ConfigError(f"benchmark.grep_biasir: no file for {missing} (files: {sorted(files)})")
    queries = read_queries(files["queries"])
    docs: list[dict[str, Any]] = []
    for key, category in CATEGORY_FILES.items():
        docs += read_documents(files[key], category, queries)
    seen: dict[int, str] = {}
    for d in docs:
        if d["d_id"] in seen:
            raise DataFormatError(f"{d['path']}, line {d['line']}: d_id {d['d_id']} repeated (first at "
                                  f"{seen[d['d_id']]})")
        seen[d["d_id"]] = f"{d['path']}, line {d['line']}"
    by_query: dict[int, list[dict[str, Any]]] = {}
    for d in docs:
        by_query.setdefault(d["query_id"], []).append(d)
    rows = []
    for q in queries.sort_values("query_id").itertuples(index=False):
        if q.query_id not in by_query:
            raise DataFormatError(f"{files['queries']}, line {q.line}: query {q.query_id} ({q.category!r}) has no "
                                  f"documents in its category file")
        rows.append(_query_item(q, by_query[q.query_id]))
    return pd.DataFrame(rows, columns=COLUMNS)


def file_rows(items: pd.DataFrame, files: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, int | None]:
    """The queries each file gave: queries.csv all of them, each category file its category's."""
    if not len(items):
        return {}
    counts = items["category"].value_counts()
    out: dict[str, int | None] = {"queries": len(items)}
    out.update({k: int(counts.get(c, 0)) for k, c in CATEGORY_FILES.items() if counts.get(c, 0)})
    return out


@register_loader("grep_biasir", splits=("all",), file_rows=file_rows)
def load_grep_biasir(files: Mapping[str, Path], cfg: Mapping[str, Any]) -> pd.DataFrame:
    split = cfg.get("split") or "all"
    if split != "all":
        raise ConfigError(f"benchmark.grep_biasir.split={split!r}: expected all")
    items = load_items(files)
    return items.head(int(cfg["limit"])).reset_index(drop=True) if cfg.get("limit") else items


__all__ = ["load_grep_biasir", "load_items", "read_queries", "read_documents", "read_csv_rows", "CATEGORY_FILES",
           "CATEGORIES", "SLOTS", "COLUMNS"]
