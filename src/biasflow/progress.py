"""Where a plan stands, read from the files its stages leave: done, running, queued, failed, interrupted, waiting;
errors; time left.

Used by ``biasflow status`` while a sweep runs, and by ``biasflow run`` to write a partial report (and log the
finished jobs to MLflow) when some jobs failed, saying which and how to re-run just them.

Sources: the outputs; Snakemake's incomplete markers (a job started and has not finished); the rule logs (the error
a stage logged); on SLURM the attempts file ``biasflow.slurm`` writes (every attempt's job id, what it asked for, its
SLURM state and cause: a job SLURM stopped, cancelled or killed logs no error of its own) and ``squeue`` (a queued
job is PENDING, not running); and the run's owner (``owner.json`` in the run folder: the ``biasflow run`` process,
its Snakemake, their start times and host), so a run that was killed is not shown as running.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from base64 import urlsafe_b64encode
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from biasflow.errors import last_error

# blocked: a job this one needs (a download, the prepare of its items, the build of its model) failed
STATES = ("done", "running", "queued", "failed", "blocked", "interrupted", "waiting")


@dataclass
class JobState:
    model: str
    metric: str
    metric_dir: str
    state: str
    error: str | None = None
    log: str | None = None
    score_seconds: float | None = None
    slurm_state: str | None = None  # the SLURM state of the job's last attempt (TIMEOUT, CANCELLED, PENDING, ...)
    attempts: list[dict[str, Any]] | None = None  # per SLURM attempt: rule, attempt, jobid, mem_mb, runtime, state

    def attempts_text(self) -> str:
        """``score #1 1500 MB 1 min TIMEOUT; score #2 3000 MB 2 min COMPLETED``"""
        return "; ".join(f"{a['rule']} #{a['attempt']} {a.get('mem_mb', '?')} MB {a.get('runtime', '?')} min "
                         f"{a.get('state') or 'submitted'}" for a in self.attempts or [])


# ---------------------------------------------------------------------------------------------- the run's owner
def owner_path(plan: Mapping[str, Any]) -> Path:
    return Path(plan["paths"]["results"]) / "runs" / plan["plan_hash"] / "owner.json"


