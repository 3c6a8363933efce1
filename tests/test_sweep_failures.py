"""A sweep survives a broken model: the others finish, the report and MLflow list the failure with its error,
`biasflow status` shows it, and a re-run after the fix does only the missing work."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, project_copy, snakemake_job_stats, snakemake_output

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
    assert parent[0].info.status == "FAILED" and parent[0].info.end_time > parent[0].info.start_time > 0
    status = biasflow(project, "status", str(report.parent))
    assert status.returncode == 0 and "1 failed" in status.stdout and "tiny_broken / crows_pairs" in status.stdout

    # the cause is fixed (the weights arrived): only the broken model's work runs
    shutil.rmtree(project / "broken_model")
    shutil.copytree(tiny_bert_dir, project / "broken_model")
    second = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    assert second.returncode == 0, second.stderr[-3000:]
    counts = snakemake_job_stats(snakemake_output(second.stdout + second.stderr, project))
    assert counts.get("score") == 1 and counts.get("metric") == 1 and "prepare" not in counts
    # the complete run (a new plan: the model folder's weights are part of its identity) is FINISHED
    parents = {r.info.run_id: r for r in client.search_runs([exp.experiment_id])
               if r.data.tags.get("biasflow.role") == "parent"}
    (done,) = [r for run_id, r in parents.items() if run_id != parent[0].info.run_id]
    assert done.info.status == "FINISHED" and done.data.tags["biasflow.unfinished_jobs"] == "0"


def test_every_job_failing_still_gives_a_report_and_an_mlflow_parent(project):
    """No job finished: the report exists anyway and lists every job with its state and cause; so does MLflow."""
    run = ["-m", "model=tiny_broken", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10", "stats.n_boot=0"]
    proc = biasflow(project, "run", *run, "--cores", "2", "--", "--directory", str(project))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    report = next((project / "results" / "runs").glob("*/report.md"))
    text = report.read_text()
    assert "PARTIAL RESULTS: 1 job(s) did not finish" in text and "| tiny_broken | crows_pairs | failed |" in text
    assert "is not a model folder" in text
    assert (report.parent / "report.html").exists()
    assert "partial results (0 of 1 jobs finished)" in out and "Resume with:\n  biasflow run -m" in out
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("biasflow")
    parent = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("biasflow.role") == "parent"]
    assert parent and parent[0].data.tags["biasflow.unfinished_jobs"] == "1"


def test_a_failed_prepare_is_named_and_its_jobs_shown_blocked_not_waiting(project, crows_csv):
    """A user's own data file (file://, checksummed) that is not UTF-8: prepare fails. The console summary,
    `biasflow status` and the report name the failed prepare, its cause and log for each job it blocked (they were
    shown as "waiting" with no cause)."""
    import hashlib

    import pandas as pd

    raw = pd.read_csv(crows_csv, index_col=0).head(10)
    raw.iloc[0, raw.columns.get_loc("sent_more")] = "The café owner was rude."
    mine = project / "my_crows.csv"
    raw.to_csv(mine, encoding="latin-1")
    digest = hashlib.sha256(mine.read_bytes()).hexdigest()
    run = ["-m", "model=tiny_ok,tiny_broken", "metric=[crows_pairs]", "stats.n_boot=0",
           f"benchmark.crows_pairs.files.csv.sources=[{{url:'{mine.as_uri()}',sha256:{digest}}}]"]
    proc = biasflow(project, "run", *run, "--cores", "2", "--", "--directory", str(project))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "0 failed, 2 blocked by a failed job" in out and "0 waiting" in out
    assert out.count("blocked by prepare crows_pairs, which failed: CrowS-Pairs CSV") == 2
    assert "is not UTF-8: byte 0xe9" in out and "logs/prepare/crows_pairs-" in out
    report = next((project / "results" / "runs").glob("*/report.md"))
    text = report.read_text()
    assert "0 failed; 2 blocked by a failed download, prepare or build" in text
    assert text.count("| blocked |") == 2 and "blocked by prepare crows_pairs" in text
    status = biasflow(project, "status", str(report.parent))
    assert status.returncode == 0 and "2 blocked by a failed job" in status.stdout
    assert "blocked  tiny_ok / crows_pairs: blocked by prepare crows_pairs" in status.stdout


def test_a_raw_file_changed_after_a_complete_run_is_named_not_called_a_report_failure(project):
    """From the independent check of Bias-NLI: after a complete run, a raw file edited by hand fails its checksum in
    prepare. The summary said '1 done, 0 failed' and 'Every job finished, but the run's report failed' (pointing at an
    empty aggregate log). Its jobs are blocked by the failed prepare (their results on disk are of the data before,
    and will be redone), the cause is named, the edited file is kept, and the last complete report stays."""
    run = ["model=tiny_ok", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10", "stats.n_boot=0"]
    first = biasflow(project, "run", *run, "--cores", "2", "--", "--directory", str(project))
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = next((project / "results" / "runs").glob("*/report.md")).parent
    complete = (run_dir / "report.md").read_bytes()
    raw = project / "resources" / "datasets" / "crows_pairs" / "crows_pairs_anonymized.csv"
    raw.write_bytes(raw.read_bytes() + b"edited by hand\n")
    second = biasflow(project, "run", *run, "--cores", "2", "--", "--directory", str(project))
    out = second.stdout + second.stderr
    assert second.returncode != 0
    assert "Every job finished" not in out and "report failed" not in out
    assert "matches none of the checksums" in out and "0 failed, 1 blocked by a failed job" in out
    assert "blocked by prepare crows_pairs, which failed" in out
    assert raw.read_bytes().endswith(b"edited by hand\n")  # never deleted
    assert (run_dir / "report.md").read_bytes() == complete
    assert "The last complete report" in out


def test_only_mlflow_failing_says_so_and_how_to_log_later(project):
    """Every metric finished and only log_mlflow failed (the store is down): the CLI says that, not 'partial
    results', and gives the biasflow log command."""
    run = ["-m", "model=tiny_ok", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10", "stats.n_boot=0",
           "tracking=server", "tracking.uri=http://127.0.0.1:9"]
    proc = biasflow(project, "run", *run, "--cores", "2", "--", "--directory", str(project))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    run_dir = next((project / "results" / "runs").glob("*/report.md")).parent
    assert "partial results" not in out and "PARTIAL RESULTS" not in (run_dir / "report.md").read_text()
    assert "Every job finished" in out and "Logging to MLflow failed" in out
    assert f"biasflow log {run_dir}" in out


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_stopped_or_killed_run_says_how_to_resume_and_is_not_shown_running(project):
    """SIGTERM of biasflow, kill -9 of biasflow, kill -9 of its Snakemake: each time the user learns that the run
    stopped and the command that resumes it; `biasflow status` never calls it running; the lock a killed Snakemake
    leaves is found stale and cleared by the next run, which finishes."""
    run = ["-m", "model=tiny_ok", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10", "stats.n_boot=0"]
    args = [sys.executable, "-m", "biasflow.cli", "run", *run, "--cores", "2", "--", "--directory", str(project)]
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), BIASFLOW_ROOT=str(ROOT), HF_HUB_OFFLINE="1")
    incomplete, locks = project / ".snakemake" / "incomplete", project / ".snakemake" / "locks"

    def owner() -> dict:
        try:
            return json.loads((project / ".snakemake" / "biasflow" / "owner.json").read_text())
        except (OSError, ValueError):
            return {}

    def start() -> subprocess.Popen:
        """biasflow run, returned once its Snakemake holds the lock and a job has started."""
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _wait_for(lambda: owner().get("pid") == proc.pid and any(locks.glob("*")), 300, "the run to start")
        _wait_for(lambda: incomplete.is_dir() and any(incomplete.iterdir()), 300, "a job to start")
        return proc

    def status() -> str:
        run_dir = next((project / "results" / "runs").glob("*/plan.json")).parent
        proc = biasflow(project, "status", str(run_dir))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    # 1. SIGTERM of biasflow: Snakemake stops its jobs, biasflow says how to resume
    proc = start()
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out[-3000:]
    assert "the run was stopped (SIGTERM)" in out and "Resume with:\n  biasflow run -m" in out, out[-3000:]
    text = status()
    assert "0 running" in text and "resume with: biasflow run -m" in text, text

    # 2. kill -9 of biasflow: nothing can speak for it then, so status says the run is gone and how to resume
    proc = start()
    proc.kill()
    proc.wait()
    snakemake = owner()["snakemake_pid"]
    _wait_for(lambda: not Path(f"/proc/{snakemake}").exists(), 120, "Snakemake to stop")
    text = status()
    assert "0 running" in text and "the run is not running" in text and "is gone" in text, text
    assert "resume with: biasflow run -m" in text, text

    # 3. kill -9 of Snakemake: its lock stays behind
    proc = start()
    os.kill(owner()["snakemake_pid"], signal.SIGKILL)
    out = proc.communicate(timeout=120)[0]
    assert "the run was stopped (SIGKILL)" in out, out[-3000:]
    assert any(locks.iterdir())
    assert "0 running" in status()

    # 4. the next run finds the lock stale, clears it and finishes
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "holds a stale lock" in out and "Unlocking" in out
    assert "1 done" in status()


