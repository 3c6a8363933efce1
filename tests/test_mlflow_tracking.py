"""MLflow logging under hostile conditions: unreachable store, interrupted store creation, equivalent re-runs,
a password in the tracking URI. Plans are written by hand (two tiny jobs), so no model runs here."""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from biasflow import cli
from biasflow.errors import TrackingError
from biasflow.secrets import redact_uri
from biasflow.stages import log_mlflow
from biasflow.tracking.mlflow_log import log_plan


PASSWORD = "hunter2-s3cret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_plan(root: Path, uri: str, overrides=("stats.n_boot=0", "benchmark.crows_pairs.limit=200"),
               device: str = "cpu") -> Path:
    """A finished two-job plan on disk (metric folders, run folder, plan.json); returns the run folder."""
    results = root / "results"
    jobs = []
    for metric in ("crows_pairs_aul", "crows_pairs_biasbench"):
        cfg_hash = f"{metric[-3:]}000000000"
        mdir = results / "metrics" / "tiny-0123abcd" / metric / cfg_hash
        mdir.mkdir(parents=True, exist_ok=True)
        agg = pd.DataFrame({"model": ["tiny"] * 2, "benchmark": ["crows_pairs"] * 2, "metric": ["metric_score"] * 2,
                            "category": ["overall", "gender"], "value": [55.0, 60.0], "ci_low": [None, None],
                            "ci_high": [None, None], "n": [200, 80], "config_hash": [cfg_hash] * 2})
        agg.to_parquet(mdir / "aggregate.parquet")
        pd.DataFrame({"item_id": [1, 2], "score": [0.1, 0.2]}).to_parquet(mdir / "per_item.parquet")
        (mdir / "config.yaml").write_text(f"metric: {metric}\n")
        jobs.append({"metric": metric, "model_key": "tiny-0123abcd", "cfg_hash": cfg_hash, "metric_dir": str(mdir),
                     "model": {"name": "tiny", "kind": "masked_lm", "path": str(root / "model"), "lowercase": True,
                               "dtype": "float32", "device": device, "batch_tokens": 2048},
                     "metric_cfg": {"variant": metric}, "benchmark": "crows_pairs",
                     "benchmark_cfg": {"limit": 200, "files": {}}, "stats": {"n_boot": 0, "seed": 0, "level": 0.95},
                     "mode": "parity"})
    run_dir = results / "runs" / "abcdef123456"
    run_dir.mkdir(parents=True, exist_ok=True)
    pd.concat([pd.read_parquet(Path(j["metric_dir"]) / "aggregate.parquet") for j in jobs]).to_csv(
        run_dir / "aggregate.csv", index=False)
    (run_dir / "report.md").write_text("# report\n")
    plan = {"plan_hash": run_dir.name, "paths": {"results": str(results), "resources": str(root / "resources")},
            "tracking": {"uri": redact_uri(uri), "experiment": "biasflow", "enabled": True,
                         "artifact_location": str(root / "mlartifacts")},
            "sweep": [{"overrides": list(overrides), "config": {}}], "skipped": [], "jobs": jobs}
    (run_dir / "plan.json").write_text(json.dumps(plan, indent=2))
    return run_dir


