"""Summary statistics of LM Challenge logs (the meaning of each figure follows LM Challenge).

* prediction (``wc``): ``hitN`` = share of tokens whose true word is among the first N next-word predictions;
  ``hit`` = share predicted at any rank; ``mrr`` = mean over tokens of 1/rank (0 when never predicted).
* completion (``wc``, unless ``--next-word-only``): a token counts as completed at the shortest typed prefix
  i after which the rest of the word is among the top 2 continuations; ``characters`` = completed characters
  (len(target) - i) / all characters, ``tokens`` = completed tokens / tokens.
* entropy (``we``/``ce``): ``mean`` = mean of -logp over the tokens the model scored (nats when the model
  returns natural logs), ``bits`` = mean / ln 2, ``hit`` = share of tokens scored, ``fingerprint`` = an
  order-independent hash of the scored tokens (user, message, token, target). Two entropies are comparable only
  when their fingerprints are equal, i.e. both models scored exactly the same tokens.
* reranking (``wr``): ``accuracy`` = share of tokens whose true word ranks strictly first under the best
  error/LM mixture, ``base_accuracy`` = the same by the error model alone.
* ``fingerprint`` (top level) hashes every selected token, so two logs over the same text share it.

Fingerprints are LM Challenge 5.2's (``lmchallenge/stats.py``, ``Hash``/``Fingerprint``): per token a 32-bit hash
of (user, message, token, target) -- a string contributes the first 8 bytes of its MD5 digest read as a
little-endian integer, an integer 50123 x its value, null 49307, combined as h = h x 48677 + column -- summed modulo
2^32 and printed as 8 hex digits, so a log's fingerprint equals the original tool's.

``users`` / ``messages`` count as LM Challenge does by default (``counting="consecutive"``): a new user (message)
whenever the key differs from the previous selected token's, so a user who reappears after another counts again.
``counting="distinct"`` counts distinct users and (user, message) pairs instead: the same for one run's log, and
also right for concatenated shard logs of a multi-user text, whose users interleave.

Tokens deselected by ``grep`` (``"select": false``) are left out and counted as ``skipped``. All other sums are
order-independent, so the concatenated logs of parallel shards give the statistics of one run.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections import Counter
from typing import Iterable

import numpy as np

from . import reranking as rr

HIT_RANKS = (1, 3, 10, 20)
COMPLETION_MAX_RANK = 2
COUNTINGS = ("consecutive", "distinct")
_MASK = 0xFFFFFFFF
_COMBINE, _INT, _NULL = 48677, 50123, 49307  # LM Challenge 5.2's Hash constants


def _column_hash(value) -> int:
    if isinstance(value, str):
        return int.from_bytes(hashlib.md5(value.encode("utf-8")).digest()[:8], "little")
    if isinstance(value, (bool, int)):
        return _INT * value
    if value is None:
        return _NULL
    raise ValueError(f"cannot fingerprint a {type(value).__name__} ({value!r}): user, message, token and target "
                     "must be strings, integers or null")


def datum_hash(d: dict) -> int:
    """LM Challenge's 32-bit hash of a datum's (user, message, token, target)."""
    h = 0
    for key in ("user", "message", "token", "target"):
        h = (h * _COMBINE + _column_hash(d.get(key))) & _MASK  # the original masks once at the end: same bits
    return h


def rank(items: list, item, max_rank: int | None = None) -> int | None:
    """1-based rank of ``item`` among the first ``max_rank`` of ``items``, or None."""
    stop = len(items) if max_rank is None else min(max_rank, len(items))
    try:
        return 1 + items.index(item, 0, stop)
    except ValueError:
        return None


def completed_at(target: str, completions: list[list[str]], max_rank: int = COMPLETION_MAX_RANK) -> int | None:
    """Characters typed before the rest of ``target`` was offered (within ``max_rank``), or None."""
    for i, row in enumerate(completions):
        if rank(row, target[i:], max_rank) is not None:
            return i
    return None


class Accumulator:
    def __init__(self, counting: str = "consecutive"):
        if counting not in COUNTINGS:
            raise ValueError(f"unknown counting {counting!r} (expected one of {', '.join(COUNTINGS)})")
        self.counting = counting
        self.tokens = self.skipped = self.characters = 0
        self.users: set = set()
        self.messages: set = set()
        self.user_runs = self.message_runs = 0
        self._previous: tuple | None = None  # (user, (user, message)) of the previous selected datum
        self.fingerprint = 0
        self.wc_tokens = self.wc_characters = 0
        self.ranks: Counter = Counter()  # rank -> tokens; sums come out the same in any order
        self.pred = {"hit": 0, **{f"hit{n}": 0 for n in HIT_RANKS}}
        self.comp_tokens = self.comp_chars = self.comp_seen = 0
        self.ent_tokens = self.ent_scored = 0
        self.ent_logps: list[float] = []  # summed with fsum: exact, so shard order cannot change a digit
        self.ent_fingerprint = 0
        self.wr_data: list[dict] = []

    def update(self, d: dict) -> None:
        if not d.get("select", True):
            self.skipped += 1
            return
        target = d["target"]
        self.tokens += 1
        self.characters += len(target)
        user, message = d.get("user"), (d.get("user"), d.get("message"))
        self.users.add(user)
        self.messages.add(message)
        prev_user, prev_message = self._previous or (object(), object())
        self.user_runs += user != prev_user
        self.message_runs += message != prev_message
        self._previous = (user, message)
        h = datum_hash(d)
        self.fingerprint = (self.fingerprint + h) & _MASK
        comps = d.get("completions")
        if comps is not None:
            self.wc_tokens += 1
            self.wc_characters += len(target)
            r = rank(comps[0], target) if comps else None
            if r is not None:
                self.ranks[r] += 1
                self.pred["hit"] += 1
                for n in HIT_RANKS:
                    self.pred[f"hit{n}"] += r <= n
            if len(comps) > 1 or len(target) <= 1:
                self.comp_seen += 1  # completion stats need the prefix rows (absent with --next-word-only)
            i = completed_at(target, comps)
            if i is not None:
                self.comp_tokens += 1
                self.comp_chars += len(target) - i
        if "logp" in d:
            self.ent_tokens += 1
            if d["logp"] is not None:
                self.ent_scored += 1
                self.ent_logps.append(d["logp"])
                self.ent_fingerprint = (self.ent_fingerprint + h) & _MASK
        if d.get("results") is not None:
            self.wr_data.append(d)

    def summary(self) -> dict:
        def ratio(a, b):
            return a / b if b else None

        if self.counting == "distinct":
            users, messages = len(self.users), len(self.messages)
        else:
            users, messages = self.user_runs, self.message_runs
        out: dict = {
            "fingerprint": f"{self.fingerprint:08x}",
            "users": users,
            "messages": messages,
            "tokens": self.tokens,
            "characters": self.characters,
            "messages_per_user": ratio(messages, users),
            "tokens_per_user": ratio(self.tokens, users),
            "characters_per_token": ratio(self.characters, self.tokens),
            "skipped": ratio(self.skipped, self.skipped + self.tokens),
            "skipped_tokens": self.skipped,
        }
        if self.wc_tokens:
            p = self.pred
            out["prediction"] = {
                **{f"hit{n}": p[f"hit{n}"] / self.wc_tokens for n in HIT_RANKS},
                "hit": p["hit"] / self.wc_tokens,
                "mrr": math.fsum(c / r for r, c in self.ranks.items()) / self.wc_tokens,
            }
            if self.comp_seen == self.wc_tokens:
                out["completion"] = {"characters": ratio(self.comp_chars, self.wc_characters),
                                     "tokens": ratio(self.comp_tokens, self.wc_tokens)}
        if self.ent_tokens:
            mean = ratio(-math.fsum(self.ent_logps), self.ent_scored)
            out["entropy"] = {
                "mean": mean,
                "bits": None if mean is None else mean / math.log(2),
                "perplexity": None if mean is None else math.exp(min(mean, 700.0)),
                "hit": self.ent_scored / self.ent_tokens,
                "tokens": self.ent_scored,
                "fingerprint": f"{self.ent_fingerprint:08x}",
            }
        if self.wr_data:
            err, lm = rr.matrices(self.wr_data)
            mix = rr.fit(err, lm)
            out["reranking"] = {
                "accuracy": rr.count_correct(mix(err, lm)) / len(self.wr_data),
                "base_accuracy": rr.count_correct(err) / len(self.wr_data),
                "max_candidates": int(np.isfinite(err).sum(axis=1).max()),
                "alpha": mix.alpha,
                "beta": mix.beta,
            }
        return out


def stats(data: Iterable[dict], counting: str = "consecutive") -> dict:
    """Summary statistics of a log; ``counting`` = how users and messages are counted (module docstring)."""
    acc = Accumulator(counting)
    for d in data:
        acc.update(d)
    return acc.summary()


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def to_json(rows: list[dict]) -> str:
    """JSON lines, one object per log (``jq`` friendly)."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def to_csv(rows: list[dict]) -> str:
    flat = [flatten(r) for r in rows]
    keys: list[str] = []
    for f in flat:
        keys += [k for k in f if k not in keys]
    first = [k for k in ("log", "fingerprint", "users", "messages", "tokens") if k in keys]
    keys = first + [k for k in keys if k not in first]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for f in flat:
        w.writerow(f)
    return buf.getvalue()