def test_a_job_waiting_in_the_slurm_queue_is_queued_not_running(tmp_path, monkeypatch):
    """A submitted cluster job that SLURM still holds (PENDING) is `queued`; a RUNNING one `running`."""
    from biasflow import progress, slurm

    results = tmp_path / "results"
    plan = {"plan_hash": "abc", "paths": {"results": str(results)}, "jobs": []}
    for name, jobid in (("tiny_q", "41"), ("tiny_r", "42")):
        job = {"model": {"name": name}, "metric": "crows_pairs", "results": str(results),
               "metric_dir": str(results / "metrics" / name / "crows_pairs" / "h"),
               "scores_path": str(results / "scores" / name / "crows_pairs-s.parquet"), "items_path": None}
        plan["jobs"].append(job)
        slurm.record({"event": "submitted", "rule": "score", "attempt": 1, "jobid": jobid,
                      "output": [job["scores_path"]], "resources": {"mem_mb": 500, "runtime": 1}}, tmp_path)
    (results / "runs" / "abc").mkdir(parents=True)
    (results / "runs" / "abc" / "owner.json").write_text(json.dumps(
        progress.owner_record(os.getpid(), None, "biasflow run -m model=tiny_q,tiny_r", str(tmp_path))))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\nprintf '41|PENDING\\n42|RUNNING\\n'\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    states = {s.model: (s.state, s.slurm_state) for s in progress.job_states(plan)}
    assert states == {"tiny_q": ("queued", "PENDING"), "tiny_r": ("running", "RUNNING")}
    text = progress.status_text(plan)
    assert "1 running, 1 queued" in text and "queued (PENDING) tiny_q / crows_pairs" in text, text


