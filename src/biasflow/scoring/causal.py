"""Per-token log-probabilities of texts under a causal LM (``TokenLogprobs`` requests, ``answer_token_logprobs``).

A text is encoded WITHOUT special tokens; ``logprobs[i]`` is log P(token_i | what precedes it). How the first token
is conditioned is the request's ``first_token`` (part of its key):

* ``prefix``   -- the whole text follows one prefix token (the tokenizer's BOS, else EOS), so token 0 is
  log P(t0 | BOS) and every later token also sees BOS. This is lm-evaluation-harness (``loglikelihood`` with an
  empty context puts ``prefix_token_id`` before the continuation).
* ``separate`` -- bias-bench's ``_joint_log_probability``: token 0 from a separate pass on the prefix token alone
  (log P(t0 | BOS)), tokens 1.. from a pass on the text WITHOUT the prefix (log P(t_i | t_<i)).
* ``none``     -- no prefix; token 0 is not scored (NaN).

Every causal scorer (this one, ``causal_options``, StereoSet's sentence log-probabilities) makes its model pass
through ``next_token_logprobs``. Texts are batched by a token budget. Models of ``models/packed.py``'s types run
packed: the texts of a batch laid end to end with no padding, so the linear layers see one large matrix whatever the
mix of lengths. Others run in canonical length buckets (right padding + attention mask, ``scoring/batching.py``).
Either way a text's scores do not depend on which other texts are scored. The vocabulary log-softmax is never
materialised: log p = logit[target] - logsumexp(logits), the head run on ``HEAD_ROWS`` tokens at a time on a CPU
(fewer when ``max_logits`` floats would be exceeded; on a GPU as many as ``max_logits`` allows, in whole GPU tiles of
the head, ``models/batch_invariant.py``); a model whose
logits are not a plain head runs padded, its batch capped so that tokens x vocabulary stays under ``max_logits``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
from biasflow.bars import progress_bar as tqdm

from biasflow.models.batch_invariant import batch_invariant, gpu_tile_rows, row_logsumexp
from biasflow.models.chunked_head import ChunkedHead, head_on_real_tokens
from biasflow.models.packed import PackedLayout, SharedPrefixLayout, packable, packed
from biasflow.scoring.answer import DEFAULT_BATCH_TOKENS, DEFAULT_MAX_LOGITS
from biasflow.scoring.batching import packed_batches, pad_right, token_budget_batches, with_padding_column

CAUSAL_KIND = "causal_token_logprobs"
FIRST_TOKEN_MODES = ("prefix", "separate", "none")


def prefix_token_id(adapter) -> int:
    tok = adapter.tokenizer
    bos = getattr(adapter, "bos_token_id", None)
    if bos is None:
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if bos is None:
        raise ValueError(f"model {adapter.name!r}: tokenizer has neither a BOS nor an EOS token to use as prefix; "
                         "use first_token: none")
    return int(bos)


def first_token_logprobs(adapter) -> torch.Tensor:
    """log-softmax over the vocabulary after the prefix token alone (float64, on the CPU): token 0's scores in
    ``separate`` mode and StereoSet's; one pass, kept on the adapter."""
    cached = getattr(adapter, "_first_token_logprobs", None)
    if cached is not None:
        return cached
    ids = torch.tensor([[prefix_token_id(adapter)]], device=adapter.device)
    with torch.inference_mode():
        logits = adapter.model(input_ids=ids).logits
    lp = torch.log_softmax(logits[0, -1].float(), dim=-1).double().cpu()
    try:
        adapter._first_token_logprobs = lp
    except AttributeError:
        pass
    return lp


