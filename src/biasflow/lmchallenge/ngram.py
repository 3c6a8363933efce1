"""The sample n-gram model: word- or character-level, interpolated Witten-Bell smoothing.

P_0(w) = c(w) / N over the training vocabulary, and for a history h of k tokens

    P_k(w | h) = (c(h, w) + T(h) P_{k-1}(w | h')) / (c(h) + T(h))      (P_{k-1} if h was never seen)

where h' drops the oldest token and T(h) is the number of distinct tokens seen after h. Every level is a
proper distribution over the vocabulary, so scores are normalised log-probabilities (natural log) as the
entropy games require; a token outside the vocabulary gets no score (it is left out, never guessed).

Run as a protocol process:  ``python -m biasflow.lmchallenge.ngram --order 3 --train FILE [--level char]``
"""
from __future__ import annotations

import argparse
import bisect
import heapq
import math
import sys
from collections import Counter, defaultdict
from typing import Iterable, Sequence

from .protocol import Model, Prediction, serve
from .text import DEFAULT_WORD_TOKENIZER, WORD_TOKENIZERS, read_messages, split_context, word_tokenizer

BOS = "\x02"  # start-of-line padding; never predicted
_SEP = "\x1f"  # joins history tokens into one dict key (smaller than tuple keys)


class NgramCounts:
    """Counts of every n-gram up to ``order`` over token sequences, with add/subtract for adaptation."""

    def __init__(self, order: int):
        if order < 1:
            raise ValueError(f"--order must be >= 1, got {order}")
        self.order = order
        # followers[k][history key] -> Counter of next tokens, for histories of k tokens
        self.followers: list[dict[str, Counter]] = [defaultdict(Counter) for _ in range(order)]
        self.totals: list[Counter] = [Counter() for _ in range(order)]
        self.version = 0  # bumped on every change, invalidates derived caches

    def add(self, tokens: Sequence[str], sign: int = 1) -> None:
        padded = [BOS] * (self.order - 1) + list(tokens)
        for i in range(self.order - 1, len(padded)):
            w = padded[i]
            for k in range(self.order):
                h = _SEP.join(padded[i - k:i])
                f = self.followers[k][h]
                f[w] += sign
                self.totals[k][h] += sign
                if f[w] <= 0:
                    del f[w]
                    if not f:
                        del self.followers[k][h]
                        del self.totals[k][h]
        self.version += 1


