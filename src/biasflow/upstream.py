"""The upstream functions biasflow replaces or wraps (``slurm.install``, ``snakemake_fixes.install``), each pinned to
the digest of the source it was written against.

A fix to another project's internals breaks silently when a release changes the function under it. So each fix is
installed only while every function it touches is the code it was written for: ``changed(group)`` names the ones
whose source differs (or that are gone), and the installer then leaves that group alone and warns, naming them and
the versions the fix was written for. ``tests/test_upstream.py`` fails as soon as an installed version's source
differs from a digest here, which is the signal to re-read the upstream code, adapt the fix (or drop it if upstream
fixed the bug), and record the new digests. The bugs, and the fixes biasflow would send upstream, are in
``docs/upstream.md``.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import logging

log = logging.getLogger(__name__)

# group -> {"module:qualified.name": sha256 of its source, first 16 hex digits}. "hydra" is called, not patched: the
# fast composition of a sweep applies value overrides with it (plan/composition.py) and falls back to Hydra's public
# compose where it differs.
PATCHED: dict[str, dict[str, str]] = {
    "hydra": {
        "hydra._internal.config_loader_impl:ConfigLoaderImpl._apply_overrides_to_config": "d2862382c3a745cd",
    },
    "snakemake": {
        "snakemake.persistence:ParamsChange.__iter__": "754d9b6c499e8e3b",
    },
    "slurm": {
        "snakemake_executor_plugin_slurm:get_min_job_age": "26dc8de45ece7b87",
        "snakemake_executor_plugin_slurm:is_query_tool_available": "e53b376dcee2c25e",
        "snakemake_executor_plugin_slurm:query_job_status": "e0a595a37ef239d2",
        "snakemake_executor_plugin_slurm:Executor.check_active_jobs": "a15ec905e07e1ef6",
        "snakemake_executor_plugin_slurm:Executor.get_account_arg": "f49dd1922c96e151",
        "snakemake_executor_plugin_slurm:Executor.report_job_submission": "d85e8b031315d668",
        "snakemake_executor_plugin_slurm:Executor.report_job_success": "ae673899a578e854",
        "snakemake_executor_plugin_slurm:Executor.report_job_error": "0bc53c8c3c968a3a",
    },
}
# the releases those digests were taken from (requirements.lock pins them)
WRITTEN_FOR = {"hydra": {"hydra-core": "1.3.8"}, "snakemake": {"snakemake": "9.27.1"},
               "slurm": {"snakemake-executor-plugin-slurm": "2.8.0",
                         "snakemake-interface-executor-plugins": "9.4.0"}}


# the upstream objects as they were before a fix replaced them in this process (``unchanged_or_warn`` keeps them)
ORIGINALS: dict[str, object] = {}


def resolve(target: str):
    """The upstream object named ``module:qualified.name`` (ImportError or AttributeError when it is gone), as it
    was before any fix of this process replaced it."""
    if target in ORIGINALS:
        return ORIGINALS[target]
    module, _, name = target.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def source_digest(target: str) -> str | None:
    """The digest of ``target``'s source as installed; None when it cannot be found."""
    try:
        source = inspect.getsource(resolve(target))
    except (ImportError, AttributeError, OSError, TypeError):
        return None
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def changed(group: str) -> list[str]:
    """The functions of ``group`` whose installed source is not the one its fix was written for."""
    return [target for target, digest in PATCHED[group].items() if source_digest(target) != digest]


def installed_versions(group: str) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for package in WRITTEN_FOR[group]:
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def unchanged_or_warn(group: str, what: str) -> bool:
    """True when every function of ``group`` is as its fix expects (the installer may then replace them: the
    originals are kept for ``source_digest``); else a warning saying which fix (``what``) is left out and why, and
    False."""
    differ = changed(group)
    if not differ:
        for target in PATCHED[group]:
            ORIGINALS.setdefault(target, resolve(target))
        return True
    written = ", ".join(f"{p} {v}" for p, v in WRITTEN_FOR[group].items())
    installed = ", ".join(f"{p} {v or 'not installed'}" for p, v in installed_versions(group).items())
    log.warning("biasflow: %s not installed: the upstream code it changes differs from the code it was written for "
                "(%s; installed: %s): %s. Install the locked versions (requirements.lock) to have it; see "
                "docs/upstream.md", what, written, installed, ", ".join(differ))
    return False


__all__ = ["PATCHED", "WRITTEN_FOR", "changed", "source_digest", "unchanged_or_warn"]
