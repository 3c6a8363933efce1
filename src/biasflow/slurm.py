"""What biasflow adds to snakemake-executor-plugin-slurm so an overnight sweep's failures are visible the next morning.

The Snakefile calls ``install()`` in the Snakemake process that submits the jobs; it wraps the plugin's executor
(class attributes only, so it works for every executor instance, whatever the order of creation):

* **Every attempt is recorded** in ``.snakemake/biasflow/jobs.jsonl`` (``ATTEMPTS``, beside Snakemake's own state in
  the working directory): submission (SLURM job id, attempt, what it asked for: memory, time limit, CPUs, GPUs,
  its SLURM log), then success or failure with the SLURM state (``TIMEOUT``, ``CANCELLED``, ``OUT_OF_MEMORY``,
  ``FAILED``, ``NODE_FAIL``, ...) and the cause in words (``failure_cause``: from ``scontrol show job`` while the
  controller remembers the job, the job's SLURM log, and the rule's own log). ``biasflow status`` and the run report
  read it (``biasflow.progress``). A failed attempt's rule logs are copied to ``<log>.attempt<N>`` before the retry
  writes the log again.
* **A status query that fails does not lose the jobs.** The plugin drops every active job from its watch list when
  its status command fails (the controller is down, or it fell back to ``sacct`` on a cluster without accounting):
  Snakemake then waits forever for jobs nobody polls. Here such jobs stay watched, the failure is said (with the
  command's error, again every 10 minutes while it lasts, with the command that resumes the run) and so is the
  controller's return, and polling goes on with ``squeue`` (``sacct`` only where accounting answers: a controller
  that is down no longer switches the plugin to ``sacct``, which fails for good on a cluster without accounting).
* **Status checks at least every ``BIASFLOW_SLURM_MAX_STATUS_INTERVAL_S`` seconds** where that is set (the plugin
  waits up to 180 s between checks; the tests set 5).
* **No account guessing.** Without ``slurm_account`` (the profile's ``default-resources``) the plugin asks ``sacct``
  for one on every submission and prints its errors; here it says once that none is set and submits without
  ``-A`` (the cluster's default account).

These wrap and replace functions of the plugin, so they are installed only on the plugin code they were written for
(``biasflow.upstream``, checked by ``tests/test_upstream.py``); the bugs and the fixes to send upstream are in
docs/upstream.md.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

ATTEMPTS = Path(".snakemake") / "biasflow" / "jobs.jsonl"
FAILED_STATES = ("BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "ERROR",
                 "PREEMPTED")
REMIND_S = 600  # during a controller outage, say every 10 min that it lasts
RESUME_HINT = "run the same biasflow command again: finished jobs are kept, the failed and unfinished ones run"


# ---------------------------------------------------------------------------------------------- the attempts file
def record(event: dict[str, Any], workdir: str | os.PathLike = ".") -> None:
    """Append one event to the attempts file (one JSON line, one write: lines of concurrent writers never mix)."""
    path = Path(workdir) / ATTEMPTS
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps({"time": time.time(), **event}, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_attempts(workdir: str | os.PathLike = ".") -> list[dict[str, Any]]:
    path = Path(workdir) / ATTEMPTS
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash mid-write
            continue
    return out


# ---------------------------------------------------------------------------------------------- what SLURM says
def _run(cmd: list[str], timeout: float = 20) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def scontrol_job(jobid: str) -> dict[str, str]:
    """``scontrol show job -o`` as a dict (empty when the controller no longer knows the job or does not answer)."""
    rc, out, _ = _run(["scontrol", "show", "job", "-o", str(jobid)])
    if rc != 0 or not out.strip():
        return {}
    fields: dict[str, str] = {}
    try:
        tokens = shlex.split(out.strip().splitlines()[0])
    except ValueError:  # an unbalanced quote in some field: plain words will do
        tokens = out.split()
    for token in tokens:
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def squeue_states(jobids: Iterable[str]) -> dict[str, str] | None:
    """SLURM state of each job id the controller still knows (PENDING, RUNNING, ...); None if squeue fails."""
    ids = [str(j) for j in jobids if j]
    if not ids:
        return {}
    rc, out, _ = _run(["squeue", "--noheader", "--states=all", "--format=%i|%T", "--jobs", ",".join(ids)])
    if rc != 0:
        return None
    return dict(line.strip().split("|", 1) for line in out.splitlines() if "|" in line)


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_cause(state: str, job: dict[str, str], slurm_log_text: str, rule_error: str | None,
                  asked: dict[str, Any]) -> tuple[str, str]:
    """(SLURM state, the cause in words) of a failed job, from its ``scontrol`` fields (may be empty), its SLURM
    log and the error its rule logged (may be None)."""
    state = (job.get("JobState") or state or "UNKNOWN").upper()
    mem, runtime = asked.get("mem_mb"), asked.get("runtime")
    exit_code, _, sig = (job.get("ExitCode") or "").partition(":")
    log = slurm_log_text or ""
    killed = re.search(r"\b(Killed|signal 9|SIGKILL)\b", log) or sig == "9" or exit_code == "137"
    if state == "TIMEOUT" or "DUE TO TIME LIMIT" in log:
        return "TIMEOUT", f"stopped by SLURM at its time limit ({runtime} min asked)"
    if state == "OUT_OF_MEMORY" or re.search(r"oom[-_ ]kill|Exceeded job memory limit|out of memory", log, re.I):
        return "OUT_OF_MEMORY", f"killed for exceeding its memory ({mem} MB asked)"
    if state == "CANCELLED" or "CANCELLED AT" in log:
        by = re.search(r"CANCELLED AT \S+ (?:DUE TO (.+?) )?\*\*\*", log)
        why = f" ({by.group(1).lower()})" if by and by.group(1) else ""
        return "CANCELLED", f"cancelled (scancel, or an administrator){why}"
    if state == "NODE_FAIL":
        return state, f"its node failed ({job.get('NodeList', 'node unknown')})"
    if state == "PREEMPTED":
        return state, "preempted by a higher-priority job"
    if killed:
        return state, (f"killed with SIGKILL, as the kernel's out-of-memory killer does ({mem} MB asked), or by "
                       "hand")
    if rule_error:
        return state, rule_error
    if sig and sig != "0":
        return state, f"killed by {_signal_name(int(sig))}" if sig.isdigit() else f"exit {job.get('ExitCode')}"
    if exit_code and exit_code != "0":
        return state, f"exited with code {exit_code} (see its SLURM log)"
    reason = job.get("Reason")
    return state, f"SLURM reason: {reason}" if reason and reason != "None" else "no cause recorded (see its SLURM log)"


def _read_tail(path: str | None, limit: int = 20000) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------- the executor patch
def _job_fields(job_info) -> dict[str, Any]:
    job = job_info.job
    res = {}
    for key in ("mem_mb", "runtime", "gpu", "slurm_partition"):
        try:
            value = job.resources.get(key)
        except Exception:  # noqa: BLE001 - a resource that cannot be read is left out
            value = None
        if value is not None:
            res[key] = value
    res["cpus"] = getattr(job, "threads", None)
    aux = job_info.aux or {}
    try:
        wildcards = dict(job.wildcards)
    except Exception:  # noqa: BLE001 - group jobs have none
        wildcards = {}
    return {"rule": getattr(job, "name", None), "wildcards": wildcards, "output": [str(o) for o in job.output],
            "log": [str(f) for f in job.log], "attempt": int(getattr(job, "attempt", 1) or 1),
            "jobid": job_info.external_jobid, "resources": res,
            "slurm_log": str(aux["slurm_logfile"]) if aux.get("slurm_logfile") else None}


def _keep_attempt_logs(fields: dict[str, Any]) -> list[str]:
    """Copy a failed attempt's rule logs to ``<log>.attempt<N>``: the retry writes the rule log again."""
    kept = []
    for log in fields.get("log") or []:
        if os.path.exists(log):
            dest = f"{log}.attempt{fields['attempt']}"
            try:
                shutil.copyfile(log, dest)
                kept.append(dest)
            except OSError:
                pass
    return kept


