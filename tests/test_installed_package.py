"""biasflow installed from its wheel works in any folder: `biasflow run` finds the workflow files the wheel ships
(share/biasflow: Snakefile, workflow/, scripts/, conf/) and writes results where it is run, not into a checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The wheel built from this checkout, installed (without dependencies) into a scratch prefix; the environment
    that makes Python import it instead of the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy of the tracked files: building writes build/ and *.egg-info where it runs
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in filter(None, tracked.stdout.split("\0")):
        if (ROOT / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, source / rel)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(source), "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("biasflow-*.whl")
    prefix = tmp / "prefix"
    # --ignore-installed: pip would otherwise uninstall the biasflow this test suite runs on
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                           "--prefix", str(prefix), str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (site,) = prefix.glob("lib/python*/site-packages")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BIASFLOW_")}
    return {**env, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "PREFIX": str(prefix)}


def test_the_wheel_ships_the_workflow_and_imports_from_the_prefix(installed, tmp_path):
    where = subprocess.run([sys.executable, "-c", "import biasflow, biasflow.installed as i; "
                            "print(biasflow.__file__); print(i.installed_project())"],
                           cwd=tmp_path, env=installed, capture_output=True, text=True, timeout=120)
    module, project = where.stdout.split()
    assert module.startswith(installed["PREFIX"]) and project == f"{installed['PREFIX']}/share/biasflow"
    for rel in ("Snakefile", "workflow/rules/metrics.smk", "scripts/score.py", "conf/config.yaml",
                "conf/model/demo_bert.yaml", "workflow/profiles/slurm/config.yaml"):
        assert (Path(project) / rel).is_file(), rel


def test_biasflow_runs_in_a_folder_of_its_own(installed, tmp_path):
    """WEAT on the packaged GloVe, run in an empty folder: results, the report and MLflow's store are there."""
    before = set(os.listdir(ROOT))
    run = subprocess.run([sys.executable, "-m", "biasflow.cli", "run", "+experiment=caliskan2017_weat",
                          "--cores", "2"], cwd=tmp_path, env=installed, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "share/biasflow/Snakefile" in run.stdout  # the installed workflow ran
    reports = list((tmp_path / "results" / "runs").glob("*/report.md"))
    assert reports and (tmp_path / "results" / "mlflow.db").exists()
    assert set(os.listdir(ROOT)) == before  # nothing written into the checkout
    from importlib.metadata import distribution

    assert distribution("biasflow").read_text("direct_url.json")  # the suite's own install is untouched