def encode(adapter, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text without special tokens (the prefix, if any, is added by the scorer)."""
    out = [adapter.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    for t, ids in zip(texts, out):
        if not ids:
            raise ValueError(f"text {t!r} encodes to no tokens")
    return out


def _check_mode(first_token: str) -> None:
    if first_token not in FIRST_TOKEN_MODES:
        raise ValueError(f"first_token={first_token!r} is not one of {FIRST_TOKEN_MODES}")


# vocabulary-head rows per slice on a CPU: a slice's logits (128 x 50,257 floats for GPT-2, 26 MB) are reduced while
# still in cache; the whole batch's at once (1,335 rows, 268 MB) made the head and its log-softmax a quarter slower
# here. Elsewhere (a GPU) a slice is as large as max_logits allows.
HEAD_ROWS = 128
# tokens per packed pass on a CPU: beyond this the feed-forward activations (tokens x 3,072 floats for GPT-2) leave
# the cache and the linear layers slow down (GPT-2 size, 2 cores: 2,048 tokens 4% faster than 8,192, 1,024 no faster)
PACKED_CPU_TOKENS = 2048


def _head_logprobs(head: torch.nn.Module | ChunkedHead, hidden: torch.Tensor, targets: torch.Tensor,
                   rows: int) -> torch.Tensor:
    """logit[target] - logsumexp(logits) for each row of ``hidden`` (tokens, hidden size), float32, the head run on
    ``rows`` rows at a time (each row's value does not depend on the slicing); a ``ChunkedHead`` (``model.head_chunk``)
    runs the vocabulary in chunks instead and never holds a slice's full logits."""
    if isinstance(head, ChunkedHead):
        return head.logprobs(hidden, targets, rows)
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], rows):
        logits = head(hidden[start:start + rows])
        if logits.device.type == "cuda":  # float32 inside row_logsumexp's fixed-shape calls: no float32 copy here
            out[start:start + rows] = (logits.gather(-1, targets[start:start + rows, None])[:, 0].float()
                                       - row_logsumexp(logits))
            continue
        logits = logits.float()
        out[start:start + rows] = (logits.gather(-1, targets[start:start + rows, None])[:, 0]
                                   - torch.logsumexp(logits, dim=-1))
    return out


@torch.inference_mode()
def _target_logprobs(model, ids: torch.Tensor, attn: torch.Tensor, targets: torch.Tensor,
                     head_rows: int = HEAD_ROWS, head: ChunkedHead | None = None) -> torch.Tensor:
    """log P(targets[r, j] | ids[r, :j+1]) for every position j (float32), whatever else shares the batch;
    padding positions are 0."""
    with batch_invariant(model):  # no key/value cache: one pass, nothing to continue from
        if not head_on_real_tokens(model):
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
            if logits.device.type == "cuda":  # fixed-shape reductions (``row_logsumexp``)
                lse = row_logsumexp(logits.reshape(-1, logits.shape[-1])).reshape(logits.shape[:-1])
            else:
                lse = torch.logsumexp(logits, dim=-1)
            return logits.gather(-1, targets[..., None])[..., 0] - lse
        hidden = model.base_model(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        real = attn.bool()
        out = torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)
        out[real] = _head_logprobs(head or model.get_output_embeddings(), hidden[real], targets[real], head_rows)
    return out


@torch.inference_mode()
def _packed_target_logprobs(model, seqs: Sequence[Sequence[int]], device, head_rows: int = HEAD_ROWS,
                            head: ChunkedHead | None = None) -> list[np.ndarray]:
    """log P(seq[j+1] | seq[:j+1]) for j < len(seq) - 1 of each sequence, the sequences scored packed in one pass."""
    layout = PackedLayout.of([len(s) for s in seqs])
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=device)
    # each position predicts the next token of its own text; a text's last position predicts nothing (target 0)
    targets = torch.tensor([t for s in seqs for t in list(s[1:]) + [0]], dtype=torch.long, device=device)
    with batch_invariant(model), packed(model):
        hidden = model.base_model(input_ids=ids[None], position_ids=layout.position_ids(device), use_cache=False,
                                  biasflow_layout=layout).last_hidden_state[0]
        lp = _head_logprobs(head or model.get_output_embeddings(), hidden, targets, head_rows).cpu().numpy()
    return [lp[start:start + len(s) - 1] for start, s in zip(layout.starts(), seqs)]


