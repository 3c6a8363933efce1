"""Causal LMs served by an inference engine (vLLM, or any server speaking the OpenAI completions API with echo).

``model.kind: served_causal_lm`` scores texts through ``POST {base_url}/completions`` with ``echo: true``,
``logprobs: 1`` and ``max_tokens: 0``: the server returns its tokens of the prompt (``logprobs.tokens``) and
log P(token_i | tokens before it) for each (``logprobs.token_logprobs``), ``null`` for the first prompt token,
which nothing precedes. That is how lm-evaluation-harness scores API models, and vLLM answers it (it samples one
token internally and returns the prompt only). No tokenizer is loaded here: tokens are what the server reports.

How token 0 of a text is conditioned (``TokenLogprobs.first_token``), as in-process (``scoring/causal.py``):

* ``prefix``: the prompt is ``model.bos_text`` + text, sent with the server's own special tokens. The tokens the
  server puts before the text are learnt once from a probe request of ``bos_text`` alone (``""``: an empty prompt,
  to which servers of Llama-style models add their BOS); every reply must start with exactly those tokens, which
  are dropped, so token 0 is log P(t0 | BOS). A server that adds nothing (GPT-2 style) needs ``bos_text`` (e.g.
  ``<|endoftext|>``), else a ConfigError says so.
* ``none``: the text alone with ``add_special_tokens: false`` (a vLLM request option): token 0 is NaN.
* ``separate`` (bias-bench): token 0 from the ``prefix`` request, tokens 1.. from the ``none`` request -- two
  requests per text, and their text tokens must agree.

``ContinuationLogprobs(context, continuation)``: the context alone and context + continuation are sent without
special tokens (with ``start_token``: after the prefix tokens, as in ``prefix`` mode); the reply to the joint text
must start with the context's tokens, and the continuation's log-probabilities are the rest. In-process, context and
continuation are tokenised separately; a server tokenises the joint text, so a continuation that merges with the end
of its context (no space or punctuation between them) is an error naming both. Each distinct context is one extra
request per chunk.

``Generation`` (HONEST, LangFair, HELM on a served model): the prompt continued through ``POST
{base_url}/completions`` (``generation.backends.OpenAICompletionsBackend``: no chat template, as for a base model;
for an instruction-tuned model's chat template use ``+generator=openai_compatible``, the server's
``/chat/completions``). A failed request is a failed answer row, not an error: the metric's
``max_failed_fraction`` decides.

Answers hold ``tokens`` (the server's token strings, not ids), ``logprobs`` and ``total``. Requests run on a thread
pool (``model.concurrency``) under a shared rate limit (``model.requests_per_second``); 408/409/429/5xx, timeouts
and refused connections are retried with exponential back-off (or the server's Retry-After); anything else, or
retries exhausted, raises ``ServedModelError`` naming the request and the server URL with credentials redacted.
The API key comes from ``model.api_key_file`` or the environment variable ``model.api_key_env`` (never the
config); it is never written anywhere. The cache fingerprint is the served model's name, the pinned
``model.revision`` and the options that change answers: not the URL (moving a server keeps the cache).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from biasflow.errors import ConfigError, ServedModelError
from biasflow.io import stable_hash
from biasflow.models import register_model_kind
from biasflow.models.fingerprint import config_fingerprint
from biasflow.openai_http import OpenAIHTTPClient, RateLimiter
from biasflow.score_kinds import FIRST_TOKEN_MODES
from biasflow.secrets import read_secret, redact_uri

log = logging.getLogger(__name__)

SHOWN_CHARS = 120  # of a request's text in error messages


def shown(text: str) -> str:
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


@dataclass(frozen=True)
class Echo:
    """The server's tokens of one prompt and log P(token_i | the tokens before it) (None for the first)."""

    tokens: list[str]
    logprobs: list[float | None]


