"""What every client of an OpenAI-compatible server shares (the chat generator and the served causal LM): one HTTP
session per thread, the bearer key in the headers only, the key redacted from every message, a rate limit across
threads, and one retry loop (``OpenAIHTTPClient.post``) with exponential back-off that honours the server's
``Retry-After``."""
from __future__ import annotations

import threading
import time
from typing import Callable

from biasflow.secrets import redact_text

# worth another attempt: timeouts, conflicts, rate limits and server errors (the rest will fail the same way again)
RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


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


class OpenAIHTTPClient:
    """Mixin: needs ``self._api_key`` (str or None), ``self._local`` (``threading.local()``), ``self.url``,
    ``self.timeout_s``, ``self.max_retries``, ``self.backoff_s``, ``self.max_backoff_s``, ``self.limiter``
    (``RateLimiter``), ``self._sleep``, ``self._count_lock`` and ``self.requests_sent``; ``timeout_option`` names
    the timeout's config key in errors."""

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

    def post(self, body: dict):
        """POST ``body`` to ``self.url`` until a 200 reply, a status not worth retrying (``RETRY_STATUS``) or
        ``max_retries`` retries: ``(response, None)`` for a 200, else ``(None, error)``, the error redacted and
        saying how many attempts were made when they ran out."""
        import requests

        error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            self.limiter.acquire()
            with self._count_lock:
                self.requests_sent += 1
            retry_after = None
            try:
                resp = self._session().post(self.url, json=body, headers=self._headers(), timeout=self.timeout_s)
            except requests.Timeout as exc:
                error = f"no reply within {self.timeout_option}={self.timeout_s:g} s ({type(exc).__name__})"
            except requests.ConnectionError as exc:
                error = self._redact(f"cannot connect ({type(exc).__name__}: {exc})")
            else:
                if resp.status_code == 200:
                    return resp, None
                error = f"HTTP {resp.status_code}: {self._redact(resp.text)[:300]}"  # redacted, then cut
                if resp.status_code not in RETRY_STATUS:
                    return None, error
                retry_after = resp.headers.get("Retry-After")
            if attempt < self.max_retries:
                self._sleep(self._delay(attempt, retry_after))
        return None, f"gave up after {self.max_retries + 1} attempts; last error: {error}"
