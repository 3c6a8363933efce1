"""Redaction: passwords in URIs and keys in free text never survive; URIs without secrets are unchanged."""
from __future__ import annotations

import pytest

from biasflow.secrets import public_uri, redact_text, redact_uri, tracking_uri, uri_has_secret


@pytest.mark.parametrize("uri", ["sqlite:////tmp/x/mlflow.db", "sqlite:///results/mlflow.db", "http://127.0.0.1:5000",
                                 "postgresql://bob@db/mlflow", "file:///a/b", "https://host/path?x=1&y=2"])
def test_uris_without_secrets_are_unchanged(uri):
    assert redact_uri(uri) == uri and not uri_has_secret(uri)


@pytest.mark.parametrize("uri, expected", [
    ("postgresql://bob:hunter2@db:5432/mlflow", "postgresql://bob:***@db:5432/mlflow"),
    ("http://u:p%40ss@host:5000", "http://u:***@host:5000"),
    ("mysql://u:pw@h/db?password=pw2&sslmode=require", "mysql://u:***@h/db?password=***&sslmode=require"),
])
def test_passwords_are_masked(uri, expected):
    assert redact_uri(uri) == expected and uri_has_secret(uri)


def test_error_bodies_lose_keys(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-value-123456")
    body = ('{"error": {"message": "Incorrect API key provided: sk-proj-abcdefghijklmnopqrstuvwx", '
            '"api_key": "zzzzzzzzzz"}} Authorization: Bearer abcdefghijklmnop seen tok-value-123456')
    out = redact_text(body)
    for secret in ("sk-proj-abcdefghijklmnop", "zzzzzzzzzz", "abcdefghijklmnop", "tok-value-123456"):
        assert secret not in out
    assert "Incorrect API key provided" in out


@pytest.mark.parametrize("uri, expected", [
    ("http://alice:pw123456@host:5000/prefix", "http://host:5000/prefix"),
    ("http://bob@host:5000", "http://host:5000"),
    ("postgresql://bob:hunter2@db/mlflow?password=x&sslmode=require", "postgresql://db/mlflow?password=***&sslmode=require"),
    ("sqlite:////tmp/x/mlflow.db", "sqlite:////tmp/x/mlflow.db"),
])
def test_public_uri_has_no_user_and_no_secret(uri, expected):
    assert public_uri(uri) == expected


def test_tracking_uri_reconnects_with_the_environment(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://bob:hunter2@db/mlflow")
    assert tracking_uri("postgresql://bob:***@db/mlflow") == "postgresql://bob:hunter2@db/mlflow"
    assert tracking_uri("postgresql://db/mlflow") == "postgresql://bob:hunter2@db/mlflow"  # the plan's public form
    assert tracking_uri("sqlite:///other.db") == "sqlite:///other.db"


@pytest.mark.parametrize("text", ["first_token=prefix: the server adds no token", "use first_token=none",
                                  "ContinuationLogprobs(context='a', start_token=True)",
                                  "metric.crows_pairs_causal.first_token=separate", '"first_token": "prefix"'])
def test_options_naming_a_token_position_are_not_secrets(text):
    """first_token / start_token say which token of a text is scored; their values are never masked."""
    assert redact_text(text) == text


@pytest.mark.parametrize("text, secret", [
    ("token=abcdef12", "abcdef12"), ("auth_token=abcd1234efgh", "abcd1234efgh"), ("HF_TOKEN=abcdefgh", "abcdefgh"),
    ('"access_token": "xyz12345"', "xyz12345"), ("refresh_token=zzzzzzzz", "zzzzzzzz"),
    ("my_first_token=hunter22", "hunter22"), ("start_token=True, token=secret99", "secret99")])
def test_token_values_stay_masked(text, secret):
    assert secret not in redact_text(text)