@torch.inference_mode()
def _packed_tree_logprobs(model, trees: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]], device,
                          head_rows: int = HEAD_ROWS, head: ChunkedHead | None = None) -> list[list[np.ndarray]]:
    """log P(branch[j] | prefix + branch[:j]) for every token of every branch of each (prefix, branches) tree, the
    trees packed in one pass (``SharedPrefixLayout``). A branch's last token is not fed: nothing is predicted from
    it and nothing attends to it. The head runs only on the rows that predict a branch token."""
    fed = [(list(prefix), [list(b)[:-1] for b in branches]) for prefix, branches in trees]
    layout = SharedPrefixLayout.of_trees([(len(p), [len(b) for b in bs]) for p, bs in fed])
    ids = torch.tensor([t for p, bs in fed for t in p + [x for b in bs for x in b]], dtype=torch.long, device=device)
    rows: list[int] = []
    targets: list[int] = []
    for start, (prefix, fed_branches), (_, branches) in zip(layout.starts(), fed, trees):
        at = start + len(prefix)
        for fed_branch, branch in zip(fed_branches, branches):
            # token 0 of a branch is predicted at the prefix's last position, token j at the branch's position j - 1
            rows += [start + len(prefix) - 1] + list(range(at, at + len(fed_branch)))
            targets += list(branch)
            at += len(fed_branch)
    with batch_invariant(model), packed(model):
        hidden = model.base_model(input_ids=ids[None], position_ids=layout.position_ids(device), use_cache=False,
                                  biasflow_layout=layout).last_hidden_state[0]
        lp = _head_logprobs(head or model.get_output_embeddings(), hidden[torch.tensor(rows, device=device)],
                            torch.tensor(targets, dtype=torch.long, device=device), head_rows).cpu().numpy()
    out, at = [], 0
    for _, branches in trees:
        out.append([lp[at + sum(len(b) for b in branches[:k]):][:len(branch)].astype(np.float64)
                    for k, branch in enumerate(branches)])
        at += sum(len(b) for b in branches)
    return out


def context_limit(model) -> int | None:
    """The most tokens ``model`` takes in one text (its position table), None when its config does not say."""
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check_lengths(adapter, seqs: Sequence[Sequence[int]]) -> None:
    limit = context_limit(adapter.model)
    too_long = [i for i, s in enumerate(seqs) if limit is not None and len(s) > limit]
    if too_long:
        i = too_long[0]
        text = adapter.tokenizer.decode(list(seqs[i])[:40])
        raise ValueError(f"model {adapter.name!r} takes at most {limit} tokens per text; {len(too_long)} text(s) are "
                         f"longer, the first ({len(seqs[i])} tokens with any prefix token) starts {text!r}")