def process_start(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid, it names one
    process (pids are reused). None if there is no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_record(pid: int, snakemake_pid: int | None, command: str, workdir: str) -> dict[str, Any]:
    return {"pid": pid, "start": process_start(pid), "snakemake_pid": snakemake_pid,
            "snakemake_start": process_start(snakemake_pid) if snakemake_pid else None,
            "host": socket.gethostname(), "command": command, "workdir": str(workdir), "started": time.time()}


def read_owner(plan: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return json.loads(owner_path(plan).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def owner_alive(owner: Mapping[str, Any] | None) -> bool | None:
    """Whether the run that owns the plan is still running: True, False (ended, or its processes are gone), None
    (unknown: no record, or it runs on another host)."""
    if not owner:
        return None
    if owner.get("ended"):
        return False
    if owner.get("host") != socket.gethostname():
        return None
    for pid_key, start_key in (("pid", "start"), ("snakemake_pid", "snakemake_start")):
        pid = owner.get(pid_key)
        if pid and owner.get(start_key) and process_start(int(pid)) == owner[start_key]:
            return True
    return False


def owner_text(owner: Mapping[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(owner.get("started") or 0))
    return f"biasflow pid {owner.get('pid')} on {owner.get('host')}, started {when}"


# ---------------------------------------------------------------------------------------------- SLURM attempts
def _norm(path: str, workdir: Path) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.relative_to(workdir.resolve())
        except ValueError:
            pass
    return os.path.normpath(str(p))


def attempts_by_output(workdir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each output path -> the attempt events of the jobs that write it, oldest first."""
    from biasflow.slurm import read_attempts

    out: dict[str, list[dict[str, Any]]] = {}
    for event in read_attempts(workdir):
        for path in event.get("output") or []:
            out.setdefault(_norm(path, workdir), []).append(event)
    return out


def _attempt_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (rule, attempt, job id): what it asked for and how it ended."""
    rows: dict[tuple, dict[str, Any]] = {}
    for e in events:
        key = (e.get("rule"), e.get("jobid"))
        row = rows.setdefault(key, {"rule": e.get("rule"), "attempt": e.get("attempt"), "jobid": e.get("jobid"),
                                    "mem_mb": (e.get("resources") or {}).get("mem_mb"),
                                    "runtime": (e.get("resources") or {}).get("runtime"), "state": None,
                                    "cause": None, "slurm_log": e.get("slurm_log"), "time": e.get("time")})
        if e.get("event") in ("failed", "finished"):
            row.update(state=e.get("state"), cause=e.get("cause"),
                       log=(e.get("kept_logs") or [None])[0] or e.get("slurm_log"))
    return sorted(rows.values(), key=lambda r: r.get("time") or 0)


def log_paths(job: Mapping[str, Any]) -> tuple[str, str]:
    """The score and metric rule logs of a job (workflow/rules/metrics.smk names them after the outputs)."""
    results = job.get("results") or str(Path(job["metric_dir"]).parents[3])
    scores = job["scores_path"]
    score_log = scores.replace(f"{results}/scores/", f"{results}/logs/score/", 1).removesuffix(".parquet") + ".log"
    metric_log = job["metric_dir"].replace(f"{results}/metrics/", f"{results}/logs/metric/", 1) + ".log"
    return score_log, metric_log


def _incomplete(path: str, workdir: Path) -> bool:
    """Snakemake marks an output incomplete while its job runs (``.snakemake/incomplete/<base64 of the path>``)."""
    root = workdir / ".snakemake" / "incomplete"
    if not root.is_dir():
        return False
    b64 = urlsafe_b64encode(path.encode()).decode()
    return (root / b64).exists() if len(b64) < 250 else any(p.name.endswith(b64[-200:]) for p in root.rglob("*"))


def _at(path: str, workdir: Path) -> Path:
    return Path(path) if Path(path).is_absolute() else workdir / path


def upstream_failure(job: Mapping[str, Any], paths: Mapping[str, Any], workdir: Path,
                     benchmarks: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
    """(cause, log) of a failed job that ``job`` needs and that left no output: a download of the files its model
    is built from (``benchmarks``: the plan's, which hold the demo model's training texts), the build of its model,
    a download of its benchmark's files, the prepare of its items (their rules' logs: workflow/rules/data.smk,
    models.smk). None when none failed."""
    results = job.get("results") or paths.get("results") or "results"
    resources = paths.get("resources") or "resources"
    needed: list[tuple[str, str, str]] = []  # (what, output, log)

    def downloads(benchmark: str, bcfg: Mapping[str, Any] | None, why: str = "") -> None:
        for spec in ((bcfg or {}).get("files") or {}).values():
            filename = (spec or {}).get("filename")
            if filename:
                needed.append((f"download {benchmark}/{filename}{why}", f"{resources}/datasets/{benchmark}/{filename}",
                               f"{results}/logs/download/{benchmark}/{filename}.log"))

    model = job.get("model") or {}
    if model.get("build") and model.get("path"):
        from biasflow.models.demo import TRAINING_BENCHMARK

        name = Path(str(model["path"])).name
        downloads(TRAINING_BENCHMARK, (benchmarks or {}).get(TRAINING_BENCHMARK),
                  f" (the training text of build_demo_model {name})")
        needed.append((f"build_demo_model {name}", str(model["path"]), f"{results}/logs/build_model/{name}.log"))
    items = job.get("items_path")
    if items:
        benchmark = job.get("benchmark")
        downloads(str(benchmark), job.get("benchmark_cfg"))
        needed.append((f"prepare {benchmark}", items, f"{results}/logs/prepare/{Path(items).stem}.log"))
    for what, output, log in needed:
        if _at(output, workdir).exists():
            continue
        error = last_error(str(_at(log, workdir)))
        if error:
            return f"blocked by {what}, which failed: {error}", log
    return None


_SNAKEMAKE_ERROR = re.compile(r"^(\w+(?:Error|Exception))(?: in .*?)?:$")


def snakemake_failure(workdir: Path, owner: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
    """(cause, log) where Snakemake itself failed in the run's last invocation, so no job of the plan could start:
    a broken Snakefile or rule file, an error in building the DAG. Read from Snakemake's own log of that invocation
    (``.snakemake/log/<time>.snakemake.log``, the newest, if written after the run's owner record), which holds the
    error as ``<Exception> in file "...", line N:`` and its message. None when there is no such log or it records a
    job's failure (``Error in rule ...``: the job's own log names the cause) or no error."""
    logs = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    if not logs:
        return None
    log = logs[-1]
    try:
        if owner and owner.get("started") and log.stat().st_mtime < float(owner["started"]) - 1:
            return None  # an earlier invocation's
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    if any(line.startswith("Error in rule ") for line in lines):
        return None
    for i, line in enumerate(lines):
        m = _SNAKEMAKE_ERROR.match(line.strip())
        if not m:
            continue
        message = []
        for more in lines[i + 1:]:
            if not more.strip() or more.startswith("  File ") or more.strip() == "None":
                break
            message.append(more.strip())
        text = " ".join(message).rstrip(":")
        return f"{line.strip()} {text}".strip()[:500], str(log)
    return None


def run_level_failures(plan: Mapping[str, Any], workdir: Path) -> list[tuple[str, str, str]]:
    """(rule, cause, log) of the run-level jobs that failed and left no output: the plan copy, the aggregate."""
    results = (plan.get("paths") or {}).get("results") or "results"
    run_dir = f"{results}/runs/{plan['plan_hash']}"
    out = []
    for rule, output in (("plan", f"{run_dir}/plan.json"), ("aggregate", f"{run_dir}/aggregate.parquet")):
        log = f"{results}/logs/{rule}/{plan['plan_hash']}.log"
        if not _at(output, workdir).exists():
            error = last_error(str(_at(log, workdir)))
            if error:
                out.append((rule, error, log))
    return out


def job_states(plan: Mapping[str, Any], workdir: str | os.PathLike | None = None) -> list[JobState]:
    """Each plan job's state. ``workdir``: Snakemake's working directory (default: the one the run's owner record
    names, else the current directory)."""
    owner = read_owner(plan)
    workdir = Path(workdir if workdir is not None else (owner or {}).get("workdir") or ".")
    alive = owner_alive(owner)
    attempts = attempts_by_output(workdir)
    pending: list[tuple[int, str]] = []  # (index in out, SLURM job id) of submitted attempts not yet ended
    # Snakemake itself failed (a broken Snakefile): every job not done is blocked by it
    stopped = snakemake_failure(workdir, owner) if alive is not True else None
    workflow_failure = (f"blocked by the workflow, which Snakemake could not run: {stopped[0]}", stopped[1]) \
        if stopped else None
    out = []
    for job in plan["jobs"]:
        mdir = job["metric_dir"]
        score_log, metric_log = log_paths(job)
        seconds = None
        meta = Path(f"{job['scores_path']}.meta.json")
        if meta.exists():
            try:
                seconds = float(json.loads(meta.read_text()).get("seconds"))
            except (ValueError, TypeError, json.JSONDecodeError):
                pass
        name = job["model"]["name"]
        events = sorted((e for path in (job.get("items_path"), job["scores_path"], f"{mdir}/aggregate.parquet")
                         if path for e in attempts.get(_norm(path, workdir), [])), key=lambda e: e.get("time") or 0)
        # the job's own attempts (score, metric), and a shared prepare job's only where it failed
        rows = [r for r in _attempt_rows(events) if r["rule"] != "prepare" or r["state"] not in (None, "COMPLETED")]
        rows = rows or None
        last = rows[-1] if rows else None
        state = JobState(name, job["metric"], mdir, "waiting", score_seconds=seconds, attempts=rows,
                         slurm_state=(last or {}).get("state"))
        out.append(state)
        # done: its results are there and its items too (Snakemake removes a dataset's items table only to make it
        # again, after its raw file changed: until then the results on disk are of the data before)
        if (Path(mdir) / "aggregate.parquet").exists() and (not job.get("items_path")
                                                           or Path(job["items_path"]).exists()):
            state.state = "done"
            continue
        started = _incomplete(job["scores_path"], workdir) or _incomplete(f"{mdir}/aggregate.parquet", workdir)
        # its last cluster attempt failed, and no live run has started it again
        if last and last["state"] not in (None, "COMPLETED") and not (started and alive):
            state.state = "failed"
            state.error = f"SLURM {last['state']} ({last['rule']}, attempt {last['attempt']}): {last['cause']}"
            state.log = last.get("log")
            continue
        if started or (last and last["state"] is None):
            if alive is False:
                state.state = "interrupted"
                state.error = (f"the run stopped ({owner_text(owner)}) before this job finished"
                               if not (owner or {}).get("ended") else
                               "the run ended before this job finished")
            else:
                state.state = "running"
                if last and last["state"] is None and last.get("jobid"):
                    pending.append((len(out) - 1, str(last["jobid"])))
            continue
        for log in (metric_log, score_log) if Path(job["scores_path"]).exists() else (score_log,):
            error = last_error(log)
            if error:
                state.state, state.error, state.log = "failed", error, log
                break
        if state.state == "waiting":
            blocker = workflow_failure or upstream_failure(job, plan.get("paths") or {}, workdir,
                                                           plan.get("benchmarks"))
            if blocker:
                state.state, state.error, state.log = "blocked", blocker[0], blocker[1]
    if pending:  # PENDING on SLURM is queued, not running
        from biasflow.slurm import squeue_states

        known = squeue_states(jid for _, jid in pending) or {}
        for i, jid in pending:
            slurm = known.get(jid)
            if slurm:
                out[i].slurm_state = slurm
                if slurm in ("PENDING", "CONFIGURING", "REQUEUED", "SUSPENDED"):
                    out[i].state = "queued"
    return out


def summary(states: Sequence[JobState], cores: int = 1) -> dict[str, Any]:
    counts = {s: sum(1 for j in states if j.state == s) for s in STATES}
    measured = [j.score_seconds for j in states if j.state == "done" and j.score_seconds]
    left = counts["waiting"] + counts["running"] + counts["queued"]
    eta = (sum(measured) / len(measured)) * left / max(1, cores) if measured and left else None
    return {"total": len(states), **counts, "eta_seconds": eta}


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown (no finished job measured yet)"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def status_text(plan: Mapping[str, Any], workdir: str | os.PathLike | None = None, cores: int = 1) -> str:
    states = job_states(plan, workdir)
    s = summary(states, cores)
    owner = read_owner(plan)
    alive = owner_alive(owner)
    lines = [f"plan {plan['plan_hash']}: {s['total']} jobs: {s['done']} done, {s['running']} running, "
             f"{s['queued']} queued, {s['failed']} failed, {s['blocked']} blocked by a failed job, "
             f"{s['interrupted']} interrupted, {s['waiting']} waiting"]
    if owner and alive is False and not owner.get("ended"):
        lines.append(f"the run is not running: {owner_text(owner)} is gone (killed, or the machine restarted)")
    elif owner and alive is True:
        lines.append(f"running: {owner_text(owner)}")
    if s["running"] or s["queued"] or (s["waiting"] and alive is not False):
        lines.append(f"time left (from finished jobs' scoring times, {cores} at a time): "
                     f"{format_duration(s['eta_seconds'])}")
    elif not (s["waiting"] or s["interrupted"] or s["failed"] or s["blocked"]):
        lines.append("nothing left to run")
    run_failures = run_level_failures(plan, Path(workdir if workdir is not None else
                                                 (owner or {}).get("workdir") or "."))
    for rule, error, log in run_failures:
        lines.append(f"  {'failed':<8} {rule} (the run's tables): {error}")
        lines.append(f"           log: {log}")
    for j in states:
        if j.state in ("failed", "blocked", "running", "queued", "interrupted"):
            head = j.state + (f" ({j.slurm_state})" if j.slurm_state and j.state != "failed" else "")
            lines.append(f"  {head:<8} {j.model} / {j.metric}" + (f": {j.error}" if j.error else ""))
            if j.attempts and j.state == "failed":
                lines.append(f"           attempts: {j.attempts_text()}")
            if j.log:
                lines.append(f"           log: {j.log}")
    if s["failed"] or s["blocked"] or s["interrupted"] or run_failures or (s["waiting"] and alive is False):
        command = (owner or {}).get("command") or "the same biasflow run command"
        lines.append(f"Fix the cause (if any) and resume with: {command}\n(finished jobs are kept; only the failed, "
                     "blocked, interrupted and waiting ones run)")
    lines.append(f"(as of {time.strftime('%H:%M:%S')})")
    return "\n".join(lines)


__all__ = ["job_states", "summary", "status_text", "JobState", "last_error", "owner_record", "read_owner",
           "owner_alive", "owner_path", "process_start", "STATES"]