def test_the_api_raises_the_unfinished_jobs_as_data(project, monkeypatch):
    """biasflow.api.run on the broken model: RunFailed carries each unfinished job (state, error), the partial
    results and the command that resumes, no console text to parse."""
    from biasflow import api

    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(project)
    with pytest.raises(api.RunFailed) as err:
        api.run("model=tiny_broken", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10", "stats.n_boot=0",
                "tracking.enabled=false", cores=2)
    [job] = err.value.unfinished
    assert (job.model, job.metric, job.state) == ("tiny_broken", "crows_pairs", "failed")
    assert "is not a model folder" in job.error and "is not a model folder" in str(err.value)
    assert "Resume with:\n  biasflow run model=tiny_broken" in str(err.value)
    assert err.value.results.report is not None and err.value.results.aggregate.empty
    assert err.value.outcome.exit_code != 0 and err.value.outcome.partial_report
    assert "BIASFLOW_COMMAND" not in os.environ  # the caller's environment is left as it was


@pytest.fixture()
def light_project(tmp_path, crows_csv):
    """A scratch project (conf/ copied, the CrowS-Pairs file in place) and no model built for it."""
    return project_copy(tmp_path, {"crows_pairs/crows_pairs_anonymized.csv": crows_csv})


def test_a_failed_download_of_the_demo_models_training_text_is_named(light_project):
    """The demo model is built from BOLD's Wikipedia files: when their download fails, the jobs on the demo model
    are blocked by that download (its rule, cause and log), in the console, `biasflow status` and the report; they
    were shown as "1 waiting" with no cause."""
    project = light_project
    missing = (project / "nowhere" / "gender_wiki.json").as_uri()
    run = ["model=demo_bert", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10", "stats.n_boot=0",
           "tracking.enabled=false", f"benchmark.bold_wikipedia.files.gender.sources=[{{url:'{missing}',sha256:{'0' * 64}}}]"]
    proc = biasflow(project, "run", *run, "--cores", "2", "--", "--directory", str(project))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "1 blocked by a failed job, 0 interrupted, 0 waiting" in out, out[-3000:]
    cause = ("blocked  demo_bert / crows_pairs: blocked by download bold_wikipedia/gender_wiki.json (the training "
             "text of build_demo_model demo_bert), which failed: could not fetch ")
    assert cause in out and "No such file or directory" in out
    assert f"log: {project}/results/logs/download/bold_wikipedia/gender_wiki.json.log" in out
    run_dir = next((project / "results" / "runs").glob("*/report.md")).parent
    assert "| demo_bert | crows_pairs | blocked |" in (run_dir / "report.md").read_text()
    status = biasflow(project, "status", str(run_dir))
    assert status.returncode == 0 and cause in status.stdout, status.stdout