def sqlite_uri(root: Path, query: str = "") -> str:
    return f"sqlite:///{root / 'mlflow.db'}{query}"


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An empty, complete store built once (MLflow's migrations take seconds); tests copy it."""
    from biasflow.tracking.store import ensure_sqlite_store

    root = tmp_path_factory.mktemp("template")
    ensure_sqlite_store(sqlite_uri(root))
    return root / "mlflow.db"


def store_in(root: Path, empty_store: Path, query: str = "") -> str:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(empty_store, root / "mlflow.db")
    return sqlite_uri(root, query)


def runs_of(uri: str, plan_hash: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("biasflow")
    return client, client.search_runs([exp.experiment_id], filter_string=f"tags.`biasflow.plan_hash` = '{plan_hash}'")


# --- item 15: equivalent plans log to the same parent ---------------------------------------------------------------

def test_equivalent_invocations_log_to_the_same_runs(tmp_path, empty_store):
    uri = store_in(tmp_path, empty_store)
    run_dir = write_plan(tmp_path, uri)
    first = log_mlflow(str(run_dir / "plan.json"), str(run_dir), str(run_dir / "mlflow.json"))
    # the same plan asked for differently: overrides reordered, a device setting that does not change the numbers
    write_plan(tmp_path, uri, overrides=("benchmark.crows_pairs.limit=200", "stats.n_boot=0"), device="auto")
    again = log_mlflow(str(run_dir / "plan.json"), str(run_dir), str(run_dir / "mlflow.json"))
    assert again["parent_run_id"] == first["parent_run_id"] and again["children"] == first["children"]
    client, runs = runs_of(uri, run_dir.name)
    assert len(runs) == 3  # one parent, two jobs: nothing duplicated
    parent = client.get_run(first["parent_run_id"])
    assert parent.data.params["plan.jobs"] == "2"
    assert json.loads(parent.data.tags["biasflow.overrides"]) == ["benchmark.crows_pairs.limit=200 stats.n_boot=0"]
    child = client.get_run(next(iter(first["children"].values())))
    assert child.data.params["benchmark.limit"] == "200" and "model.device" not in child.data.params
    assert child.data.tags["model.device"] == "auto"  # the latest invocation's setting, as a tag


# --- item 7: unreachable store ------------------------------------------------------------------------------------

def test_unreachable_server_fails_in_seconds_saying_where_the_results_are(tmp_path, monkeypatch, empty_store):
    dead = f"http://bob:{PASSWORD}@127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)
    run_dir = write_plan(tmp_path, dead)
    start = time.monotonic()
    with pytest.raises(TrackingError) as err:
        log_mlflow(str(run_dir / "plan.json"), str(run_dir), str(run_dir / "mlflow.json"))
    assert time.monotonic() - start < 10
    msg = str(err.value)
    assert redact_uri(dead) in msg and "unreachable" in msg and PASSWORD not in msg
    assert str(run_dir) in msg and f"biasflow log {run_dir}" in msg
    assert not (run_dir / "mlflow.json").exists() and (run_dir / "aggregate.csv").exists()
    # later, against a store that works
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    store = store_in(tmp_path / "store", empty_store)
    assert cli.main(["log", str(run_dir), "--tracking-uri", store]) == 0
    record = json.loads((run_dir / "mlflow.json").read_text())
    assert record["tracking_uri"] == store and len(record["children"]) == 2
    _, runs = runs_of(store, run_dir.name)
    assert len(runs) == 3


def test_biasflow_log_names_a_missing_run(tmp_path, capsys):
    assert cli.main(["log", str(tmp_path / "nope")]) == 2
    assert "no run folder with a plan.json" in capsys.readouterr().err


def test_log_refuses_incomplete_results(tmp_path):
    run_dir = write_plan(tmp_path, sqlite_uri(tmp_path))
    victim = Path(json.loads((run_dir / "plan.json").read_text())["jobs"][0]["metric_dir"]) / "aggregate.parquet"
    victim.unlink()
    with pytest.raises(TrackingError, match="results are incomplete"):
        log_plan(json.loads((run_dir / "plan.json").read_text()), run_dir)
    assert not (tmp_path / "mlflow.db").exists()


# --- item 8: interrupted creation of the sqlite store -------------------------------------------------------------

def fail_after(monkeypatch, n_tables: int):
    """Make MLflow's schema migration fail (as on a full disk) after creating ``n_tables`` tables."""
    from alembic.operations import Operations

    original = Operations.create_table
    calls = {"n": 0}

    def create_table(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > n_tables:
            raise sqlite3.OperationalError("database or disk is full")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Operations, "create_table", create_table)


def test_failed_store_creation_leaves_nothing_and_the_next_run_works(tmp_path, monkeypatch):
    uri = sqlite_uri(tmp_path)
    run_dir = write_plan(tmp_path, uri)
    with monkeypatch.context() as m:
        fail_after(m, 9)
        with pytest.raises(TrackingError, match=r"could not create the MLflow store .*disk is full"):
            log_plan(json.loads((run_dir / "plan.json").read_text()), run_dir)
    # no half-created store (the store's lock file beside it stays, as a lock)
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.glob(".mlflow.db.creating*"))
    record = log_plan(json.loads((run_dir / "plan.json").read_text()), run_dir)
    assert len(record["children"]) == 2


def half_created_store(path: Path, monkeypatch) -> None:
    """What MLflow itself leaves when its first use fails half way through the migrations (as on a full disk)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with monkeypatch.context() as m:
        fail_after(m, 9)
        with pytest.raises(sqlite3.OperationalError):
            SqlAlchemyStore(f"sqlite:///{path}", str(path.parent / "artifacts"))
    SqlAlchemyStore._engine_map.pop(f"sqlite:///{path}").dispose()  # as if that process had ended
    assert path.exists()


def test_half_created_store_without_runs_is_replaced(tmp_path, caplog, monkeypatch):
    db = tmp_path / "mlflow.db"
    half_created_store(db, monkeypatch)
    run_dir = write_plan(tmp_path, sqlite_uri(tmp_path))
    record = log_plan(json.loads((run_dir / "plan.json").read_text()), run_dir)  # before: "table ... already exists"
    assert len(record["children"]) == 2
    assert len(list(tmp_path.glob("mlflow.db.incomplete-*"))) == 1
    assert "was incomplete" in caplog.text


def test_store_with_runs_and_a_wrong_schema_is_refused_with_the_way_out(tmp_path, empty_store):
    uri = store_in(tmp_path, empty_store)
    run_dir = write_plan(tmp_path, uri)
    log_plan(json.loads((run_dir / "plan.json").read_text()), run_dir)
    with sqlite3.connect(tmp_path / "mlflow.db") as con:  # as if an upgrade had been interrupted
        con.execute("update alembic_version set version_num = '3500859a5d39'")
    with pytest.raises(TrackingError) as err:
        log_plan(json.loads((run_dir / "plan.json").read_text()), run_dir)
    msg = str(err.value)
    assert str(tmp_path / "mlflow.db") in msg and "3 runs, 1 experiments" in msg and "mlflow db upgrade" in msg
    assert "move it away" in msg and "biasflow log" in msg


# --- item 4: a password in the tracking URI is never written ------------------------------------------------------

def assert_nowhere(root: Path, client, run_ids, secret: str, planted=()) -> None:
    for f in root.rglob("*"):
        if f.is_file() and f.suffix != ".db" and f not in planted:  # the store is checked through MLflow below
            assert secret.encode() not in f.read_bytes(), f
    for run_id in run_ids:
        run = client.get_run(run_id)
        for key, value in {**run.data.params, **run.data.tags}.items():
            assert secret not in value, key
        for art in client.list_artifacts(run_id):
            if not art.is_dir:
                local = client.download_artifacts(run_id, art.path, str(root.parent / "dl"))
                assert secret.encode() not in Path(local).read_bytes(), art.path


def test_password_in_the_tracking_uri_is_written_nowhere(tmp_path, monkeypatch, capsys, empty_store):
    real = store_in(tmp_path / "store", empty_store, f"?password={PASSWORD}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", real)
    project = tmp_path / "project"
    run_dir = write_plan(project, real)
    (run_dir / "report.md").write_text(f"# report\nstore: {real}\n")  # a file quoting the URI is redacted on upload
    assert PASSWORD not in (run_dir / "plan.json").read_text()
    record = log_mlflow(str(run_dir / "plan.json"), str(run_dir), str(run_dir / "mlflow.json"))
    assert record["tracking_uri"] == redact_uri(real)
    from mlflow.tracking import MlflowClient

    assert_nowhere(project, MlflowClient(tracking_uri=real), [record["parent_run_id"], *record["children"].values()],
                   PASSWORD, planted=[run_dir / "report.md"])
    assert PASSWORD not in capsys.readouterr().out


# --- items 4 and 7 against a real tracking server -----------------------------------------------------------------

@pytest.mark.slow
def test_server_unreachable_then_back_biasflow_log_logs_without_leaking(tmp_path, monkeypatch, capsys):
    port = free_port()
    real = f"http://bob:{PASSWORD}@127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", real)
    project = tmp_path / "project"
    run_dir = write_plan(project, real)
    start = time.monotonic()
    assert cli.main(["log", str(run_dir)]) == 2
    assert time.monotonic() - start < 10
    down = capsys.readouterr()
    assert "unreachable" in down.err and f"biasflow log {run_dir}" in down.err
    store = tmp_path / "server"
    store.mkdir()  # MLflow before 3.5 does not create the sqlite file's folder
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
         "--artifacts-destination", str(store / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        import requests

        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.RequestException:  # not listening yet, or busy starting
                pass
            assert time.monotonic() < deadline and server.poll() is None, "mlflow server did not start"
            time.sleep(0.3)
        assert cli.main(["log", str(run_dir)]) == 0
        up = capsys.readouterr()
        assert PASSWORD not in up.out + up.err + down.out + down.err  # MLflow's "View run at <URI>" lines included
        record = json.loads((run_dir / "mlflow.json").read_text())
        from mlflow.tracking import MlflowClient

        assert_nowhere(project, MlflowClient(tracking_uri=real),
                       [record["parent_run_id"], *record["children"].values()], PASSWORD)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.mark.parametrize("uri,shown", [
    ("sqlite:///results/mlflow.db", "sqlite:///results/mlflow.db"),
    ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
    ("sqlite:////abs/mlflow.db?password=pw123&timeout=5", "sqlite:////abs/mlflow.db?password=***&timeout=5"),
    ("http://bob:pw123@host:5000/prefix", "http://bob:***@host:5000/prefix"),
])
def test_redacted_uri_still_names_the_same_store(uri, shown):
    assert redact_uri(uri) == shown


def test_biasflow_log_refuses_a_password_on_the_command_line(tmp_path, capsys):
    assert cli.main(["log", str(tmp_path), "--tracking-uri", f"http://bob:{PASSWORD}@host:5000"]) == 2
    err = capsys.readouterr().err
    assert "MLFLOW_TRACKING_URI" in err and PASSWORD not in err


# --- issue 13: runs in MLflow's own terms ---------------------------------------------------------------------------

def with_stage_records(run_dir: Path, t0: float) -> dict:
    """Add what the stages record to a hand-written plan: the items' raw file (prepare), the score and metric stage
    times; returns the plan."""
    plan = json.loads((run_dir / "plan.json").read_text())
    items = run_dir.parents[1] / "items" / "crows_pairs-0000.parquet"
    items.parent.mkdir(parents=True, exist_ok=True)
    (items.parent / f"{items.name}.meta.json").write_text(json.dumps(
        {"benchmark": "crows_pairs", "rows": 200,
         "files": {"csv": {"path": "/data/crows.csv", "sha256": "ab" * 32, "source": "https://example.org/crows.csv"}}}))
    for i, job in enumerate(plan["jobs"]):
        job["items_path"] = str(items)
        mdir = Path(job["metric_dir"])
        (mdir / "score_meta.json").write_text(json.dumps({"provenance": {"model.revision": "local:0123"},
                                                          "started": t0, "finished": t0 + 5}))
        (mdir / "metric_meta.json").write_text(json.dumps({"started": t0 + 6 + i, "finished": t0 + 9 + i}))
    (run_dir / "plan.json").write_text(json.dumps(plan))
    return plan


def test_runs_carry_mlflows_own_metadata_and_logging_again_changes_nothing(tmp_path, empty_store, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = store_in(tmp_path, empty_store)
    run_dir = write_plan(tmp_path, uri)
    t0 = time.time() - 3600
    plan = with_stage_records(run_dir, t0)
    # the aggregate job (paired tests, report) ends the run, after the last metric stage
    (run_dir / "run_times.json").write_text(json.dumps({"started": t0 + 10.5, "finished": t0 + 25}))
    command = "biasflow run -m metric=[crows_pairs_aul,crows_pairs_biasbench] stats.n_boot=0"
    monkeypatch.setenv("BIASFLOW_COMMAND", command)
    first = log_mlflow(str(run_dir / "plan.json"), str(run_dir), str(run_dir / "mlflow.json"))
    record = log_mlflow(str(run_dir / "plan.json"), str(run_dir), str(run_dir / "mlflow.json"))
    assert record["children"] == first["children"]
    client = MlflowClient(tracking_uri=uri)
    # the experiment opens as model training, not GenAI
    assert client.get_experiment(record["experiment_id"]).tags["mlflow.experimentKind"] == "custom_model_development"
    assert record["ui"] == f"#/experiments/{record['experiment_id']}/runs/{record['parent_run_id']}" \
                           f"?workflowType=machine_learning"
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    parent = client.get_run(record["parent_run_id"])
    for run in [parent, *(client.get_run(r) for r in record["children"].values())]:
        tags = run.data.tags
        assert tags["mlflow.source.name"] == "biasflow run" and tags["mlflow.source.type"] == "LOCAL"
        assert tags["biasflow.command"] == command and command in tags["mlflow.note.content"]
        assert tags["mlflow.source.git.commit"] == head and "git.commit" not in tags
        assert run.info.status == "FINISHED"
    assert parent.data.tags["mlflow.note.content"].startswith("# report")
    # the run's real times: first scoring start to the end of the aggregate job
    assert (parent.info.start_time, parent.info.end_time) == (int(t0 * 1000), int((t0 + 25) * 1000))
    for i, job in enumerate(plan["jobs"]):
        child = client.get_run(record["children"][f"tiny-0123abcd/{job['metric']}/{job['cfg_hash']}"])
        assert (child.info.start_time, child.info.end_time) == (int(t0 * 1000), int((t0 + 9 + i) * 1000))
        short = job["metric"].removeprefix("crows_pairs_")  # aul, biasbench: what tells the runs apart, first
        assert child.info.run_name == f"{short} · tiny/{job['metric']}"
        # the description: the job's numbers in Markdown
        note = child.data.tags["mlflow.note.content"]
        assert f"## {job['metric']} / tiny" in note and "| metric_score | 55.00 |" in note
        # the dataset, with the sha256 of the raw file that was read
        [dataset] = child.inputs.dataset_inputs
        assert (dataset.dataset.name, dataset.dataset.digest) == ("crows_pairs", "ab" * 8)
        assert json.loads(dataset.dataset.source) == {"url": "https://example.org/crows.csv"}
        assert json.loads(dataset.dataset.profile)["sha256"] == "ab" * 32
        # short params to compare by
        params = child.data.params
        assert (params["model"], params["metric"], params["variant"]) == ("tiny", job["metric"], job["metric"])
        # tables the UI renders, not doubled by the second logging; one point per metric
        assert {a.path for a in client.list_artifacts(child.info.run_id, "tables")} == {"tables/aggregate.json",
                                                                                        "tables/per_item.json"}
        table = json.loads(Path(client.download_artifacts(child.info.run_id, "tables/per_item.json",
                                                          str(tmp_path / f"dl{i}"))).read_text())
        assert table == {"columns": ["item_id", "score"], "data": [[1, 0.1], [2, 0.2]]}
        assert json.loads(child.data.tags["mlflow.loggedArtifacts"]) == [
            {"path": "tables/aggregate.json", "type": "table"}, {"path": "tables/per_item.json", "type": "table"}]
        assert len(client.get_metric_history(child.info.run_id, "metric_score.overall")) == 1
    assert [d.dataset.name for d in parent.inputs.dataset_inputs] == ["crows_pairs"]
    # `biasflow log` later, from a shell: the runs keep the command that produced them
    monkeypatch.delenv("BIASFLOW_COMMAND")
    assert cli.main(["log", str(run_dir)]) == 0
    assert client.get_run(record["parent_run_id"]).data.tags["biasflow.command"] == command


def test_the_parent_run_lies_inside_the_runs_wall_clock_window(tmp_path, empty_store):
    """Issue 44 item 4: the parent's start comes from the Snakemake benchmark records (pandas 3 parses their times
    to datetime64[us], once read as nanoseconds: a start in January 1970, "Created 56 years ago"). A run written
    now, with stage records at their real times, reads back from MLflow inside the window that held it."""
    from mlflow.tracking import MlflowClient

    from biasflow.report.timing import benchmark_file, plan_jobs

    window_start = time.time()
    uri = store_in(tmp_path, empty_store)
    run_dir = write_plan(tmp_path, uri)
    plan = with_stage_records(run_dir, window_start)
    time.sleep(0.3)
    for job in plan["jobs"]:  # the stages' own records, at their real times
        mdir = Path(job["metric_dir"])
        (mdir / "score_meta.json").write_text(json.dumps({"started": time.time() - 0.2, "finished": time.time()}))
        (mdir / "metric_meta.json").write_text(json.dumps({"started": time.time(), "finished": time.time()}))
    results = plan["paths"]["results"]
    jobs = list(plan_jobs(plan))
    assert {r for r, _ in jobs} >= {"prepare", "metric"}
    for rule, key in jobs:  # written when the job ends, timing its 0.25 s
        path = Path(benchmark_file(results, rule, key))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("s\th:m:s\tmax_rss\tcpu_time\n0.25\t0:00:00\t100\t0.2\n")
    started = time.time()
    time.sleep(0.1)
    (run_dir / "run_times.json").write_text(json.dumps({"started": started, "finished": time.time()}))
    record = log_plan(plan, run_dir, uri)
    window_end = time.time()
    parent = MlflowClient(tracking_uri=uri).get_run(record["parent_run_id"])
    low, high = int(window_start * 1000), int(window_end * 1000) + 1
    assert low <= parent.info.start_time <= parent.info.end_time <= high, (low, parent.info, high)


def test_sweep_runs_are_named_by_what_differs():
    from biasflow.tracking.mlflow_log import child_run_names

    jobs = [{"model": {"name": "bert"}, "metric": "crows_pairs", "model_key": "bert-1", "cfg_hash": h,
             "metric_cfg": {"diff_threshold": t, "variants": ["pll"]}} for h, t in (("a1", 0.05), ("b2", 0.1))]
    jobs.append({"model": {"name": "bert"}, "metric": "seat", "model_key": "bert-1", "cfg_hash": "c3",
                 "metric_cfg": {}})
    assert child_run_names(jobs) == {
        "bert-1/crows_pairs/a1": "0.05 crows_pairs · bert/crows_pairs diff_threshold=0.05",
        "bert-1/crows_pairs/b2": "0.1 crows_pairs · bert/crows_pairs diff_threshold=0.1",
        "bert-1/seat/c3": "seat · bert/seat"}
    # the default pipeline's runs: CrowS-Pairs' variants differ in their first letters, as MLflow's runs list shows
    # them (about 12 characters at its default column width: tests/test_report_browser.py)
    default = [{"model": {"name": m}, "metric": f, "model_key": m, "cfg_hash": "h", "metric_cfg": {}} for m, f in (
        ("demo_bert", "crows_pairs"), ("demo_bert", "crows_pairs_aul"), ("demo_bert", "crows_pairs_biasbench"),
        ("demo_bert", "cbs"), ("all_minilm_l6_v2", "seat"), ("glove_6b_50d", "weat"))]
    names = child_run_names(default)
    assert names["demo_bert/crows_pairs_aul/h"] == "demo_bert aul · demo_bert/crows_pairs_aul"
    assert len({name[:12] for name in names.values()}) == len(default), names
    assert child_run_names(default[:1]) == {"demo_bert/crows_pairs/h": "demo_bert/crows_pairs"}  # one run: no lead
    from biasflow.tracking.mlflow_log import _short_metric

    # long model names of one family: their own words lead (an independent check found 'my_finetuned…' for all six)
    models = [{"model": {"name": f"my_finetuned_model_{v}"}, "metric": f, "model_key": v, "cfg_hash": "h",
               "metric_cfg": {}} for v in ("v1", "v2") for f in ("crows_pairs", "crows_pairs_aul")]
    names = child_run_names(models)
    assert names["v1/crows_pairs_aul/h"] == "v1 aul · my_finetuned_model_v1/crows_pairs_aul"
    assert len({name[:10] for name in names.values()}) == 4, names

    assert [_short_metric(m, {"lmc_wc", "lmc_we", "winobias", "winogender", "winobias_mc"}) for m in (
        "lmc_wc", "winobias", "winogender", "winobias_mc")] == ["wc", "winobias", "winogender", "mc"]


def test_a_relative_sqlite_store_is_the_current_folders(tmp_path, monkeypatch):
    """MLflow keeps one store per URI for the life of a process: the relative default sqlite:///results/mlflow.db,
    used from a second project folder in the same Python session (a notebook, the test suite), logged into the first
    folder's database. The URI connected to is absolute, from the folder the run is logged from."""
    from biasflow.tracking.store import connect_uri

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        assert connect_uri("sqlite:///results/mlflow.db") == f"sqlite:///{tmp_path / name}/results/mlflow.db"
    assert connect_uri("sqlite:////abs/mlflow.db") == "sqlite:////abs/mlflow.db"
    assert connect_uri("sqlite:///x.db?timeout=5") == f"sqlite:///{tmp_path / 'b'}/x.db?timeout=5"
    assert connect_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_a_local_folder_on_a_hub_config_is_named_as_the_folder_everywhere():
    """model=gpt2 model.path=DIR: loading reads the folder, so the report, the MLflow description, the model.id tag
    and the revision param name the folder and its weights digest, never openai-community/gpt2 at main."""
    from biasflow.provenance import configured_revision, model_source
    from biasflow.tracking.mlflow_log import job_note, model_revision

    model = {"name": "tiny_gpt2", "kind": "causal_lm", "hub_id": "openai-community/gpt2", "revision": "main",
             "path": "/models/tiny-gpt2"}
    job = {"model": model, "metric": "bbq", "benchmark": "bbq", "cfg_hash": "abc",
           "user_files": {"model.path": {"digest": "0123abcd"}}}
    assert model_source(model) == "/models/tiny-gpt2" and configured_revision(model) is None
    assert model_revision(job) == "local:0123abcd"
    note = job_note(job, pd.DataFrame(columns=["metric", "category", "value", "ci_low", "ci_high", "n"]))
    assert "/models/tiny-gpt2" in note and "openai-community" not in note and "`main`" not in note
    hub = {k: v for k, v in model.items() if k != "path"}
    assert model_source(hub) == "openai-community/gpt2" and model_revision({"model": hub}) == "main"


