"""Packed forward passes of decoder-only LMs: the texts of a batch laid end to end, no padding.

In a decoder-only transformer every op but attention works on each token on its own (embeddings, linear layers,
layer norm, activations, residual additions, the vocabulary head). So the texts of a batch can run as one row of
tokens: the linear layers, most of the time of a scoring pass, then multiply one matrix of every token in the batch
instead of one per padded width, with no padding at all, whatever mix of lengths the batch holds. Positions restart
at 0 for each text (``position_ids``), and attention runs per text: ``packed_attention`` takes the texts of one
length together (the layout keeps them contiguous) and runs causal SDPA on them as an ordinary batch of shape
``[texts, heads, length, head dim]``.

A text's scores do not depend on its company: its attention is computed in a call of its own length, and the other
ops are row by row (the linear layers through ``batch_invariant``). ``tests/test_batch_invariance.py`` checks it,
``tests/test_scoring.py`` checks the scores against the untouched model, one text at a time.

On a GPU in bfloat16/float16 the texts of a pass attend in one variable-length flash-attention call
(``_flash_varlen``) instead of one SDPA call per length; float32 and the CPU keep the loop.

Texts that begin with one shared prefix (a multiple-choice question and its options) can be packed as a tree
(``SharedPrefixLayout``): the prefix once, then each branch with positions that continue the prefix's, attending to
the prefix and to itself (an explicit mask per tree), so the prefix's keys and values are computed once for all its
branches, as a key/value cache would give them.

Only model types whose decoder goes through transformers' attention interface with positions from
``position_ids`` are packed (``PACKABLE_TYPES``); anything else runs the padded path.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

log = logging.getLogger(__name__)

PACKED = "biasflow_packed"
# decoder-only model types whose attention layers call ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` and
# whose positions come from ``position_ids`` alone (absolute embeddings or rotary), with no bias, sink or soft-cap
PACKABLE_TYPES = {"gpt2", "llama", "mistral", "qwen2", "qwen3"}


@dataclass(frozen=True)
class PackedLayout:
    """Where each text lies in a packed row: texts of one length are contiguous (``groups``: start, count, length)."""

    lengths: tuple[int, ...]
    groups: tuple[tuple[int, int, int], ...]
    _offsets: dict = field(default_factory=dict, compare=False, repr=False)  # device -> offsets(), made once

    @classmethod
    def of(cls, lengths: Sequence[int]) -> "PackedLayout":
        """Layout of texts laid end to end in the given order; equal lengths must be adjacent."""
        groups: list[list[int]] = []
        start = 0
        for length in map(int, lengths):
            if length < 1:
                raise ValueError(f"packed layout: a text of {length} tokens")
            if groups and groups[-1][2] == length:
                groups[-1][1] += 1
            else:
                if any(g[2] == length for g in groups):
                    raise ValueError("packed layout: texts of one length must be adjacent")
                groups.append([start, 1, length])
            start += length
        return cls(tuple(map(int, lengths)), tuple(tuple(g) for g in groups))

    def position_ids(self, device=None) -> torch.Tensor:
        """(1, tokens): 0..length-1 for each text."""
        return torch.cat([torch.arange(n, device=device) for n in self.lengths])[None]

    def offsets(self, device=None) -> torch.Tensor:
        """(texts + 1,) int32: where each text starts, then the total (flash attention's ``cu_seqlens``); made once
        per device."""
        key = str(device)
        cached = self._offsets.get(key)
        if cached is None:
            starts = self.starts() + [sum(self.lengths)]
            cached = self._offsets[key] = torch.tensor(starts, dtype=torch.int32).to(device, non_blocking=True)
        return cached

    def starts(self) -> list[int]:
        out, start = [], 0
        for n in self.lengths:
            out.append(start)
            start += n
        return out


@dataclass(frozen=True)
class SharedPrefixLayout(PackedLayout):
    """A packed row of trees: each a prefix followed by its branches (``trees``: prefix length, branch lengths).
    ``lengths``/``groups`` are the trees' total lengths, as for texts; positions restart at 0 for each tree and
    continue from the prefix's end in every branch; ``group_masks`` say who attends to whom."""

    trees: tuple[tuple[int, tuple[int, ...]], ...] = ()
    _masks: dict = field(default_factory=dict, compare=False, repr=False)  # device -> group_masks(), made once

    @classmethod
    def of_trees(cls, trees: Sequence[tuple[int, Sequence[int]]]) -> "SharedPrefixLayout":
        """Trees laid end to end in the given order; trees of one total length must be adjacent."""
        shaped = tuple((int(p), tuple(map(int, branches))) for p, branches in trees)
        if any(p < 1 or min(b, default=0) < 0 for p, b in shaped):
            raise ValueError("shared-prefix layout: a tree needs a prefix of at least one token")
        texts = PackedLayout.of([p + sum(b) for p, b in shaped])
        return cls(texts.lengths, texts.groups, trees=shaped)

    def position_ids(self, device=None) -> torch.Tensor:
        parts = []
        for prefix, branches in self.trees:
            parts.append(torch.arange(prefix, device=device))
            parts += [torch.arange(prefix, prefix + b, device=device) for b in branches]
        return torch.cat(parts)[None]

    @staticmethod
    def tree_mask(prefix: int, branches: Sequence[int]) -> torch.Tensor:
        """(tokens, tokens) bool, True where a row attends to a column: causal within the prefix and within each
        branch, and every branch sees the whole prefix."""
        total = prefix + sum(branches)
        mask = torch.zeros((total, total), dtype=torch.bool)
        mask[:prefix, :prefix] = torch.ones((prefix, prefix), dtype=torch.bool).tril()
        mask[prefix:, :prefix] = True
        start = prefix
        for b in branches:
            mask[start:start + b, start:start + b] = torch.ones((b, b), dtype=torch.bool).tril()
            start += b
        return mask

    def group_masks(self, device=None) -> list[torch.Tensor]:
        """One (trees, 1, length, length) bool mask per group of ``groups``."""
        key = str(device)
        cached = self._masks.get(key)
        if cached is None:
            cached, t = [], 0
            for _start, count, _length in self.groups:
                cached.append(torch.stack([self.tree_mask(*tree) for tree in self.trees[t:t + count]])[:, None]
                              .to(device))
                t += count
            self._masks[key] = cached
        return cached


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, *, biasflow_layout: PackedLayout,
                     scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Causal attention of each packed text on its own (a ``SharedPrefixLayout``'s trees: by their masks); query
    (1, heads, tokens, dim), key/value (1, kv heads,
    tokens, dim); returns (1, tokens, heads, dim) like transformers' attention functions."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    masks = biasflow_layout.group_masks(query.device) if isinstance(biasflow_layout, SharedPrefixLayout) else None
    if masks is None and _use_varlen(query):
        try:
            return _flash_varlen(query, key, value, biasflow_layout, scaling), None
        except (RuntimeError, TypeError) as exc:  # an older torch or an unsupported shape: the loop below
            _VARLEN["ok"] = False
            log.warning("packed attention: one flash-attention call per pass failed (%s); attending per length "
                        "instead", exc)
    heads, tokens, dim = query.shape[1:]
    out = query.new_empty((1, tokens, heads, dim))

    def texts(x: torch.Tensor, start: int, count: int, length: int) -> torch.Tensor:
        # (1, h, count*length, d) -> (count, h, length, d): a view whose strides do not depend on the company
        return x[0, :, start:start + count * length].unflatten(1, (count, length)).transpose(0, 1)

    for g, (start, count, length) in enumerate(biasflow_layout.groups):
        part, _ = sdpa_attention_forward(module, texts(query, start, count, length), texts(key, start, count, length),
                                         texts(value, start, count, length), None if masks is None else masks[g],
                                         dropout=0.0, scaling=scaling, is_causal=masks is None)
        out[0, start:start + count * length] = part.reshape(count * length, heads, dim)
    return out, None


# on a GPU in bfloat16/float16 all texts of a pass attend in ONE flash-attention call over variable lengths (the
# texts' offsets tell it where each starts) instead of one call per length: a pass holds ~40 lengths, and the calls,
# not the arithmetic, set the pace there. Each text is still computed on its own (flash attention's blocks never
# cross a text), with the key/value blocks unsplit where this torch lets us say so (``num_splits=1``). False once it
# failed in this process (the loop per length is used from then on).
_VARLEN: dict[str, bool | None] = {"ok": None}


def _use_varlen(query: torch.Tensor) -> bool:
    return (query.device.type == "cuda" and query.dtype in (torch.bfloat16, torch.float16)
            and _VARLEN["ok"] is not False)


def _flash_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                  scaling: float | None) -> torch.Tensor:
    op = torch.ops.aten._flash_attention_forward
    offsets = layout.offsets(query.device)
    longest = max(layout.lengths)
    extra = {"num_splits": 1} if "num_splits" in str(op.default._schema) else {}
    # (1, heads, tokens, dim) -> (tokens, heads, dim): flash attention's variable-length layout
    out = op(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), offsets, offsets, longest,
             longest, 0.0, True, False, scale=scaling, **extra)[0]
    _VARLEN["ok"] = True
    return out[None]


def _no_mask(*args, **kwargs) -> None:
    return None  # packed_attention knows where each text starts and masks causally itself


_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface.register(PACKED, packed_attention)
        AttentionMaskInterface.register(PACKED, _no_mask)
        _registered = True


def packable(model: torch.nn.Module, max_length: int) -> bool:
    """True when ``model`` can score texts of up to ``max_length`` tokens packed (see the module doc)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in PACKABLE_TYPES:
        return False
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "add_cross_attention", False):
        return False
    window = getattr(config, "sliding_window", None)
    if window is not None and (getattr(config, "use_sliding_window", True) and max_length > int(window)):
        return False  # the sliding window would matter, and the packed attention does not apply it
    return getattr(config, "_attn_implementation", None) in ("sdpa", "eager", None)


@contextlib.contextmanager
def packed(model: torch.nn.Module) -> Iterator[None]:
    """While the block runs, ``model``'s attention layers take ``biasflow_layout=`` (a ``PackedLayout``) and
    attend within each packed text."""
    _register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = PACKED
    try:
        yield
    finally:
        config._attn_implementation = before