@register_model_kind("served_causal_lm")
class ServedCausalLM(OpenAIHTTPClient):
    kind = "served_causal_lm"
    timeout_option = "model.timeout_s"

    def __init__(self, cfg: Mapping[str, Any], *, sleep: Callable[[float], None] = time.sleep):

        self.cfg = dict(cfg)
        self.name = str(cfg.get("name") or "")
        self.served_name = str(cfg.get("served_model_name") or self.name)
        if not self.served_name:
            raise ConfigError("model.kind=served_causal_lm needs model.name (or model.served_model_name): the name "
                              "the server knows the model by")
        base_url = cfg.get("base_url")
        if not base_url:
            raise ConfigError(f"model {self.name!r}: model.kind=served_causal_lm needs model.base_url, the server's "
                              "OpenAI-compatible API root, e.g. http://gpu-node-1:8000/v1")
        self.base_url = str(base_url).rstrip("/")
        self.url = self.base_url + "/completions"
        self.shown_url = redact_uri(self.url)
        self._api_key = read_secret(env=cfg.get("api_key_env"), file=cfg.get("api_key_file"),
                                    what="model.api_key_file")
        self.revision = cfg.get("revision") or None
        self.lowercase = bool(cfg.get("lowercase", False))
        self.bos_text = str(cfg.get("bos_text") or "")
        self.concurrency = int(cfg.get("concurrency", 8))
        if self.concurrency < 1:
            raise ConfigError(f"model.concurrency must be >= 1, got {self.concurrency}")
        self.timeout_s = float(cfg.get("timeout_s") or 120)
        self.max_retries = int(cfg.get("max_retries", 5))
        self.backoff_s = float(cfg.get("backoff_s", 1.0))
        self.max_backoff_s = float(cfg.get("max_backoff_s", 60.0))
        self.limiter = RateLimiter(cfg.get("requests_per_second"))
        self._sleep = sleep
        self.fingerprint = served_fingerprint(self.cfg)
        if not self.revision:
            log.warning("model %s: model.revision is not set, so cached answers cannot tell a re-deployed model from "
                        "the old one; pin it (e.g. the hub commit the server loaded)", self.name)
        self._local = threading.local()
        self._prefix: Echo | None = None
        self._prefix_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.requests_sent = 0  # HTTP attempts, retries included
        self.tokens_scored = 0  # prompt tokens the server returned log-probabilities for
        self._backend = None

    @property
    def backend(self):
        """What answers this model's ``Generation`` requests: its server's ``/completions``, with this model's
        key, retries, concurrency and rate limit."""
        if self._backend is None:
            from biasflow.generation.backends import OpenAICompletionsBackend

            self._backend = OpenAICompletionsBackend(
                self.base_url, self.served_name, api_key_env=self.cfg.get("api_key_env"),
                api_key_file=self.cfg.get("api_key_file"), timeout_s=self.timeout_s, max_retries=self.max_retries,
                backoff_s=self.backoff_s, max_backoff_s=self.max_backoff_s, concurrency=self.concurrency,
                requests_per_second=self.cfg.get("requests_per_second"), sleep=self._sleep)
            self._backend.timeout_option = "model.timeout_s"
        return self._backend

    # ------------------------------------------------------------------------------------------- identity
    def normalise(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def provenance(self) -> dict[str, str]:
        return {"model.served_model_name": self.served_name, "model.base_url": redact_uri(self.base_url),
                "model.revision": str(self.revision or "unpinned"), "model.fingerprint": self.fingerprint}

    # ------------------------------------------------------------------------------------------- HTTP
    def _fail(self, what: str, detail: str) -> ServedModelError:
        return ServedModelError(self._redact(f"served model {self.served_name!r} at {self.shown_url}: {what}: "
                                             f"{detail}"))

    def _post(self, body: dict, what: str) -> dict:
        """The JSON reply to ``body``, retried on transient failures; ServedModelError naming ``what`` otherwise."""
        resp, error = self.post(body)
        if resp is None:
            raise self._fail(what, error)
        try:
            return resp.json()
        except ValueError:
            raise self._fail(what, f"the reply is not JSON: {resp.text[:200]}") from None

    def echo(self, prompt: str, *, special_tokens: bool, what: str) -> Echo:
        """The server's tokens of ``prompt`` and their log-probabilities (checked: echoed, complete)."""
        body: dict[str, Any] = {"model": self.served_name, "prompt": prompt, "echo": True, "logprobs": 1,
                                "max_tokens": 0, "temperature": 0.0}
        if not special_tokens:
            body["add_special_tokens"] = False
        data = self._post(body, what)
        try:
            choice = data["choices"][0]
            lp = choice.get("logprobs") or {}
            tokens, logprobs = lp.get("tokens"), lp.get("token_logprobs")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise self._fail(what, f"malformed reply (no choices[0]): {str(data)[:200]}") from None
        if not isinstance(tokens, list) or not isinstance(logprobs, list):
            raise self._fail(what, "the reply has no prompt log-probabilities (choices[0].logprobs.tokens / "
                                   "token_logprobs): the server does not support echo with logprobs on /completions")
        if logprobs and logprobs[0] is not None:
            raise self._fail(what, "the first token has a log-probability, so it is a generated token, not the "
                                   "prompt's: the server ignores echo=true")
        if len(tokens) != len(logprobs):
            raise self._fail(what, f"truncated reply: {len(tokens)} tokens but {len(logprobs)} log-probabilities")
        n_prompt = (data.get("usage") or {}).get("prompt_tokens")
        if isinstance(n_prompt, int):
            if len(tokens) < n_prompt:
                raise self._fail(what, f"truncated reply: log-probabilities for {len(tokens)} of the prompt's "
                                       f"{n_prompt} tokens")
            tokens, logprobs = tokens[:n_prompt], logprobs[:n_prompt]  # a server that generated a token anyway
        if not tokens:
            raise self._fail(what, "the server echoed no prompt tokens (it ignores echo=true?)")
        missing = [i for i, v in enumerate(logprobs[1:], 1) if v is None]
        if missing:
            raise self._fail(what, f"no log-probability for prompt tokens {missing[:5]} of {len(tokens)}")
        with self._count_lock:
            self.tokens_scored += len(tokens)
        return Echo([str(t) for t in tokens], [None] + [float(v) for v in logprobs[1:]])

    # ------------------------------------------------------------------------------------------- the conventions
    def prefix(self, asked_by: str = "") -> Echo:
        """The tokens the server puts before every text in ``prefix`` mode (probed once, for ``asked_by``)."""
        with self._prefix_lock:
            if self._prefix is None:
                hint = ("set model.bos_text to the model's BOS token text (e.g. '<|endoftext|>' for GPT-2, '<s>' for "
                        "Llama 2 or Mistral) or use first_token=none")
                try:
                    probe = self.echo(self.bos_text, special_tokens=True,
                                      what=f"probe of the prefix tokens (model.bos_text={self.bos_text!r}) "
                                           f"for {asked_by or 'first_token=prefix'}")
                except ServedModelError as exc:
                    if self.bos_text:
                        raise
                    raise ConfigError(f"first_token=prefix: the server adds no token before an empty prompt "
                                      f"({exc}); {hint}") from exc
                if len(probe.tokens) > 1:
                    log.warning("model %s: the server puts %d tokens %s before every text in first_token=prefix "
                                "mode (model.bos_text plus its own BOS?); in-process scoring puts one",
                                self.name, len(probe.tokens), probe.tokens)
                self._prefix = probe
            return self._prefix

    def _text_part(self, reply: Echo, head: list[str], what: str, head_name: str) -> Echo:
        """``reply`` without its first ``len(head)`` tokens, which must be ``head``; at least one token left."""
        n = len(head)
        if reply.tokens[:n] != head:
            raise self._fail(what, f"the reply's first tokens {reply.tokens[:n]} are not the tokens of the "
                                   f"{head_name} {head} (the text merges with it when tokenised)")
        if len(reply.tokens) <= n:
            raise self._fail(what, f"the text has no tokens after the {head_name}")
        return Echo(reply.tokens[n:], reply.logprobs[n:])

    def text_logprobs(self, text: str, first_token: str) -> Echo:
        """The text's own tokens and log P(token_i | ...) by the ``first_token`` convention (NaN: not scored)."""
        what = f"TokenLogprobs(text={shown(text)}, first_token={first_token!r})"
        if first_token not in FIRST_TOKEN_MODES:
            raise ConfigError(f"{what}: first_token must be one of {list(FIRST_TOKEN_MODES)}")
        if not text:
            raise ValueError(f"{what}: an empty text has no tokens to score")
        prefixed = alone = None
        if first_token in ("prefix", "separate"):
            head = self.prefix(what).tokens
            prefixed = self._text_part(self.echo(self.bos_text + text, special_tokens=True, what=what), head, what,
                                       "prefix")
        if first_token in ("none", "separate"):
            alone = self.echo(text, special_tokens=False, what=what)
        if first_token == "prefix":
            return prefixed
        if first_token == "none":
            return Echo(alone.tokens, [math.nan] + alone.logprobs[1:])
        if prefixed.tokens != alone.tokens:
            raise self._fail(what, f"first_token=separate needs the same tokens with and without the prefix; got "
                                   f"{prefixed.tokens} and {alone.tokens}")
        return Echo(alone.tokens, [prefixed.logprobs[0]] + alone.logprobs[1:])

    def context_tokens(self, context: str, start_token: bool = False, asked_by: str = "") -> Echo:
        """The server's tokens of a continuation's context: alone (no special tokens), or after the prefix tokens
        (``start_token``, as in ``prefix`` mode; the context may then be empty)."""
        what = asked_by or f"context {shown(context)}"
        if not start_token:
            if not context:
                raise ValueError(f"{what}: an empty context gives the first continuation token nothing to be "
                                 "predicted from")
            return self.echo(context, special_tokens=False, what=what)
        head = self.prefix(what)
        return self.echo(self.bos_text + context, special_tokens=True, what=what) if context else head

    def continuation_logprobs(self, context: str, continuation: str, start_token: bool = False,
                              context_reply: Echo | None = None) -> Echo:
        """The continuation's tokens and log P(token | context, earlier continuation tokens)."""
        what = (f"ContinuationLogprobs(context={shown(context)}, continuation={shown(continuation)}"
                f"{', start_token=True' if start_token else ''})")
        if not continuation:
            raise ValueError(f"{what}: an empty continuation has no tokens")
        if context_reply is None:
            context_reply = self.context_tokens(context, start_token, what)
        prompt = (self.bos_text if start_token else "") + context + continuation
        joint = self.echo(prompt, special_tokens=start_token, what=what)
        return self._text_part(joint, context_reply.tokens, what, "context")

    # ------------------------------------------------------------------------------------------- many at once
    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], desc: str, progress: bool = True) -> list:
        """``[fn(x) for x in items]`` on ``concurrency`` threads, in order; the first error cancels the rest."""
        from tqdm.auto import tqdm

        out: list[Any] = [None] * len(items)
        if not items:
            return out
        bar = tqdm(total=len(items), desc=f"{desc} {self.name}", unit="request", disable=not progress,
                   mininterval=1.0)
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
            futures = {pool.submit(fn, x): i for i, x in enumerate(items)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in done:
                    if fut.exception() is not None:
                        for other in pending:
                            other.cancel()
                        bar.close()
                        raise fut.exception()
                    out[futures[fut]] = fut.result()
                    bar.update(1)
        bar.close()
        return out


def served_fingerprint(cfg: Mapping[str, Any]) -> str:
    """The served model's name, pinned revision and answer-changing options; never the URL or a key."""
    name = cfg.get("served_model_name") or cfg.get("name")
    return stable_hash({"config": config_fingerprint(cfg), "served_model_name": name}, 24)


def _frame(replies: Sequence[Echo]) -> pd.DataFrame:
    return pd.DataFrame({"tokens": [list(r.tokens) for r in replies],
                         "logprobs": [[float(v) for v in r.logprobs] for r in replies],
                         "total": [math.fsum(v for v in r.logprobs if not math.isnan(v)) for r in replies]})


def answer_token_logprobs(model: ServedCausalLM, requests: Sequence, budget) -> pd.DataFrame:
    """``TokenLogprobs`` answers: ``tokens`` (the server's strings), ``logprobs``, ``total`` (NaN-skipping sum)."""
    replies = model.map(lambda r: model.text_logprobs(model.normalise(r.text), r.first_token), requests,
                        "served log-probs", budget.progress)
    return _frame(replies)


def answer_separate_logprobs(model: ServedCausalLM, requests: Sequence, budget) -> pd.DataFrame:
    """Requests of a ``text`` scored as ``first_token=separate`` (StereoSet's sentence log-probabilities)."""
    replies = model.map(lambda r: model.text_logprobs(model.normalise(r.text), "separate"), requests,
                        "served log-probs", budget.progress)
    return _frame(replies)


def answer_continuation_logprobs(model: ServedCausalLM, requests: Sequence, budget) -> pd.DataFrame:
    """``ContinuationLogprobs`` answers: ``tokens``, ``logprobs``, ``total`` of the continuation (context and
    continuation cased as ``model.lowercase`` says); each distinct context is sent once per chunk."""
    def norm(r):
        return model.normalise(r.context), model.normalise(r.continuation), bool(getattr(r, "start_token", False))

    asked = [norm(r) for r in requests]
    contexts = list(dict.fromkeys((c, start) for c, _, start in asked))
    replies = model.map(lambda cs: model.context_tokens(*cs), contexts, "served contexts", budget.progress)
    by_context = dict(zip(contexts, replies))
    answers = model.map(lambda a: model.continuation_logprobs(a[0], a[1], a[2], by_context[(a[0], a[2])]), asked,
                        "served continuations", budget.progress)
    return _frame(answers)


__all__ = ["ServedCausalLM", "Echo", "served_fingerprint", "answer_token_logprobs", "answer_separate_logprobs",
           "answer_continuation_logprobs"]
