"""Where the configuration comes from: ``conf_dir`` (the user's ``conf/``, ``BIASFLOW_CONF`` or the shipped one, or
the user's files layered over the shipped ones) and one-line YAML errors naming the user's own file."""
from __future__ import annotations

import json
import os
from pathlib import Path



def conf_dir() -> Path:
    """The configuration to compose: ``BIASFLOW_CONF``, else ``conf/`` of the working directory, else the conf/
    shipped with this install (the checkout of an editable install, or the wheel's copy: ``biasflow.installed``), so
    biasflow works in any folder. A conf folder without ``config.yaml`` is a layer of the user's own files (a model,
    a benchmark, an experiment) over the shipped configuration: ``layered_conf`` joins the two."""
    from biasflow.installed import installed_project

    shipped = installed_project()
    base = shipped / "conf" if shipped is not None and (shipped / "conf" / "config.yaml").exists() else None
    if "BIASFLOW_CONF" in os.environ:
        own = Path(os.environ["BIASFLOW_CONF"]).resolve()
    else:
        own = Path("conf").resolve()
        if not own.is_dir() and base is not None:
            return base
    if (own / "config.yaml").exists() or base is None or not own.is_dir() or own == base.resolve():
        return own
    return layered_conf(own, base)


SOURCES = ".sources.json"  # in a layered conf folder: each file's original, for error messages


def source_file(path: str | os.PathLike) -> str:
    """The file a user wrote for a config file biasflow read (a layered conf's copy names its original)."""
    path = Path(path)
    for folder in path.parents:
        if folder.name.startswith("conf-") and (folder / SOURCES).exists():
            try:
                return json.loads((folder / SOURCES).read_text())[str(path.relative_to(folder))]
            except (OSError, ValueError, KeyError):
                break
    return str(path)


def yaml_error_text(exc: Exception) -> str:
    """A YAML syntax error as one line naming the user's file and line."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source_file(mark.name)}, line {mark.line + 1}" if mark is not None else "a config file"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: not valid YAML ({problem}); fix the file (YAML: key: value, two-space indents)"


def layered_conf(own: Path, base: Path) -> Path:
    """``base`` with the YAML files of ``own`` on top (a file of ``own`` replaces the one at the same place), as a
    folder named by the content of both (``.biasflow/conf-<digest>`` beside ``own``): written once, atomically, and
    reused while neither changes."""
    import hashlib
    import shutil
    import tempfile

    files = {p.relative_to(base): p for p in base.rglob("*.yaml")}
    files.update({p.relative_to(own): p for p in own.rglob("*.yaml")})
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(str(rel).encode() + b"\0" + files[rel].read_bytes() + b"\0")
    dest = own.parent / ".biasflow" / f"conf-{digest.hexdigest()[:16]}"
    if (dest / SOURCES).exists():  # complete (renamed into place whole)
        return dest
    shutil.rmtree(dest, ignore_errors=True)  # a folder of an older biasflow, without its sources
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".conf-", dir=dest.parent))
    for rel, src in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, tmp / rel)
    (tmp / SOURCES).write_text(json.dumps({str(rel): str(src) for rel, src in files.items()}, indent=1))
    try:
        tmp.rename(dest)
    except OSError:  # made meanwhile by another process: the same content
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
