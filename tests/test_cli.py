"""The biasflow command line: Snakemake arguments after `--` (targets, --unlock) and what it prints."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, project_copy


@pytest.fixture()
def project(tmp_path):
    return project_copy(tmp_path)


def biasflow(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), BIASFLOW_ROOT=str(ROOT))
    return subprocess.run([sys.executable, "-m", "biasflow.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_target_file_after_the_separator(project):
    from biasflow.plan import build_plan

    os.environ["BIASFLOW_CONF"] = str(project / "conf")
    try:
        items = build_plan(["metric=[crows_pairs]"]).jobs[0].items_path
    finally:
        del os.environ["BIASFLOW_CONF"]
    proc = biasflow(project, "run", "-n", "metric=[crows_pairs]", "--", "--directory", str(project), items)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "prepare" in out and "score" not in out.split("Job stats")[-1]  # only what the target needs


def test_unlock_prints_no_report_path(project):
    proc = biasflow(project, "run", "metric=[crows_pairs]", "--", "--directory", str(project), "--unlock")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "results:" not in proc.stdout and "report.md" not in proc.stdout


def test_a_bad_option_is_one_line_naming_it(project):
    proc = biasflow(project, "run", "metric=[crows_pairs]", "stats.level=2")
    assert proc.returncode == 2
    assert "stats.level=2" in proc.stderr and "Traceback" not in proc.stderr
