"""Small file helpers every stage uses: atomic writes, hashing, stable config hashes."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Iterator

import pandas as pd


def _temp_beside(path: Path, suffix: str) -> tuple[int, str]:
    """Create a new, uniquely named file beside ``path``; return its descriptor and name.

    Created with mode 0o666 so the process umask decides the permissions, as for any file a program writes
    (usually 0644). ``tempfile.mkstemp`` makes 0600 files, and the rename would hand that on to every output.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}{suffix}")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[Any]:
    """Open a temp file beside ``path``; on success it replaces ``path`` in one rename.

    An interrupted or failing writer leaves the old file (or no file) in place, never a half-written one. The
    file gets the permissions of a normal write (0o666 minus the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path, ".tmp")
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside ``path`` for writers that want a file name; renamed over ``path`` on success.

    The temp file exists (empty, normal permissions) before the writer runs; writers that truncate and write it
    keep those permissions.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path, suffix or ".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_parquet(df: pd.DataFrame, path: str | os.PathLike) -> None:
    with atomic_path(path, suffix=".parquet") as tmp:
        df.to_parquet(tmp, index=False)


def write_text(text: str, path: str | os.PathLike) -> None:
    with atomic_write(path, "w") as fh:
        fh.write(text)


def write_json(obj: Any, path: str | os.PathLike) -> None:
    write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", path)


def write_text_if_changed(text: str, path: str | os.PathLike) -> bool:
    """Write only when the content differs, so Snakemake sees an unchanged mtime for unchanged configs."""
    path = Path(path)
    if path.exists() and path.read_text() == text:
        return False
    write_text(text, path)
    return True


def flatten_mapping(d, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); values kept as they are."""
    from collections.abc import Mapping

    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_mapping(v, key + "."))
        else:
            out[key] = v
    return out


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stable_hash(obj: Any, length: int = 12) -> str:
    """Hash of a JSON-able object that does not depend on dict order."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def read_text_utf8(path: str | os.PathLike, what: str = "file") -> str:
    """The text of a UTF-8 file (a BOM is dropped); any other encoding is an error naming the file and the place.

    Loaders read through this, never ``open(..., encoding=...)`` directly, so a latin-1 or UTF-16 file says which
    file it is and what to do, instead of a bare UnicodeDecodeError."""
    from biasflow.errors import DataFormatError

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataFormatError(f"{what} {path}: cannot read it ({exc.strerror})") from exc
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DataFormatError(f"{what} {path} is UTF-16 text; save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataFormatError(
            f"{what} {path} is not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line}) cannot "
            f"be decoded. Save it as UTF-8 (a latin-1 file: iconv -f latin1 -t UTF-8)") from None


def read_tsv_rows(path: str | os.PathLike, what: str, check_header=None) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(header, [(line number, fields)]) of a UTF-8 tab-separated file whose first line is its header (CRLF or LF;
    blank lines skipped). ``check_header(header)`` raises for a wrong header before any row is read; a row with
    another field count than the header is an error naming the file and line."""
    from biasflow.errors import DataFormatError

    lines = read_text_utf8(path, what).splitlines()
    header = lines[0].split("\t") if lines else []
    if check_header is not None:
        check_header(header)
    rows = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataFormatError(f"{path}, line {n}: expected {len(header)} tab-separated fields, got {len(fields)}")
        rows.append((n, fields))
    return header, rows


def markdown_safe(text: str) -> str:
    """Markdown with HTML's special characters escaped outside code spans and blocks: names a user chose (word
    lists, templates, models) are shown as text wherever the Markdown is rendered (the MLflow run description
    renders raw HTML), never run as markup."""
    import re

    def escaped(part: str) -> str:
        part = re.sub(r"&(?=#?\w+;)", "&amp;", part)  # an entity a user wrote stays the characters they wrote
        part = part.replace("<", "&lt;")
        # '>' opens no tag; at a line's start it is Markdown's quote (the report's warnings), elsewhere escaped
        return re.sub(r"(?m)(?<!^)(?<!^ )(?<!^  )(?<!^   )>", "&gt;", part)

    out = []
    for n, part in enumerate(re.split(r"(```.*?```|`+[^`\n]*`+)", text, flags=re.S)):
        out.append(part if n % 2 else escaped(part))
    return "".join(out)
