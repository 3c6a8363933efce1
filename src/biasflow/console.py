"""``biasflow run``'s compact console: jobs done of total, what runs now (model, benchmark, progress, time left),
each failure as it happens (rule, cause, log), and Snakemake's full output in a log file.

It reads no console text. Snakemake runs with the logger plugin ``biasflow`` (``snakemake_logger_plugin_biasflow``),
which appends its structured log records (job info, started, finished, error, progress, run info) as JSON lines to
the file ``BIASFLOW_EVENTS`` names; the scorers' progress bars (``biasflow.bars``) write where they stand to
``BIASFLOW_PROGRESS_DIR``. ``biasflow run`` writes Snakemake's own output (its job blocks, the jobs' stdout and
stderr: model load reports, warnings, progress bars) to the full log, ``BIASFLOW_FULL_LOG``
(``<results>/logs/run/<plan hash>-<time>.log``).

On a terminal the view is a ``rich`` live display; elsewhere (CI logs, ``| tee``, SLURM batch logs) it is plain
text, one line per event (``[12/40] done score demo_bert crows_pairs (1m02s)``), no cursor movement, and a line on
what runs at most every ``PLAIN_EVERY_S`` seconds. ``biasflow run -v`` shows Snakemake's raw output instead.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, TextIO

EVENTS_ENV = "BIASFLOW_EVENTS"
FULL_LOG_ENV = "BIASFLOW_FULL_LOG"
PLAIN_EVERY_S = 30.0
NOTE_CHARS = 200  # a job's warning on the console: its first line, cut to this length
LOGGER_ARGS = ["--logger", "biasflow"]  # Snakemake's option for the plugin (before an option: --logger takes 1+)


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stdout) is a terminal that can redraw a live view (not ``TERM=dumb``)."""
    stream = stream or sys.stdout
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(max(0.0, seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _rate(rate: float | None, unit: str) -> str:
    if not rate:
        return ""
    return f"{rate:.3g} {unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{unit}"


@dataclass
class ConsoleJob:
    jobid: Any
    rule: str = ""
    label: str = ""
    outputs: list[str] = field(default_factory=list)
    log: str | None = None
    started: float | None = None
    finished: float | None = None
    state: str = "running"  # running, done, failed
    attempt: int = 1
    progress: dict[str, Any] | None = None
    cause: str = ""


class JobLabels:
    """A job's words on the console, from its rule, wildcards and outputs and the plan: ``score demo_bert
    crows_pairs``, ``metric tiny_bert crows_pairs diff_threshold=0.1``, ``download crows_pairs/x.csv``."""

    def __init__(self, plan: Mapping[str, Any] | None, workdir: Path):
        self.by_output: dict[str, str] = {}
        self.models: dict[str, str] = {}
        jobs = list((plan or {}).get("jobs") or [])
        if not jobs:
            return
        try:
            from biasflow.report.sweep import job_table

            table = job_table(plan)
            settings = dict(zip(table["config_hash"], table["setting"]))
            self.models = dict(zip(table["model_key"], table["model"]))
        except Exception:  # noqa: BLE001 - labels are a nicety: fall back to the wildcards
            settings = {}
        for j in jobs:
            model = self.models.get(j.get("model_key"), j.get("model_key") or "")
            metric = j.get("metric", "")
            setting = settings.get(j.get("cfg_hash"), "")
            if j.get("scores_path"):
                self.by_output[self._abs(j["scores_path"], workdir)] = f"{model} {metric}"
            if j.get("metric_dir"):
                self.by_output[self._abs(j["metric_dir"], workdir)] = f"{model} {metric}" + (
                    f" {setting}" if setting else "")

    @staticmethod
    def _abs(path: str, workdir: Path) -> str:
        return os.path.normpath(path if os.path.isabs(path) else os.path.join(str(workdir), path))

    def label(self, rule: str, wildcards: Mapping[str, Any], outputs: list[str]) -> str:
        for out in outputs:
            out = os.path.normpath(out)
            if out in self.by_output:
                return f"{rule} {self.by_output[out]}"
            parent = os.path.dirname(out)
            if parent in self.by_output:  # a metric job's files lie in its folder
                return f"{rule} {self.by_output[parent]}"
        words = []
        for key, value in (wildcards or {}).items():
            if key.endswith("hash"):
                continue
            value = str(value)
            words.append(self.models.get(value) or re.sub(r"-[0-9a-f]{8}$", "", value) if key == "model_key"
                         else value)
        if rule == "download" and len(words) == 2:
            words = ["/".join(words)]
        return " ".join([rule, *words])


class RunConsole:
    """The compact view of one Snakemake run: ``env()`` for the child, ``start()``, then ``stop(exit_code)``."""

    def __init__(self, plan: Any, workdir: Path, stream: TextIO | None = None, live: bool | None = None,
                 plain_every_s: float = PLAIN_EVERY_S, poll_s: float | None = None):
        self.workdir = Path(workdir).resolve()
        self.stream = stream or sys.stdout
        self.live = is_terminal(self.stream) if live is None else live
        self.plain_every_s = plain_every_s
        self.poll_s = poll_s if poll_s is not None else (0.25 if self.live else 1.0)
        doc = json.loads(plan.to_json()) if hasattr(plan, "to_json") else dict(plan)
        self.plan_hash = doc.get("plan_hash", "")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        results = (doc.get("paths") or {}).get("results") or "results"
        self.log_shown = f"{results}/logs/run/{self.plan_hash}-{stamp}.log"  # as the user's paths read
        self.log_path = Path(self.log_shown) if os.path.isabs(self.log_shown) else self.workdir / self.log_shown
        self.channel = self.workdir / ".snakemake" / "biasflow" / "console" / f"{stamp}-{os.getpid()}"
        self.events_path = self.channel / "events.jsonl"
        self.progress_dir = self.channel / "progress"
        self.labels = JobLabels(doc, self.workdir)
        self.jobs: dict[Any, ConsoleJob] = {}
        self.stats: dict[str, int] = {}
        self.total: int | None = None
        self.done = 0
        self.failures: list[ConsoleJob] = []
        self.errors: list[str] = []
        self.began = time.time()
        self._offset = 0
        self._partial = ""
        self._last_plain = 0.0
        self._last_progress_poll = 0.0
        self._note_offsets: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------------------------------ set-up
    def env(self) -> dict[str, str]:
        """What the Snakemake child needs: the events file, the progress folder, the full log."""
        from biasflow.bars import PROGRESS_ENV

        return {EVENTS_ENV: str(self.events_path), PROGRESS_ENV: str(self.progress_dir),
                FULL_LOG_ENV: str(self.log_path)}

    def start(self, command: list[str] | None = None) -> None:
        self._remove_stale_channels()
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        self.events_path.touch()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w", encoding="utf-8") as f:
            if command:
                import shlex

                f.write("+ " + shlex.join(command) + "\n")
        self._say(f"biasflow: running plan {self.plan_hash} with Snakemake; its full log: {self.log_shown}")
        self._last_plain = time.monotonic()
        if self.live:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream, highlight=False)
            self._live = Live(self._renderable(), console=console, refresh_per_second=4, transient=True,
                              redirect_stdout=False, redirect_stderr=True)
            self._live.start()
        self._thread = threading.Thread(target=self._loop, name="biasflow-console", daemon=True)
        self._thread.start()

    def stop(self, exit_code: int | None = None) -> None:
        """Read the last events, close the live view and say how the run ended and where its full log is."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._poll()
        if self._live is not None:
            self._live.stop()
            self._live = None
        finished = sum(1 for j in self.jobs.values() if j.state == "done")
        total = self.total if self.total is not None else len(self.jobs)
        failed = [j for j in self.jobs.values() if j.state == "failed"]
        never = total - finished - len(failed) - len(self.running())
        words = (f"{finished} of {total} job(s) done" + (f", {len(failed)} failed" if failed else "")
                 + (f", {never} not run" if never > 0 and exit_code not in (None, 0) else ""))
        if exit_code not in (None, 0) and not failed:
            if self.errors:  # Snakemake itself stopped (a Snakefile that does not parse, a DAG error)
                self._say(f"biasflow: Snakemake stopped: {self.errors[0]}")
            elif not self.jobs:
                words = "Snakemake ran no job"
        self._say(f"biasflow: {words} in {duration(time.time() - self.began)}; Snakemake's full log: "
                  f"{self.log_shown}")
        import shutil

        shutil.rmtree(self.channel, ignore_errors=True)

    def _remove_stale_channels(self) -> None:
        """The channels of runs killed before they could remove theirs (kill -9): their process is gone."""
        import shutil

        for old in self.channel.parent.glob("*-*"):
            pid = old.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists() and Path("/proc/self").exists():
                shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------------------------------------------ events
    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._poll()
            except Exception as exc:  # noqa: BLE001 - the view must not stop the run
                self._say(f"biasflow: the console stopped updating ({exc}); the full log goes on: {self.log_shown}")
                return

    def _poll(self) -> None:
        with self._lock:
            for event in self._read_events():
                self._handle(event)
            now = time.monotonic()
            if now - self._last_progress_poll >= 1.0 or self._stop.is_set():
                self._last_progress_poll = now
                self._read_progress()
            if self._live is not None:
                self._live.update(self._renderable())
            elif self.plain_every_s is not None and now - self._last_plain >= self.plain_every_s:
                running = self.running()
                if running and not self._stop.is_set():
                    self._last_plain = now
                    self._say(self.progress_line(running))

    def _read_events(self) -> list[dict[str, Any]]:
        try:
            with open(self.events_path, "r", encoding="utf-8") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except OSError:
            return []
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # a line being written
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out

    def _read_notes(self) -> None:
        """The warnings jobs logged (``biasflow.bars.report_warnings``), each said once."""
        try:
            files = sorted(self.progress_dir.glob("*.notes.jsonl"))
        except OSError:
            return
        for path in files:
            try:
                with open(path, "rb") as f:
                    f.seek(self._note_offsets.get(path.name, 0))
                    data = f.read()
            except OSError:
                continue
            complete = data[:data.rfind(b"\n") + 1]
            self._note_offsets[path.name] = self._note_offsets.get(path.name, 0) + len(complete)
            for line in complete.decode("utf-8", errors="replace").splitlines():
                try:
                    note = json.loads(line)
                except json.JSONDecodeError:
                    continue
                outputs = {os.path.normpath(p) for p in note.get("outputs") or []}
                job = next((j for j in self.jobs.values() if outputs & {os.path.normpath(p) for p in j.outputs}),
                           None)
                where = f" ({job.label or job.rule})" if job else ""
                msg = str(note.get("msg", ""))
                if len(msg) > NOTE_CHARS:  # the whole text is in the job's log and the full log
                    msg = msg[:NOTE_CHARS].rstrip() + " ... (more in " + (job.log if job and job.log else
                                                                           self.log_shown) + ")"
                self._say(f"warning{where}: {msg}")

    def _read_progress(self) -> None:
        self._read_notes()
        running = [j for j in self.jobs.values() if j.state == "running"]
        if not running:
            return
        try:
            files = list(self.progress_dir.glob("*.json"))
        except OSError:
            return
        for path in files:
            try:
                state = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            outputs = {os.path.normpath(p) for p in state.get("outputs") or []}
            for job in running:
                if outputs & {os.path.normpath(p) for p in job.outputs} and (
                        job.started is None or float(state.get("time") or 0) >= job.started - 5):
                    job.progress = state

    def handle(self, event: Mapping[str, Any]) -> None:
        """One event of the plugin (``snakemake_logger_plugin_biasflow.event_of``)."""
        with self._lock:
            self._handle(event)

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event")
        t = float(event.get("t") or time.time())
        if kind == "run_info":
            self.stats = {k: int(v) for k, v in (event.get("stats") or {}).items() if k != "total"}
            if "total" in (event.get("stats") or {}):
                self.total = int(event["stats"]["total"])
        elif kind == "progress":
            self.done, self.total = int(event.get("done") or 0), int(event.get("total") or 0)
        elif kind == "job_started":
            for jobid in event.get("jobs") or []:
                job = self.jobs.setdefault(jobid, ConsoleJob(jobid))
                self._begin(job, t)
        elif kind == "job_info":
            job = self.jobs.setdefault(event.get("jobid"), ConsoleJob(event.get("jobid")))
            job.rule = event.get("rule") or job.rule
            job.outputs = list(event.get("output") or [])
            job.log = (event.get("log") or [None])[0]
            job.label = self.labels.label(job.rule, event.get("wildcards") or {}, job.outputs)
            self._begin(job, t)
        elif kind == "job_finished":
            job = self.jobs.setdefault(event.get("jobid"), ConsoleJob(event.get("jobid")))
            job.state, job.finished = "done", t
            done = sum(1 for j in self.jobs.values() if j.state == "done")
            took = f" ({duration(t - job.started)})" if job.started else ""
            self._say(f"[{done}/{self._total()}] done {job.label or job.rule}{took}")
        elif kind == "job_error":
            job = self.jobs.setdefault(event.get("jobid"), ConsoleJob(event.get("jobid")))
            job.rule = job.rule or event.get("rule") or ""
            job.label = job.label or job.rule
            logs = [p for p in event.get("log") or [] if p]
            job.log = logs[0] if logs else job.log
            job.state, job.finished = "failed", t
            job.cause = event.get("cause") or cause_of(job.log, event.get("msg"), event.get("aux"))
            self.failures.append(job)
            self._say(self.failure_text(job))
        elif kind == "group_error":
            for info in event.get("jobs") or []:
                self._handle({"event": "job_error", "jobid": info.get("jobid"), "rule": info.get("rule"),
                             "log": info.get("log") or event.get("log"), "msg": event.get("msg"), "t": t})
        elif kind == "message" and str(event.get("msg") or "").startswith("biasflow: "):
            self._say(str(event["msg"]))  # biasflow's own words in Snakemake (the SLURM watch: biasflow.slurm)
        elif kind == "error":  # an exception Snakemake printed: a failed job's (said above) or its own
            text = " ".join(ln.strip() for ln in str(event.get("msg") or "").splitlines()[:3] if ln.strip())
            self.errors.append(text[:300] or str(event.get("exception") or "an error"))

    def _begin(self, job: ConsoleJob, t: float) -> None:
        if job.state == "failed":  # Snakemake tries it again (--retries)
            job.attempt += 1
            job.state, job.progress, job.finished, job.started = "running", None, None, t
            self._say(f"retrying {job.label or job.rule} (attempt {job.attempt})")
        elif job.started is None:
            job.started = t

    def _total(self) -> str:
        return str(self.total) if self.total is not None else "?"

    # ------------------------------------------------------------------------------------------------ words
    def running(self) -> list[ConsoleJob]:
        return [j for j in self.jobs.values() if j.state == "running"]

    def failure_text(self, job: ConsoleJob) -> str:
        label = job.label or job.rule
        rule = "" if label.split(" ")[0] == job.rule else f"rule {job.rule}, "
        return (f"FAILED {label} ({rule}attempt {job.attempt}): {job.cause}\n"
                f"       log: {job.log or '(none: see the full log ' + self.log_shown + ')'}")

    @staticmethod
    def job_progress(job: ConsoleJob) -> str:
        p = job.progress
        if not p:
            return f"{duration(time.time() - job.started) if job.started else '?'} so far"
        n, total, unit = p.get("n") or 0, p.get("total"), p.get("unit") or "it"
        parts = [f"{p.get('desc') or ''} {n}/{total if total is not None else '?'} {unit}".strip()]
        if p.get("rate"):
            parts.append(_rate(p["rate"], unit))
        if p.get("remaining") is not None:
            parts.append(f"{duration(p['remaining'])} left")
        return ", ".join(parts)

    def time_left(self) -> float | None:
        """Seconds until the run ends, from this run's finished jobs' durations per rule (and the running jobs'
        bars), spread over the jobs that run at once; None while nothing has been measured."""
        took: dict[str, list[float]] = {}
        for j in self.jobs.values():
            if j.state == "done" and j.started and j.finished:
                took.setdefault(j.rule, []).append(j.finished - j.started)
        if not took:
            running_left = [j.progress.get("remaining") for j in self.running() if j.progress]
            return max(running_left) if running_left and None not in running_left and not self._pending() \
                else None
        mean_all = sum(sum(v) for v in took.values()) / sum(len(v) for v in took.values())
        mean = {rule: sum(v) / len(v) for rule, v in took.items()}
        work = 0.0
        for j in self.running():
            if j.progress and j.progress.get("remaining") is not None:
                work += float(j.progress["remaining"])
            else:
                work += max(0.0, mean.get(j.rule, mean_all) - (time.time() - (j.started or time.time())))
        for rule, count in self._pending().items():
            work += count * mean.get(rule, mean_all)
        longest = max((float(j.progress["remaining"]) for j in self.running()
                       if j.progress and j.progress.get("remaining") is not None), default=0.0)
        return max(work / max(1, len(self.running())), longest)

    def _pending(self) -> dict[str, int]:
        seen: dict[str, int] = {}
        for j in self.jobs.values():
            seen[j.rule] = seen.get(j.rule, 0) + 1
        return {rule: n - seen.get(rule, 0) for rule, n in self.stats.items() if n > seen.get(rule, 0)}

    def headline(self) -> str:
        done = sum(1 for j in self.jobs.values() if j.state == "done")
        failed = sum(1 for j in self.jobs.values() if j.state == "failed")
        left = self.time_left() if self.running() else None
        return (f"{done}/{self._total()} jobs done, {len(self.running())} running"
                + (f", {failed} failed" if failed else "")
                + (f", about {duration(left)} left" if left is not None else "")
                + f" ({duration(time.time() - self.began)} so far)")

    def progress_line(self, running: list[ConsoleJob]) -> str:
        shown = "; ".join(f"{j.label or j.rule}: {self.job_progress(j)}" for j in running[:4])
        more = f"; and {len(running) - 4} more" if len(running) > 4 else ""
        return f"[{self.headline()}] running {shown}{more}"

    def _renderable(self):
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        total = self.total or 0
        done = sum(1 for j in self.jobs.values() if j.state == "done")
        head = Table.grid(padding=(0, 1))
        head.add_row(Text("biasflow", style="bold"), ProgressBar(total=max(total, 1), completed=done, width=30),
                     Text(self.headline()))
        rows = Table.grid(padding=(0, 2))
        for job in self.running():
            p = job.progress or {}
            bar = (ProgressBar(total=p["total"], completed=p.get("n") or 0, width=24)
                   if p.get("total") else Text(""))
            rows.add_row(Text("  " + (job.label or job.rule or str(job.jobid)), style="cyan"), bar,
                         Text(self.job_progress(job)))
        return Group(head, rows, Text(f"  full log: {self.log_shown}", style="dim"))

    def _say(self, text: str) -> None:
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)


def cause_of(log: str | None, msg: Any = None, aux: Any = None) -> str:
    """A failed job's cause in one line: the error its stage logged, else what Snakemake or the executor said
    (a SLURM state), else the log's last line."""
    from biasflow.errors import last_error

    if log:
        error = last_error(log)
        if error:
            return error
    if msg:
        return " ".join(str(msg).split())[:300]
    if isinstance(aux, Mapping):
        text = "; ".join(f"{k}: {v}" for k, v in aux.items() if v)
        if text:
            return text[:300]
    if log:
        try:
            lines = [ln.strip() for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            lines = []
        if lines:
            return lines[-1][:300]
    return "no error was logged (see the full log)"


def tee_raw(lines, log_path: str | os.PathLike, watch: Callable[[str], None]) -> None:
    """Snakemake's raw output, line by line, into the full log (each line also given to ``watch``)."""
    with open(log_path, "a", encoding="utf-8", errors="replace") as log:
        for line in lines:
            log.write(line)
            log.flush()
            watch(line)