def test_a_broken_snakefile_is_named_with_its_error_and_log(light_project, tmp_path):
    """Snakemake cannot parse the workflow: every job is blocked by it, with Snakemake's error (file, line,
    message) and its log, in the console and `biasflow status` (they were "1 waiting" with no cause)."""
    project = light_project
    root = tmp_path / "checkout"
    root.mkdir()
    for part in ("workflow", "scripts"):
        shutil.copytree(ROOT / part, root / part)
    snakefile = (ROOT / "Snakefile").read_text()
    assert "\nrule all:\n" in snakefile
    (root / "Snakefile").write_text(snakefile.replace("\nrule all:\n", "\nrule all\n", 1))
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), BIASFLOW_ROOT=str(root), HF_HUB_OFFLINE="1")
    run = ["metric=[crows_pairs]", "benchmark.crows_pairs.limit=10", "stats.n_boot=0", "tracking.enabled=false"]
    proc = subprocess.run([sys.executable, "-m", "biasflow.cli", "run", *run, "--cores", "1", "--", "--directory",
                           str(project)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "1 blocked by a failed job, 0 interrupted, 0 waiting" in out, out[-3000:]
    cause = re.search(r"blocked  demo_bert / crows_pairs: blocked by the workflow, which Snakemake could not run: "
                      r"SyntaxError in file \"(.*?)\", line \d+: Expected name or colon after rule.*", out)
    assert cause and cause.group(1) == str(root / "Snakefile"), out[-3000:]
    cause = cause.group(0)
    log = next((project / ".snakemake" / "log").glob("*.snakemake.log"))
    assert f"log: {log}" in out
    run_dir = next((project / "results" / "runs").glob("*/report.md")).parent
    status = biasflow(project, "status", str(run_dir))
    assert status.returncode == 0 and cause in status.stdout and f"log: {log}" in status.stdout, status.stdout


def test_a_partial_run_never_replaces_the_last_complete_report(project, tiny_bert_dir):
    """Issue 45: a run in which a job failed replaced the complete aggregate.csv (85 rows) with its partial one
    (15 rows). The last complete report and tables stay until a complete run replaces them; the partial report is
    written beside them (partial/), marked partial, and the console says where each is."""
    shutil.rmtree(project / "broken_model")
    shutil.copytree(tiny_bert_dir, project / "broken_model")
    first = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = next((project / "results" / "runs").glob("*/report.md")).parent
    complete = {name: (run_dir / name).read_bytes() for name in ("report.md", "aggregate.csv", "report.html")}

    # the second model's outputs are gone and it is asked for on a GPU this machine lacks (the same plan: where a
    # model runs is not its identity): its job fails on the re-run
    for folder in ("scores", "metrics"):
        for path in (project / "results" / folder).glob("tiny_broken-*"):
            shutil.rmtree(path)
    shutil.rmtree(project / "results" / "cache")  # its answers too (tiny_ok's scores stay: not asked again)
    config = project / "conf" / "model" / "tiny_broken.yaml"
    config.write_text(config.read_text().replace("device: cpu", "device: cuda:7"))
    second = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    out = second.stdout + second.stderr
    assert second.returncode != 0
    assert {name: (run_dir / name).read_bytes() for name in complete} == complete  # kept, byte for byte
    assert (run_dir / "partial" / "report.md").exists(), out[-3000:]
    partial = (run_dir / "partial" / "report.md").read_text()
    assert "PARTIAL RESULTS: 1 job(s) did not finish" in partial and "tiny_broken" in partial
    assert f"{run_dir}/partial/report.html" in out and "The last complete report" in out
    assert not (run_dir / ".last-complete").exists()
    # a second failure in a row (before: 'SameFileError' from the restore, no summary, no partial report)
    again = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    assert again.returncode != 0 and "SameFileError" not in again.stdout + again.stderr
    assert "The last complete report" in again.stdout + again.stderr
    assert {name: (run_dir / name).read_bytes() for name in complete} == complete
    assert not list(run_dir.glob("*.restoring")) and (run_dir / "partial" / "report.md").exists()

    config.write_text(config.read_text().replace("device: cuda:7", "device: cpu"))
    third = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    assert third.returncode == 0, third.stderr[-3000:]
    assert not (run_dir / "partial").exists()  # a complete report replaced both
    assert (run_dir / "aggregate.csv").read_bytes().count(b"\n") == complete["aggregate.csv"].count(b"\n")


def test_damaged_outputs_are_recomputed_to_the_same_tables(project, tiny_bert_dir):
    """Issue 45: a truncated or overwritten file under results/scores, results/items or results/metrics failed every
    re-run with 'ArrowInvalid: Parquet magic bytes not found'. Now it counts as missing: the re-run names it, moves
    it aside, recomputes it and what depends on it, and the tables equal the clean run's."""
    shutil.rmtree(project / "broken_model")
    shutil.copytree(tiny_bert_dir, project / "broken_model")
    first = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    assert first.returncode == 0, first.stderr[-3000:]
    results = project / "results"
    run_dir = next((results / "runs").glob("*/report.md")).parent
    clean = (run_dir / "aggregate.csv").read_text()
    scores = next((results / "scores").glob("tiny_ok-*/*.parquet"))
    scores.write_bytes(scores.read_bytes()[: scores.stat().st_size // 2])  # truncated
    metric = next((results / "metrics").glob("tiny_broken-*/*/*/aggregate.parquet"))
    metric.write_text("overwritten")
    items = next((results / "items").glob("*.parquet"))
    items.write_bytes(b"PAR1" + b"\0" * 64)
    second = biasflow(project, "run", *SWEEP, "--cores", "2", "--", "--directory", str(project))
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    for path in (scores, metric, items):
        assert f"{path} was damaged" in out and path.exists()
    assert len(list((results / ".damaged").rglob("*.parquet.*"))) == 3
    assert (run_dir / "aggregate.csv").read_text() == clean
