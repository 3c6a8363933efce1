"""Snakemake logger plugin ``biasflow`` (``snakemake --logger biasflow``): Snakemake's structured log records as JSON
lines, one event a line, appended to the file named by ``BIASFLOW_EVENTS``. ``biasflow run`` reads them to draw its
compact console (``biasflow.console``); Snakemake's own text still goes to its stream (``biasflow run`` writes it to
the run's full log). Without ``BIASFLOW_EVENTS`` the plugin writes nothing.

Each line is an object with ``event`` (``job_info``, ``job_started``, ``job_finished``, ``job_error``, ``progress``,
``run_info``, ``error``, ``group_error``, ``message``) and ``t`` (seconds since the epoch); file paths are absolute.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from snakemake_interface_logger_plugins.base import LogHandlerBase

ENV = "BIASFLOW_EVENTS"


def _files(values: Any) -> list[str]:
    """Snakemake's formatted file names (``fmt_iofile`` may append a flag in parentheses) as absolute paths."""
    out = []
    for value in values or []:
        text = str(value).split(" (", 1)[0]
        out.append(os.path.abspath(text) if text else text)
    return out


def _plain(value: Any) -> Any:
    """A JSON-able copy: mappings and lists kept, anything else as its text."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "items"):
        try:
            return {str(k): _plain(v) for k, v in value.items()}
        except Exception:  # noqa: BLE001 - a Namedlist whose items cannot be listed: its text
            return str(value)
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    return str(value)


def _logged_error(logs: list[str]) -> str | None:
    """The error the failed job's stage logged, read now: a retry of the job starts over its log."""
    try:
        from biasflow.errors import last_error
    except ImportError:  # the plugin outside biasflow's environment
        return None
    for log in logs:
        error = last_error(log)
        if error:
            return error
    return None


def event_of(record: logging.LogRecord) -> dict[str, Any] | None:
    """The JSON event of one Snakemake log record, or None for records the console does not use."""
    kind = getattr(record, "event", None)
    kind = str(kind) if kind is not None else None
    get = record.__dict__.get
    if kind == "job_info":
        resources = get("resources")
        return {"event": kind, "jobid": get("jobid"), "rule": get("rule_name"), "msg": get("rule_msg"),
                "wildcards": _plain(get("wildcards") or {}), "output": _files(get("output")),
                "log": _files(get("log")), "threads": _plain(get("threads")), "local": bool(get("local")),
                "resources": {k: _plain(v) for k, v in (dict(resources.items()) if hasattr(resources, "items")
                                                         else {}).items() if not str(k).startswith("_")}}
    if kind == "job_started":
        return {"event": kind, "jobs": _plain(get("jobs") or [])}
    if kind == "job_finished":
        return {"event": kind, "jobid": get("job_id")}
    if kind == "job_error":
        logs = _files(get("log"))
        return {"event": kind, "jobid": get("jobid"), "rule": get("rule_name"), "msg": _plain(get("rule_msg")),
                "log": logs, "output": _files(get("output")), "aux": _plain(get("aux") or {}),
                "cause": _logged_error(logs)}
    if kind == "group_error":
        return {"event": kind, "msg": _plain(get("msg")), "log": _files(get("aux_logs")),
                "jobs": [{"rule": i.get("rule_name"), "jobid": i.get("jobid"), "log": _files(i.get("log"))}
                         for i in get("job_error_info") or []]}
    if kind == "progress":
        return {"event": kind, "done": get("done"), "total": get("total")}
    if kind == "run_info":
        return {"event": kind, "stats": _plain(get("stats") or {})}
    if kind == "error":
        return {"event": kind, "exception": get("exception"), "msg": record.getMessage()}
    if kind is None:  # Snakemake's own errors and warnings, and biasflow's words said in Snakemake, as text
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record whose arguments do not format
            text = str(record.msg)
        if record.levelno >= logging.WARNING or text.startswith("biasflow: "):
            return {"event": "message", "level": record.levelname, "msg": text}
    return None


class LogHandler(LogHandlerBase):
    """Appends each event to ``$BIASFLOW_EVENTS`` as one JSON line, flushed at once (the reader tails the file)."""

    def __post_init__(self) -> None:
        self._path = os.environ.get(ENV) or None
        self._file = None
        self._write_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if self._path is None:
            return
        try:
            event = event_of(record)
            if event is None:
                return
            event["t"] = record.created or time.time()
            line = json.dumps(event, default=str) + "\n"
            with self._write_lock:
                if self._file is None:
                    self._file = open(self._path, "a", encoding="utf-8")
                self._file.write(line)
                self._file.flush()
        except Exception:  # noqa: BLE001 - the console is a view: a failure here must never stop Snakemake
            self.handleError(record)

    def close(self) -> None:
        with self._write_lock:
            if self._file is not None:
                self._file.close()
                self._file = None
        super().close()

    @property
    def writes_to_stream(self) -> bool:
        return False  # Snakemake's own text still goes to its stream: biasflow run keeps it as the full log

    @property
    def writes_to_file(self) -> bool:
        return False  # (a file handler must have a baseFilename Snakemake names as "Complete log")

    @property
    def has_filter(self) -> bool:
        return True  # every record: event_of picks

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False
