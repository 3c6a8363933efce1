"""Where a plan stands, read from the files its stages leave: done, running, failed, waiting; errors; time left.

Used by ``biasflow status`` while a sweep runs, and by ``biasflow run`` to write a partial report (and log the
finished jobs to MLflow) when some jobs failed, saying which and how to re-run just them.
"""
from __future__ import annotations

import json
import os
import re
import time
from base64 import urlsafe_b64encode
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

STATES = ("done", "running", "failed", "waiting")


@dataclass
class JobState:
    model: str
    metric: str
    metric_dir: str
    state: str
    error: str | None = None
    log: str | None = None
    score_seconds: float | None = None


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


_ERROR = re.compile(r" (?:ERROR|CRITICAL) [\w.]+: (.*)$")


def last_error(log: str) -> str | None:
    """The error a stage logged (biasflow.stages.setup_logging writes it with its traceback), in one line."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for i in range(len(lines) - 1, -1, -1):
        m = _ERROR.search(lines[i])
        if m:
            msg = m.group(1).removeprefix("error: ")
            if msg == "stage failed":  # an unexpected exception: its last traceback line says what
                tail = [ln for ln in lines[i + 1:] if ln and not ln.startswith(" ")]
                msg = tail[-1] if tail else msg
            return msg[:500]
    return None


def job_states(plan: Mapping[str, Any], workdir: str | os.PathLike = ".") -> list[JobState]:
    workdir = Path(workdir)
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
        if (Path(mdir) / "aggregate.parquet").exists():
            out.append(JobState(name, job["metric"], mdir, "done", score_seconds=seconds))
            continue
        if _incomplete(job["scores_path"], workdir) or _incomplete(f"{mdir}/aggregate.parquet", workdir):
            out.append(JobState(name, job["metric"], mdir, "running", score_seconds=seconds))
            continue
        for log in (metric_log, score_log) if Path(job["scores_path"]).exists() else (score_log,):
            error = last_error(log)
            if error:
                out.append(JobState(name, job["metric"], mdir, "failed", error=error, log=log, score_seconds=seconds))
                break
        else:
            out.append(JobState(name, job["metric"], mdir, "waiting", score_seconds=seconds))
    return out


def summary(states: Sequence[JobState], cores: int = 1) -> dict[str, Any]:
    counts = {s: sum(1 for j in states if j.state == s) for s in STATES}
    measured = [j.score_seconds for j in states if j.state == "done" and j.score_seconds]
    left = counts["waiting"] + counts["running"]
    eta = (sum(measured) / len(measured)) * left / max(1, cores) if measured and left else None
    return {"total": len(states), **counts, "eta_seconds": eta}


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown (no finished job measured yet)"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def status_text(plan: Mapping[str, Any], workdir: str | os.PathLike = ".", cores: int = 1) -> str:
    states = job_states(plan, workdir)
    s = summary(states, cores)
    lines = [f"plan {plan['plan_hash']}: {s['total']} jobs: {s['done']} done, {s['running']} running, "
             f"{s['failed']} failed, {s['waiting']} waiting",
             f"time left (from finished jobs' scoring times, {cores} at a time): {format_duration(s['eta_seconds'])}"
             if s["running"] or s["waiting"] else "nothing left to run"]
    for j in states:
        if j.state in ("failed", "running"):
            lines.append(f"  {j.state:<8} {j.model} / {j.metric}" + (f": {j.error}\n           log: {j.log}"
                                                                         if j.error else ""))
    if s["failed"]:
        lines.append("Fix the cause and run the same command again: finished jobs are kept, only the failed and "
                     "waiting ones run.")
    lines.append(f"(as of {time.strftime('%H:%M:%S')})")
    return "\n".join(lines)


__all__ = ["job_states", "summary", "status_text", "JobState", "last_error"]
