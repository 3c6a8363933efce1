"""The reply grammar (docs/bbq.md, "How a reply is read") on 10,799 chat replies written for the test by a helper
that worked from the docs and the option layouts only, never from the parser's code (tests/fixtures/chat_replies/,
its README says how). Each reply carries the option its writer meant, or null. A wrong parse (a letter other than
the one meant, or any letter where none was meant) is a failure; a miss (None where a letter was meant) is allowed
and counted: docs/bbq.md reports the counts, and this test holds the docs to them."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from biasflow.metrics import bbq, winobias

HERE = Path(__file__).parent
SET = HERE / "fixtures" / "chat_replies" / "replies.jsonl"
SECOND = HERE / "fixtures" / "chat_replies_second" / "replies.jsonl"  # an independent tester's (its README)


def parsed_letter(row: dict) -> str | None:
    """The letter the metric of the row's layout reads from the reply (each metric's own entry point)."""
    options = row["options"]
    if row["layout"] == "winobias_mc":
        return winobias.parse_choice(row["reply"], dict(zip("ABC", options)))
    index = bbq.parse_choice(row["reply"], options)  # stereoset_mc reads its replies with bbq.parse_choice
    return None if index is None else "ABC"[index]


def read_outcomes(path: Path) -> list[tuple[dict, str | None]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [(row, parsed_letter(row)) for row in rows]


@pytest.fixture(scope="module")
def outcomes() -> list[tuple[dict, str | None]]:
    return read_outcomes(SET)


def test_the_second_set_has_no_wrong_parse_either():
    """7,125 replies of a tester who worked from the docs alone (incl. the 124 probes that found wrong reads)."""
    outcomes = read_outcomes(SECOND)
    assert len(outcomes) == 7_125
    wrong = [(row["id"], row["reply"], row["options"], row["intended"], got) for row, got in outcomes
             if got is not None and got != row["intended"]]
    assert wrong == []
    committed = [(row, got) for row, got in outcomes if row["intended"] is not None]
    parsed = sum(got == row["intended"] for row, got in committed)
    text = " ".join((HERE.parent / "docs" / "bbq.md").read_text(encoding="utf-8").split())
    m = re.search(r"second set of ([\d,]+) replies .*? parsed ([\d,]+) of ([\d,]+) committed replies", text)
    assert m and [int(g.replace(",", "")) for g in m.groups()] == [len(outcomes), parsed, len(committed)]


def test_the_set_is_what_its_readme_says(outcomes):
    rows = [row for row, _ in outcomes]
    assert len(rows) == 10_799 and len({r["id"] for r in rows}) == len(rows)
    layouts = Counter(r["layout"] for r in rows)
    assert layouts == {"bbq": 3_856, "stereoset_mc": 3_572, "winobias_mc": 3_371}
    assert sum(r["intended"] is None for r in rows) == 4_899


def test_no_reply_is_parsed_wrongly(outcomes):
    wrong = [(row["family"], row["reply"], row["options"], row["intended"], got) for row, got in outcomes
             if got is not None and got != row["intended"]]
    assert wrong == []


def test_the_counts_docs_bbq_reports(outcomes):
    committed = [(row, got) for row, got in outcomes if row["intended"] is not None]
    parsed = sum(got == row["intended"] for row, got in committed)
    text = " ".join((HERE.parent / "docs" / "bbq.md").read_text(encoding="utf-8").split())
    m = re.search(r"parsed ([\d,]+) of ([\d,]+) replies that commit to an option \(([\d.]+) %\), left ([\d,]+) "
                  r"unparsed, parsed 0 wrongly; all ([\d,]+) replies that commit to none are unparsed", text)
    assert m, "docs/bbq.md no longer states the reply set's counts"
    numbers = [int(g.replace(",", "")) for g in m.group(1, 2, 4, 5)]
    assert numbers == [parsed, len(committed), len(committed) - parsed, len(outcomes) - len(committed)]
    assert float(m.group(3)) == round(100 * parsed / len(committed), 1)
