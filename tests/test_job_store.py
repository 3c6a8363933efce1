"""A cluster job's parse reads the staged plan's job store (its own jobs), never the whole plan."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from biasflow.errors import ConfigError
from biasflow.plan import build_plan
from biasflow.workflow import JobStore, Lookups, load_plan, stage_plan

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["model=bert_base_uncased,roberta_base,gpt2", "metric=[crows_pairs,stereoset,crows_pairs_causal,weat]",
         "metric.crows_pairs.diff_threshold=0.05,0.1"]


@pytest.fixture()
def staged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = build_plan(SWEEP, multirun=True)
    return plan, stage_plan(plan)


def test_every_lookup_from_the_store_equals_the_whole_plans(staged):
    """Every rule's params and inputs, the download specs, the exports and the metrics with extra files: the same from
    the job store as from the whole plan."""
    plan, path = staged
    whole = Lookups(plan, path)
    head, stored = load_plan({"plan": path}, remote=True)
    assert stored.store is not None and stored.plan is None
    assert (head.plan_hash, head.run_dir, head.paths) == (plan.plan_hash, plan.run_dir, plan.paths)
    assert stored.final_target() == whole.final_target()
    assert stored.families_with_extras() == whole.families_with_extras()
    assert stored.built_models() == whole.built_models()
    for job in plan.jobs:
        m = stored.metric_job(job.model_key, job.metric, job.cfg_hash)
        assert m.params() == job.params() and stored.metric_inputs(m) == whole.metric_inputs(job)
        s = stored.score_job(job.model_key, job.metric, job.score_hash())
        w = whole.score_job(job.model_key, job.metric, job.score_hash())
        assert s.score_params() == w.score_params() and stored.score_inputs(s) == whole.score_inputs(w)
        if job.items_path:
            bhash = job.items_path.rsplit("-", 1)[1].removesuffix(".parquet")
            assert stored.items_job(job.benchmark, bhash).benchmark_cfg == \
                whole.items_job(job.benchmark, bhash).benchmark_cfg
            for spec in job.benchmark_cfg["files"].values():
                assert stored.file_spec(job.benchmark, spec["filename"]) == \
                    whole.file_spec(job.benchmark, spec["filename"])
    with pytest.raises(ConfigError, match=r"no_such_model-00000000/crows_pairs/0{12}: no job of the plan .* writes it "
                                          r"\(a target of another plan; or its file in the job store .* is gone"):
        stored.metric_job("no_such_model-00000000", "crows_pairs", "0" * 12)
    with pytest.raises(ConfigError, match="no job of the plan .* writes it .a target of another plan.$"):
        whole.metric_job("no_such_model-00000000", "crows_pairs", "0" * 12)


def test_a_store_is_used_only_for_the_plan_file_it_was_written_for(staged):
    """A plan file rewritten after its store (another plan staged under the same hash by an older biasflow, a file
    edited by hand) is read whole; staging again writes a new store."""
    plan, path = staged
    assert JobStore.beside(path) is not None
    Path(path).write_text(Path(path).read_text() + " ")
    assert JobStore.beside(path) is None
    _, lookups = load_plan({"plan": path}, remote=True)
    assert lookups.store is None and lookups.plan.plan_hash == plan.plan_hash
    stage_plan(plan)
    assert JobStore.beside(path) is not None


def test_a_copied_project_keeps_its_store_and_a_damaged_plan_or_store_is_named(staged, tmp_path):
    """A copy that did not keep the plan file's times (cp -r, rsync -r) is recognised by its content: its jobs still
    parse from the store, not the whole plan; the same size with other bytes is not. A plan that is not text, and a
    job whose store file is gone, are errors naming the file."""
    plan, path = staged
    job = plan.jobs[0]
    text = Path(path).read_bytes()
    os.utime(path, ns=(1, 1))  # what a copy without -p leaves: other times, the same bytes
    assert JobStore.beside(path) is not None
    Path(path).write_bytes(text[:-2] + b"  ")  # the same size, other bytes (and other times)
    assert JobStore.beside(path) is None
    Path(path).write_bytes(text)
    os.utime(path, ns=(1, 1))
    folder = JobStore.folder_of(path)
    (folder / JobStore._name(job.metric_dir)).unlink()
    _, lookups = load_plan({"plan": path}, remote=True)
    assert lookups.store is not None
    with pytest.raises(ConfigError, match=rf"{re.escape(job.metric_dir)}: no job of the plan {re.escape(path)} writes "
                                          rf"it .*its file in the job store {re.escape(str(folder))} is gone: delete"):
        lookups.metric_job(job.model_key, job.metric, job.cfg_hash)
    Path(path).write_bytes(b"\xff\xfe\x00 binary")
    with pytest.raises(ConfigError, match=rf"cannot read the plan {re.escape(path)}: .*codec"):
        load_plan({"plan": path}, remote=True)


def test_a_cluster_job_parse_never_reads_the_whole_plan(staged):
    """Snakemake's remote mode (what a SLURM job runs) with the plan file replaced by garbage of the same size and
    time: the job still parses and plans its own work, from the store alone."""
    plan, path = staged
    job = next(j for j in plan.jobs if j.metric == "crows_pairs")
    stat = os.stat(path)
    Path(path).write_text("x" * stat.st_size)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    target = f"metric:model_key={job.model_key},metric={job.metric},chash={job.cfg_hash}"
    out = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--mode",
                          "remote", "--target-jobs", target, "--config", f"plan={path}", "--dry-run", "--cores", "1"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{job.metric_dir}/aggregate.parquet" in out.stdout  # the target job, with its score job upstream
    assert job.scores_path() in out.stdout


def test_a_damaged_or_misplaced_store_file_is_an_error_naming_it(staged):
    """A job file holding another job (copied over it) would give one job another's inputs; a garbled one a bare JSON
    error. Both are errors naming the file and how to get a good store back."""
    plan, path = staged
    a, b = plan.jobs[0], next(j for j in plan.jobs if j.model_key != plan.jobs[0].model_key)
    folder = JobStore.folder_of(path)
    (folder / JobStore._name(b.metric_dir)).write_text((folder / JobStore._name(a.metric_dir)).read_text())
    _, lookups = load_plan({"plan": path}, remote=True)
    with pytest.raises(ConfigError, match=rf"holds another job \({re.escape(a.metric_dir)}\); delete "):
        lookups.metric_job(b.model_key, b.metric, b.cfg_hash)
    (folder / JobStore._name(b.metric_dir)).write_text("garbage{")
    _, lookups = load_plan({"plan": path}, remote=True)
    with pytest.raises(ConfigError, match=r"a damaged file of the plan's job store .*delete .*\.jobs and run again"):
        lookups.metric_job(b.model_key, b.metric, b.cfg_hash)
    assert oct(folder.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # readable like any folder made by mkdir


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
