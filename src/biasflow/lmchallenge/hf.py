"""Hugging Face causal and masked LMs behind the LM Challenge ``Model`` API, in-process.

Word-level on purpose:

* a word is one or more tokens: a word-start token followed by continuation pieces (WordPiece ``##x``, BPE tokens
  without a leading space) whose text is letters or digits; punctuation is a token of its own, as in LM Challenge;
* the score of a word is log P(its pieces | context) + log P(a word boundary follows), the boundary being any
  token that does not continue the word (with ``word_boundary=False``: the pieces only, the earlier convention, under
  which a word can never outrank its own first piece);
* scoring a candidate: the context and context+candidate are tokenised; the tokens after their common prefix are
  the candidate's word (an in-progress prefix is re-scored as part of the word, like the n-gram model); causal LMs
  score left to right, masked LMs fill one [MASK] per piece after the context, left to right (LM Challenge models
  are forward-contextual), and read the boundary at one more mask;
* predictions without candidates: a beam search over pieces (``beam`` words per step, at most ``max_pieces``
  pieces, each step one batched forward pass), filtered by the in-progress prefix, so words spanning several pieces
  are predicted with the same score they get as candidates.
"""
from __future__ import annotations

import abc
from typing import Sequence

from .protocol import Model, Prediction
from .text import split_context


def _word_pieces(tokenizer) -> tuple[list[bool], list[str], list[bool]]:
    """Per vocabulary id: does the token start a word, its surface text, and can it continue a word."""
    n = len(tokenizer)
    toks = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(tokenizer.all_special_ids)
    starts, surface, continues = [False] * n, [""] * n, [False] * n
    wordpiece = any(t and t.startswith("##") for t in toks)
    for i, t in enumerate(toks):
        if t is None or i in special or (t.startswith("[") and t.endswith("]")):
            continue
        if wordpiece:
            starts[i], surface[i] = not t.startswith("##"), t[2:] if t.startswith("##") else t
            continues[i] = t.startswith("##") and surface[i].isalnum()
        elif t.startswith(("Ġ", "▁")):
            starts[i], surface[i] = True, tokenizer.convert_tokens_to_string([t]).strip()
        else:
            surface[i] = tokenizer.convert_tokens_to_string([t])
            continues[i] = surface[i].isalnum()
    return starts, surface, continues


class _HFModel(Model):
    def __init__(self, model, tokenizer, n_predictions: int = 20, word_boundary: bool = True, beam: int = 0,
                 max_pieces: int = 3):
        import torch

        self.model = model.eval()
        self.tok = tokenizer
        self.n_predictions = n_predictions
        self.word_boundary = word_boundary
        self.beam = beam or max(2 * n_predictions, 8)
        self.max_pieces = max(1, max_pieces)
        self._starts, self._surface, cont = _word_pieces(tokenizer)
        self._continues = torch.tensor(cont + [False] * (model.config.vocab_size - len(cont)))
        self._word_start = torch.tensor(self._starts + [False] * (model.config.vocab_size - len(self._starts)))

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kw):
        """A hub id or local folder, through biasflow's one Hugging Face loading function."""
        from pathlib import Path

        from biasflow.models.hf import load_pretrained

        where = "path" if Path(name_or_path).expanduser().exists() else "hub_id"
        # no name: a hub id or path is none (messages name the source, as they did)
        loaded = load_pretrained({where: name_or_path, "device": "cpu"}, cls._auto())
        return cls(loaded.model, loaded.tokenizer, **kw)

    def _enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"] if text else []

    def _split(self, context: str, candidate: str) -> tuple[list[int], list[int]]:
        """(history ids, ids of the scored word) for ``candidate`` following ``context``."""
        hist = context.rstrip()
        h_ids, f_ids = self._enc(hist), self._enc(context + candidate)
        n = 0
        while n < min(len(h_ids), len(f_ids)) and h_ids[n] == f_ids[n]:
            n += 1
        return f_ids[:n], f_ids[n:]

    def _boundary(self, logp):
        """log P(the next token does not continue the current word), from next-token log-probabilities."""
        import torch

        cont = self._continues[: logp.shape[-1]]
        return torch.log1p(-logp[..., cont].exp().sum(-1).clamp(max=1 - 1e-7))

    @abc.abstractmethod
    def _next_logprobs_batch(self, history_ids: list[int], words: list[list[int]]):
        """Log-probabilities of the next token after ``history_ids + word`` for each word (all the same length)."""

    def _next_logprobs(self, history_ids: list[int]):
        return self._next_logprobs_batch(history_ids, [[]])[0]

    @abc.abstractmethod
    def _score_pieces(self, history_ids: list[int], word_ids: list[int]) -> tuple[float, object]:
        """log P(word_ids | history_ids) and the next-token log-probabilities after the word (None if not free)."""

    def _score(self, history_ids: list[int], word_ids: list[int]) -> float:
        total, after = self._score_pieces(history_ids, word_ids)
        if self.word_boundary:
            if after is None:
                after = self._next_logprobs_batch(history_ids, [word_ids])[0]
            total += float(self._boundary(after))
        return total

    def _consistent(self, rest: str, size: int):
        """Tokens whose text agrees with the still-typed ``rest``: a prefix of it, or starting with it."""
        import torch

        cached = getattr(self, "_consistent_cache", None)
        if cached is not None and cached[0] == rest:
            return cached[1]
        ok = torch.zeros(size, dtype=torch.bool)
        idx = [i for i, s in enumerate(self._surface[:size]) if s and (s.startswith(rest) or rest.startswith(s))]
        ok[idx] = True
        self._consistent_cache = (rest, ok)
        return ok

    def _text(self, ids: list[int]) -> str:
        return "".join(self._surface[i] for i in ids)

    def _beam_words(self, hist_ids: list[int], prefix: str) -> list[Prediction]:
        """The ``n_predictions`` best completions of ``prefix``: beam search over word pieces."""
        import torch

        beams: list[tuple[list[int], float]] = [([], 0.0)]
        done: dict[str, float] = {}
        for step in range(self.max_pieces + 1):
            logps = self._next_logprobs_batch(hist_ids, [ids for ids, _ in beams])
            grown = []
            for (ids, lp), logp in zip(beams, logps):
                if ids:
                    text = self._text(ids)
                    if text.startswith(prefix) and len(text) > len(prefix):
                        score = lp + (float(self._boundary(logp)) if self.word_boundary else 0.0)
                        done[text[len(prefix):]] = max(score, done.get(text[len(prefix):], -float("inf")))
                if step == self.max_pieces:
                    continue
                allowed = (self._word_start if not ids else self._continues)[: logp.shape[-1]]
                text = self._text(ids)
                rest = prefix[len(text):] if len(prefix) > len(text) else ""
                if rest:  # only pieces consistent with what is still typed
                    allowed = allowed & self._consistent(rest, logp.shape[-1])
                masked = logp.masked_fill(~allowed, -float("inf"))
                for t in torch.topk(masked, min(self.beam, masked.shape[-1])).indices.tolist():
                    if masked[t] == -float("inf"):
                        break
                    grown.append((ids + [t], lp + float(logp[t])))
            if not grown:
                break
            beams = sorted(grown, key=lambda b: -b[1])[: self.beam]
        return sorted(done.items(), key=lambda kv: -kv[1])[: self.n_predictions]

    def predict(self, context: str, candidates: Sequence[str] | None = None) -> list[Prediction]:
        import torch

        with torch.inference_mode():
            if candidates is not None:
                out = []
                for c in candidates:
                    hist, word = self._split(context, c)
                    if word:
                        out.append((c, self._score(hist, word)))
                return out
            _, prefix = split_context(context)
            hist_ids = self._enc(context[:len(context) - len(prefix)].rstrip())
            return self._beam_words(hist_ids, prefix)


