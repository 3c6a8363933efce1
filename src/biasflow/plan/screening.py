"""Secrets kept out of the plan: overrides that carry one are refused, and configs are written without them."""
from __future__ import annotations

import functools
from typing import Any, Sequence

from biasflow.errors import ConfigError
from biasflow.secrets import environ_snapshot, public_uri, redact_text, redact_uri, secret_env_values, uri_has_secret


def reject_secret_overrides(overrides: Sequence[str]) -> None:
    """Secrets never come from the command line: it lands in the plan, shell history, process lists and logs."""
    for o in overrides:
        key, _, value = o.partition("=")
        if uri_has_secret(value) or redact_text(value) != value:
            hint = ("set MLFLOW_TRACKING_URI in the environment and use tracking=server"
                    if key.lstrip("+~").startswith("tracking") else
                    "put the key in an environment variable and set generator.api_key_env=<VARIABLE NAME>, or in "
                    "a file and set generator.api_key_file=<path>")
            raise ConfigError(f"{key.lstrip('+~')} is not accepted: the value holds a password or key, and the "
                              f"command line is written to the plan and logs; {hint}")


# a sweep's jobs repeat the same strings (dataset URLs, paths) thousands of times: each is parsed once
_has_secret = functools.lru_cache(maxsize=1 << 16)(uri_has_secret)


def without_secrets(cfg: dict[str, Any], checked: dict[int, Any] | None = None) -> dict[str, Any]:
    """The composed config with the tracking URI's credentials removed (the stages reconnect with the environment's
    URI, see biasflow.secrets.tracking_uri; user names stay out too, so a team's runs of one plan share its hash);
    any other secret-bearing URI is an error naming the option. ``checked``: sections found clean by earlier calls
    (id -> the section, kept alive): the jobs of a sweep share them (``compose_shared``), each is walked once."""
    tracking = dict(cfg.get("tracking") or {})
    if tracking.get("uri"):
        tracking["uri"] = public_uri(tracking["uri"])
    cfg = dict(cfg, tracking=tracking)

    env = environ_snapshot()
    # values of secret-named variables (API keys, tokens), e.g. resolved into the config by ${oc.env:OPENAI_API_KEY}
    secret_values = set(secret_env_values(env))
    secrets = {v: k for k, v in sorted(env.items()) if v in secret_values}

    def walk(obj: Any, where: str) -> None:
        if isinstance(obj, dict):
            if checked is not None and checked.get(id(obj)) is obj:
                return
            for k, v in obj.items():
                walk(v, f"{where}.{k}" if where else str(k))
            if checked is not None:
                checked[id(obj)] = obj
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{where}.{i}")
        elif isinstance(obj, str):
            if where != "tracking.uri" and _has_secret(obj):
                raise ConfigError(f"{where}={redact_uri(obj)!r} holds a password: give credentials through the "
                                  f"environment instead")
            leaked = [name for value, name in secrets.items() if value in obj]
            if leaked:
                raise ConfigError(f"{where} holds the value of the secret environment variable {leaked[0]} (e.g. "
                                  f"through ${{oc.env:{leaked[0]}}}); it would be written to the plan, logs and MLflow. "
                                  f"Options that need a key name its variable instead (api_key_env={leaked[0]})")

    walk(cfg, "")
    return cfg
