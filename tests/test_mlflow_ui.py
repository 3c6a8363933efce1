"""MLflow as its users meet it: the UI in headless Chromium on the embedded store, and a team server (``mlflow
server`` on PostgreSQL, artifacts proxied) that two checkouts log the same sweep to.

The pipeline's stages run in-process (prepare, score, metric, aggregate, log: what Snakemake would run) on a tiny BERT
and 20 CrowS-Pairs pairs, from project folders with the default relative paths, so two checkouts plan the same runs.
PostgreSQL and Chromium come from Debian (``apt-get install postgresql chromium``; .ci/run installs them in CI).
"""
from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
import requests
from mlflow.tracking import MlflowClient

from biasflow import stages
from biasflow.io import sha256_file
from biasflow.plan import build_plan
from biasflow.registry import get_metric
from biasflow.tracking.mlflow_log import front_columns
from biasflow.workflow import Lookups
from conftest import ROOT
from mlflow_services import Browser, mlflow_server, postgres

pytestmark = pytest.mark.slow  # real services: about a minute each

SWEEP = ["metric=[crows_pairs]", "model=tiny_bert", "benchmark.crows_pairs.limit=20", "stats.n_boot=20",
         "metric.crows_pairs.diff_threshold=0.05,0.1"]
COMMAND = "biasflow run -m " + " ".join(SWEEP)


def make_project(work: Path, tiny_bert_dir: Path, crows_csv: Path) -> Path:
    """A project folder as a user has it: conf/ (the default relative paths) and the downloaded raw file."""
    shutil.copytree(ROOT / "conf", work / "conf")
    (work / "conf" / "model" / "tiny_bert.yaml").write_text(
        f"name: tiny_bert\nkind: masked_lm\npath: {tiny_bert_dir}\nlowercase: true\ndtype: float32\n"
        f"device: cpu\nbatch_tokens: 2048\n")
    raw = work / "resources" / "datasets" / "crows_pairs" / "crows_pairs_anonymized.csv"
    raw.parent.mkdir(parents=True)
    shutil.copy(crows_csv, raw)
    return work


def run_pipeline(work: Path, overrides: list[str], env: dict[str, str], before_logging=lambda: None,
                 command: str = COMMAND) -> tuple[Path, dict]:
    """Every stage of ``biasflow run -m overrides`` in ``work``, as the Snakefile chains them; returns the run folder
    (relative to ``work``) and what the MLflow stage recorded (``command``: the command line it was run by)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.delenv("BIASFLOW_CONF", raising=False)
        mp.setenv("BIASFLOW_COMMAND", command)
        for key, value in env.items():
            mp.setenv(key, value)
        plan = build_plan(overrides, multirun=True)
        plan_path = plan.write()
        lookups = Lookups(plan, plan_path)
        for job in plan.jobs:
            keys = get_metric(job.metric).score_keys
            if not Path(job.items_path).exists():
                stages.prepare(job.benchmark, job.benchmark_cfg, lookups.raw_files(job.benchmark, job.benchmark_cfg),
                               job.items_path)
            if not Path(job.scores_path(keys)).exists():
                stages.score(job.score_params(keys), job.items_path, job.scores_path(keys), plan.paths["cache"])
            stages.metric(job.params(), job.items_path, job.scores_path(keys), job.metric_dir)
        stages.aggregate_run(plan_path, plan.run_dir)
        before_logging()
        record = stages.log_mlflow(plan_path, plan.run_dir, f"{plan.run_dir}/mlflow.json")
        return Path(plan.run_dir), record


def job_times(work: Path, job_metric_dir: str) -> tuple[int, int]:
    score = json.loads((work / job_metric_dir / "score_meta.json").read_text())
    metric = json.loads((work / job_metric_dir / "metric_meta.json").read_text())
    return int(score["started"] * 1000), int(metric["finished"] * 1000)


class Rest:
    """MLflow's REST API, as any client of a team server reads it."""

    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        response = requests.get(f"{self.url}/api/2.0/mlflow/{path}", params=params, timeout=30)
        assert response.ok, response.text
        return response.json()

    def search(self, experiment_id: str, filter_string: str) -> list[dict]:
        response = requests.post(f"{self.url}/api/2.0/mlflow/runs/search", timeout=30,
                                 json={"experiment_ids": [experiment_id], "filter": filter_string, "max_results": 1000})
        assert response.ok, response.text
        return response.json().get("runs", [])

    def artifact(self, run_id: str, path: str) -> bytes:
        response = requests.get(f"{self.url}/get-artifact", params={"path": path, "run_uuid": run_id}, timeout=30)
        assert response.ok, f"{path}: HTTP {response.status_code} {response.text[:300]}"
        return response.content


