"""Where results come from: package versions, the checkout's commit, the command and the processes that made them.

Torch-free and MLflow-free, below everything that reports provenance (the stages, the HTML report, MLflow logging),
so none of those has to import another to learn it.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
from pathlib import Path
from typing import Any, Callable, Mapping

PACKAGES = ("biasflow", "torch", "transformers", "tokenizers", "pandas", "pyarrow", "snakemake", "hydra-core",
            "mlflow", "numpy", "scipy")


def package_versions() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        try:
            out[f"version.{p}"] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            pass
    out["version.python"] = platform.python_version()
    return out


def cpu_description() -> str:
    """The CPU as benchmark figures must name it: model, architecture, cores and the widest vector instruction set
    ("AMD EPYC, x86_64, 2 cores, AVX-512 (bf16 in oneDNN)"); oneDNN's bf16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:  # not Linux
        pass
    if {"avx512bw", "avx512vl", "avx512dq"} <= flags:
        isa = "AVX-512 (bf16 in oneDNN)"
    elif "avx_ne_convert" in flags:
        isa = "AVX2 + AVX-NE-CONVERT (bf16 in oneDNN)"
    elif "avx2" in flags:
        isa = "AVX2 (no bf16 in oneDNN)"
    else:
        isa = "no AVX2" if flags else "instruction set unknown"
    restricted = isa_restrictions()
    note = ("; kernels restricted by " + ", ".join(f"{k}={v}" for k, v in restricted.items())) if restricted else ""
    return (f"{model or platform.processor() or 'unknown CPU'}, {platform.machine()}, {os.cpu_count()} cores, "
            f"{isa}{note}")


# the variables that make ATen, oneDNN and MKL use fewer instruction sets than the CPU has (to time, on an AVX-512
# machine, what a CPU with AVX2 only would do)
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
WITHOUT_AVX512 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def isa_restrictions() -> dict[str, str]:
    """The instruction-set limits set in this process's environment (``ISA_VARIABLES``), as set."""
    return {k: os.environ[k] for k in ISA_VARIABLES if os.environ.get(k)}


def model_source(model: Mapping[str, Any]) -> str:
    """Where a model's weights come from, in the order loading reads them (``models.hf.source_of``): a package's
    folder, a local path (which wins over a hub id set beside it), the hub id, a served model's name."""
    if model.get("package"):
        return f"package:{model['package']}"
    for key in ("path", "hub_id", "served_model_name", "model_id"):
        if model.get(key):
            return str(model[key])
    return str(model.get("name") or "")


def configured_revision(model: Mapping[str, Any]) -> str | None:
    """The configured hub revision, where the hub is what loading reads (not for a local path or package)."""
    if model.get("revision") and not model.get("path") and not model.get("package"):
        return str(model["revision"])
    return None


def git_commit() -> str:
    """The commit of the folder the run is made in (a project of one's own under git), else of the biasflow checkout
    the code runs from (a run from another folder: "<commit> (biasflow checkout)"); "unknown" for neither (an
    installed wheel run outside git). For reports (no MLflow import)."""
    def head(cwd: str | None) -> str:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=20,
                              cwd=cwd).stdout.strip()

    try:
        return head(None)
    except Exception:  # not a git checkout, or no git
        pass
    source = Path(__file__).resolve().parent
    if (source.parent.name == "src" and (source.parent.parent / "pyproject.toml").exists()
            and (source.parent.parent / ".git").exists()):  # an editable install: the checkout it runs from
        try:
            return f"{head(str(source))} (biasflow checkout)"
        except Exception:
            pass
    return "unknown"


def process_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...; start time at index 19)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):  # not Linux, or the process just went away
        return None


def ancestor_matching(word: str) -> tuple[int, str] | None:
    """The nearest ancestor process whose command line contains ``word``: (pid, its /proc start time)."""
    pid = os.getppid()
    while pid > 1:
        stat = process_stat(pid)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return None
        if stat is None:
            return None
        # `snakemake ...`, `python -m snakemake ...`, `python /venv/bin/snakemake ...` (not a shell running a
        # script that merely lives under .snakemake/)
        if any(os.path.basename(a) == word for a in argv[:3]):
            return pid, stat[19]
        pid = int(stat[1])
    return None


def alive(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` (/proc start time) still runs (not a reused pid, not
    a zombie)."""
    stat = process_stat(pid)
    return stat is not None and stat[19] == started and stat[0] != "Z"


def source_command() -> str | None:
    """The command that produced the results: ``biasflow run ...`` (the CLI passes it down in BIASFLOW_COMMAND) or
    the command line of the Snakemake process this stage runs under; None when neither is known."""
    command = os.environ.get("BIASFLOW_COMMAND")
    if command:
        return command
    found = ancestor_matching("snakemake")
    if found is None:
        return None
    try:
        argv = [a for a in Path(f"/proc/{found[0]}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return None
    first = next((i for i, a in enumerate(argv[:3]) if os.path.basename(a) == "snakemake"), 0)
    return shlex.join(["snakemake", *argv[first + 1:]])


def file_rows(loader: str, items: Any, files: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, int | None]:
    """The files the prepared ``items`` came from: file key -> the rows it contributed (after ``limit``), or None
    for a file read beside them that gives no rows of its own (BBQ's metadata, templates), or whose share the
    loader does not declare. A file that contributed no row (another split, a category not chosen, rows cut by
    ``limit``) is left out: the report and MLflow list only the files the numbers come from."""
    from biasflow.registry import loader_file_rows

    count = loader_file_rows(loader)
    if count is not None:
        counted = dict(count(items, files, cfg))
        unknown = sorted(set(counted) - set(files))
        if unknown:  # files keyed otherwise than the loader expects: listed, without counts, rather than wrong
            import logging

            logging.getLogger(__name__).warning("loader %s: rows counted for %s, which are not among the files "
                                                "%s; listing every file without counts", loader, unknown,
                                                sorted(files))
            return {key: None for key in files}
        return {k: (None if v is None else int(v)) for k, v in counted.items() if v is None or int(v) > 0}
    if len(files) == 1:
        return {key: len(items) for key in files} if len(items) else {}
    return {key: None for key in files}


def rows_by_column(column: str, supporting: tuple[str, ...] = ()) -> Callable[..., dict[str, int | None]]:
    """A ``file_rows`` for loaders whose items name their file in ``column`` (its value is the file key, e.g. a
    BBQ category); ``supporting``: files read beside them that give no rows of their own (None)."""
    def count(items: Any, files: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, int | None]:
        by_key = items[column].value_counts() if len(items) else {}
        out: dict[str, int | None] = {k: int(n) for k, n in dict(by_key).items() if n}
        if len(items):
            out.update({k: None for k in supporting if k in files})
        return out

    return count


__all__ = ["package_versions", "file_rows", "rows_by_column", "git_commit", "ancestor_matching", "alive", "process_stat", "source_command",
           "PACKAGES"]
