"""What every client of an OpenAI-compatible server shares (the chat generator and the served causal LM): one HTTP
session per thread, the bearer key in the headers only, the key redacted from every message, a rate limit across
threads, and one retry loop (``OpenAIHTTPClient.send``) with exponential back-off that honours the server's
``Retry-After``.

How long one request may take is bounded twice: each attempt by ``timeout_s`` (the reply complete, not merely
started: a server that trickles its reply byte by byte is cut off too), and the request as a whole, attempts and
back-off waits together, by ``timeout_s * (max_retries + 1)``. Only what may pass is retried (``RETRY_STATUS``,
timeouts, refused or cut connections); a reply that is wrong (an HTML page, broken JSON, a client error) would be
wrong again and is not."""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from biasflow.secrets import redact_text

# worth another attempt: timeouts, conflicts, rate limits and server errors (the rest will fail the same way again)
RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
READ_CHUNK = 1 << 16
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)


class RateLimiter:
    """At most ``rate`` request starts per second across threads (evenly spaced)."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.interval = 1.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = threading.Lock()
        self._clock, self._sleep = clock, sleep

    def acquire(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self._sleep(start - now)


@dataclass
class Outcome:
    """What ``OpenAIHTTPClient.send`` got: the 200 ``response`` (its body read), else the redacted ``error``;
    ``status`` is the last HTTP status received (None: no reply), ``attempts`` the HTTP attempts made."""

    response: Any
    error: str | None
    status: int | None
    attempts: int


def looks_like_html(resp) -> bool:
    """Whether a reply is a web page (a proxy's or login page, a wrong path) rather than the API's JSON."""
    ctype = (resp.headers.get("Content-Type") or "").lower()
    head = resp.content[:512].lstrip().lower()
    return "html" in ctype or head.startswith((b"<!doctype", b"<html", b"<head", b"<body"))


def html_summary(resp) -> str:
    """``an HTML page titled '...'`` (its title, if it has one: the page's own words for what went wrong)."""
    match = _TITLE.search(resp.text[:20000])
    title = " ".join(match.group(1).split())[:120] if match else ""
    return f"an HTML page{f' titled {title!r}' if title else ''}"


class _Stalled(Exception):
    """The reply did not arrive complete within the attempt's time."""


class OpenAIHTTPClient:
    """Mixin: needs ``self._api_key`` (str or None), ``self._local`` (``threading.local()``), ``self.url``,
    ``self.timeout_s``, ``self.max_retries``, ``self.backoff_s``, ``self.max_backoff_s``, ``self.limiter``
    (``RateLimiter``), ``self._sleep``, ``self._count_lock`` and ``self.requests_sent``; ``timeout_option`` names
    the timeout's config key in errors (its section names the other options: ``model.timeout_s`` ->
    ``model.max_retries``, ``model.base_url``).

    A thread that sets ``self._local.abort`` (a ``threading.Event``) has its requests stop retrying once the event
    is set: a pool of workers whose first failure ends the job makes no more attempts for the others."""

    _api_key: str | None
    _local: threading.local
    url: str
    timeout_s: float
    max_retries: int
    backoff_s: float
    max_backoff_s: float
    limiter: RateLimiter
    _sleep: Callable[[float], None]
    _count_lock: threading.Lock
    requests_sent: int
    timeout_option = "timeout_s"

    def option(self, name: str) -> str:
        """The config key of option ``name`` in this client's section (``model.max_retries``)."""
        section, _, _ = self.timeout_option.rpartition(".")
        return f"{section}.{name}" if section else name

    @property
    def time_limit_s(self) -> float:
        """How long one request may take, every attempt and back-off wait included."""
        return self.timeout_s * (self.max_retries + 1)

    def _session(self):
        import requests

        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _redact(self, text: str) -> str:
        return redact_text(text, extra_secrets=[self._api_key] if self._api_key else [])

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds before retry ``attempt``: the server's numeric Retry-After, else ``backoff_s * 2**attempt``,
        capped by ``max_backoff_s``."""
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass
        return min(self.backoff_s * (2 ** attempt), self.max_backoff_s)

    def describe_error_body(self, resp) -> str:
        """A non-200 reply's body for an error message: redacted and cut, or what an HTML page is."""
        if looks_like_html(resp):
            return (f"{html_summary(resp)}, not the API's JSON (is {self.option('base_url')} the OpenAI-compatible "
                    "API root, e.g. http://host:8000/v1?)")
        return self._redact(resp.text)[:300]  # redacted, then cut

    def _attempt(self, body: dict, timeout: float):
        """One POST whose reply must be complete within ``timeout`` seconds (``_Stalled`` otherwise)."""
        deadline = time.monotonic() + timeout
        resp = self._session().post(self.url, json=body, headers=self._headers(), timeout=timeout, stream=True)
        try:
            data = bytearray()
            for chunk in resp.iter_content(READ_CHUNK):
                data += chunk
                if time.monotonic() > deadline:
                    raise _Stalled()
            resp._content = bytes(data)  # what .content, .text and .json() read
        finally:
            resp.close()
        return resp

    def _wait(self, seconds: float, abort: threading.Event | None) -> None:
        if abort is not None and self._sleep is time.sleep:
            abort.wait(seconds)  # woken early when the job gives up
        else:
            self._sleep(seconds)

    def send(self, body: dict) -> Outcome:
        """POST ``body`` to ``self.url`` until a 200 reply, a status not worth retrying (``RETRY_STATUS``),
        ``max_retries`` retries or the request's time limit (``time_limit_s``); errors are redacted and say how
        many attempts were made when they ran out."""
        import requests

        error, status, attempts = "no attempt made", None, 0
        abort: threading.Event | None = getattr(self._local, "abort", None)
        deadline = None
        for attempt in range(self.max_retries + 1):
            if abort is not None and abort.is_set():
                return Outcome(None, f"not retried after {attempts} attempts: another request of the job failed "
                                     f"first; last error: {error}", status, attempts)
            self.limiter.acquire()
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.time_limit_s
            timeout = min(self.timeout_s, deadline - now)
            if timeout <= 0:
                break
            with self._count_lock:
                self.requests_sent += 1
            attempts += 1
            retry_after = None
            try:
                resp = self._attempt(body, timeout)
            except requests.Timeout as exc:
                error = f"no reply within {self.timeout_option}={self.timeout_s:g} s ({type(exc).__name__})"
            except _Stalled:
                error = f"no complete reply within {self.timeout_option}={self.timeout_s:g} s (it was still arriving)"
            except requests.ConnectionError as exc:
                error = self._redact(f"cannot connect, or the connection broke ({type(exc).__name__}: {exc})")
            except requests.RequestException as exc:  # a reply cut short (chunked encoding, content decoding)
                error = self._redact(f"the reply was cut short ({type(exc).__name__}: {exc})")
            else:
                status = resp.status_code
                if status == 200:
                    return Outcome(resp, None, status, attempts)
                error = f"HTTP {status}: {self.describe_error_body(resp)}"
                if status not in RETRY_STATUS:
                    return Outcome(None, error, status, attempts)
                retry_after = resp.headers.get("Retry-After")
            if attempt < self.max_retries:
                delay = self._delay(attempt, retry_after)
                if time.monotonic() + delay >= deadline:
                    break
                self._wait(delay, abort)
        else:
            return Outcome(None, f"gave up after {attempts} attempts; last error: {error}", status, attempts)
        return Outcome(None, f"gave up after {attempts} attempts, at the time limit of one request "
                             f"({self.timeout_option} x ({self.option('max_retries')} + 1) = "
                             f"{self.time_limit_s:g} s); last error: {error}", status, attempts)

    def post(self, body: dict):
        """``send``'s ``(response, None)`` for a 200 reply, else ``(None, error)``."""
        outcome = self.send(body)
        return outcome.response, outcome.error
