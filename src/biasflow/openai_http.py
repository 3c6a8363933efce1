"""What every client of an OpenAI-compatible server shares (the chat generator and the served causal LM): one HTTP
session per thread, the bearer key in the headers only, the key redacted from every message, a rate limit across
threads and exponential back-off that honours the server's ``Retry-After``."""
from __future__ import annotations

import threading
import time
from typing import Callable

from biasflow.secrets import redact_text


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
    """Mixin: needs ``self._api_key`` (str or None), ``self._local`` (``threading.local()``), ``self.backoff_s`` and
    ``self.max_backoff_s``."""

    _api_key: str | None
    _local: threading.local
    backoff_s: float
    max_backoff_s: float

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
