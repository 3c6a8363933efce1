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
    assert "report:" not in proc.stdout and "report.html" not in proc.stdout and "report.md" not in proc.stdout


def test_a_bad_option_is_one_line_naming_it(project):
    proc = biasflow(project, "run", "metric=[crows_pairs]", "stats.level=2")
    assert proc.returncode == 2
    assert "stats.level=2" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["status", "log"])
@pytest.mark.parametrize("target", ["results/runs/typo123", "abcdef123456"])
def test_a_mistyped_run_folder_is_one_line_naming_it(project, command, target):
    proc = biasflow(project, command, target)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "hydra" not in proc.stderr.lower()
    assert f"{target}: no run folder with a plan.json" in proc.stderr


def test_ui_uses_this_interpreters_mlflow(project, tmp_path):
    """Without the venv activated there is no `mlflow` on PATH: the UI starts with the interpreter's own MLflow."""
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), PATH="/usr/bin:/bin")
    import signal
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "biasflow.cli", "ui", "--port", str(port)], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first_line = proc.stdout.readline()
        try:
            proc.wait(timeout=8)  # a missing `mlflow` executable fails at once; the UI server keeps running
        except subprocess.TimeoutExpired:
            pass
        exited = proc.returncode
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the UI server's workers too
        out = proc.communicate(timeout=60)[0]
    assert first_line.startswith("+ mlflow ui --backend-store-uri"), first_line
    assert exited is None, out[-2000:]
    assert "FileNotFoundError" not in out, out[-2000:]


@pytest.fixture()
def read_only_dir(tmp_path):
    """A folder on a read-only bind mount (root ignores file modes; CI runs as root)."""
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(target), str(target)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and mount (a read-only bind mount); CI runs as root")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, capture_output=True)
        yield target
    finally:
        subprocess.run(["umount", str(target)], capture_output=True)


def test_a_read_only_results_folder_is_one_line_naming_it(project, read_only_dir):
    proc = biasflow(project, "run", "metric=[crows_pairs]", f"paths.results={read_only_dir}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"cannot write {read_only_dir}" in proc.stderr and "Read-only file system" in proc.stderr
    assert "paths.results" in proc.stderr


def test_plan_names_each_jobs_setting(tmp_path, monkeypatch, capsys):
    """`biasflow plan -m` of a threshold sweep: one row per job with the threshold that tells it apart."""
    from biasflow.cli import main

    monkeypatch.setenv("BIASFLOW_CONF", str(ROOT / "conf"))
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "-m", "metric=[crows_pairs]", "metric.crows_pairs.diff_threshold=0.05,0.1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  crows_pairs")]
    assert rows == [["crows_pairs", "demo_bert", "diff_threshold=0.05"],
                    ["crows_pairs", "demo_bert", "diff_threshold=0.1"]]


def test_a_conf_folder_of_ones_own_layers_over_the_shipped_one(tmp_path, monkeypatch, capsys):
    """A project folder with conf/model/my_tiny.yaml only (no config.yaml): the shipped configuration with that file
    added; a changed file is a new layer (the folder is named by the content)."""
    from biasflow.cli import main
    from biasflow.plan import build_plan, conf_dir

    monkeypatch.delenv("BIASFLOW_CONF", raising=False)
    monkeypatch.delenv("BIASFLOW_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    own = tmp_path / "conf" / "model" / "my_tiny.yaml"
    own.parent.mkdir(parents=True)
    own.write_text(f"name: my_tiny\nkind: masked_lm\npath: {weights}\ndevice: cpu\n")
    assert main(["plan", "metric=[crows_pairs]", "model=my_tiny"]) == 0
    assert "crows_pairs              my_tiny" in capsys.readouterr().out
    first = conf_dir()
    assert first.parent == tmp_path / ".biasflow" and (first / "model" / "bert_base_uncased.yaml").exists()
    assert (first / "model" / "my_tiny.yaml").read_text() == own.read_text()
    # a shipped file replaced by one's own: its values win
    bench = tmp_path / "conf" / "benchmark" / "crows_pairs.yaml"
    bench.parent.mkdir()
    bench.write_text((ROOT / "conf" / "benchmark" / "crows_pairs.yaml").read_text().replace("limit: null", "limit: 7"))
    job = build_plan(["metric=[crows_pairs]", "model=my_tiny"]).jobs[0]
    assert job.benchmark_cfg["limit"] == 7 and conf_dir() != first


@pytest.mark.parametrize("layered", [False, True])
def test_a_config_file_that_is_not_yaml_is_one_line_naming_it(tmp_path, monkeypatch, capsys, layered):
    """A broken model file, in a full conf folder or in a layer of one's own: one line naming the user's own file
    and line (not biasflow's copy of it), no traceback."""
    import shutil

    from biasflow.cli import main

    monkeypatch.delenv("BIASFLOW_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf"
    if layered:
        monkeypatch.delenv("BIASFLOW_CONF", raising=False)
        (conf / "model").mkdir(parents=True)
    else:
        shutil.copytree(ROOT / "conf", conf)
        monkeypatch.setenv("BIASFLOW_CONF", str(conf))
    broken = conf / "model" / "mine.yaml"
    broken.write_text("name: mine\nkind: masked_lm\n  path: [oops\n")
    assert main(["plan", "metric=[crows_pairs]", "model=mine"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"biasflow: error: {broken}, line 3: not valid YAML (mapping values are not allowed here); fix "
                   "the file (YAML: key: value, two-space indents)")
