"""Exceptions with messages that name the file, row or option at fault, and the one-line error a stage logged."""
from __future__ import annotations

import re
from pathlib import Path


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'Age'?)' for the closest choice (case ignored first), or ''."""
    import difflib

    choices = [str(c) for c in choices]
    same = [c for c in choices if c.lower() == str(word).lower()]
    close = same or difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class BiasflowError(Exception):
    """Base class: the message is meant for the user as-is."""


class ChecksumError(BiasflowError):
    pass


class DownloadError(BiasflowError):
    pass


class DataFormatError(BiasflowError):
    pass


class ConfigError(BiasflowError):
    pass


class ModelLoadError(BiasflowError):
    pass


class TrackingError(BiasflowError):
    """The MLflow store is unreachable, broken or refused the results (the results on disk are unaffected)."""


class GenerationError(BiasflowError):
    """Too many generation requests failed; the answered ones are cached and a re-run retries the rest."""


class ServedModelError(BiasflowError):
    """A model server did not answer a request usably (HTTP errors after retries, timeouts, malformed replies)."""


# How a stage logs its error (biasflow.stages.setup_logging): read back by biasflow status and the report.
_ERROR = re.compile(r" (?:ERROR|CRITICAL) [\w.]+: (.*)$")


def last_error(log: str) -> str | None:
    """The error a stage logged (biasflow.stages.setup_logging writes it with its traceback), in one line."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for i in range(len(lines) - 1, -1, -1):
        m = _ERROR.search(lines[i])
        if m:
            msg = m.group(1).removeprefix("error: ")
            if msg == "stage failed":  # an unexpected exception: its last traceback line says what
                tail = [ln for ln in lines[i + 1:] if ln and not ln.startswith(" ")]
                msg = tail[-1] if tail else msg
            return msg[:500]
    return None
