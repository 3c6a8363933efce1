"""Opening the MLflow store: the URI to connect with, a quick reachability check, an sqlite store created atomically,
and nothing secret in what MLflow prints or what biasflow writes.

* The plan holds the redacted URI; ``connect_uri`` returns the one to connect with (the environment's
  ``MLFLOW_TRACKING_URI`` when it redacts to the plan's value), so the password is used but never written down.
* ``open_store`` checks once, with a short timeout, that the store answers (``/health`` of a server, a connection to
  a database), so an unreachable store fails in seconds instead of after MLflow's retries (7 retries, 120 s each).
* A new sqlite store is created and migrated in a temporary file beside it and renamed into place only when complete:
  a full disk or a kill during creation leaves no half-created store. A half-created store from an earlier version
  (schema revision not MLflow's head) is moved aside when it holds nothing, and otherwise refused with the way out.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import unquote, urlsplit

from biasflow.errors import TrackingError
from biasflow.secrets import MASK, redact_text, redact_uri, secret_env_values, tracking_uri

log = logging.getLogger(__name__)

REACH_TIMEOUT = 5.0  # seconds: a store that does not answer within this is reported unreachable
# After the reachability check, MLflow's own retries (unless the user set them) are kept short too.
MLFLOW_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
TEXT_SUFFIXES = {".md", ".json", ".csv", ".yaml", ".yml", ".txt", ".html", ".log", ".tsv"}
_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def connect_uri(configured: str) -> str:
    """The URI to connect with for a configured (possibly redacted) tracking URI. A relative sqlite path
    (``sqlite:///results/mlflow.db``) is made absolute from the current folder: MLflow keeps one store per URI for
    the life of the process, so a relative URI used again from another folder (a notebook, a second project in one
    Python session) would log into the first folder's database."""
    uri = tracking_uri(configured) or configured
    prefix = "sqlite:///"
    if isinstance(uri, str) and uri.startswith(prefix) and not uri[len(prefix):].startswith("/") \
            and uri[len(prefix):] not in ("", ":memory:"):
        path, sep, query = uri[len(prefix):].partition("?")
        uri = prefix + os.path.abspath(path) + sep + query
    return uri


def uri_secrets(uri: str) -> list[str]:
    """The secret parts of a URI (password, credential query values), raw and percent-decoded."""
    out: list[str] = []
    if not isinstance(uri, str) or "://" not in uri:
        return out
    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:
        return out
    if password:
        out += [password, unquote(password)]
    redacted = urlsplit(redact_uri(uri)).query.split("&")
    for pair, shown in zip(parts.query.split("&"), redacted):
        if pair != shown and "=" in pair:
            value = pair.split("=", 1)[1]
            out += [value, unquote(value)]
    return sorted({s for s in out if len(s) >= 3}, key=len, reverse=True)


class Redactor:
    """Masks the tracking URI's secrets (and anything else secret-looking) in text before it is written."""

    def __init__(self, uri: str, extra: Iterable[str] = ()):
        self.secrets = sorted({*uri_secrets(uri), *extra, *secret_env_values()}, key=len, reverse=True)

    def __call__(self, text: Any) -> Any:
        if not isinstance(text, str):
            return text
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return redact_text(text)

    def config(self, obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: self.config(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.config(v) for v in obj]
        return self(redact_uri(obj)) if isinstance(obj, str) else obj

    def leaks(self, data: bytes) -> bool:
        return any(s.encode() in data for s in self.secrets)


@contextlib.contextmanager
def safe_artifacts(paths: Iterable[Path], redactor: Redactor) -> Iterator[list[Path]]:
    """The files to upload as artifacts: a file holding a secret is replaced by a redacted copy (text) or left out
    with a warning (binary), so nothing secret reaches the artifact store."""
    with tempfile.TemporaryDirectory(prefix="biasflow-artifacts-") as tmp:
        out = []
        for i, path in enumerate(paths):
            path = Path(path)
            data = path.read_bytes()
            if not redactor.leaks(data):
                out.append(path)
            elif path.suffix.lower() in TEXT_SUFFIXES:
                copy = Path(tmp) / str(i) / path.name
                copy.parent.mkdir()
                copy.write_text(redactor(data.decode("utf-8", errors="replace")))
                out.append(copy)
            else:
                log.warning("%s is not logged to MLflow: it contains a secret", path)
        yield out


@contextlib.contextmanager
def mlflow_env() -> Iterator[None]:
    """MLflow's console run links off (they show the URI with its password), short retries unless set by the user."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", *MLFLOW_ENV_DEFAULTS)}
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    for key, value in MLFLOW_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def open_store(uri: str, timeout: float = REACH_TIMEOUT) -> None:
    """Make sure the store at ``uri`` (the real URI) can be used: reachable, and for sqlite complete.

    Raises TrackingError naming the redacted URI and the reason, within about ``timeout`` seconds."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    if scheme in ("http", "https"):
        _check_server(uri, timeout)
    elif scheme == "sqlite":
        ensure_sqlite_store(uri)
    elif scheme in _DB_SCHEMES:
        _check_database(uri, timeout)
    # file stores, databricks and plugin schemes: MLflow's own errors apply


def _unreachable(uri: str, reason: str) -> TrackingError:
    return TrackingError(f"the MLflow tracking store {redact_uri(uri)} is unreachable: {Redactor(uri)(reason)}")


def _check_server(uri: str, timeout: float) -> None:
    """One GET of the server's /health endpoint, no retries, with MLflow's own credentials and TLS settings."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    start = time.monotonic()
    try:
        response = http_request(get_default_host_creds(uri.rstrip("/")), "/health", "GET", max_retries=0,
                                backoff_factor=0, backoff_jitter=0, timeout=timeout, raise_on_status=False)
    except Exception as exc:  # connection refused, DNS failure, timeout, TLS error
        reason = str(exc)
        cause = exc.__cause__ or exc.__context__
        if cause is not None:
            reason = f"{type(cause).__name__}: {cause}"
        raise _unreachable(uri, f"{reason} (after {time.monotonic() - start:.1f} s)") from None
    if response.status_code >= 500:
        raise _unreachable(uri, f"GET /health answered HTTP {response.status_code}")


def _check_database(uri: str, timeout: float) -> None:
    import sqlalchemy

    url = sqlalchemy.engine.make_url(uri)
    driver = url.get_driver_name()
    seconds = max(1, int(timeout))
    connect_args = {"pymssql": {"login_timeout": seconds}, "pyodbc": {"timeout": seconds}}.get(
        driver, {"connect_timeout": seconds})
    try:
        engine = sqlalchemy.create_engine(url, connect_args=connect_args)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except Exception as exc:
        raise _unreachable(uri, f"{type(exc).__name__}: {exc}") from None


# --- sqlite: atomic creation, detection of a half-created store ---------------------------------------------------

def sqlite_path(uri: str) -> Path | None:
    """The database file of an sqlite URI; None for in-memory or URI-mode (``file:``) databases."""
    import sqlalchemy

    url = sqlalchemy.engine.make_url(uri)
    db = url.database
    if not db or db == ":memory:" or db.startswith("file:") or url.query.get("uri"):
        return None
    return Path(db)


def _head_revision() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _store_state(path: Path) -> tuple[str | None, dict[str, int]]:
    """(schema revision, what a user would lose: runs, experiments besides Default, models, traces)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
            revision = None
            if "alembic_version" in tables:
                row = con.execute("select version_num from alembic_version").fetchone()
                revision = row[0] if row else None
            records = {}
            for table, where in (("runs", ""), ("experiments", " where experiment_id != 0"),
                                 ("registered_models", ""), ("logged_models", ""), ("trace_info", "")):
                if table in tables:
                    n = con.execute(f"select count(*) from {table}{where}").fetchone()[0]
                    if n:
                        records[table] = n
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise TrackingError(f"the MLflow store {path} is not a readable sqlite database ({exc}): move it away "
                            f"(a new store is then created) or restore it from a backup") from None
    return revision, records


def _lock_path(path: Path) -> str:
    """Beside the store (a project's files stay in its folder; one lock per store, whatever path names it)."""
    return str(path.resolve().with_name(f".{path.name}.lock"))


def _remove_db_files(path: Path) -> None:
    for p in (path, Path(f"{path}-journal"), Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _create_store(path: Path) -> None:
    """Create and migrate a new store in a temporary file beside ``path``; rename it into place when complete."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables, _verify_schema

    for stale in path.parent.glob(f".{path.name}.creating-*"):  # left by a killed creator (we hold the lock)
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)
            _verify_schema(engine)
        finally:
            engine.dispose()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _remove_db_files(tmp)
        if isinstance(exc, Exception):
            raise TrackingError(f"could not create the MLflow store {path}: {type(exc).__name__}: {exc}. Nothing "
                                f"was left behind: free disk space (or fix the cause) and run again") from exc
        raise
    log.info("created the MLflow store %s", path)


def ensure_sqlite_store(uri: str) -> None:
    """A complete sqlite store at ``uri``: created atomically if missing; a half-created one is recovered or refused."""
    from filelock import FileLock

    path = sqlite_path(uri)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unreachable(uri, f"cannot create the folder {path.parent}: {exc.strerror}") from None
    with FileLock(_lock_path(path), timeout=600):
        if path.exists() and path.stat().st_size > 0:
            revision, records = _store_state(path)
            head = _head_revision()
            if revision == head:
                return
            if records:
                raise TrackingError(
                    f"the MLflow store {path} has schema revision {revision or '(none)'} but this MLflow "
                    f"expects {head}, and it is not empty ({', '.join(f'{n} {t}' for t, n in records.items())}). Either it comes from an "
                    f"older MLflow: back it up, then run  mlflow db upgrade sqlite:///{path}  ; or its creation "
                    f"or upgrade was interrupted (full disk?): restore it from a backup, or move it away to start a "
                    f"new store.")
            aside = path.with_name(f"{path.name}.incomplete-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(str(path), aside)
            for suffix in ("-journal", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{path}{suffix}", f"{aside}{suffix}")
            log.warning("the MLflow store %s was incomplete (schema revision %s, expected %s) and held no runs: "
                        "moved it to %s and created a new one", path, revision, head, aside)
        _create_store(path)


# --- a copied or moved project folder ------------------------------------------------------------------------------

def repoint_moved_store(uri: str, recorded: str | None, wanted: str) -> int | None:
    """Point a local store's artifact locations at ``wanted`` when the store and its artifacts were copied or moved
    together (the database file sits beside the artifact folder) and the store still records the old folder
    (``recorded``, the experiment's artifact location). MLflow keeps absolute locations: without this, a re-run in a
    copy writes its artifacts into the original folder, and in a moved folder recreates the old path. Returns the
    number of runs re-pointed, None when nothing was to do."""
    path = sqlite_path(uri)
    if path is None or not recorded or recorded == wanted or not recorded.startswith("file:"):
        return None
    from urllib.parse import unquote, urlparse

    wanted_dir = Path(unquote(urlparse(wanted).path))
    if path.resolve().parent != wanted_dir.parent:  # a store shared with other folders keeps its locations
        return None
    old = recorded.rstrip("/")
    new = wanted.rstrip("/")
    # the folders moved together: re-point everything under the old project folder (MLflow's Default experiment
    # too), found by stripping the path both locations end with (results/mlartifacts)
    common = 0
    for a, b in zip(reversed(old.split("/")), reversed(new.split("/"))):
        if a != b:
            break
        common += 1
    if common and len(old.split("/")) > common + 3:
        old, new = "/".join(old.split("/")[:-common]), "/".join(new.split("/")[:-common])
    con = sqlite3.connect(str(path), timeout=60)
    try:
        with con:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
            for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                                  ("logged_models", "artifact_location")):
                if table not in tables:
                    continue
                # the old folder itself, or a path under it, as a file: URI or a bare path (MLflow's Default)
                for before, after in ((old, new), (unquote(urlparse(old).path), unquote(urlparse(new).path))):
                    con.execute(f"update {table} set {column} = ? || substr({column}, ?) "
                                f"where {column} = ? or substr({column}, 1, ?) = ?",
                                (after, len(before) + 1, before, len(before) + 1, before + "/"))
            runs = con.execute("select count(*) from runs where substr(artifact_uri, 1, ?) = ?",
                               (len(new) + 1, new + "/")).fetchone()[0]
    finally:
        con.close()
    with contextlib.suppress(Exception):  # MLflow caches each run's artifact repository by run id, in-process
        from mlflow.tracking._tracking_service import utils as tracking_utils

        tracking_utils._artifact_repos_cache.clear()
    log.warning("the MLflow store %s was copied or moved from another folder: its artifact locations pointed to %s; "
                "re-pointed to %s (%d runs), so nothing is written outside this folder", path, old, new, runs)
    return runs


__all__ = ["connect_uri", "open_store", "ensure_sqlite_store", "sqlite_path", "repoint_moved_store", "Redactor", "safe_artifacts",
           "mlflow_env", "uri_secrets", "REACH_TIMEOUT"]
