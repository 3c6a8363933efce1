"""MLflow logging of a large sweep (issue 48 item 4): the work per child run is bounded (no search per child, no
run read back per child), a re-run or a run resumed after a partial logging finds every child in one search and
creates none twice, the parent run carries the same few params however many children it has, and the run names'
shared-prefix rule is computed in O(n log n) with the same answers as comparing each name with every other.

The figures (seconds per 100 children, the code before against this code) are benchmarks/mlflow_scale.py's; the
plan here is written by hand (no model runs) and small enough for CI's 2 cores (60 children)."""
from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from biasflow.tracking.mlflow_log import _own_words_of, child_run_names, log_plan

N_JOBS = 60


def write_sweep(root: Path, n: int) -> tuple[dict, Path]:
    """A finished plan of ``n`` jobs: 12 models x 10 metric configs (CrowS-Pairs at 3 thresholds)."""
    results = root / "results"
    configs = [(m, None) for m in ("crows_pairs_aul", "crows_pairs_biasbench", "stereoset", "winobias", "lpbs",
                                   "cbs", "seat")] + [("crows_pairs", t) for t in (0.05, 0.1, 0.2)]
    per_item = pd.DataFrame({"item_id": range(20), "score": [i / 20 for i in range(20)]})
    jobs = []
    for i in range(n):
        metric, threshold = configs[i % len(configs)]
        name = f"model_{i // len(configs):03d}"
        cfg_hash = f"{i:012x}"
        mdir = results / "metrics" / name / metric / cfg_hash
        mdir.mkdir(parents=True)
        pd.DataFrame({"model": name, "metric": "metric_score", "category": ["overall", "gender", "race"],
                      "value": [50.0 + i % 7, 51.0, 52.0], "ci_low": [45.0, 46.0, None],
                      "ci_high": [55.0, 56.0, None], "n": 20, "config_hash": cfg_hash}).to_parquet(
            mdir / "aggregate.parquet")
        per_item.to_parquet(mdir / "per_item.parquet")
        (mdir / "config.yaml").write_text(f"metric: {metric}\n")
        (mdir / "metric_meta.json").write_text(json.dumps({"started": 1.7e9 + i, "finished": 1.7e9 + i + 2}))
        metric_cfg = {"variant": metric} if threshold is None else {"variant": metric, "diff_threshold": threshold}
        jobs.append({"metric": metric, "model_key": name, "cfg_hash": cfg_hash, "metric_dir": str(mdir),
                     "model": {"name": name, "kind": "masked_lm", "hub_id": f"org/{name}", "revision": "main",
                               "device": "cpu"},
                     "metric_cfg": metric_cfg, "benchmark": "crows_pairs", "benchmark_cfg": {"limit": 20},
                     "stats": {"n_boot": 0, "seed": 0, "level": 0.95}, "mode": "parity"})
    run_dir = results / "runs" / "0123456789ab"
    run_dir.mkdir(parents=True)
    (run_dir / "report.md").write_text("# report\n")
    plan = {"plan_hash": run_dir.name, "paths": {"results": str(results)},
            "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": "biasflow", "enabled": True,
                         "artifact_location": str(root / "mlartifacts")},
            "sweep": [{"overrides": ["-m", "model=..."], "config": {}}], "skipped": [], "jobs": jobs}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    return plan, run_dir


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """How often logging asks MLflow to search runs, read a run back, or set one tag."""
    from mlflow.tracking import MlflowClient

    counts: Counter = Counter()
    for name in ("search_runs", "get_run", "set_tag", "log_artifact", "create_run"):
        original = getattr(MlflowClient, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(MlflowClient, name, counted)
    return counts


def test_a_sweep_logs_without_a_search_per_child_and_resumes_without_duplicates(tmp_path, calls, monkeypatch):
    from mlflow.tracking import MlflowClient

    from biasflow.tracking import mlflow_log

    monkeypatch.setattr(mlflow_log, "CHILDREN_PAGE", 16)  # the children found again in pages: 16, 16, 8

    plan, run_dir = write_sweep(tmp_path, N_JOBS)
    # a partial run first: the last 20 jobs unfinished (no child run yet)
    unfinished = [{"metric_dir": j["metric_dir"], "job": j["metric"], "error": "killed"} for j in plan["jobs"][40:]]
    first = log_plan(plan, run_dir, unfinished=unfinished)
    assert len(first["children"]) == 40
    # one search (for the parent), no run read back per child, one request per child to create it with its tags
    assert calls["search_runs"] <= 1 and calls["get_run"] <= 2 and calls["create_run"] == 41, calls
    assert calls["set_tag"] <= 2 and calls["log_artifact"] <= 3, calls  # the parent's few; none per child
    calls.clear()
    again = log_plan(plan, run_dir)  # resumed: the 40 found in one search, 20 created
    assert {k: v for k, v in again["children"].items() if k in first["children"]} == first["children"]
    assert len(again["children"]) == N_JOBS and again["parent_run_id"] == first["parent_run_id"]
    assert calls["search_runs"] == 1 + 3 and calls["create_run"] == N_JOBS - 40, calls  # the parent, 3 pages
    assert calls["get_run"] <= 3 and calls["set_tag"] <= 2, calls  # the parent's: its command, end, tables
    assert log_plan(plan, run_dir)["children"] == again["children"]  # idempotent

    client = MlflowClient(tracking_uri=plan["tracking"]["uri"])
    runs = client.search_runs([again["experiment_id"]], max_results=1000)
    assert len(runs) == N_JOBS + 1  # one parent, one child per job, nothing duplicated
    names = child_run_names(plan["jobs"])
    by_job = {r.data.tags.get("biasflow.job"): r for r in runs}
    for job in (plan["jobs"][0], plan["jobs"][9], plan["jobs"][-1]):
        child = by_job[f"{job['model_key']}/{job['metric']}/{job['cfg_hash']}"]
        assert child.info.run_name == names[child.data.tags["biasflow.job"]] and child.info.status == "FINISHED"
        assert child.data.metrics["metric_score.overall_ci_low"] == 45.0 and \
            "metric_score.race_ci_low" not in child.data.metrics
        assert child.info.end_time == int((1.7e9 + plan["jobs"].index(job) + 2) * 1000)
        assert json.loads(child.data.tags["mlflow.loggedArtifacts"]) == [
            {"path": "tables/aggregate.json", "type": "table"}, {"path": "tables/per_item.json", "type": "table"}]
        assert {a.path for a in client.list_artifacts(child.info.run_id)} == {
            "aggregate.parquet", "per_item.parquet", "config.yaml", "tables"}
        assert len(client.get_metric_history(child.info.run_id, "metric_score.overall")) == 1
    # the parent stays small whatever the number of children: three params, no metrics
    parent = client.get_run(again["parent_run_id"])
    assert set(parent.data.params) == {"plan.jobs", "plan.metrics", "plan.models"} and not parent.data.metrics
    assert parent.data.params["plan.jobs"] == str(N_JOBS) and parent.data.tags["biasflow.unfinished_jobs"] == "0"


def _own_words_pairwise(name: str, others: set[str], separators: str) -> str:
    """The rule as it was written first: compare the name with every other."""
    split = lambda text: re.split(f"[{re.escape(separators)}]", text)  # noqa: E731
    words = split(name)
    shared = 0
    for other in others - {name}:
        common = 0
        for a, b in zip(words, split(other)):
            if a != b:
                break
            common += 1
        shared = max(shared, common)
    if not 0 < shared < len(words):
        return name
    return name[sum(len(w) + 1 for w in words[:shared]):]


def test_shared_words_by_neighbours_equal_comparing_every_pair():
    rng = random.Random(48)
    words = ["my", "model", "v1", "v2", "bert", "base", "a", "", "x"]
    for _ in range(200):
        names = {rng.choice("_-./").join(rng.choice(words) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 12))}
        fast = _own_words_of(names, "_-./")
        assert fast == {n: _own_words_pairwise(n, names, "_-./") for n in names}, names