class NgramModel(Model):
    """Word (``level='word'``) or character (``level='char'``) n-gram model behind the ``Model`` API."""

    def __init__(self, order: int = 3, level: str = "word", n_predictions: int = 20,
                 tokenizer: str = DEFAULT_WORD_TOKENIZER):
        if level not in ("word", "char"):
            raise ValueError(f"level must be 'word' or 'char', got {level!r}")
        self.level = level
        self.word_tokenizer = word_tokenizer(tokenizer)  # the games' word tokenizer, so both see the same words
        self.n_predictions = n_predictions
        self.counts = NgramCounts(order)
        self._trained: list[list[str]] = []  # lines added by train(), removed again by clear()
        self._cache_version = -1
        self._sorted: dict = {}
        self._alpha: list[str] = []

    @property
    def order(self) -> int:
        return self.counts.order

    def tokenize(self, text: str) -> list[str]:
        return list(text) if self.level == "char" else self.word_tokenizer.findall(text)

    def fit(self, lines: Iterable[str]) -> "NgramModel":
        for line in lines:
            self.counts.add(self.tokenize(line))
        return self

    # -- persistence: train once, serve from every game shard -----------------------------------------------
    FORMAT = "biasflow-ngram/1"

    def save(self, path: str) -> None:
        """Write the counts as JSON (no pickle: a model file is data, never code), atomically."""
        import json

        from biasflow.io import write_text

        if self._trained:
            raise ValueError("save() after train(): the adapted counts are session state, not the model")
        doc = {"format": self.FORMAT, "order": self.order, "level": self.level,
               "followers": [{h: dict(c) for h, c in level.items()} for level in self.counts.followers]}
        write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")), path)

    @classmethod
    def load(cls, path: str, n_predictions: int = 20) -> "NgramModel":
        import json

        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except OSError as e:
            raise ValueError(f"n-gram model {path}: {e.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"n-gram model {path} is damaged ({e}); delete it and re-run to retrain") from None
        if not isinstance(doc, dict) or doc.get("format") != cls.FORMAT:
            raise ValueError(f"n-gram model {path}: not a {cls.FORMAT} file")
        model = cls(order=int(doc["order"]), level=doc["level"], n_predictions=n_predictions)
        if len(doc["followers"]) != model.order:
            raise ValueError(f"n-gram model {path}: {len(doc['followers'])} levels for order {model.order}")
        for k, level in enumerate(doc["followers"]):
            fol, tot = model.counts.followers[k], model.counts.totals[k]
            for h, c in level.items():
                fol[h] = Counter(c)
                tot[h] = sum(c.values())
        model.counts.version += 1
        return model

    @property
    def vocabulary(self) -> set[str]:
        return set(self.counts.followers[0].get("", {}))

    # -- probabilities ----------------------------------------------------------------------------------
    def prob(self, history: Sequence[str], w: str) -> float:
        """Interpolated Witten-Bell P(w | history); 0.0 when ``w`` is outside the vocabulary."""
        fol, tot = self.counts.followers, self.counts.totals
        uni = fol[0].get("")
        if not uni or w not in uni:
            return 0.0
        p = uni[w] / tot[0][""]
        padded = [BOS] * (self.order - 1) + list(history)
        for k in range(1, self.order):
            h = _SEP.join(padded[len(padded) - k:])
            f = fol[k].get(h)
            if not f:
                break  # a longer history containing an unseen one is unseen too
            c, t = tot[k][h], len(f)
            p = (f.get(w, 0) + t * p) / (c + t)
        return p

    def logprob(self, history: Sequence[str], tokens: Sequence[str]) -> float | None:
        """Sum of log P over ``tokens`` following ``history``; None if any token is out of vocabulary."""
        history = list(history)
        total = 0.0
        for w in tokens:
            p = self.prob(history, w)
            if p <= 0.0:
                return None
            total += math.log(p)
            history.append(w)
        return total

    # -- top-k ------------------------------------------------------------------------------------------
    def _refresh(self) -> None:
        if self._cache_version != self.counts.version:
            self._sorted = {}
            self._alpha = sorted(self.counts.followers[0].get("", {}))
            self._cache_version = self.counts.version

    def _top_followers(self, k: int, h: str, prefix: str, m: int) -> list[str]:
        """The ``m`` most frequent followers of history ``h`` that extend ``prefix``."""
        f = self.counts.followers[k].get(h)
        if not f:
            return []
        if k == 0 and prefix:
            # the unigram list is the whole vocabulary: narrow it to the prefix range first
            lo = bisect.bisect_left(self._alpha, prefix)
            hi = bisect.bisect_left(self._alpha, prefix + "\U0010ffff")
            return heapq.nlargest(m, (w for w in self._alpha[lo:hi] if w != prefix), key=lambda w: (f[w], w))
        key = (k, h)
        order = self._sorted.get(key)
        if order is None:
            order = sorted(f, key=lambda w: (-f[w], w))
            self._sorted[key] = order
        out = []
        for w in order:
            if w.startswith(prefix) and len(w) > len(prefix):
                out.append(w)
                if len(out) == m:
                    break
        return out

    def top(self, history: Sequence[str], prefix: str = "", n: int | None = None) -> list[tuple[str, float]]:
        """Approximate top-n tokens extending ``prefix``, with exact log-probabilities.

        Candidates are the most frequent followers at every history length; this finds the true top-n
        unless a token ranks low at every level yet high in the mixture (rare, and harmless for ranking).
        """
        n = n or self.n_predictions
        self._refresh()
        padded = [BOS] * (self.order - 1) + list(history)
        cands: set[str] = set()
        for k in range(self.order):
            h = _SEP.join(padded[len(padded) - k:]) if k else ""
            if k and h not in self.counts.followers[k]:
                break
            cands.update(self._top_followers(k, h, prefix, 2 * n))
        scored = [(w, self.prob(history, w)) for w in cands]
        best = heapq.nlargest(n, scored, key=lambda x: (x[1], x[0]))
        return [(w, math.log(p)) for w, p in best if p > 0]

    # -- Model API --------------------------------------------------------------------------------------
    def predict(self, context: str, candidates: Sequence[str] | None = None) -> list[Prediction]:
        if self.level == "char":
            history = list(context)
            if candidates is None:
                return self.top(history)
            return [(c, s) for c in candidates if (s := self.logprob(history, list(c))) is not None]

        history, prefix = split_context(context, self.word_tokenizer)
        if candidates is None:
            # completions of the word being typed (next-word predictions when prefix is empty)
            return [(w[len(prefix):], s) for w, s in self.top(history, prefix)]
        out = []
        for c in candidates:
            tokens = self.word_tokenizer.findall(prefix + c)
            hist = history
            if prefix and tokens and tokens[0] == prefix:
                # the context's last token is complete and the candidate starts a new one ("hello" + ",")
                hist, tokens = history + [prefix], tokens[1:]
            if not tokens:
                continue
            s = self.logprob(hist, tokens)
            if s is not None:
                out.append((c, s))
        return out

    def train(self, line: str) -> None:
        tokens = self.tokenize(line)
        self.counts.add(tokens)
        self._trained.append(tokens)

    def clear(self) -> None:
        for tokens in self._trained:
            self.counts.add(tokens, sign=-1)
        self._trained = []


def load_training_lines(path: str, fmt: str = "auto") -> list[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [m.text for m in read_messages(fh, fmt, source=path)]
    except OSError as e:
        raise ValueError(f"training text {path}: {e.strerror}") from None


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="python -m biasflow.lmchallenge.ngram",
                                          description="Serve the sample n-gram model over the LM Challenge protocol.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--train", metavar="FILE", help="training text (plain lines or JSON lines)")
    src.add_argument("--load", metavar="MODEL", help="a model saved with --save (no retraining)")
    p.add_argument("--save", metavar="MODEL", help="train, write the model to this file and exit")
    p.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    p.add_argument("--level", choices=["word", "char"], default="word", help="word or character model")
    p.add_argument("--predictions", type=int, default=20, help="how many predictions to return (default 20)")
    p.add_argument("--format", choices=["auto", "text", "json"], default="auto", help="training file format")
    p.add_argument("--tokenizer", choices=list(WORD_TOKENIZERS), default=DEFAULT_WORD_TOKENIZER,
                   help="word tokenizer (default lmchallenge, LM Challenge 5.2's; lossless keeps every character)")
    return p


def model_from_args(args: argparse.Namespace) -> NgramModel:
    if args.load:
        return NgramModel.load(args.load, n_predictions=args.predictions)
    if args.order < 1:
        raise ValueError(f"--order must be >= 1, got {args.order}")
    model = NgramModel(order=args.order, level=args.level, n_predictions=args.predictions,
                       tokenizer=args.tokenizer)
    return model.fit(load_training_lines(args.train, args.format))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model = model_from_args(args)
        if args.save:
            model.save(args.save)
            return 0
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    serve(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