def test_descriptions_render_multi_line_options_and_tables_lead_with_the_numbers():
    """A prompt template option is a fenced block in the child's description (inside a code span its lines would
    run together), a backtick in an option or command stays inside its span, and the logged tables start with
    model, metric, category, value and CI, whatever order the job's table had."""
    from markdown_it import MarkdownIt

    from biasflow.tracking.mlflow_log import front_columns, job_note

    prompt = "Q: {question}\nA: `{answer}`\n```"
    job = {"model": {"name": "m", "kind": "causal_lm", "hub_id": "org/m"}, "metric": "bbq", "benchmark": "bbq",
           "cfg_hash": "abc", "metric_cfg": {"prompt": prompt, "definition": "parrish2022", "k": 3}}
    note = job_note(job, pd.DataFrame(columns=["metric", "category", "value", "ci_low", "ci_high", "n"]),
                    command="biasflow run 'x=`y`'")
    html = MarkdownIt().render(note)
    assert "<code>definition=parrish2022</code>, <code>k=3</code>" in html
    assert "<code>biasflow run 'x=`y`'</code>" in html
    assert '<pre><code class="language-text">Q: {question}\nA: `{answer}`\n```\n</code></pre>' in html
    agg = pd.DataFrame({"config_hash": ["h"], "benchmark": ["bbq"], "n": [3], "ci_high": [2.0], "ci_low": [0.0],
                        "value": [1.0], "category": ["overall"], "metric": ["acc"], "model": ["m"]})
    assert list(front_columns(agg).columns) == ["model", "metric", "category", "value", "ci_low", "ci_high", "n",
                                                "config_hash", "benchmark"]