def tags_of(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def metrics_of(run: dict) -> dict[str, float]:
    return {m["key"]: m["value"] for m in run["data"].get("metrics", [])}


def params_of(run: dict) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


@pytest.fixture(scope="module")
def timings():
    spent: dict[str, float] = {}
    yield spent
    print("\nMLflow service tests, seconds:", json.dumps({k: round(v, 1) for k, v in spent.items()}))


# --- a team server: PostgreSQL, artifacts proxied, two checkouts -----------------------------------------------------

def test_team_server_on_postgresql(tmp_path, tiny_bert_dir, crows_csv, timings):
    start = time.monotonic()
    with postgres() as database, mlflow_server(database, tmp_path, ready=False) as server:
        timings["postgres"] = time.monotonic() - start
        url = server.url
        first, second = (make_project(tmp_path / name, tiny_bert_dir, crows_csv) for name in ("alice", "bob"))
        env = {"MLFLOW_TRACKING_URI": url}
        t = time.monotonic()
        run_dir, record = run_pipeline(first, SWEEP + ["tracking=server"], env, before_logging=server.wait)
        timings["first pipeline (while the server starts) + logging"] = time.monotonic() - t
        t = time.monotonic()
        run_dir_again, again = run_pipeline(second, SWEEP + ["tracking=server"], env)
        timings["second pipeline + logging"] = time.monotonic() - t
        t = time.monotonic()
        assert run_dir == run_dir_again  # the same plan from both checkouts
        assert again["parent_run_id"] == record["parent_run_id"] and again["children"] == record["children"]

        rest = Rest(url)
        exp_id = record["experiment_id"]
        experiment = rest.get("experiments/get", experiment_id=exp_id)["experiment"]
        assert {"key": "mlflow.experimentKind", "value": "custom_model_development"} in experiment["tags"]
        runs = rest.search(exp_id, f"tags.`biasflow.plan_hash` = '{run_dir.name}'")
        parents = [r for r in runs if tags_of(r).get("biasflow.role") == "parent"]
        children = [r for r in runs if tags_of(r).get("biasflow.role") == "job"]
        assert len(parents) == 1 and len(children) == 2 and len(runs) == 3  # nothing duplicated
        assert len({tags_of(r)["biasflow.job"] for r in children}) == 2
        assert all(tags_of(r)["mlflow.parentRunId"] == parents[0]["info"]["run_id"] for r in children)

        agg = pd.read_parquet(first / run_dir / "aggregate.parquet")
        plan = json.loads((first / run_dir / "plan.json").read_text())
        raw_sha256 = sha256_file(first / "resources" / "datasets" / "crows_pairs" / "crows_pairs_anonymized.csv")
        for job in plan["jobs"]:
            child = rest.get("runs/get", run_id=record["children"][f"{job['model_key']}/crows_pairs/"
                                                                  f"{job['cfg_hash']}"])["run"]
            rows = agg[agg.config_hash == job["cfg_hash"]].dropna(subset=["value"])
            logged = {k: v for k, v in metrics_of(child).items() if not k.endswith(("_ci_low", "_ci_high"))}
            assert logged == pytest.approx({f"{r.metric}.{r.category}": r.value for r in rows.itertuples()})
            tags, params = tags_of(child), params_of(child)
            assert tags["mlflow.source.name"] == "biasflow run" and tags["mlflow.source.type"] == "LOCAL"
            assert tags["biasflow.command"] == COMMAND
            assert params["model"] == "tiny_bert" and params["diff_threshold"] == str(job["metric_cfg"]
                                                                                      ["diff_threshold"])
            assert params["revision"] == tags["model.revision"]  # the weights digest of the local model folder
            # the job's real times: the first checkout's scoring start and metric end (the second one's logging
            # does not move them)
            assert (child["info"]["start_time"], child["info"]["end_time"]) == job_times(first, job["metric_dir"])
            datasets = child["inputs"]["dataset_inputs"]
            assert [(d["dataset"]["name"], d["dataset"]["digest"]) for d in datasets] == \
                [("crows_pairs", raw_sha256[:16])]
            assert json.loads(datasets[0]["dataset"]["profile"])["sha256"] == raw_sha256
            # artifacts, through the server's artifact proxy
            run_id = child["info"]["run_id"]
            parquet = pd.read_parquet(io.BytesIO(rest.artifact(run_id, "aggregate.parquet")))
            pd.testing.assert_frame_equal(parquet, pd.read_parquet(first / job["metric_dir"] / "aggregate.parquet"))
            table = json.loads(rest.artifact(run_id, "tables/per_item.json"))  # MLflow's table format
            per_item = pd.read_parquet(first / job["metric_dir"] / "per_item.parquet")
            # the columns a reader looks for first lead (model, metric, category, value, CI), then the rest
            assert table["columns"] == list(front_columns(per_item).columns) and len(table["data"]) == len(per_item)
            assert {"path": "tables/per_item.json", "type": "table"} in json.loads(tags["mlflow.loggedArtifacts"])
        assert b"# biasflow run" in rest.artifact(record["parent_run_id"], "report.md")
        timings["checks"] = time.monotonic() - t
        t = time.monotonic()
    timings["stop"] = time.monotonic() - t
    timings["team server test"] = time.monotonic() - start


# --- the UI in a browser, on the embedded store ----------------------------------------------------------------------

def js_number(value: float) -> str:
    """A number as the UI prints it (JavaScript's shortest round-trip form: 15, 7.375000000000002)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def test_mlflow_ui_in_a_browser(tmp_path, tiny_bert_dir, crows_csv, timings):
    start = time.monotonic()
    work = make_project(tmp_path / "project", tiny_bert_dir, crows_csv)
    browser = Browser(tmp_path)  # first: skips (locally) before any work when Chromium is missing
    try:
        run_dir, record = run_pipeline(work, SWEEP, {})
        timings["pipeline + logging"] = time.monotonic() - start
        plan = json.loads((work / run_dir / "plan.json").read_text())
        agg = pd.read_parquet(work / run_dir / "aggregate.parquet")
        digest = sha256_file(work / "resources" / "datasets" / "crows_pairs" / "crows_pairs_anonymized.csv")[:16]
        job = plan["jobs"][0]
        child = record["children"][f"{job['model_key']}/crows_pairs/{job['cfg_hash']}"]
        name = f"tiny_bert/crows_pairs diff_threshold={job['metric_cfg']['diff_threshold']}"
        metrics = {f"{r.metric}.{r.category}": r.value for r in agg[agg.config_hash == job["cfg_hash"]].itertuples()}
        t = time.monotonic()
        # the documented command, in the project folder (the store's path is relative to it)
        with mlflow_server("sqlite:///results/mlflow.db", work, command="ui") as server:
            url = server.url
            timings["mlflow ui start"] = time.monotonic() - t
            t = time.monotonic()
            ui = f"{url}/#/experiments/{record['experiment_id']}"
            # the experiment: its runs table (model training, not GenAI traces), the dataset with its digest
            page = browser.text(f"{ui}?workflowType=machine_learning", [f"plan-{run_dir.name}", "3 matching runs"],
                                timeout=120)  # the first page waits for the server's first answers
            assert f"plan-{run_dir.name}" in page and f"crows_pairs ({digest})" in page, page[:3000]
            # the parent run: the report as its description, its children, the command as its source
            page = browser.text(f"{url}/{record['ui']}", ["Description", f"biasflow run {run_dir.name}", name])
            assert f"biasflow run {run_dir.name}" in page and "By category: metric_score" in page, page[:3000]
            assert name in page and "diff_threshold=0.1" in page and COMMAND in page, page[:3000]
            assert f"crows_pairs ({digest})" in page, page[:3000]
            # a child run: its summary, a metric value beside its name, its dataset and digest, its source
            page = browser.text(f"{ui}/runs/{child}", [name, "metric_score.overall", f"crows_pairs ({digest})"])
            shown = f"metric_score.overall\n{js_number(metrics['metric_score.overall'])}\n"
            assert shown in page and f"crows_pairs ({digest})" in page and COMMAND in page, page[:3000]
            assert f"diff_threshold\n{job['metric_cfg']['diff_threshold']}" in page  # a short param for Compare
            # its metrics tab: every metric as a chart
            logged = MlflowClient(f"sqlite:///{work}/results/mlflow.db").get_run(child).data.metrics

            def charts(text: str) -> list[str]:  # a chart shows its metric's name above its value
                return [k for k, v in logged.items() if f"\n{k}\n{v:.2f}\n" in text]

            page = browser.text(f"{ui}/runs/{child}/model-metrics", lambda text: bool(charts(text)))
            assert f"Model metrics\n({len(logged)})" in page and charts(page), page[:3000]
            # an artifact: the aggregate table, shown as a table
            page = browser.text(f"{ui}/runs/{child}/artifactPath/tables/aggregate.json", ["View as table",
                                                                                          job["cfg_hash"]])
            assert "View as table" in page and job["cfg_hash"] in page and "metric_score" in page, page[:3000]
            timings["five pages"] = time.monotonic() - t
    finally:
        browser.close()
    timings["browser test"] = time.monotonic() - start