def _head_rows(device, vocab: int, max_logits: int, chunked: ChunkedHead | None = None) -> int:
    """Vocabulary-head rows per slice (the padded path of a model whose logits are not a plain head holds a whole
    batch's logits at once instead); with a ``ChunkedHead`` the rows of its fixed tile: a slice holds rows x chunk
    logits, so on a GPU one fixed tile of ``gpu_tile_rows(chunk)`` rows (2,048 for 8,192 columns), on a CPU
    ``HEAD_ROWS``."""
    if chunked is not None:
        if torch.device(device).type == "cuda":
            return gpu_tile_rows(chunked.chunk)
        return max(1, min(HEAD_ROWS, int(max_logits) // chunked.chunk))
    rows = max(1, min(HEAD_ROWS if torch.device(device).type == "cpu" else int(max_logits),
                      int(max_logits) // max(1, vocab)))
    if torch.device(device).type == "cuda":
        # whole fixed tiles of the head (``batch_invariant``'s GPU tile), at least one: a slice that is not a
        # multiple of the tile would be padded up to one
        tile = gpu_tile_rows(vocab)
        rows = max(tile, rows // tile * tile)
    return rows


def _chunked_head(adapter) -> ChunkedHead | None:
    """The adapter's ``ChunkedHead`` (``model.head_chunk``; ``models/causal_lm.py`` builds it), None for the plain
    head; only a plain head (``head_on_real_tokens``) is ever chunked."""
    head = getattr(adapter, "chunked_head", None)
    return head if isinstance(head, ChunkedHead) and head_on_real_tokens(adapter.model) else None


def next_token_logprobs(adapter, seqs: Sequence[Sequence[int]], batch_tokens: int = DEFAULT_BATCH_TOKENS,
                        max_logits: int = DEFAULT_MAX_LOGITS, progress: bool = False,
                        desc: str = "causal log-probs") -> list[np.ndarray]:
    """log P(seq[j+1] | seq[:j+1]) for j = 0 .. len(seq) - 2 of each token-id sequence (float64, one value fewer
    than the sequence has tokens): every causal scorer's one model pass.

    Packed (``models/packed.py``) when the model allows it, else in canonical-width padded batches; at most
    ``batch_tokens`` tokens per pass (padding included) and ``max_logits`` vocabulary floats at a time."""
    model, device = adapter.model, adapter.device
    tok = adapter.tokenizer
    _check_lengths(adapter, seqs)
    head = model.get_output_embeddings()
    vocab = int(head.weight.shape[0]) if head is not None else len(tok)
    on_cpu = torch.device(device).type == "cpu"
    chunked = _chunked_head(adapter)
    head_rows = _head_rows(device, vocab, max_logits, chunked)
    out = [np.zeros(max(0, len(s) - 1), dtype=np.float64) for s in seqs]
    todo = [i for i, s in enumerate(seqs) if len(s) > 1]  # a single token predicts nothing
    lengths = [len(seqs[i]) for i in todo]
    bar = tqdm(total=len(seqs), desc=f"{desc} {adapter.name}", unit="text", disable=not progress, mininterval=1.0)
    bar.update(len(seqs) - len(todo))
    if todo and head_on_real_tokens(model) and packable(model, max(lengths)):
        tokens = min(int(batch_tokens), PACKED_CPU_TOKENS) if on_cpu else int(batch_tokens)
        for batch in packed_batches(todo, lengths, max(1, tokens)):
            for i, lp in zip(batch, _packed_target_logprobs(model, [seqs[i] for i in batch], device, head_rows,
                                                            chunked)):
                out[i][:] = lp
            bar.update(len(batch))
    else:
        plain_head = head_on_real_tokens(model)
        budget = max(1, int(batch_tokens) if plain_head else min(int(batch_tokens), int(max_logits) // max(1, vocab)))
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        for batch in token_budget_batches(todo, lengths, budget):
            ids, attn = with_padding_column(*pad_right([seqs[i] for i in batch], pad_id), pad_id, device)
            # position j predicts input j+1; the last position predicts nothing we need
            targets = torch.cat([ids[:, 1:], torch.full((len(batch), 1), pad_id, dtype=torch.long)], dim=1)
            lp = _target_logprobs(model, ids.to(device), attn.to(device), targets.to(device), head_rows,
                                  chunked).cpu().numpy()
            for r, i in enumerate(batch):
                out[i][:] = lp[r, : len(seqs[i]) - 1]
            bar.update(len(batch))
    bar.close()
    return out


def shared_prefix_logprobs(adapter, prefixes: Sequence[Sequence[int]], branches: Sequence[Sequence[Sequence[int]]],
                           batch_tokens: int = DEFAULT_BATCH_TOKENS, max_logits: int = DEFAULT_MAX_LOGITS,
                           progress: bool = False, desc: str = "contexts") -> list[list[np.ndarray]]:
    """For each prefix and each of its branches, log P(branch[j] | prefix + branch[:j]) for every token of the
    branch (float64): the prefix computed once for all its branches.

    Packed as trees (``SharedPrefixLayout``) when the model packs; any other model scores prefix + branch as one
    text per branch (``next_token_logprobs``), which is what the tree computes, up to float rounding."""
    if len(prefixes) != len(branches):
        raise ValueError("prefixes and branches must have the same length")
    model, device = adapter.model, adapter.device
    for prefix, bs in zip(prefixes, branches):
        if not prefix or any(not b for b in bs):
            raise ValueError("shared-prefix scoring: a prefix or a branch without tokens")
    joined = [list(p) + list(b) for p, bs in zip(prefixes, branches) for b in bs]
    _check_lengths(adapter, joined)
    on_cpu = torch.device(device).type == "cpu"
    if not (joined and head_on_real_tokens(model) and packable(model, max(map(len, joined)))):
        found = iter(next_token_logprobs(adapter, joined, batch_tokens, max_logits, progress, desc))
        return [[next(found)[len(p) - 1:] for _ in bs] for p, bs in zip(prefixes, branches)]
    chunked = _chunked_head(adapter)
    head_rows = _head_rows(device, int(model.get_output_embeddings().weight.shape[0]), max_logits, chunked)
    # a tree feeds its prefix and every branch but the branch's last token
    sizes = [len(p) + sum(len(b) - 1 for b in bs) for p, bs in zip(prefixes, branches)]
    tokens = min(int(batch_tokens), PACKED_CPU_TOKENS) if on_cpu else int(batch_tokens)
    out: list[list[np.ndarray] | None] = [None] * len(prefixes)
    with tqdm(total=len(prefixes), desc=f"{desc} {adapter.name}", unit="context", disable=not progress,
              mininterval=1.0) as bar:
        for batch in packed_batches(list(range(len(prefixes))), sizes, max(1, tokens)):
            trees = [(prefixes[i], branches[i]) for i in batch]
            for i, lps in zip(batch, _packed_tree_logprobs(model, trees, device, head_rows, chunked)):
                out[i] = lps
            bar.update(len(batch))
    return out


def causal_token_logprobs(adapter, token_ids: Sequence[Sequence[int]], first_token: str = "prefix",
                          batch_tokens: int = DEFAULT_BATCH_TOKENS, max_logits: int = DEFAULT_MAX_LOGITS,
                          progress: bool = True) -> list[np.ndarray]:
    """Per-token log-probabilities of each id sequence (same length as it); see the module doc for ``first_token``."""
    _check_mode(first_token)
    bos = prefix_token_id(adapter) if first_token in ("prefix", "separate") else None
    with_prefix = first_token == "prefix"
    inputs = [([bos] + list(ids)) if with_prefix else list(ids) for ids in token_ids]
    found = next_token_logprobs(adapter, inputs, batch_tokens, max_logits, progress)
    out = [np.full(len(ids), np.nan, dtype=np.float64) for ids in token_ids]
    for t, lp in enumerate(found):
        if with_prefix:
            out[t][:] = lp       # the prefix predicts token 0, ...
        else:
            out[t][1:] = lp      # token 0 has no context here
    if first_token == "separate":
        first = first_token_logprobs(adapter)
        for t, ids in enumerate(token_ids):
            out[t][0] = float(first[ids[0]])
    return out


def answer_token_logprobs(adapter, requests, budget) -> pd.DataFrame:
    """Answerer of ``TokenLogprobs``: texts cased as the model expects (``model.lowercase``), one scorer call per
    ``first_token`` mode: ``token_ids``, ``logprobs`` (NaN where not scored), ``total`` (their sum)."""
    out: list[dict | None] = [None] * len(requests)
    for mode in dict.fromkeys(r.first_token for r in requests):
        _check_mode(mode)
        rows = [i for i, r in enumerate(requests) if r.first_token == mode]
        ids = encode(adapter, [adapter.normalise(requests[i].text) for i in rows])
        lps = causal_token_logprobs(adapter, ids, first_token=mode, batch_tokens=budget.batch_tokens,
                                    max_logits=budget.max_logits, progress=budget.progress)
        for i, seq, lp in zip(rows, ids, lps):
            out[i] = {"token_ids": list(map(int, seq)), "logprobs": lp.tolist(), "total": float(np.nansum(lp))}
    return pd.DataFrame(out, columns=["token_ids", "logprobs", "total"])