def _plan_in(root: Path, model_dir: Path) -> tuple[dict, Path]:
    """write_plan's plan in ``root``, scoring the model in ``model_dir`` (the same model in every copy)."""
    run_dir = write_plan(root, sqlite_uri(root))
    plan = json.loads((run_dir / "plan.json").read_text())
    for job in plan["jobs"]:
        job["model"]["path"] = str(model_dir)
    return plan, run_dir


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_copied_or_moved_project_writes_nothing_outside_itself(tmp_path, empty_store, monkeypatch, caplog):
    """Issue 45: the local store records its artifact location as an absolute path. After `cp -a project copy`, a
    re-run in the copy rewrote the original's report artifacts and wrote none into its own folder; after moving a
    folder, the re-run recreated the old path. Now the store and its artifacts, copied or moved together, are
    re-pointed at the folder they are in (one warning line), and nothing outside that folder is written."""
    import logging
    import subprocess

    from mlflow.tracking import MlflowClient

    original = tmp_path / "project"
    run_dir = write_plan(original, store_in(original, empty_store))
    monkeypatch.chdir(original)
    log_plan(json.loads((run_dir / "plan.json").read_text()), run_dir)
    before = _snapshot(original)
    assert any(p.startswith("mlartifacts/") for p in before)

    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    plan, run_dir = _plan_in(copy, original / "model")  # the copy's plan names the copy's folders
    (run_dir / "report.md").write_text("# report of the copy\n")
    monkeypatch.chdir(copy)
    with caplog.at_level(logging.WARNING):
        record = log_plan(plan, run_dir)
    assert _snapshot(original) == before  # not one file of the original written
    assert "copied or moved from another folder" in caplog.text and f"re-pointed to {copy.as_uri()}" in caplog.text
    client = MlflowClient(tracking_uri=sqlite_uri(copy))
    parent = client.get_run(record["parent_run_id"])
    assert parent.info.artifact_uri.startswith((copy / "mlartifacts").as_uri())
    assert "report of the copy" in (copy / "mlartifacts").joinpath(
        parent.info.artifact_uri.split("/mlartifacts/", 1)[1], "report.md").read_text()

    moved = tmp_path / "moved"
    subprocess.run(["mv", str(copy), str(moved)], check=True)
    plan, run_dir = _plan_in(moved, original / "model")
    monkeypatch.chdir(moved)
    log_plan(plan, run_dir)
    assert not copy.exists()  # the old path is not recreated
    client = MlflowClient(tracking_uri=sqlite_uri(moved))
    runs = client.search_runs(["1"])
    assert runs and all(r.info.artifact_uri.startswith((moved / "mlartifacts").as_uri()) for r in runs)
    # MLflow's Default experiment (under the project folder, not its artifact folder) moved with it
    assert client.get_experiment("0").artifact_location.startswith((str(moved) + "/", moved.as_uri() + "/"))
    assert not list(tmp_path.glob("*.lock")) and not list(Path(tempfile.gettempdir()).glob(
        "biasflow-mlflow-store-*.lock"))  # the store's lock lies beside it
