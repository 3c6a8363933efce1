"""Secrets: where they may come from, and redaction before anything is written.

Secrets (API keys, tracking-server passwords) come only from the environment or from a file the config names
(``api_key_env`` / ``api_key_file``); the configuration, the plan, logs, caches and MLflow only ever hold redacted
text. ``redact_uri`` hides the password of a URI (``postgresql://bob:***@db/mlflow``); ``redact_text`` hides
anything secret-looking in free text (server error bodies, exception messages) before it is stored.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit

from biasflow.errors import ConfigError

MASK = "***"

# Query parameters that carry credentials in database / storage URIs.
_SECRET_QUERY_KEYS = {"password", "passwd", "pwd", "token", "access_token", "api_key", "apikey", "key", "secret",
                      "sig", "signature", "x-amz-signature", "x-amz-credential", "sas"}
# Environment variables whose values are secrets wherever they appear in text.
SECRET_ENV_PATTERN = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)

# biasflow's own options named ``..._token`` that hold no secret (which token of a text is scored): the key=value
# pattern below leaves their values alone (``first_token=prefix``, ``start_token=True``)
_NOT_SECRET_TOKEN_KEYS = ("first", "start")
_NOT_A_SECRET_KEY = "".join(rf"(?<!(?<![A-Za-z0-9_]){k}_)" for k in _NOT_SECRET_TOKEN_KEYS)

_TEXT_PATTERNS = [
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"),                 # Authorization header values
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),                                       # OpenAI-style keys
    re.compile(r"\b(?:hf|ghp|gho|ghs|github_pat|xox[abp])_[A-Za-z0-9_]{20,}"),    # hub / GitHub / Slack tokens
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),                                         # AWS access key ids
    re.compile(rf"(?i)(\"?(?:api[_-]?key|access[_-]?token|{_NOT_A_SECRET_KEY}token|secret|password|passwd)\"?"
               r"\s*[:=]\s*\"?)([^\s\"',;&}]{4,})"),                           # key=value / "key": "value"
    re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)"),              # user:password@ in URIs
]


def redact_uri(uri: Any) -> Any:
    """``uri`` with its password (and credential query parameters) replaced by ``***``; non-strings unchanged."""
    if not isinstance(uri, str) or "://" not in uri:
        return uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return redact_text(uri)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_QUERY_KEYS for k, _ in pairs):
            query = urlencode([(k, MASK if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return uri  # nothing secret: unchanged (urlunsplit would turn sqlite:////abs/path into sqlite://abs/path)
    rebuilt = f"{uri.split('://', 1)[0]}://{netloc}{parts.path}"
    return rebuilt + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")


def public_uri(uri: Any) -> Any:
    """``uri`` as it may be written down and shared: no user name or password at all (``http://host/``), credential
    query parameters masked. Plans hold this form, so two people logging to one server with their own credentials
    plan the same run, and a printed link opens in a browser (which refuses URLs with credentials)."""
    uri = redact_uri(uri)
    if not isinstance(uri, str) or "://" not in uri:
        return uri
    scheme, rest = uri.split("://", 1)
    netloc, sep, tail = rest.partition("/")
    if "@" not in netloc:
        return uri
    return f"{scheme}://{netloc.rsplit('@', 1)[1]}{sep}{tail}"


def uri_has_secret(uri: Any) -> bool:
    return isinstance(uri, str) and redact_uri(uri) != uri


def environ_snapshot() -> dict[str, str]:
    """A copy of the environment that another thread may change meanwhile (MLflow's telemetry thread deletes a
    variable): ``dict(os.environ)`` reads each key after listing them and fails with KeyError on a deleted one."""
    return {k: v for k in os.environ if (v := os.environ.get(k)) is not None}


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables named like secrets (long enough that masking them cannot mangle text)."""
    env = environ_snapshot() if environ is None else environ
    return sorted({v for k, v in env.items() if SECRET_ENV_PATTERN.search(k) and len(v) >= 6}, key=len, reverse=True)


def redact_text(text: Any, extra_secrets: Iterable[str] = ()) -> Any:
    """Free text with every secret-looking substring masked: known secret values first, then patterns."""
    if not isinstance(text, str) or not text:
        return text
    for secret in [*extra_secrets, *secret_env_values()]:
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    for pat in _TEXT_PATTERNS:
        if pat.groups >= 2:
            text = pat.sub(lambda m: m.group(1) + MASK + (m.group(3) if pat.groups >= 3 else ""), text)
        else:
            text = pat.sub(MASK, text)
    return text


def redact_config(obj: Any) -> Any:
    """A config (nested dicts/lists) with every URI-looking string redacted; used before anything is written."""
    if isinstance(obj, Mapping):
        return {k: redact_config(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_config(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(redact_uri(obj))
    return obj


def read_secret(*, env: str | None = None, file: str | None = None, what: str = "secret") -> str | None:
    """The secret named by an environment variable or a file (first line); None when neither is set."""
    if file:
        path = Path(file).expanduser()
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{what}: cannot read the key file {path}: {exc.strerror}") from exc
        if not value:
            raise ConfigError(f"{what}: the key file {path} is empty")
        return value
    if env:
        return os.environ.get(env) or None
    return None


def tracking_uri(configured: str | None) -> str | None:
    """The URI to connect with: the environment's ``MLFLOW_TRACKING_URI`` when the configured URI is its public (or
    redacted) form, so a password given in the environment is used without ever being written down."""
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if configured and env_uri and configured in (public_uri(env_uri), redact_uri(env_uri)):
        return env_uri
    return configured


__all__ = ["MASK", "public_uri", "redact_uri", "redact_text", "redact_config", "uri_has_secret", "read_secret", "tracking_uri",
           "secret_env_values"]
