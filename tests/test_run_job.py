"""stages.run_job, the one in-process runner of a plan job (api.evaluate, tests): the same files and numbers as the
stage functions called one by one, each stage run only where its output is missing; and the metric stage's file
names, declared once in biasflow.report, as the metric rule spells them."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from conftest import project_copy

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LIMIT = 20


@pytest.fixture
def job_and_project(tmp_path, monkeypatch, crows_csv, tiny_bert_dir):
    from biasflow.plan import build_plan

    project = project_copy(tmp_path / "project", datasets={f"crows_pairs/{crows_csv.name}": crows_csv})
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    monkeypatch.chdir(project)
    plan = build_plan(["model=local_masked_lm", f"model.path={tiny_bert_dir}", "model.lowercase=true",
                       "model.device=cpu", "metric=[crows_pairs]", f"benchmark.crows_pairs.limit={LIMIT}",
                       "metric.crows_pairs.filter_threshold=0", "metric.crows_pairs.fill_mask_top_k=null",
                       "stats.n_boot=50", "tracking.enabled=false"])
    (job,) = plan.jobs
    return job, plan, crows_csv


def test_run_job_gives_the_files_and_numbers_of_the_stages_one_by_one(job_and_project, tmp_path):
    from biasflow import stages
    from biasflow.report import METRIC_FILES

    job, plan, crows_csv = job_and_project
    files = stages.run_job(job, plan.paths["resources"], plan.paths["cache"])
    assert files.raw == {"csv": f"{plan.paths['resources']}/datasets/crows_pairs/{crows_csv.name}"}
    assert (files.items, files.scores, files.metric_dir) == (job.items_path, job.scores_path(), Path(job.metric_dir))
    assert sorted(os.listdir(files.metric_dir)) == sorted(METRIC_FILES)
    assert all(Path(p).exists() for p in [files.items, files.scores, *files.metric.values()])

    # by hand, into other files and another cache: the numbers must not depend on the runner
    by_hand = tmp_path / "by_hand"
    items, scores = str(by_hand / "items.parquet"), str(by_hand / "scores.parquet")
    stages.prepare(job.benchmark, job.benchmark_cfg, {"csv": str(crows_csv)}, items)
    stages.score(job.score_params(), items, scores, str(by_hand / "cache"))
    expected = stages.metric(job.params(), items, scores, str(by_hand / "metric"))
    assert expected.set_index(["metric", "category"]).n["metric_score", "overall"] == LIMIT
    pd.testing.assert_frame_equal(pd.read_parquet(files.metric["aggregate"]), expected)
    pd.testing.assert_frame_equal(pd.read_parquet(files.metric["per_item"]),
                                  pd.read_parquet(by_hand / "metric" / "per_item.parquet"))


def test_run_job_runs_only_the_stages_whose_outputs_are_missing(job_and_project):
    from biasflow import stages

    job, plan, _ = job_and_project
    paths = plan.paths["resources"], plan.paths["cache"]
    files = stages.run_job(job, *paths)
    outputs = [files.items, files.scores, *files.metric.values()]

    def stamps() -> dict[str, int]:
        return {p: Path(p).stat().st_mtime_ns for p in outputs}

    before = stamps()
    assert stages.run_job(job, *paths) == files and stamps() == before  # done: nothing runs

    Path(files.metric["aggregate"]).unlink()  # the metric stage again, on the same items and scores
    stages.run_job(job, *paths)
    again = stamps()
    assert again[files.items] == before[files.items] and again[files.scores] == before[files.scores]
    assert again[files.metric["aggregate"]] != before[files.metric["aggregate"]]

    Path(files.metric["aggregate"]).unlink()  # the items prepared again; the scores kept
    Path(files.items).unlink()
    stages.run_job(job, *paths)
    last = stamps()
    assert last[files.items] != again[files.items] and last[files.scores] == again[files.scores]


def test_metric_output_paths_are_the_metric_rules_outputs():
    """The paths ``_metric_rule_outputs`` in workflow/rules/metrics.smk declares, from the one mapping."""
    from biasflow.report import metric_output_paths

    folder = "results/metrics/{model_key}/{metric}/{chash}"
    assert metric_output_paths(folder, ("lmc.log", "pages/index.html")) == {
        "per_item": folder + "/per_item.parquet", "aggregate": folder + "/aggregate.parquet",
        "config": folder + "/config.yaml", "score_meta": folder + "/score_meta.json",
        "metric_meta": folder + "/metric_meta.json", "extra0": folder + "/lmc.log",
        "extra1": folder + "/pages/index.html"}
    assert metric_output_paths(folder + "/") == metric_output_paths(folder)
