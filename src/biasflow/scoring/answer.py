"""Answering requests: each model kind answers the request kinds it can, behind the one cache.

``answer_requests(requests, model_cfg, cache_root)`` de-duplicates the requests, takes the model's fingerprint (it
names the cache folder; remembered by ``Models``, or from loading the model), looks every request up in the cache
(``AnswerCache``: ``<cache_root>/<model fingerprint>/<request kind>/``), answers the missing requests in chunks
through the answerer the model kind declares for the request kind (``model_kinds.answer_for``) (each chunk written to the cache as it finishes, so an
interrupted run keeps its progress) and returns one row per distinct request: ``key``, ``kind``, the request's
fields and the answer's columns.

An answerer is ``fn(model, requests, budget) -> DataFrame`` with one row per request, in order, holding the answer's
columns only. ``budget`` (``Budget``) carries the model config's token budgets; when a chunk runs out of memory the
dispatcher halves the token budget and answers the chunk again, for every request kind.

Who answers what is declared once per model kind in ``biasflow.model_kinds`` (``model_kinds.answer_for``);
answerers are imported only when needed (this module imports neither torch nor transformers).
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from biasflow import model_kinds
from biasflow.errors import ConfigError
from biasflow.interface.requests import Request
from biasflow.schema import ModelOptions, model_options

log = logging.getLogger(__name__)

def cache_kind(model_kind: str, request_kind: str) -> str:
    """The cache folder of ``model_kind``'s answers to ``request_kind``: the request kind, with ``.r<revision>`` from
    the answerer's second revision on (``model_kinds.Answer.revision``: raised whenever a change moves the answers,
    even in the last bits, so a resumed run or a sweep never mixes answers of two versions of the code)."""
    answer = model_kinds.answer_for(model_kind, request_kind)
    revision = answer.revision if answer is not None else 1
    return request_kind if revision == 1 else f"{request_kind}.r{revision}"


# where Models remembers fingerprints, under the cache root (beside the fingerprints' folders)
MODEL_MEMO_DIR = "models"

# requests written to the cache every so many answers (a model config's ``flush_every`` overrides): generations
# (one network call or sampled decoding each) in small chunks, so an interrupted run loses little; multi-mask
# questions in big ones, since CBS asks ~70 of each masked template and a chunk shares the template's passes
CHUNK_SIZES = {"generation": 32, "multi_mask": 4096}
DEFAULT_CHUNK_SIZE = 512
# on a GPU the default chunk is this many times larger: each chunk's batches are as wide as its requests allow, and a
# chunk of 512 CrowS-Pairs sentences split over ~30 padded widths made batches too small to keep an H200 busy
GPU_CHUNK_FACTOR = 8
# a request kind's missing answers are split into this many work units by work key; concurrent jobs on one model
# claim units one by one and so share the work (``_answer_missing``)
WORK_UNITS = 64

def _model_default(option: str):
    from biasflow.schema import ModelOptions

    return ModelOptions.model_fields[option].default


DEFAULT_BATCH_TOKENS = _model_default("batch_tokens")  # every model config's default (biasflow.schema.ModelOptions)
DEFAULT_MAX_LOGITS = 1 << 26  # 64M floats = 256 MB of logits per forward pass
MIN_BATCH_TOKENS = 16


@dataclass(frozen=True)
class Budget:
    """How much one forward pass may hold: ``batch_tokens`` (rows x padded length, the model config's) and
    ``max_logits`` (rows x length x vocabulary floats: not a config option; a GPU's grows with its memory,
    ``device_budget``); ``progress`` shows bars."""

    batch_tokens: int = DEFAULT_BATCH_TOKENS
    max_logits: int = DEFAULT_MAX_LOGITS
    progress: bool = True

    @classmethod
    def from_model_cfg(cls, cfg: Mapping[str, Any] | ModelOptions, progress: bool = True) -> "Budget":
        """The budget of a model config (its options: ``schema.model_options``)."""
        return cls(batch_tokens=int(model_options(cfg).batch_tokens), progress=progress)


# on a GPU the budgets scale with the free memory of the device (``device_budget``): a pass may hold about
# GPU_MEMORY_SHARE of it in activations and GPU_LOGITS_SHARE in vocabulary logits, within these bounds
GPU_MEMORY_SHARE = 0.5
GPU_LOGITS_SHARE = 1 / 16
GPU_MAX_BATCH_TOKENS = 1 << 18
GPU_MAX_LOGITS = 1 << 29


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(x).bit_length() - 1) if x >= 1 else 1


def device_budget(budget: Budget, adapter: Any) -> Budget:
    """``budget`` for ``adapter``'s device: unchanged on a CPU (or anything but CUDA); on a CUDA device the token
    budget grows with the device's free memory (the config's ``batch_tokens``/``max_logits`` are then floors).

    Tokens per pass: GPU_MEMORY_SHARE of the free memory over an upper estimate of one token's activations in a
    layer (4 bytes x (8 x hidden + 2 x feed-forward + vocabulary), the last for passes that keep every position's
    logits), a power of two up to GPU_MAX_BATCH_TOKENS; logits: GPU_LOGITS_SHARE of it in float32, up to
    GPU_MAX_LOGITS. An estimate that is too large is corrected as on a CPU: out of memory halves the budget."""
    device = str(getattr(adapter, "device", "cpu"))
    if not device.startswith("cuda"):
        return budget
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    config = getattr(getattr(adapter, "model", None), "config", None)

    def size(*names: str, default: int) -> int:
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return default

    hidden = size("hidden_size", "n_embd", "d_model", default=4096)
    ff = size("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    vocab = size("vocab_size", default=32000)
    per_token = 4 * (8 * hidden + 2 * ff + vocab)
    tokens = min(GPU_MAX_BATCH_TOKENS, _pow2_floor(free * GPU_MEMORY_SHARE / per_token))
    logits = min(GPU_MAX_LOGITS, _pow2_floor(free * GPU_LOGITS_SHARE / 4))
    return replace(budget, batch_tokens=max(budget.batch_tokens, tokens), max_logits=max(budget.max_logits, logits))


def answerer(model_kind: str, request_kind: str, metric: str | None = None, *, lazy: bool = False) -> Callable:
    """The function answering ``model_kind``'s ``request_kind`` requests (ConfigError if there is none). ``lazy``:
    a stand-in that imports it on its first call (answerers import torch; a job served by the cache needs none)."""
    answer = model_kinds.answer_for(model_kind, request_kind)
    if answer is None:
        can = model_kinds.kinds_answering(request_kind)
        who = f" (asked by metric {metric!r})" if metric else ""
        raise ConfigError(f"model.kind={model_kind!r} cannot answer {request_kind!r} requests{who}; "
                          f"model kinds that can: {can or 'none'}")
    target = answer.target
    if callable(target):  # registered in process (tests, plugins)
        return target
    module, name = target.split(":")
    if not lazy:
        return getattr(importlib.import_module(module), name)

    def on_first_call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    on_first_call.__module__, on_first_call.__name__ = module, name  # errors name the real answerer
    return on_first_call


def can_answer(model_kind: str, request_kind: str) -> bool:
    return model_kinds.answer_for(model_kind, request_kind) is not None


class Models:
    """The job's model(s), loaded on first use: the configured one and any sibling head (``model_kinds.Answer.load_as``).

    A model whose fingerprint is known without loading it (``models.fingerprint.load_identity``: a local folder's
    content digest, a hub id pinned to a commit) is remembered in ``<cache>/models/<identity>.json`` (fingerprint
    and provenance) when it is loaded; a later job whose requests are all in the cache then neither loads it nor
    imports torch (a warm score job: about 1 s instead of 4-5)."""

    def __init__(self, model_cfg: Mapping[str, Any] | ModelOptions, model: Any = None):
        # validated once here (options models pass through); the adapters are built from it
        self.opts = model_options(model_cfg, getattr(model, "kind", None))
        self.cfg = self.opts.written()  # as written: what the fingerprints hash
        self._loaded: dict[str, Any] = {self.opts.kind: model} if model is not None else {}
        self._remembered: dict[str, dict] = {}  # kind -> {"fingerprint", "provenance"} read from its memo file
        self._memo_files: dict[str, Path] = {}  # kind -> where its fingerprint is remembered

    def get(self, kind: str | None = None):
        kind = kind or self.opts.kind
        if kind not in self._loaded:
            from biasflow.models import load_model

            adapter = self._loaded[kind] = load_model(self.opts, kind)
            remembered = self._remembered.pop(kind, None)
            if kind in self._memo_files and (remembered or {}).get("fingerprint") != adapter.fingerprint:
                if remembered:  # the loaded model is right; the memo is renewed
                    log.warning("model %s: fingerprint %s, not the remembered %s (%s): using the loaded model's",
                                self.opts.name, adapter.fingerprint, remembered["fingerprint"],
                                self._memo_files[kind])
                self._remember(kind)
        return self._loaded[kind]

    @property
    def loaded(self) -> dict[str, Any]:
        return dict(self._loaded)

    def fingerprint(self, kind: str | None = None, memo_dir: Path | None = None) -> str:
        """The fingerprint of the model loaded as ``kind``: remembered in ``memo_dir`` if it is there (the model is
        then not loaded), else from loading it (and remembered there if ``load_identity`` names it)."""
        kind = kind or self.opts.kind
        if kind in self._loaded:
            return self._loaded[kind].fingerprint
        if kind in self._remembered:
            return self._remembered[kind]["fingerprint"]
        if memo_dir is not None:
            from biasflow.models.fingerprint import load_identity

            identity = load_identity(self.opts.loaded_as(kind).written())
            if identity:
                memo = self._memo_files[kind] = Path(memo_dir) / f"{identity}.json"
                record = _read_memo(memo)
                if record is not None:
                    self._remembered[kind] = record
                    return record["fingerprint"]
        return self.get(kind).fingerprint

    def _remember(self, kind: str) -> None:
        from biasflow.io import write_json

        adapter = self._loaded[kind]
        provenance = adapter.provenance() if hasattr(adapter, "provenance") else {}
        try:
            write_json({"fingerprint": adapter.fingerprint, "provenance": provenance}, self._memo_files[kind])
        except OSError as exc:  # a read-only or full cache: the next job loads the model again, nothing is lost
            log.warning("could not remember the fingerprint of model %s in %s: %s", self.opts.name,
                        self._memo_files[kind], exc)

    def provenance(self) -> dict[str, str]:
        """Provenance of every model the job used: loaded, or remembered (whose cached answers it served)."""
        out: dict[str, str] = {}
        for record in self._remembered.values():
            out.update(record["provenance"])
        for adapter in self._loaded.values():
            if hasattr(adapter, "provenance"):
                out.update(adapter.provenance())
        return out


def _read_memo(memo: Path) -> dict | None:
    if not memo.exists():
        return None
    try:
        record = json.loads(memo.read_text())
        if isinstance(record.get("fingerprint"), str) and isinstance(record.get("provenance"), dict):
            return record
    except (OSError, ValueError, AttributeError):
        pass
    log.warning("%s: not a remembered fingerprint (unreadable); the model is loaded instead", memo)
    return None


def _answer_chunk(fn: Callable, model: Any, chunk: Sequence[Request], budget: Budget) -> pd.DataFrame:
    """``fn`` on ``chunk``; on out-of-memory the token budget is halved and the chunk answered again (down to
    ``MIN_BATCH_TOKENS``; ``batching.halving_on_out_of_memory``, the loop a scorer's batches back off with too)."""
    from biasflow.scoring.batching import halving_on_out_of_memory

    def halve(budget: Budget) -> Budget | None:
        if budget.batch_tokens <= MIN_BATCH_TOKENS:
            return None
        return replace(budget, batch_tokens=max(MIN_BATCH_TOKENS, budget.batch_tokens // 2),
                       max_logits=max(1, budget.max_logits // 2))

    out, _ = halving_on_out_of_memory(lambda budget: fn(model, list(chunk), budget), budget, halve,
                                      describe=lambda _: f"a chunk of {len(chunk)} {chunk[0].kind} requests",
                                      tokens=lambda budget: budget.batch_tokens)
    if len(out) != len(chunk):
        raise RuntimeError(f"answerer {fn.__module__}.{fn.__name__} returned {len(out)} rows "
                           f"for {len(chunk)} {chunk[0].kind} requests")
    return out.reset_index(drop=True)


def _answer_and_store(fn: Callable, model: Any, budget: Budget, cache, chunk: Sequence[Request]) -> pd.DataFrame:
    """The rows of ``chunk`` (request columns and answer columns), written to ``cache`` (if any) before returning."""
    answers = _answer_chunk(fn, model, chunk, budget)
    rows = pd.concat([request_frame(chunk), answers.drop(columns=[c for c in ("key", "kind") if c in answers])],
                     axis=1)
    if cache is not None:
        cache.put(rows)
    return rows


def request_frame(requests: Sequence[Request]) -> pd.DataFrame:
    """``key``, ``kind`` and the request's fields, one row per request."""
    return pd.DataFrame([{"key": r.key, "kind": r.kind, **r.fields()} for r in requests])


def _cached(cache, todo: Sequence[Request]) -> tuple[pd.DataFrame, list[Request]]:
    """The cached answers among ``todo`` (failed ones, e.g. a server error, are asked again) and what is missing."""
    hits = pd.DataFrame({"key": pd.Series([], dtype=str)})
    if cache is not None:
        hits = cache.get([r.key for r in todo])
        if "status" in hits:
            hits = hits[hits["status"] == "ok"]
    have = set(hits["key"])
    return hits, [r for r in todo if r.key not in have]


def work_unit(request: Request) -> int:
    """The work unit of a request: by its work key (requests that share model work share a unit), so every job
    agrees on it whatever else it asks."""
    return int(hashlib.sha256(request.work_key.encode()).hexdigest()[:8], 16) % WORK_UNITS


def _answer_missing(missing: Sequence[Request], cache, size: int,
                    answer: Callable[[Sequence[Request]], pd.DataFrame]) -> list[pd.DataFrame]:
    """Answers to ``missing``, ``answer`` called on chunks of at most ``size`` requests.

    With a cache, the requests are split into work units (``work_unit``) and a job answers a unit only while it
    holds the unit's claim (``AnswerCache.claim``): it claims free units until it has ``size`` requests, re-reads
    the cache for them (another job may have answered them since), answers the rest, writes them and releases the
    claims. Two jobs asking the same model the same questions (CrowS-Pairs and its bias-bench variant both ask for
    every sentence's PLL) thus split the work between them instead of computing it twice or one waiting for the
    other; when every unit left is claimed by another job, this one waits for a claim and reads its answers."""
    # answered in the order asked, except that requests sharing model work (``Request.work_key``) are kept
    # together, so chunk boundaries rarely split them
    first_of_group: dict[str, int] = {}
    order = {r.key: (first_of_group.setdefault(r.work_key, i), i) for i, r in enumerate(missing)}
    if cache is None:
        missing = sorted(missing, key=lambda r: order[r.key])
        return [answer(missing[start:start + size]) for start in range(0, len(missing), size)]
    units: dict[int, list[Request]] = {}
    for request in missing:
        units.setdefault(work_unit(request), []).append(request)
    parts, wait = [], False
    while units:
        held, todo = [], []
        for unit in list(units):
            claim = cache.claim(unit, wait=wait)
            if claim is None:
                continue
            held.append(claim)
            todo += units.pop(unit)
            if wait or len(todo) >= size:
                break
        if not held:  # every unit left is being answered by another job
            log.info("another job is answering the %d %s requests left; waiting for its answers",
                     sum(map(len, units.values())), missing[0].kind)
            wait = True
            continue
        wait = False
        try:
            hits, todo = _cached(cache, sorted(todo, key=lambda r: order[r.key]))
            parts += [hits] if len(hits) else []
            parts += [answer(todo[start:start + size]) for start in range(0, len(todo), size)]
        finally:
            for claim in held:
                claim.release()
    return parts


def answer_requests(requests: Sequence[Request], model_cfg: Mapping[str, Any], cache_root: str | Path | None,
                    *, model: Any = None, models: Models | None = None, metric: str | None = None,
                    chunk_size: int | None = None, progress: bool = True) -> pd.DataFrame:
    """One row per distinct request (first-asked order): key, kind, request fields, answer columns.

    ``cache_root`` None answers everything without the cache. ``model`` is an already loaded adapter of
    ``model_cfg``'s kind (else loaded on first need). Missing answers are written to the cache every
    ``chunk_size`` requests (default: ``model_cfg.flush_every``, else ``CHUNK_SIZES`` of the request kind, else 512;
    on a GPU 512 x ``GPU_CHUNK_FACTOR``).
    """
    models = models or Models(model_cfg, model)
    opts = models.opts  # model_cfg's options, validated once (by Models)
    budget = Budget.from_model_cfg(opts, progress=progress)
    unique = list({r.key: r for r in requests}.values())
    kind_of_model = opts.kind
    flush_every = getattr(opts, "flush_every", None)  # a generator's (kinds/generator.py); other kinds have none
    frames = []
    for request_kind in dict.fromkeys(r.kind for r in unique):
        todo = [r for r in unique if r.kind == request_kind]
        fn = answerer(kind_of_model, request_kind, metric, lazy=True)
        load_as = model_kinds.answer_for(kind_of_model, request_kind).load_as
        adapter, cache = None, None
        if cache_root is not None:
            from biasflow.scoring.cache import AnswerCache

            folder = cache_kind(kind_of_model, request_kind)
            cache = AnswerCache(cache_root, models.fingerprint(load_as, Path(cache_root) / MODEL_MEMO_DIR), folder)
        hits, missing = _cached(cache, todo)
        if missing or cache is None:
            adapter = models.get(load_as)
            if cache is not None and adapter.fingerprint != cache.fingerprint:  # a stale memo (Models.get renewed it)
                cache = AnswerCache(cache_root, adapter.fingerprint, folder)
                hits, missing = _cached(cache, todo)
        log.info("%s requests: %d, %d cached, %d to answer (%s)", request_kind, len(todo), len(todo) - len(missing),
                 len(missing), opts.name or kind_of_model)
        size = int(chunk_size or flush_every or CHUNK_SIZES.get(request_kind, DEFAULT_CHUNK_SIZE))
        on_gpu = adapter is not None and str(getattr(adapter, "device", "cpu")).startswith("cuda")
        if on_gpu and not (chunk_size or flush_every) and request_kind not in CHUNK_SIZES:
            size *= GPU_CHUNK_FACTOR  # a GPU answers a CPU-sized chunk in a fraction of a second

        job_budget = budget if adapter is None else device_budget(budget, adapter)  # a GPU's grows with its memory
        answer = partial(_answer_and_store, fn, adapter, job_budget, cache)
        parts = ([hits] if len(hits) else []) + _answer_missing(missing, cache, size, answer)
        if parts:
            table = pd.concat(parts, ignore_index=True).drop_duplicates("key", keep="first")
            order = {r.key: i for i, r in enumerate(todo)}
            frames.append(table.sort_values("key", key=lambda s: s.map(order), kind="stable"))
    if not frames:
        return pd.DataFrame({"key": pd.Series([], dtype=str), "kind": pd.Series([], dtype=str)})
    return pd.concat(frames, ignore_index=True)


def lookup(answers: pd.DataFrame, requests: Sequence[Request], column: str) -> list:
    """``column`` of the answer to each request, in the requests' order (KeyError naming a missing one)."""
    by_key = answers.drop_duplicates("key").set_index("key")[column]
    missing = [r for r in requests if r.key not in by_key.index]
    if missing:
        raise KeyError(f"no answer to {len(missing)} {missing[0].kind} requests (first: {missing[0]}); "
                       f"the scores file does not match the items or the metric config")
    return [by_key[r.key] for r in requests]


def metric_answers(metric: str, items: pd.DataFrame, metric_cfg: Mapping[str, Any],
                   model_cfg: Mapping[str, Any] | None, cache_root: str | Path | None, *, model: Any = None,
                   models: Models | None = None, progress: bool = True) -> pd.DataFrame:
    """What the score stage writes for one metric: its requests on ``items``, answered (see ``answer_requests``).
    ``metric_cfg``: the metric's options model, or a mapping it is built from (``registry.metric_options_from``).
    ``model_cfg`` None takes the config of the loaded ``model``."""
    from biasflow.registry import get_metric, metric_options_from

    spec = get_metric(metric)
    metric_cfg = metric_options_from(metric, metric_cfg)
    if model_cfg is None:
        model_cfg = getattr(model, "opts", None) or dict(getattr(model, "cfg", None) or {"kind": model.kind})
    models = models or Models(model_cfg, model)
    opts = models.opts
    requests = spec.requests(items, metric_cfg, opts.kind)
    if opts.kind == "generator":  # what its generator kind refuses before anything is answered
        from biasflow.generator_kinds import GENERATOR_KINDS
        from biasflow.interface.requests import Generation
        from biasflow.model_kinds import resolve

        kind = GENERATOR_KINDS.get(str(opts.generator))
        if kind is not None and kind.check_requests is not None:
            resolve(kind.check_requests)(opts, [r for r in requests if isinstance(r, Generation)], spec.name)
    answers = answer_requests(requests, opts, cache_root, models=models, metric=spec.name, progress=progress)
    if spec.check_answers is not None:  # raising fails the score stage before it writes anything
        if "items" in inspect.signature(spec.check_answers).parameters:  # it names failed requests by item
            spec.check_answers(answers, metric_cfg, items=items)
        else:
            spec.check_answers(answers, metric_cfg)
    if spec.followup_requests is None:
        return answers
    frames = [answers]
    for other_cfg, more in spec.followup_requests(items, answers, metric_cfg):  # e.g. a classifier on the text
        frames.append(answer_requests(more, other_cfg, cache_root, metric=spec.name, progress=progress))
    return pd.concat(frames, ignore_index=True).drop_duplicates("key")
