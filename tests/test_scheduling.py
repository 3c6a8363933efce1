"""What a scoring job asks the scheduler for comes from its model config, so one SLURM profile serves every model.

Checked where Snakemake sees it: the resources and threads of each score job in a dry run (what the SLURM executor
turns into sbatch --mem, --gpus, -t and --cpus-per-task).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, project_copy


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return project_copy(tmp_path)


def score_jobs(project: Path, overrides: list[str], cores: int = 16) -> dict[str, dict[str, str]]:
    """model name -> {"threads": N, resource: value} of every score job in a dry run."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(project),
           "--dry-run", "--cores", str(cores), "--config", f"overrides={json.dumps(overrides)}", "multirun=true"]
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = {}
    for block in re.split(r"\n(?=\S)", proc.stdout + proc.stderr):
        if not block.startswith("rule score:"):
            continue
        model = re.search(r"model_key=([^,\s]+)-[0-9a-f]{8}", block).group(1)
        threads = re.search(r"threads: (\d+)", block)
        resources = dict(kv.split("=", 1) for kv in re.search(r"resources: (.*)", block).group(1).split(", "))
        jobs[model] = {"threads": threads.group(1) if threads else "1", **resources}
    return jobs


def test_score_jobs_ask_for_what_their_model_config_says(project):
    jobs = score_jobs(project, ["model=mistral_7b,glove_6b_50d,gpt2", "metric=[crows_pairs_causal,weat]",
                                "++model.device=cuda"])
    seven_b = yaml.safe_load((ROOT / "conf" / "model" / "mistral_7b.yaml").read_text())["resources"]
    assert jobs["mistral_7b"]["gpu"] == str(seven_b["gpus"]) == "1"
    assert jobs["mistral_7b"]["mem_mb"] == str(seven_b["mem_mb"])
    assert jobs["mistral_7b"]["runtime"] == str(seven_b["runtime_min"])
    assert jobs["mistral_7b"]["threads"] == str(seven_b["cpus"])
    # GloVe is a table lookup: no GPU even when the sweep says device=cuda, one thread, a little memory
    assert jobs["glove_6b_50d"]["gpu"] == "0" and jobs["glove_6b_50d"]["threads"] == "1"
    assert int(jobs["glove_6b_50d"]["mem_mb"]) < int(jobs["mistral_7b"]["mem_mb"])
    # a causal LM with no resources block gets the kind's defaults; device=cuda asks for its GPU
    assert jobs["gpt2"]["gpu"] == "1" and int(jobs["gpt2"]["mem_mb"]) < int(jobs["mistral_7b"]["mem_mb"])


def test_resources_are_overridable_and_capped_by_half_the_cores_locally(project):
    """On one machine a score job takes at most half of --cores, so two share it; the model's cpus go to a cluster."""
    overrides = ["model=mistral_7b", "metric=[crows_pairs_causal]", "model.resources.gpus=0",
                 "model.resources.mem_mb=1234"]
    jobs = score_jobs(project, overrides, cores=2)
    assert jobs["mistral_7b"]["gpu"] == "0" and jobs["mistral_7b"]["mem_mb"] == "1234"
    assert jobs["mistral_7b"]["threads"] == "1"  # cpus: 8, but Snakemake was given 2 cores: half of them
    assert score_jobs(project, overrides, cores=6)["mistral_7b"]["threads"] == "3"
    assert score_jobs(project, overrides + ["model.resources.cpus=2"], cores=6)["mistral_7b"]["threads"] == "2"


def test_resources_change_no_results_folder(project, monkeypatch):
    """Asking for more memory must never re-run a model: resources are not in any cache key or output path."""
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    from biasflow.plan import build_plan
    from biasflow.registry import get_metric

    def paths(extra):
        plan = build_plan(["model=gpt2", "metric=[crows_pairs_causal]", *extra])
        return [(j.scores_path(get_metric(j.metric).score_keys), j.metric_dir) for j in plan.jobs]

    assert paths([]) == paths(["+model.resources.mem_mb=64000", "+model.resources.gpus=2",
                               "++model.device=cuda"])


def test_a_bad_resource_names_the_option(project, monkeypatch):
    from biasflow.errors import ConfigError
    from biasflow.plan import build_plan

    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    with pytest.raises(ConfigError, match=r"model\.resources\.gpus=-1"):
        build_plan(["model=mistral_7b", "metric=[crows_pairs_causal]", "model.resources.gpus=-1"])
    with pytest.raises(ConfigError, match=r"model\.resources\.memory: unknown option"):
        build_plan(["model=gpt2", "metric=[crows_pairs_causal]", "+model.resources.memory=2000"])


@pytest.mark.parametrize("model,partition", [("mistral_7b", "gpu"), ("glove_6b_50d", "cpu"), ("gpt2", "cpu")])
def test_slurm_gpu_profile_sends_only_gpu_jobs_to_the_gpu_partition(model, partition):
    """workflow/profiles/slurm_gpu: the executor plugin picks each job's partition from partitions.yaml by the
    resources the score rule gives it (gpu, mem_mb, runtime, threads)."""
    partitions = pytest.importorskip("snakemake_executor_plugin_slurm.partitions")
    import logging
    from types import SimpleNamespace

    from biasflow.plan import load_model_config
    from biasflow.scheduling import score_resources

    profile = ROOT / "workflow" / "profiles" / "slurm_gpu"
    config = yaml.safe_load((profile / "config.yaml").read_text())
    choices = partitions.read_partition_file(profile / config["slurm-partition-config"])

    class Resources(dict):
        __getattr__ = dict.get

    want = score_resources(load_model_config(model, {}))
    job = SimpleNamespace(name="score", threads=want["cpus"], resources=Resources(
        gpu=want["gpus"], mem_mb=want["mem_mb"], runtime=want["runtime_min"]))
    assert partitions.get_best_partition(choices, job, logging.getLogger("test")) == partition
