"""Causal LMs served by an inference engine (vLLM, or any server speaking the OpenAI completions API with echo).

``model.kind: served_causal_lm`` scores texts through ``POST {base_url}/completions`` with ``echo: true``,
``logprobs: 1`` and ``max_tokens: 0``: the server returns its tokens of the prompt (``logprobs.tokens``) and
log P(token_i | tokens before it) for each (``logprobs.token_logprobs``), ``null`` for the first prompt token,
which nothing precedes. That is how lm-evaluation-harness scores API models, and vLLM answers it (it samples one
token internally and returns the prompt only). No tokenizer is loaded here: tokens are what the server reports.

How token 0 of a text is conditioned (``TokenLogprobs.first_token``), as in-process (``scoring/causal.py``):

* ``prefix``: the prompt is ``model.bos_text`` + text, sent with the server's own special tokens. The tokens the
  server puts before the text are learnt once per model from a probe request of ``bos_text`` alone (``""``: an
  empty prompt, to which servers of Llama-style models add their BOS), whichever worker thread asks first; a failed
  probe is remembered, and every later request fails at once with its error. Every reply must start with exactly
  those tokens, which are dropped, so token 0 is log P(t0 | BOS). A server that adds nothing (GPT-2 style) refuses
  the empty prompt (vLLM: HTTP 400) or echoes no token: it needs ``bos_text`` (e.g. ``<|endoftext|>``), and a
  ConfigError says so; any other failure of the probe is reported as what it is.
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
{base_url}/completions`` (``generation.backends.OpenAICompletionsBackend``, built for this model by
``generation.answer.generation_backend``: no chat template, as for a base model;
for an instruction-tuned model's chat template use ``+generator=openai_compatible``, the server's
``/chat/completions``). A failed request is a failed answer row, not an error: the metric's
``max_failed_fraction`` decides.

Answers hold ``tokens`` (the server's token strings, not ids), ``logprobs`` and ``total``. Every reply is checked
before it is used (``checked_echo``): tokens, log-probabilities, text offsets and ``usage.prompt_tokens`` must agree,
the text must echo the prompt, and every scored log-probability must be finite (NaN, -Infinity and vLLM's -9999.0
for -inf are refused) and at most 0. A reply that fails a check raises ``ServedModelError`` and fails the score job:
the causal metrics have no failed-row path (their answers have no ``status`` column, as generations do), so a row
without a usable number would be averaged in or crash later; the answers of earlier chunks are cached.

Requests run on a thread pool (``model.concurrency``) under a shared rate limit (``model.requests_per_second``);
408/409/429/5xx, timeouts and refused or cut connections are retried with exponential back-off (or the server's
Retry-After), each attempt limited to ``model.timeout_s`` and the request, back-off included, to ``timeout_s *
(max_retries + 1)``; anything else (an HTML page, broken JSON, a reply that fails the checks, HTTP 4xx), or retries
exhausted, raises ``ServedModelError`` naming the request and the server URL with credentials redacted, and the
requests still in flight make no further attempt.
The API key comes from ``model.api_key_file`` or the environment variable ``model.api_key_env`` (never the
config); it is never written anywhere. The cache fingerprint is the served model's name, the pinned
``model.revision`` and the options that change answers: not the URL (moving a server keeps the cache).
"""
from __future__ import annotations

import json
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
from biasflow.models.fingerprint import config_fingerprint
from biasflow.openai_http import OpenAIHTTPClient, RateLimiter, html_summary, looks_like_html
from biasflow.schema import ModelOptions, model_options
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


# vLLM sends log P = -inf as -9999.0 (JSON has no infinity): that value, or below, is a token the model rules out
VLLM_NEG_INF = -9999.0
# a log-probability above this is not one (the rounding of a log-softmax stays far below it)
MAX_LOGPROB = 1e-4
SHOWN_TOKENS = 5  # of the tokens at fault, in error messages


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at(tokens: Sequence[str], idx: Sequence[int], values: Sequence[Any] | None = None) -> str:
    shown_idx = list(idx)[:SHOWN_TOKENS]
    parts = [f"{i} {tokens[i]!r}" + (f" = {values[i]!r}" if values is not None else "") for i in shown_idx]
    return ", ".join(parts) + (f" and {len(idx) - len(shown_idx)} more" if len(idx) > len(shown_idx) else "")