class HFCausalLM(_HFModel):
    @staticmethod
    def _auto():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def _start(self) -> list[int]:
        for t in (self.tok.bos_token_id, self.tok.cls_token_id, self.tok.eos_token_id):
            if t is not None:
                return [t]
        raise ValueError("causal LM tokenizer has no BOS/CLS/EOS token to start a line with")

    def _logits(self, ids: list[int]):
        import torch

        return self.model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)

    def _next_logprobs_batch(self, history_ids, words):
        import torch

        batch = torch.tensor([self._start() + history_ids + w for w in words])  # same length: no padding
        return self.model(input_ids=batch).logits[:, -1].float().log_softmax(-1)

    def _score_pieces(self, history_ids, word_ids):
        ids = self._start() + history_ids + word_ids
        lp = self._logits(ids)
        first = 1 + len(history_ids)  # position of the first word token in ids
        return float(sum(lp[p - 1, ids[p]] for p in range(first, len(ids)))), lp[-1]


class HFMaskedLM(_HFModel):
    @staticmethod
    def _auto():
        from transformers import AutoModelForMaskedLM

        return AutoModelForMaskedLM

    def _wrap(self, ids: list[int]) -> list[int]:
        cls, sep = self.tok.cls_token_id, self.tok.sep_token_id
        return ([cls] if cls is not None else []) + ids + ([sep] if sep is not None else [])

    def _mask_logprobs(self, ids: list[int], position: int):
        import torch

        return self.model(input_ids=torch.tensor([ids])).logits[0, position].float().log_softmax(-1)

    def _next_logprobs_batch(self, history_ids, words):
        import torch

        mask = self.tok.mask_token_id
        offset = 1 if self.tok.cls_token_id is not None else 0
        batch = torch.tensor([self._wrap(history_ids + w + [mask]) for w in words])
        pos = offset + len(history_ids) + len(words[0])
        return self.model(input_ids=batch).logits[:, pos].float().log_softmax(-1)

    def _score_pieces(self, history_ids, word_ids):
        mask = self.tok.mask_token_id
        offset = 1 if self.tok.cls_token_id is not None else 0
        body = history_ids + [mask] * len(word_ids)
        total = 0.0
        for k, t in enumerate(word_ids):  # fill the masks left to right
            pos = len(history_ids) + k
            total += float(self._mask_logprobs(self._wrap(body), pos + offset)[t])
            body[pos] = t
        return total, None