def _rule_error(logs: list[str]) -> str | None:
    from biasflow.errors import last_error

    for log in logs:
        err = last_error(log)
        if err:
            return err
    return None


def _state_from_message(msg: str | None) -> str:
    m = re.search(r"SLURM status is: '(\w+)'", msg or "")
    return m.group(1) if m else ""


class _Watch:
    """Per executor: what was said once."""

    def __init__(self):
        self.account_said = False


def _watch(executor) -> _Watch:
    w = executor.__dict__.get("_biasflow_watch")
    if w is None:
        w = executor.__dict__["_biasflow_watch"] = _Watch()
    return w


def _say(executor, text: str, warn: bool = True) -> None:
    logger = getattr(executor, "logger", None)
    if logger is not None:
        (logger.warning if warn else logger.info)(text)
    else:  # pragma: no cover
        print(text, flush=True)


def accounting_works() -> bool:
    """Whether ``sacct`` answers on this cluster (not where accounting storage is disabled)."""
    if shutil.which("sacct") is None:
        return False
    rc, _, err = _run(["sacct", "--noheader", "-X", "--format=JobIdRaw", "--starttime", "now-1minutes"], timeout=30)
    return rc == 0 and "disabled" not in err.lower()


def install() -> bool:
    """Wrap the SLURM executor (idempotent). False when the plugin is not installed, or when its code is not the
    code these wrappers were written for (``biasflow.upstream``: a warning says so)."""
    try:
        import snakemake_executor_plugin_slurm as plugin
    except ImportError:
        return False
    Executor = plugin.Executor
    if getattr(Executor, "_biasflow_installed", False):
        return True
    from biasflow.upstream import unchanged_or_warn

    if not unchanged_or_warn("slurm", "the SLURM executor fixes (attempt records, outage handling, no account "
                                      "guessing)"):
        return False
    Executor._biasflow_installed = True

    # ---- status command: keep the last MinJobAge the controller told (a down controller must not switch the
    # status command to sacct), and use sacct only where accounting answers
    original_min_job_age = plugin.get_min_job_age
    last_age: dict[str, Any] = {}

    def get_min_job_age():
        value = original_min_job_age()
        if value is not None:
            last_age["value"] = value
            return value
        return last_age.get("value")

    plugin.get_min_job_age = get_min_job_age
    original_available = plugin.is_query_tool_available
    sacct_ok: dict[str, bool] = {}

    def is_query_tool_available(tool):
        if tool == "sacct":
            if "sacct" not in sacct_ok:
                sacct_ok["sacct"] = original_available("sacct") and accounting_works()
            return sacct_ok["sacct"]
        return original_available(tool)

    plugin.is_query_tool_available = is_query_tool_available

    # ---- a status query that fails is said (once per outage, with the command's error), and so is its return
    outage: dict[str, Any] = {}

    async def query_job_status(command: str, logger):
        import asyncio
        import csv
        from io import StringIO

        started = time.time()
        err = ""
        try:
            proc = await asyncio.create_subprocess_exec(*shlex.split(command), stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            out, err_b = await asyncio.wait_for(proc.communicate(), timeout=60)
            err = err_b.decode(errors="replace").strip() if err_b else ""
            if proc.returncode == 0:
                if outage.get("since") is not None:
                    logger.warning(f"biasflow: the SLURM controller answers again (after "
                                   f"{time.time() - outage['since']:.0f} s); following the jobs.")
                outage.clear()
                rows = csv.reader(StringIO(out.decode(errors="replace")), delimiter="|")
                return {r[0].strip(): r[1].strip() for r in rows if len(r) >= 2 and r[0].strip()}, \
                    time.time() - started
            err = err or f"exit {proc.returncode}"
        except (asyncio.TimeoutError, OSError) as exc:
            err = f"{type(exc).__name__}: {exc}" if str(exc) else "no answer within 60 s"
        if outage.get("since") is None:
            outage["since"] = outage["said"] = started
            logger.warning(f"biasflow: the SLURM controller does not answer ({shlex.split(command)[0]}: "
                           f"{err[:300]}). The jobs are still watched and polled until it is back; if you stop "
                           f"now, {RESUME_HINT}.")
        elif time.time() - outage["said"] > REMIND_S:
            outage["said"] = time.time()
            logger.warning(f"biasflow: the SLURM controller has not answered for "
                           f"{(time.time() - outage['since']) / 60:.0f} min ({err[:300]}); still polling. If you "
                           f"stop now, {RESUME_HINT}.")
        return None, None

    plugin.query_job_status = query_job_status

    # ---- what each attempt asked for, and how it ended
    original_submission = Executor.report_job_submission
    original_success = Executor.report_job_success
    original_error = Executor.report_job_error
    original_check = Executor.check_active_jobs
    original_account = Executor.get_account_arg

    def report_job_submission(self, job_info, *args, **kwargs):
        try:
            record({"event": "submitted", **_job_fields(job_info)})
        except Exception as exc:  # noqa: BLE001 - the record must never stop a run
            _say(self, f"biasflow: could not record a submission: {exc}")
        return original_submission(self, job_info, *args, **kwargs)

    def report_job_success(self, job_info, *args, **kwargs):
        try:
            fields = _job_fields(job_info)
            record({"event": "finished", "state": "COMPLETED", **fields})
        except Exception:  # noqa: BLE001
            pass
        return original_success(self, job_info, *args, **kwargs)

    def report_job_error(self, job_info, msg=None, *args, **kwargs):
        try:
            fields = _job_fields(job_info)
            kept = _keep_attempt_logs(fields)
            info = scontrol_job(fields["jobid"]) if fields.get("jobid") else {}
            state, cause = failure_cause(_state_from_message(msg), info, _read_tail(fields.get("slurm_log")),
                                         _rule_error(fields["log"]), fields["resources"])
            record({"event": "failed", "state": state, "cause": cause, "kept_logs": kept,
                    "exit_code": info.get("ExitCode"), **fields})
            retry = fields["attempt"] <= int(getattr(job_info.job, "restart_times", 0) or 0)
            msg = (f"SLURM job {fields['jobid']} ({fields['rule']}, attempt {fields['attempt']}: "
                   f"{fields['resources'].get('mem_mb')} MB, {fields['resources'].get('runtime')} min) ended "
                   f"{state}: {cause}." + (" Retrying with more memory and time." if retry else "")
                   + (f" SLURM log: {fields['slurm_log']}" if fields.get("slurm_log") else ""))
        except Exception as exc:  # noqa: BLE001
            _say(self, f"biasflow: could not record a failed job: {exc}")
        return original_error(self, job_info, msg, *args, **kwargs)

    async def check_active_jobs(self, active_jobs):
        reported: set[str] = set()
        self.__dict__["_biasflow_reported"] = reported
        seen = set()
        async for job_info in original_check(self, active_jobs):
            seen.add(id(job_info))
            yield job_info
        self.__dict__.pop("_biasflow_reported", None)
        lost = [j for j in active_jobs if id(j) not in seen and j.external_jobid not in reported]
        if lost and len(lost) == len(active_jobs):
            # every status query of this check failed: the plugin reported nothing and kept nothing (Snakemake would
            # wait forever for jobs nobody polls); keep watching them all, checking again within a minute
            self.next_seconds_between_status_checks = min(self.next_seconds_between_status_checks or 30, 60)
        for j in lost:  # neither reported nor yielded: never lose a job
            yield j
        cap = os.environ.get("BIASFLOW_SLURM_MAX_STATUS_INTERVAL_S")
        if cap and self.next_seconds_between_status_checks:
            self.next_seconds_between_status_checks = min(self.next_seconds_between_status_checks, float(cap))

    def report_success_marking(self, job_info, *args, **kwargs):
        reported = self.__dict__.get("_biasflow_reported")
        if reported is not None:
            reported.add(job_info.external_jobid)
        return report_job_success(self, job_info, *args, **kwargs)

    def report_error_marking(self, job_info, msg=None, *args, **kwargs):
        reported = self.__dict__.get("_biasflow_reported")
        if reported is not None:
            reported.add(job_info.external_jobid)
        return report_job_error(self, job_info, msg, *args, **kwargs)

    def get_account_arg(self, job):
        settings = self.workflow.executor_settings
        if job.resources.get("slurm_account") or getattr(settings, "no_account", False):
            yield from original_account(self, job)
            return
        watch = _watch(self)
        if not watch.account_said:
            watch.account_said = True
            _say(self, "biasflow: no SLURM account set: jobs are submitted without -A (the cluster's default "
                       "account). To choose one, set slurm_account under default-resources in the profile "
                       "(workflow/profiles/slurm/config.yaml).", warn=False)
        yield ""

    Executor.report_job_submission = report_job_submission
    Executor.report_job_success = report_success_marking
    Executor.report_job_error = report_error_marking
    Executor.check_active_jobs = check_active_jobs
    Executor.get_account_arg = get_account_arg
    return True


__all__ = ["install", "record", "read_attempts", "failure_cause", "scontrol_job", "squeue_states", "ATTEMPTS",
           "FAILED_STATES", "RESUME_HINT"]
