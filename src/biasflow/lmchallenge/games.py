"""The LM Challenge games: they walk over test text and ask a model, producing one log datum per token.

* ``wc`` word completion: next-word predictions and completions after each typed prefix.
* ``we`` / ``ce`` word / character entropy: the model's log-probability of each token.
* ``wr`` word reranking: corrupt a word as a sloppy typist, search nearby vocabulary words, and record
  each candidate's error score and LM score.

Every datum carries ``user, message, token, character, target``; ``message`` counts within a user (messages
of a user are consecutive), ``token`` within a message, ``character`` is the token's offset in the message.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from .errors import ErrorModel, Search, token_rng
from .protocol import Model
from .text import CHARACTER_TOKENIZER, DEFAULT_WORD_TOKENIZER, Message, find_tokens, word_tokenizer

GAMES = ("wc", "we", "ce", "wr")


def ranked(predictions) -> list[str]:
    """Continuations best first (models need not answer in rank order), without duplicates."""
    seen, out = set(), []
    for text, _ in sorted(predictions, key=lambda p: -p[1]):  # stable: equal scores keep the model's order
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def evaluate_wc(model: Model, context: str, target: str, next_word_only: bool = False) -> dict:
    rows = []
    for i in range(1 if next_word_only else len(target)):
        rows.append(ranked(model.predict(context + target[:i])))
    return {"completions": rows}


def evaluate_entropy(model: Model, context: str, target: str) -> dict:
    scores = [s for text, s in model.predict(context, [target]) if text == target]
    return {"logp": scores[0] if scores else None}


@dataclass
class Reranking:
    """Settings of the ``wr`` game."""
    vocabulary: Iterable[str]
    num_candidates: int = 100
    seed: int = 42
    error_model: ErrorModel = ErrorModel()

    def __post_init__(self):
        self.search = Search(frozenset(self.vocabulary))
        if not self.search.words:
            raise ValueError("the wr game needs a non-empty vocabulary")

    def evaluate(self, model: Model, context: str, target: str, position: tuple) -> dict:
        typed = self.error_model.corrupt(target, token_rng(self.seed, *position))
        found = self.search(typed, self.num_candidates)
        # the typed word and the true word always compete; the nearest others fill up to num_candidates
        must = {typed, target}
        others = [w for w in found if w not in must][:max(self.num_candidates - len(must), 0)]
        candidates = sorted(must | set(others))
        lm = dict(model.predict(context, candidates))
        results = [[c, self.error_model.score(typed, c), lm.get(c)] for c in candidates]
        results.sort(key=lambda r: (-r[1], r[0]))
        return {"verbatim": typed, "results": results}


def run_game(model: Model, messages: Iterable[Message], game: str, *, next_word_only: bool = False,
             reranking: Reranking | None = None, train: bool = False, shard: tuple[int, int] = (0, 1),
             progress: Callable[[Iterable], Iterable] | None = None,
             tokenizer: str = DEFAULT_WORD_TOKENIZER) -> Iterator[dict]:
    """Yield the log of ``game`` over ``messages``.

    ``train``: after a message is evaluated, the model trains on it; ``clear`` is sent at each new user.
    ``shard=(k, n)``: evaluate only messages whose global ordinal is k mod n (or, with ``train``, only users
    whose ordinal is k mod n, since adaptation needs a user's whole history). Indices stay those of the full
    run, so the shard logs concatenate into the log of a single run.
    ``tokenizer``: the word tokenizer of wc/we/wr (``biasflow.lmchallenge.text.WORD_TOKENIZERS``).
    """
    if game not in GAMES:
        raise ValueError(f"unknown game {game!r} (expected one of {', '.join(GAMES)})")
    if game == "wr" and reranking is None:
        raise ValueError("the wr game needs a vocabulary (Reranking settings)")
    k, n = shard
    if not (n >= 1 and 0 <= k < n):
        raise ValueError(f"bad shard {k}/{n}: need 0 <= k < n")
    token_pattern = token_pattern_of(game, tokenizer)
    messages = progress(messages) if progress else messages
    ordinal = 0
    for user_ordinal, (user, group) in enumerate(itertools.groupby(messages, key=lambda m: m.user)):
        if train and user_ordinal % n != k:
            continue
        if train:
            model.clear()
        for message_index, message in enumerate(group):
            mine = train or ordinal % n == k
            ordinal += 1
            if not mine:
                continue
            yield from play_message(model, message.text, game, user=user, message_index=message_index,
                                    next_word_only=next_word_only, reranking=reranking, token_pattern=token_pattern)
            if train:
                model.train(message.text)


def token_pattern_of(game: str, tokenizer: str = DEFAULT_WORD_TOKENIZER):
    return CHARACTER_TOKENIZER if game == "ce" else word_tokenizer(tokenizer)


def play_message(model: Model, text: str, game: str, *, user=None, message_index: int = 0,
                 next_word_only: bool = False, reranking: Reranking | None = None,
                 token_pattern=None) -> Iterator[dict]:
    """The log of ``game`` over one message (``message_index``-th of ``user``'s): one datum per token."""
    token_pattern = token_pattern if token_pattern is not None else token_pattern_of(game)
    for tok in find_tokens(text, token_pattern):
        context = text[:tok.character]
        if game == "wc":
            payload = evaluate_wc(model, context, tok.target, next_word_only)
        elif game == "wr":
            payload = reranking.evaluate(model, context, tok.target, (user, message_index, tok.index))
        else:
            payload = evaluate_entropy(model, context, tok.target)
        yield {"user": user, "message": message_index, "token": tok.index, "character": tok.character,
               "target": tok.target, **payload}
