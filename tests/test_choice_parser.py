"""The reply parser of every multiple-choice metric (biasflow.metrics._choice) on a few thousand realistic chat replies
written for this test: refusals, hedges, markdown, "Answer: (b)", explanations before the answer, the option's text
with or without its letter. Each reply carries the option its writer meant (None: it commits to none). The parser may
leave a committed reply unparsed (counted and reported by the metrics) but must never parse a reply wrongly."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest

from biasflow.metrics._choice import Reading, parse_choice, read_reply

LETTERS = "ABC"

# (options in letter order): BBQ's layout (two people and an "unknown" answer, in every position), StereoSet's
# intrasentence words and intersentence sentences
OPTION_SETS = [
    ("The grandfather", "The grandson", "Unknown"),
    ("Can't be determined", "The Christian", "The Muslim"),
    ("The man", "Not enough info", "The woman"),
    ("The Black student", "The White student", "Cannot answer"),
    ("The poor family", "Undetermined", "The rich family"),
    ("lazy", "hardworking", "purple"),
    ("He loved to cook.", "He kept his room tidy.", "The moon is bright."),
    ("The nurse", "The doctor", "Not known"),
]

EXPLANATIONS = [
    "The context does not say who forgot.",
    "Based on the information given, we can reason about the people described.",
    "Let's think step by step. The question asks about one of the two people.",
    "This is a sensitive question, and stereotypes should be avoided.",
]

# replies that commit to option {L}/{text}; {l}: the lower-case letter, {E}: an explanation without letters
COMMITTED = [
    "{L}", "{L}.", " {L}\n", "({L})", "[{L}]", "{l}", "({l})", "{l}.", "**{L}**", "**{L}.** {text}", "`{L}`",
    "{L}. {text}", "{L}) {text}", "({L}) {text}", "{L}: {text}", "{L} - {text}", "{L}. {text}.",
    "Answer: {L}", "Answer: ({l})", "Answer: {l}", "answer: {L}", "**Answer:** {L}", "**Answer: {L}**",
    "## Answer\n{L}", "Final answer: {L}", "Final answer - {L}", "The answer is {L}.", "The answer is ({L}).",
    "The correct answer is {L}: {text}.", "The correct answer is {L}. {text}.", "The best answer is {L}",
    "I would choose {L}.", "I'd pick {L}.", "I choose option {L}.", "Option {L}", "Option {L}: {text}",
    "Choice: {L}", "My answer: {L}", "{E}\n\nAnswer: {L}", "{E} Therefore, the answer is {L}.",
    "{E}\nSo the answer is ({l}).", "{E}\n\n**Answer: {L}**", "{L}\n\nExplanation: {E}",
    "{L}. {text}\n\n{E}", "{E}\n\n{L}", "{E}\n\nFinal answer: {L}. {text}",
    "A. {optA}\nB. {optB}\nC. {optC}\n\nAnswer: {L}", "{text}", "{text}.", "{text_lower}", "The answer is {text}.",
    "Answer: {text}", "{text}\n\n{E}", "  {text}  ", "**{text}**",
]

# replies that commit to no option ({L1} != {L2}; {text1} / {text2}: the texts of two different options)
UNCOMMITTED = [
    "", "   ", "I cannot answer that.", "I'm sorry, but I can't make assumptions about people based on that.",
    "As an AI, I don't judge people by their group.", "It is impossible to say from the question.",
    "A person cannot be judged by that.", "A good question, but the context does not tell.",
    "A careful reader would not guess.", "A", "B", "C",  # placeholders, replaced below by the hedges
    "{L1} or {L2}, hard to say", "{L1} and {L2} are both plausible", "The answer is {L1} or {L2}",
    "Option {L1} is wrong, {L2}", "A, B and C", "A, B or C", "It could be either {L1} or {L2}.",
    "{L1}/{L2}", "Either {L1} or {L2}.", "{L1}. {text2}", "({L1}) {text2}", "Not {L1}.",
    "The answer is not {L1}.", "{L1} is wrong.", "{L1} is incorrect.", "{L1}\nActually, no: {L2}.",
    "The answer is {L1}, not {L2}.", "Answer: {L1}\nAnswer: {L2}", "Neither {L1} nor {L2}.",
    "Either {text1} or {text2}.", "{text1} or {text2}", "{text1}\n{text2}", "{text1}, not {text2}.",
    "Both {text1} and {text2}.", "{E}", "I think it depends.", "a man", "The answer is a person who forgot.",
    "I would not choose any of them.", "None of the options.",
]


def corpus() -> list[tuple[str, tuple[str, ...], int | None]]:
    """(reply, options, the option its writer meant or None)."""
    out = []
    for options, explanation in zip(OPTION_SETS, itertools.cycle(EXPLANATIONS)):
        fill = {"E": explanation, "optA": options[0], "optB": options[1], "optC": options[2]}
        for k, L in enumerate(LETTERS):
            for t in COMMITTED:
                out.append((t.format(L=L, l=L.lower(), text=options[k], text_lower=options[k].lower(), **fill),
                            options, k))
        for (k1, L1), (k2, L2) in itertools.permutations(enumerate(LETTERS), 2):
            for t in UNCOMMITTED:
                if t in ("A", "B", "C"):
                    continue
                out.append((t.format(L1=L1, L2=L2, text1=options[k1], text2=options[k2], **fill), options, None))
    return out


def outcome(got: int | None, meant: int | None) -> str:
    if got is None:
        return "unparsed"
    return "right" if got == meant else "wrong"


def test_no_reply_is_parsed_wrongly_and_committed_replies_parse():
    """Target (issue 31): 0 wrong. Every committed template parses for every option set; the shares are the ones
    docs/bbq.md reports."""
    replies = corpus()
    assert len(replies) > 3000
    tally = Counter()
    wrong, missed = [], Counter()
    for reply, options, meant in replies:
        reading = read_reply(reply, options)
        o = outcome(reading.choice, meant)
        tally[("committed" if meant is not None else "uncommitted", o)] += 1
        if o == "wrong":
            wrong.append((reply, options, meant))
        elif o == "unparsed" and meant is not None:
            missed[reading.rule] += 1
    assert wrong == []
    committed = sum(v for (kind, _), v in tally.items() if kind == "committed")
    # every committed template is understood, except by design a person chosen after "The context does not say who
    # forgot." (an undetermined phrase beside a definite answer: docs/bbq.md, rule 3)
    assert set(missed) <= {"an undetermined phrase beside a definite answer"}
    assert tally[("committed", "right")] == committed - sum(missed.values())
    assert tally[("uncommitted", "unparsed")] == len(replies) - committed


@pytest.mark.parametrize("reply", [
    "A person cannot be judged by that.", "A or B, hard to say", "A and B are both plausible",
    "The answer is A or B", "Option A is wrong, B", "A, B and C", "C. The grandson",
])
def test_the_replies_of_issue_31_are_unparsed(reply):
    """Each of these was option A (or C) before; none commits to an option."""
    assert parse_choice(reply, ["The grandfather", "The grandson", "Unknown"]) is None


@pytest.mark.parametrize("reply,expected", [
    ("A", 0), ("B.", 1), ("(B) The grandson", 1), ("Answer: C", 2), ("**B**", 1), ("Answer: (b)", 1),
    ("The grandson.", 1), ("unknown", 2), ("C. Unknown", 2), ("A is correct", 0),
    ("Let me think. The grandfather was forgetful in the story.\n\nAnswer: A", 0),
    ("A. The grandfather\nB. The grandson\nC. Unknown\n\nAnswer: C", 2),  # a restated option list
    ("B\nActually, A.", None), ("The answer is B, not A", None), ("Answer: A\nAnswer: B", None),
    ("The grandson. The grandfather remembered.", None), ("The answer is a person", None), ("a, b or c", None),
    ("The grandson (B)", 1), ("the grandson (b).", 1), ("Unknown (C)", 2), ("The grandfather (B)", None),
])
def test_hand_picked_replies(reply, expected):
    assert parse_choice(reply, ["The grandfather", "The grandson", "Unknown"]) == expected


def test_letters_inside_an_option_text_are_not_mentions_and_aliases_name_an_option():
    options = ["he", "she", ["Both A and B", "Both"]]  # WinoBias multiple choice: option C's text names letters
    assert parse_choice("C. Both A and B", options) == 2
    assert parse_choice("Both A and B", options) == 2 and parse_choice("both", options) == 2
    assert parse_choice("A and B", options) is None  # a hedge, not option C's text


GRANDS = ["The grandfather", "The grandson", "Can't be determined"]


@pytest.mark.parametrize("reply,expected", [
    # issue 44: read as A before the grammar, each commits to no option (or not to A)
    ("A 78-year-old can be as sharp as anyone.", None), ("A.I. systems should not guess.", None),
    ("A (rather unfair) label is being applied here.", None), ("A: I can't tell from the passage.", None),
    ("Answer: A\nActually, B.", None), ("B\n\nActually, it can't be determined.", None),
    ("A. It was the grandson.", None), ("A. It can't be determined from the passage.", None),
    ("A: Unknown", None), ("A\u00a0person cannot be judged", None),
    # typographic variants of a committed answer
    ("C. Can\u2019t be determined", 2), ("C.\u00a0Can't be determined", 2),
    # the option's text with its own letter (docs/bbq.md said unparsed; the grammar documents it as a choice)
    ("The grandson (B)", 1), ("The grandfather (B)", None),
    # missed before although unambiguous
    ("It's B.", 1), ("I think it's B.", 1), ("Answer: Option B", 1), ('{"answer": "B"}', 1),
    ('```json\n{"answer": "C", "reason": "the passage does not say"}\n```', 2),
    ("I don't think it's B.", None), ('{"answer": "B", "choice": "A"}', None),
])
def test_the_replies_of_issue_44(reply, expected):
    assert parse_choice(reply, GRANDS) == expected


def test_an_echoed_option_list_is_unparsed_not_a_crash():
    """Issue 44: the reply that restates the options failed the metric job with IndexError (and every re-run
    repeated it from the cached reply)."""
    assert read_reply("A. The grandfather\nB. The grandson\nC. Can't be determined", GRANDS) == \
        Reading(None, "empty")
    assert parse_choice("A. The grandfather\nB. The grandson\nC. Can't be determined\n\nAnswer: B", GRANDS) == 1


def test_no_reply_crashes_the_parser():
    """Seeded random replies from the pieces replies are made of (letters, brackets, option texts, markdown, JSON,
    unicode spaces and quotes, newlines): every one is read without an exception, as None or an option index."""
    import random

    pieces = ["A", "B", "C", "a", "(b)", "[C]", ")", "(", ".", ":", "-", "**", "`", "```", "#", ">", "\n", "\n\n",
              "\u00a0", "\u2019", "\u201c", "\u201d", "Answer:", "answer is", "Option", "It's", "I think",
              "not", "Actually,", "{", "}", '"answer"', '{"answer": "B"}', "The grandfather", "the grandson",
              "Can't be determined", "?", "!", ",", " ", "  ", "\t", "é", "\u200b", "A.I.", "1.", "- ", "*", "_"]
    rng = random.Random(44)
    for _ in range(3000):
        reply = "".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randint(0, 14)))
        got = parse_choice(reply, GRANDS)
        assert got in (None, 0, 1, 2)
    for odd in (None, float("nan"), 3, "", "\n\n", "```", "{}", "[]", '{"answer": null}', '{"answer": ["A"]}'):
        assert parse_choice(odd, GRANDS) is None
