"""A sweep survives a broken model: the others finish, the report and MLflow list the failure with its error,
`biasflow status` shows it, and a re-run after the fix does only the missing work."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, project_copy, snakemake_job_stats

pytestmark = pytest.mark.slow


@pytest.fixture()
def project(tmp_path, tiny_bert_dir, crows_csv):
    conf = project_copy(tmp_path) / "conf"
    broken = tmp_path / "broken_model"
    broken.mkdir()
    (broken / "README.txt").write_text("weights still uploading")
    for name, path in (("tiny_ok", tiny_bert_dir), ("tiny_broken", broken)):
        (conf / "model" / f"{name}.yaml").write_text(
            f"name: {name}\nkind: masked_lm\npath: {path}\nlowercase: true\ndevice: cpu\nbatch_tokens: 2048\n")
    raw = tmp_path / "resources" / "datasets" / "crows_pairs" / "crows_pairs_anonymized.csv"
    raw.parent.mkdir(parents=True)
    shutil.copy(crows_csv, raw)
    return tmp_path


def biasflow(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), BIASFLOW_ROOT=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "biasflow.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


SWEEP = ["-m", "model=tiny_ok,tiny_broken", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10",
         "stats.n_boot=0"]


def test_a_broken_model_does_not_stop_the_sweep(project, tiny_bert_dir):
    first = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    out = first.stdout + first.stderr
    assert first.returncode != 0
    assert "1 done" in out and "1 failed" in out and "is not a model folder" in out
    report = next((project / "results" / "runs").glob("*/report.md"))
    text = report.read_text()
    assert "PARTIAL RESULTS: 1 job(s) did not finish" in text and "tiny_broken" in text
    assert "is not a model folder" in text and "run the same command again" in text
    agg = json.loads(json.dumps(sorted(set(
        __import__("pandas").read_parquet(report.parent / "aggregate.parquet")["model"]))))
    assert agg == ["tiny_ok"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("biasflow")
    parent = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("biasflow.role") == "parent"]
    assert parent and parent[0].data.tags["biasflow.unfinished_jobs"] == "1"
    status = biasflow(project, "status", str(report.parent))
    assert status.returncode == 0 and "1 failed" in status.stdout and "tiny_broken / crows_pairs" in status.stdout

    # the cause is fixed (the weights arrived): only the broken model's work runs
    shutil.rmtree(project / "broken_model")
    shutil.copytree(tiny_bert_dir, project / "broken_model")
    second = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    assert second.returncode == 0, second.stderr[-3000:]
    counts = snakemake_job_stats(second.stdout + second.stderr)
    assert counts.get("score") == 1 and counts.get("metric") == 1 and "prepare" not in counts
