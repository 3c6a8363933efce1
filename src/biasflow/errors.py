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


def full_disk(exc: BaseException) -> OSError | None:
    """The "no space left" (or quota) error behind ``exc``, following its causes (a DownloadError wraps one)."""
    import errno

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def full_disk_text(err: OSError, job: str = "") -> str:
    """One paragraph: which folder filled (its file system's free and total space), what was being written, by
    which job, and what to do."""
    import os
    import shutil
    from pathlib import Path

    # a copy names its source and target, a write() no file: the one on a file system that is full (else the
    # job's own outputs and log, checked the same way)
    candidates = [str(f) for f in (err.filename, err.filename2) if f]
    candidates += [c for c in os.environ.get("BIASFLOW_JOB_OUTPUTS", "").split(os.pathsep) if c]
    named = next((c for c in candidates if _nearly_full(Path(c))), err.filename)
    target = Path(named or ".").absolute()
    folder = target if target.is_dir() else target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    mount = folder
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        usage = shutil.disk_usage(folder)
        space = f"{_size(usage.free)} free of {_size(usage.total)} on {mount}"
    except OSError:
        space = f"on {mount}"
    written = f" writing {target}" if named else ""
    by = f" in {job}" if job else ""
    return (f"the disk is full{by}{written}: the folder {folder} ({space}). Free space there, or point "
            f"paths.results / paths.resources (whichever holds it) at a bigger disk, then resume with the same "
            f"command: finished work is kept and the interrupted job is redone.")


def _nearly_full(path) -> bool:
    import shutil

    folder = path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return False
    return usage.free < max(1 << 20, usage.total // 200)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
