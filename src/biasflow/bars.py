"""Every progress bar of biasflow's scorers: a tqdm bar that, in a job of ``biasflow run``'s compact console, also
reports where it stands to a small file the console polls (no text parsing).

``biasflow run`` sets ``BIASFLOW_PROGRESS_DIR`` (a folder under ``.snakemake/biasflow/``, on the shared file system
for cluster jobs too); a job's bar then writes ``<dir>/<host>-<pid>.json`` (replaced atomically, at most once a
second) with the job's outputs (``BIASFLOW_JOB_OUTPUTS``, set by ``stages.start_stage``, absolute), the bar's
description, ``n``, ``total``, ``unit``, ``rate`` (per second), ``elapsed`` and ``remaining`` (seconds). The console
matches the outputs with those of the jobs Snakemake runs. Without the variable a bar is a plain tqdm bar.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

PROGRESS_ENV = "BIASFLOW_PROGRESS_DIR"
WRITE_EVERY_S = 1.0


def progress_file(folder: str | os.PathLike, host: str | None = None, pid: int | None = None) -> str:
    return os.path.join(str(folder), f"{host or socket.gethostname()}-{pid or os.getpid()}.json")


def _outputs() -> list[str]:
    return [os.path.abspath(p) for p in os.environ.get("BIASFLOW_JOB_OUTPUTS", "").split(os.pathsep) if p]


def write_progress(folder: str, state: dict[str, Any]) -> None:
    """``state`` as the job's progress file, replaced atomically (a reader never sees half a file)."""
    path = progress_file(folder)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def progress_bar(iterable=None, **kwargs):
    """``tqdm.auto.tqdm(iterable, **kwargs)``, reporting to ``$BIASFLOW_PROGRESS_DIR`` when it is set. A bar asked
    to be silent (``disable=True``) still reports there, and stays silent."""
    from tqdm.auto import tqdm

    folder = os.environ.get(PROGRESS_ENV)
    if not folder or not os.environ.get("BIASFLOW_JOB_OUTPUTS"):
        return tqdm(iterable, **kwargs)
    silent = kwargs.get("disable", False)
    if silent is None:  # tqdm's "silent unless its stream is a terminal"
        stream = kwargs.get("file") or sys.stderr
        silent = not (hasattr(stream, "isatty") and stream.isatty())
    if silent:
        kwargs["disable"] = False
        kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed with the bar
    return _reporting(tqdm)(iterable, _folder=folder, **kwargs)


_CLASSES: dict[type, type] = {}


def _reporting(base: type) -> type:
    """A subclass of the tqdm class ``base`` that writes its state to the progress folder as it updates."""
    if base in _CLASSES:
        return _CLASSES[base]

    class ReportingBar(base):  # type: ignore[misc, valid-type]
        def __init__(self, iterable=None, *args, _folder: str = "", **kwargs):
            self._bf_folder = _folder
            self._bf_written = 0.0
            self._bf_outputs = _outputs()
            super().__init__(iterable, *args, **kwargs)
            self._bf_report(force=True)

        def update(self, n=1):
            shown = super().update(n)
            self._bf_report()
            return shown

        def close(self):
            if not getattr(self, "_bf_closed", True):
                self._bf_report(force=True, finished=True)
            self._bf_closed = True
            try:
                super().close()
            finally:
                fp = getattr(self, "fp", None)
                if fp is not None and getattr(fp, "name", None) == os.devnull:
                    fp.close()

        def _bf_report(self, force: bool = False, finished: bool = False) -> None:
            now = time.monotonic()
            if not force and now - self._bf_written < WRITE_EVERY_S:
                return
            self._bf_written = now
            self._bf_closed = False
            try:
                d = self.format_dict
                n, total, elapsed = d.get("n") or 0, d.get("total"), d.get("elapsed") or 0.0
                rate = d.get("rate") or (n / elapsed if elapsed and n else None)
                remaining = (total - n) / rate if rate and total is not None and total >= n else None
                write_progress(self._bf_folder, {
                    "outputs": self._bf_outputs, "desc": str(d.get("prefix") or "").rstrip(": "),
                    "n": n, "total": total, "unit": d.get("unit") or "it", "rate": rate, "elapsed": elapsed,
                    "remaining": remaining, "finished": finished, "time": time.time()})
            except OSError:  # the console is a view: a full disk or a removed folder must not stop the job
                pass

    _CLASSES[base] = ReportingBar
    return ReportingBar


class _WarningNotes:
    """A logging handler for a job of the compact console: biasflow's warnings and errors (a repeated item, a store
    re-pointed, a value kept out of MLflow) appended to ``<dir>/<host>-<pid>.notes.jsonl``, redacted, so the console
    shows them as they happen (the rule log keeps them too)."""

    def __init__(self, folder: str):
        import logging

        class Handler(logging.Handler):
            def emit(inner, record: logging.LogRecord) -> None:  # noqa: N805 - the handler's own self
                if record.levelno != logging.WARNING:  # a job's error is its failure line
                    return
                try:
                    from biasflow.secrets import redact_text

                    text = redact_text(record.getMessage()).splitlines()
                    note = {"outputs": _outputs(), "level": record.levelname, "msg": text[0] if text else "",
                            "time": time.time()}
                    path = progress_file(folder).removesuffix(".json") + ".notes.jsonl"
                    with open(path, "a", encoding="utf-8") as f:
                        f.write(json.dumps(note) + "\n")
                except Exception:  # noqa: BLE001 - the console is a view: never a job's failure
                    pass

        self.handler = Handler(level=logging.WARNING)


def report_warnings() -> None:
    """In a job of ``biasflow run``'s compact console (``BIASFLOW_PROGRESS_DIR`` set): biasflow's warnings go to the
    console too (``stages.setup_logging`` calls this). Elsewhere nothing changes."""
    import logging

    folder = os.environ.get(PROGRESS_ENV)
    if not folder or not os.environ.get("BIASFLOW_JOB_OUTPUTS"):
        return
    logger = logging.getLogger("biasflow")
    if not any(getattr(h, "_biasflow_notes", False) for h in logger.handlers):
        handler = _WarningNotes(folder).handler
        handler._biasflow_notes = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
