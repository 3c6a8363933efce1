"""The fixes to Snakemake's and the SLURM plugin's internals are installed only on the code they were written for."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from biasflow import upstream


@pytest.mark.parametrize("group", sorted(upstream.PATCHED))
def test_the_patched_upstream_functions_are_the_code_the_fixes_were_written_for(group):
    """Fails when an installed release changes a function biasflow replaces or wraps: re-read it, adapt the fix in
    slurm.py / snakemake_fixes.py (or drop it), then record the new digest in upstream.PATCHED."""
    pytest.importorskip("snakemake_executor_plugin_slurm" if group == "slurm" else "snakemake")
    assert upstream.changed(group) == [], (
        f"upstream code under biasflow's {group} fixes changed (written for {upstream.WRITTEN_FOR[group]}, "
        f"installed {upstream.installed_versions(group)})")


def test_a_changed_upstream_function_leaves_the_fix_out_with_a_warning(monkeypatch, caplog):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    import snakemake_executor_plugin_slurm as plugin

    from biasflow import slurm

    target = "snakemake_executor_plugin_slurm:Executor.check_active_jobs"
    monkeypatch.setitem(upstream.PATCHED, "slurm", {**upstream.PATCHED["slurm"], target: "0" * 16})
    monkeypatch.setattr(plugin.Executor, "_biasflow_installed", False, raising=False)
    before = dict(vars(plugin.Executor))
    with caplog.at_level(logging.WARNING, logger="biasflow.upstream"):
        assert slurm.install() is False
    assert dict(vars(plugin.Executor)) == before  # nothing replaced
    text = caplog.text
    assert "SLURM executor fixes" in text and "not installed" in text and "Executor.check_active_jobs" in text
    assert "snakemake-executor-plugin-slurm 2.8.0" in text and "docs/upstream.md" in text


def test_a_missing_function_counts_as_changed(monkeypatch):
    monkeypatch.setitem(upstream.PATCHED, "snakemake", {"snakemake.persistence:NoSuchThing.method": "0" * 16})
    assert upstream.changed("snakemake") == ["snakemake.persistence:NoSuchThing.method"]


def test_every_patched_function_is_written_up_in_the_docs():
    text = (Path(__file__).resolve().parents[1] / "docs" / "upstream.md").read_text()
    for group in upstream.PATCHED.values():
        for target in group:
            assert f"`{target}`" in text, target
    for packages in upstream.WRITTEN_FOR.values():
        for package, version in packages.items():
            assert re.search(rf"{re.escape(package)}[` ]+{re.escape(version)}", text), (package, version)