def checked_echo(data: Any, prompt: str, fail: Callable[[str], Exception], *, allow_empty: bool = False) -> Echo:
    """The prompt's tokens and log-probabilities in ``data``, the reply to an echo request for ``prompt``, every
    part of it checked against the others; ``fail(detail)`` is the exception raised for what does not agree.

    ``choices[0].logprobs`` holds ``tokens`` (strings) and ``token_logprobs`` of one length, and so do
    ``text_offset`` and ``top_logprobs`` when present; each offset is the previous one plus the previous token's
    length (vLLM's offsets are running sums of its token strings); ``choices[0].text`` begins with
    the prompt (the echo); there are ``usage.prompt_tokens`` tokens (more only for tokens generated in spite of
    ``max_tokens: 0``, which ``usage.completion_tokens`` counts and the text holds after the prompt; they are
    dropped); the first token has no log-probability (``null``: nothing precedes it; a number means it is a
    generated token, the prompt not echoed) and every other one a finite one, at most 0. Non-finite values (NaN,
    -Infinity, or vLLM's -9999.0 for -inf) are refused, not scored: a sentence score with one is not a number that
    can be compared or averaged. Zero tokens are an error unless ``allow_empty`` (the probe of an empty prompt)."""
    if not isinstance(data, dict):
        raise fail(f"the reply is JSON but not an object: {str(data)[:200]}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise fail(f"malformed reply (no choices[0]): {str(data)[:200]}")
    choice = choices[0]
    lp = choice.get("logprobs")
    tokens = lp.get("tokens") if isinstance(lp, dict) else None
    logprobs = lp.get("token_logprobs") if isinstance(lp, dict) else None
    if not isinstance(tokens, list) or not isinstance(logprobs, list):
        raise fail("the reply has no prompt log-probabilities (choices[0].logprobs.tokens / token_logprobs): the "
                   "server does not support echo with logprobs on /completions")
    n = len(tokens)
    if len(logprobs) != n:
        raise fail(f"too {'few' if len(logprobs) < n else 'many'} log-probabilities: {len(logprobs)} "
                   f"(logprobs.token_logprobs) for {n} tokens (logprobs.tokens)")
    for name in ("text_offset", "top_logprobs"):
        other = lp.get(name)
        if other is not None and (not isinstance(other, list) or len(other) != n):
            count = len(other) if isinstance(other, list) else type(other).__name__
            raise fail(f"logprobs.{name} has {count} entries for {n} tokens")
    not_text = [i for i, t in enumerate(tokens) if not isinstance(t, str)]
    if not_text:
        raise fail(f"tokens that are not strings: {_at(tokens, not_text)}")
    if n and logprobs[0] is not None:
        raise fail(f"the first token {tokens[0]!r} has a log-probability ({logprobs[0]!r}), so it is a generated "
                   "token, not the prompt's: the server ignores echo=true")
    text = choice.get("text")
    if not isinstance(text, str) or not text.startswith(prompt):
        raise fail(f"the reply's text {str(text)[:SHOWN_CHARS]!r} does not begin with the prompt: the server "
                   "ignores echo=true")
    offsets = lp.get("text_offset")
    if offsets is not None:
        if not all(_is_int(o) for o in offsets):
            raise fail(f"logprobs.text_offset holds non-integers: {str(offsets)[:200]}")
        off = next((i for i in range(1, n) if offsets[i] - offsets[i - 1] != len(tokens[i - 1])), None)
        if off is not None:
            raise fail(f"logprobs.text_offset does not follow the tokens: token {off - 1} {tokens[off - 1]!r} has "
                       f"{len(tokens[off - 1])} characters, but the offsets of tokens {off - 1} and {off} are "
                       f"{offsets[off - 1]} and {offsets[off]}")
    usage = data.get("usage")
    n_prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not _is_int(n_prompt) or n_prompt < 0:
        raise fail(f"the reply has no usage.prompt_tokens (usage: {str(usage)[:200]}) to check its {n} tokens "
                   "against")
    extra = n - n_prompt
    if extra < 0:
        raise fail(f"truncated reply: {n} tokens, but usage.prompt_tokens={n_prompt}")
    if extra:
        n_generated = usage.get("completion_tokens")
        if not (_is_int(n_generated) and n_generated >= extra and len(text) > len(prompt)):
            raise fail(f"usage.prompt_tokens={n_prompt}, but the reply has {n} tokens, and the {extra} beyond the "
                       f"prompt's are not generated ones (usage.completion_tokens={n_generated!r}, text after the "
                       f"prompt {text[len(prompt):][:SHOWN_CHARS]!r}): the token count and the tokens disagree")
        tokens, logprobs = tokens[:n_prompt], logprobs[:n_prompt]  # a server that generated anyway
        n = n_prompt
    if not tokens and not allow_empty:
        raise fail("the server echoed no tokens of the prompt")
    missing, not_number, non_finite, positive = [], [], [], []
    for i in range(1, n):
        v = logprobs[i]
        if v is None:
            missing.append(i)
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            not_number.append(i)
        elif not math.isfinite(v) or v <= VLLM_NEG_INF:
            non_finite.append(i)
        elif v > MAX_LOGPROB:
            positive.append(i)
    if missing:
        raise fail(f"no log-probability (null) for {len(missing)} of the {n} tokens: {_at(tokens, missing)}")
    if not_number:
        raise fail(f"log-probabilities that are not numbers: {_at(tokens, not_number, logprobs)}")
    if non_finite:
        raise fail(f"non-finite log-probabilities (NaN, -Infinity, or vLLM's -9999.0 for -inf) for {len(non_finite)} "
                   f"of the {n - 1} scored tokens: {_at(tokens, non_finite, logprobs)}; a text score with one is "
                   "no number to compare or average, so the reply is refused")
    if positive:
        raise fail(f"log-probabilities above 0 (probabilities above 1) for {len(positive)} of the {n - 1} scored "
                   f"tokens: {_at(tokens, positive, logprobs)}")
    return Echo([str(t) for t in tokens], ([None] if n else []) + [float(v) for v in logprobs[1:n]])


class ServedCausalLM(OpenAIHTTPClient):
    kind = "served_causal_lm"
    timeout_option = "model.timeout_s"

    def __init__(self, cfg: Mapping[str, Any] | ModelOptions, *, sleep: Callable[[float], None] = time.sleep):
        opts = self.opts = model_options(cfg, self.kind)
        self.cfg = opts.written()  # as written: what the fingerprint hashes
        self.name = str(opts.name or "")
        self.served_name = str(opts.served_model_name or self.name)
        if not self.served_name:
            raise ConfigError("model.kind=served_causal_lm needs model.name (or model.served_model_name): the name "
                              "the server knows the model by")
        base_url = opts.base_url
        if not base_url:
            raise ConfigError(f"model {self.name!r}: model.kind=served_causal_lm needs model.base_url, the server's "
                              "OpenAI-compatible API root, e.g. http://gpu-node-1:8000/v1")
        self.base_url = str(base_url).rstrip("/")
        self.url = self.base_url + "/completions"
        self.shown_url = redact_uri(self.url)
        self._api_key = read_secret(env=opts.api_key_env, file=opts.api_key_file,
                                    what="model.api_key_file")
        self.revision = opts.revision or None
        self.lowercase = opts.lowercase
        self.bos_text = str(opts.bos_text or "")
        self.concurrency = int(opts.concurrency)
        if self.concurrency < 1:
            raise ConfigError(f"model.concurrency must be >= 1, got {self.concurrency}")
        self.timeout_s = float(opts.timeout_s)
        self.max_retries = int(opts.max_retries)
        self.backoff_s = float(opts.backoff_s)
        self.max_backoff_s = float(opts.max_backoff_s)
        self.limiter = RateLimiter(opts.requests_per_second)
        self._sleep = sleep
        self.fingerprint = served_fingerprint(opts)
        if not self.revision:
            log.warning("model %s: model.revision is not set, so cached answers cannot tell a re-deployed model from "
                        "the old one; pin it (e.g. the hub commit the server loaded)", self.name)
        self._local = threading.local()
        self._prefix: Echo | None = None
        self._prefix_error: Exception | None = None  # a failed probe, remembered: every later request fails with it
        self._prefix_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.requests_sent = 0  # HTTP attempts, retries included
        self.tokens_scored = 0  # prompt tokens the server returned log-probabilities for
        self.generation_backend = None  # answers its Generation requests: generation.answer.generation_backend

    # ------------------------------------------------------------------------------------------- identity
    def normalise(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def provenance(self) -> dict[str, str]:
        return {"model.served_model_name": self.served_name, "model.base_url": redact_uri(self.base_url),
                "model.revision": str(self.revision or "unpinned"), "model.fingerprint": self.fingerprint}

    # ------------------------------------------------------------------------------------------- HTTP
    def _fail(self, what: str, detail: str, error: type[Exception] = ServedModelError) -> Exception:
        return error(self._redact(f"served model {self.served_name!r} at {self.shown_url}: {what}: {detail}"))

    def _post(self, body: dict, what: str) -> dict:
        """The JSON reply to ``body``, retried on transient failures; ServedModelError naming ``what`` otherwise
        (with ``http_status``, the last HTTP status received or None, and ``server_error``, when the server
        refused)."""
        outcome = self.send(body)
        if outcome.response is None:
            err = self._fail(what, outcome.error)
            err.http_status, err.server_error = outcome.status, outcome.error
            raise err
        resp = outcome.response
        try:
            return json.loads(resp.content)
        except ValueError as exc:  # neither is retried: the same request gets the same page
            if looks_like_html(resp):
                detail = (f"the reply is {html_summary(resp)}, not the API's JSON (is model.base_url the "
                          "OpenAI-compatible API root, e.g. http://host:8000/v1?)")
            else:
                detail = f"the reply is not valid JSON ({exc}): {self._redact(resp.text[:200])!r}"
            raise self._fail(what, detail) from None

    def echo(self, prompt: str, *, special_tokens: bool, what: str, allow_empty: bool = False) -> Echo:
        """The server's tokens of ``prompt`` and their log-probabilities, the reply checked (``checked_echo``)."""
        body: dict[str, Any] = {"model": self.served_name, "prompt": prompt, "echo": True, "logprobs": 1,
                                "max_tokens": 0, "temperature": 0.0}
        if not special_tokens:
            body["add_special_tokens"] = False
        reply = checked_echo(self._post(body, what), prompt, lambda detail: self._fail(what, detail),
                             allow_empty=allow_empty)
        with self._count_lock:
            self.tokens_scored += len(reply.tokens)
        return reply

    # ------------------------------------------------------------------------------------------- the conventions
    def prefix(self, asked_by: str = "") -> Echo:
        """The tokens the server puts before every text in ``prefix`` mode: probed once per model, whichever
        worker thread asks first; a failed probe is remembered, and every later request fails with its error."""
        with self._prefix_lock:
            if self._prefix is None and self._prefix_error is None:
                try:
                    self._prefix = self._probe(asked_by)
                except (ServedModelError, ConfigError) as exc:
                    self._prefix_error = exc
            if self._prefix_error is not None:
                raise type(self._prefix_error)(str(self._prefix_error)) from self._prefix_error
            return self._prefix

    def _probe(self, asked_by: str) -> Echo:
        what = (f"probe of the prefix tokens (model.bos_text={self.bos_text!r}; sent once per model, for every "
                f"request that needs them; asked by {asked_by or 'the first'})")
        hint = ("set model.bos_text to the model's BOS token text (e.g. '<|endoftext|>' for GPT-2, '<s>' for Llama 2 "
                "or Mistral), or use first_token='none'")
        try:
            probe = self.echo(self.bos_text, special_tokens=True, what=what, allow_empty=True)
        except ServedModelError as exc:
            # vLLM answers an empty prompt it adds nothing to with HTTP 400 "The decoder prompt cannot be empty";
            # any other failure (or a 400 for another reason) is reported as it is, its cause unmasked
            refusal = str(getattr(exc, "server_error", "") or "").lower()
            if self.bos_text or getattr(exc, "http_status", None) != 400 or "empty" not in refusal:
                raise
            raise ConfigError(f"{exc}. The server refuses the probe's empty prompt, so it puts no BOS token before a "
                              f"text; {hint}") from exc
        if not probe.tokens:
            raise self._fail(what, f"the server echoed no token for it, so it puts no BOS token before a text; {hint}",
                             ConfigError)
        if len(probe.tokens) > 1:
            log.warning("model %s: the server puts %d tokens %s before every text in first_token='prefix' "
                        "mode (model.bos_text plus its own BOS?); in-process scoring puts one",
                        self.name, len(probe.tokens), probe.tokens)
        return probe

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
            raise self._fail(what, f"first_token='separate' needs the same tokens with and without the prefix; got "
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
        """``[fn(x) for x in items]`` on ``concurrency`` threads, in order. The first error cancels the rest: the
        items not started are not, and the requests in flight make no further attempt (``OpenAIHTTPClient``'s
        ``abort``)."""
        from biasflow.bars import progress_bar as tqdm

        out: list[Any] = [None] * len(items)
        if not items:
            return out
        abort = threading.Event()

        def run(x):
            self._local.abort = abort
            try:
                return fn(x)
            finally:
                self._local.abort = None

        bar = tqdm(total=len(items), desc=f"{desc} {self.name}", unit="request", disable=not progress,
                   mininterval=1.0)
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
            futures = {pool.submit(run, x): i for i, x in enumerate(items)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in done:
                    if fut.exception() is not None:
                        abort.set()
                        for other in pending:
                            other.cancel()
                        bar.close()
                        raise fut.exception()
                    out[futures[fut]] = fut.result()
                    bar.update(1)
        bar.close()
        return out


def served_fingerprint(cfg: Mapping[str, Any] | ModelOptions) -> str:
    """The served model's name, pinned revision and answer-changing options (of the config as written: a cache
    key); never the URL or a key."""
    opts = model_options(cfg, ServedCausalLM.kind)
    return stable_hash({"config": config_fingerprint(opts.written()),
                        "served_model_name": opts.served_model_name or opts.name}, 24)


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


__all__ = ["ServedCausalLM", "Echo", "checked_echo", "served_fingerprint", "answer_token_logprobs",
           "answer_separate_logprobs", "answer_continuation_logprobs"]
