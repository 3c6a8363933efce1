"""Running a plan: Snakemake started on the saved plan, its lock and owner record, and what became of the run.

``execute`` is what ``biasflow run`` and ``biasflow.api.run`` share: it returns a ``RunOutcome`` (exit code, the
unfinished jobs with their states and causes, the report, the MLflow page) instead of printing its verdict, so the
command line words it for a terminal and the API raises with the jobs as data. Snakemake's own output passes
through to the terminal as it runs, or (``compact``, what ``biasflow run`` does without ``-v``) goes to the run's
full log while ``biasflow.console`` shows jobs done, running and failed.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from biasflow.errors import BiasflowError
from biasflow.secrets import environ_snapshot


def project_root() -> Path:
    """The Snakefile's folder: ``BIASFLOW_ROOT``, else the working directory when it holds one (a project of the
    user's own), else the one shipped with this install (``biasflow.installed``)."""
    if "BIASFLOW_ROOT" in os.environ:
        root = Path(os.environ["BIASFLOW_ROOT"]).resolve()
        if not (root / "Snakefile").exists():
            raise BiasflowError(f"BIASFLOW_ROOT={root} holds no Snakefile: point it at a biasflow checkout, or unset "
                                f"it to use the workflow installed with biasflow")
        return root
    here = Path(".").resolve()
    if (here / "Snakefile").exists():
        return here
    from biasflow.installed import installed_project

    shipped = installed_project()
    if shipped is None:
        raise BiasflowError("this biasflow install has no workflow files (Snakefile, workflow/, scripts/, conf/): "
                            "reinstall it (pip install biasflow, or pip install -e <checkout>), or set BIASFLOW_ROOT to "
                            "a biasflow checkout")
    return shipped


def snakemake_command(plan_path: str, cores: str, dry_run: bool, extra: list[str]) -> list[str]:
    root = project_root()
    # Outputs are written atomically, so a job Snakemake marks incomplete (killed mid-run) is always safe to redo.
    # --keep-going: one broken model must not stop the others of an overnight sweep (the failed jobs are listed
    # in a partial report afterwards)
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(root / "Snakefile"), "--cores", str(cores),
           "--rerun-incomplete", "--keep-going"]
    if dry_run:
        cmd.append("--dry-run")
    if "--retries" not in extra:  # a transient failure (a server error, a lost node) is tried again once
        cmd += ["--retries", "1"]
    # --config takes every following word, so it goes last: extra arguments (targets, --unlock) come before it
    # the saved plan: Snakemake (and every cluster job's re-parse) reads it instead of composing the configs again
    return cmd + extra + ["--config", f"plan={plan_path}"]


def _die_with_parent() -> None:
    """In the Snakemake child: get SIGTERM when biasflow dies (kill -9 included), so Snakemake stops its jobs."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: nothing to arrange
        pass


def run_snakemake(cmd: list[str], cwd: Path, env: dict[str, str], on_start=None) -> tuple[int, bool]:
    """Run Snakemake, passing its output through; return (exit code, whether it found the directory locked).
    ``on_start(pid)`` runs once Snakemake has started. SIGTERM to biasflow is passed on to Snakemake (which stops
    its jobs and releases its lock); the exit code is then -15."""
    import signal

    from biasflow.console import FULL_LOG_ENV

    full_log = env.get(FULL_LOG_ENV)  # the compact console: all of Snakemake's output (the jobs' too) to its file
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE if full_log else None,
                            stderr=subprocess.STDOUT if full_log else subprocess.PIPE, text=True, bufsize=1,
                            errors="replace", preexec_fn=_die_with_parent if os.name == "posix" else None)
    if on_start is not None:
        on_start(proc.pid)
    stopped: list[int] = []

    def forward(signum, _frame):
        stopped.append(signum)
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    locked = False
    log = open(full_log, "a", encoding="utf-8", errors="replace") if full_log else None
    try:
        for line in proc.stdout if full_log else proc.stderr:  # watching for what needs a hint
            if log is not None:
                log.write(line)
                log.flush()
            else:
                sys.stderr.write(line)
            locked = locked or "Directory cannot be locked" in line
        rc = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reaches Snakemake too (same process group): let it stop its jobs
        stopped.append(signal.SIGINT)
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if log is not None:
            log.close()
    return (-stopped[0] if stopped else rc), locked


LOCK_HINT = ("Snakemake found the directory locked. If no other biasflow/snakemake run is active here (one was "
             "killed), unlock it with:\n  biasflow run {args} -- --unlock\nthen run the same command again; "
             "finished work is kept and interrupted jobs are redone.")


@dataclass
class RunOutcome:
    """What became of one ``execute``: the exit code as a shell reports it (0 done, 128 + N stopped by signal N),
    why it stopped, and where its results are."""
    exit_code: int
    plan: Any  # biasflow.plan.Plan
    workdir: Path  # where Snakemake ran: the plan's relative paths are relative to it
    resume: str  # the command that resumes the run
    dry_run: bool = False
    locked: bool = False  # Snakemake found the folder locked (another run, or one killed without unlocking)
    live_run: str | None = None  # another run active in this folder, as it is named (nothing was started)
    started_at: float = 0.0  # when Snakemake was started (a report written since is this run's)
    signal: str | None = None  # the signal that stopped the run (SIGTERM, SIGINT, SIGKILL)
    unfinished: list[Any] = field(default_factory=list)  # progress.JobState of each job that did not finish
    partial_report: bool = False  # the finished jobs' results were written as a partial report
    kept_complete: "LastComplete | None" = None  # the run folder's last complete report, kept over a partial run
    run_level_failure: str = ""  # every job finished but the report or the MLflow logging failed: which
    full_log: str | None = None  # the compact console's file of Snakemake's whole output (None: it was shown)

    @property
    def run_dir(self) -> Path:
        return self.workdir / self.plan.run_dir

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _tracking_enabled(plan) -> bool:
    """``tracking.enabled`` of the plan (the schema's default where the config leaves it out)."""
    from biasflow.schema import TrackingConfig

    return TrackingConfig.model_validate(plan.tracking or {}).enabled


NOT_TRACKED = {"--unlock", "-n", "--dry-run", "--list", "--touch", "--cleanup-metadata", "--list-untracked"}


def execute(plan, overrides: Sequence[str], multirun: bool = False, cores: int | str = "all",
            dry_run: bool = False, snakemake_args: Sequence[str] = (), compact: bool = False) -> RunOutcome:
    """Run ``plan`` (built from ``overrides``) with Snakemake in the working directory; after failed jobs, the
    finished jobs' partial report (and MLflow runs). Raises BiasflowError only for what stops it from starting.
    ``compact``: show the run in ``biasflow.console``'s compact view (Snakemake's output goes to the run's full
    log) instead of passing Snakemake's output through; a dry run and Snakemake's one-off commands (--unlock,
    --list, ...) always pass it through."""
    from biasflow.workflow import stage_plan

    extra = list(snakemake_args)
    if "--directory" not in extra and Path.cwd().resolve() != project_root():
        # the plan's relative paths (results/, a responses file) are the caller's: Snakemake works where they point
        extra = [*extra, "--directory", str(Path.cwd().resolve())]
    root = project_root()
    workdir = Path(extra[extra.index("--directory") + 1]) if "--directory" in extra[:-1] else root
    tracked = not dry_run and not NOT_TRACKED & set(extra)
    resume = resume_command(overrides, multirun, cores, extra)
    live = live_run_in(workdir) if tracked else None
    if live:  # refused before anything is written: Snakemake's lock and owner.json stay the live run's
        return RunOutcome(exit_code=1, plan=plan, workdir=workdir, resume=resume, dry_run=dry_run, locked=True,
                          live_run=live)
    plan_path = stage_plan(plan)  # Snakemake's parses read it; the plan rule copies it into the run folder
    cmd = snakemake_command(plan_path, str(cores), dry_run, extra)
    console = None
    if compact and tracked and "--logger" not in extra:  # a logger of the user's own: Snakemake's output as it is
        from biasflow.console import LOGGER_ARGS, RunConsole

        at = len(cmd) - 1 - cmd[::-1].index("--config")  # --logger takes one or more words: an option follows it
        cmd = cmd[:at] + LOGGER_ARGS + cmd[at:]
        console = RunConsole(plan, workdir)
    print("+", " ".join(cmd), flush=True)
    env = environ_snapshot()
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see docs/performance.md: spinning threads hurt shared machines
    # the MLflow runs' Source: what the user ran
    env["BIASFLOW_COMMAND"] = shlex.join(["biasflow", "run", *(["-m"] if multirun else []), *overrides])
    owner: dict = {}
    if tracked:
        clear_stale_lock(workdir, lambda: snakemake_command(plan_path, str(cores), False, extra + ["--unlock"]),
                         root, env)
        from biasflow.output_check import quarantine_damaged

        for line in quarantine_damaged(workdir / plan.paths["results"]):  # a damaged output counts as missing
            print(f"biasflow: {line}", file=sys.stderr, flush=True)
    last_complete = LastComplete(workdir / plan.run_dir) if tracked else None
    if last_complete is not None:
        last_complete.save()  # Snakemake deletes a rule's outputs when it reruns it, and a failed rule's outputs
    owner_files = [workdir / plan.run_dir / "owner.json", workdir / ".snakemake" / "biasflow" / "owner.json"]
    before = {p: p.read_bytes() if p.exists() else None for p in owner_files}

    def started(pid: int) -> None:
        if tracked:
            from biasflow.progress import owner_record

            owner.update(owner_record(os.getpid(), pid, resume, str(workdir.resolve())),
                         run_dir=str(plan.run_dir), plan=str(Path(plan_path).resolve()))  # biasflow status finds it
            write_owner(owner, plan.run_dir, workdir)

    started_at = time.time()
    if console is not None:
        env.update(console.env())
        console.start(cmd)
    rc: int | None = None
    try:
        rc, locked = run_snakemake(cmd, root, env, **({"on_start": started} if tracked else {}))  # real runs only
    finally:
        if console is not None:
            console.stop(rc)
    if locked:  # Snakemake refused to start: the owner record written on its start is not this run's to keep
        for path, content in before.items():
            with contextlib.suppress(OSError):
                path.write_bytes(content) if content is not None else path.unlink(missing_ok=True)
    elif owner:
        owner.update(ended=time.time(), exit_code=rc)
        write_owner(owner, plan.run_dir, workdir)
    outcome = RunOutcome(exit_code=128 - rc if rc < 0 else rc,  # stopped by signal N: 128 + N, as a shell says
                         plan=plan, workdir=workdir, resume=resume, dry_run=dry_run, locked=locked,
                         started_at=started_at, full_log=console.log_shown if console is not None else None)
    if last_complete is not None:
        if rc == 0:
            last_complete.discard()  # a new complete report replaced it (and any partial one is stale)
        else:
            outcome.kept_complete = last_complete if last_complete.restore() else None
    if rc < 0:
        import signal

        outcome.signal = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
    elif rc != 0 and tracked and not locked:
        # the partial MLflow runs' Source too, for this call only (an API caller's process keeps its environment)
        before = os.environ.get("BIASFLOW_COMMAND")
        os.environ["BIASFLOW_COMMAND"] = env["BIASFLOW_COMMAND"]
        try:
            partial_results(outcome, plan_path)
        finally:
            if before is None:
                os.environ.pop("BIASFLOW_COMMAND", None)
            else:
                os.environ["BIASFLOW_COMMAND"] = before
    return outcome


def resume_command(overrides: Sequence[str], multirun: bool, cores: int | str, extra: Sequence[str]) -> str:
    """The command that resumes this run: the same one (without a one-off --unlock)."""
    more = [a for a in extra if a != "--unlock"]
    return shlex.join(["biasflow", "run", *(["-m"] if multirun else []), *overrides,
                       *(["--cores", str(cores)] if str(cores) != "all" else []),
                       *(["--", *more] if more else [])])


def write_owner(owner: dict, run_dir: str, workdir: Path) -> None:
    """Who runs the plan (read by biasflow status and by the next run): in the run folder and Snakemake's folder."""
    from biasflow.io import write_json

    for path in (workdir / run_dir / "owner.json", workdir / ".snakemake" / "biasflow" / "owner.json"):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(owner, path)
        except OSError as exc:
            print(f"biasflow: cannot write {path}: {exc}", file=sys.stderr)


class LastComplete:
    """A run folder's last complete report and tables, kept while a run that may not complete runs: saved as hard
    links (the report's writers replace files, they never write into them) in ``.last-complete/``, restored over
    whatever a failed run left, discarded once a complete report replaced them. A partial report goes to
    ``partial/`` beside them."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.saved_dir = self.run_dir / ".last-complete"
        self.partial_dir = self.run_dir / "partial"
        self.when = ""

    def complete_here(self) -> bool:
        from biasflow.report.timing import RUN_TIMES

        try:
            times = json.loads((self.run_dir / RUN_TIMES).read_text())
        except (OSError, json.JSONDecodeError):
            return False
        self.when = time.strftime("%Y-%m-%d %H:%M", time.localtime(times.get("finished") or 0))
        return bool(times.get("complete", True))  # written before the flag existed: a report of its own

    def save(self) -> None:
        import shutil

        if self.saved_dir.exists() or not self.complete_here():  # a saved copy from a killed run stays the one
            return
        from biasflow.report import RUN_DIRS, RUN_FILES

        tmp = self.run_dir / ".last-complete.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in (*RUN_FILES, *RUN_DIRS):
            src = self.run_dir / name
            if src.is_dir():
                shutil.copytree(src, tmp / name, copy_function=_link_or_copy)
            elif src.exists():
                _link_or_copy(src, tmp / name)
        os.replace(tmp, self.saved_dir)

    def restore(self) -> bool:
        """Put the saved report back over what the run left; False when there was none."""
        import shutil

        if not self.saved_dir.is_dir():
            return False
        from biasflow.report.timing import RUN_TIMES

        try:
            saved, now = (json.loads((d / RUN_TIMES).read_text()) for d in (self.saved_dir, self.run_dir))
        except (OSError, json.JSONDecodeError):
            saved, now = None, None
        if now and now != saved and now.get("complete", True):  # the run wrote a new complete report (then
            self.discard()  # failed later, in MLflow say): that one stays
            return False
        self.complete_here()
        for src in self.saved_dir.iterdir():
            dst = self.run_dir / src.name
            if src.is_dir():
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst, copy_function=_link_or_copy)
            elif not (dst.exists() and os.path.samefile(src, dst)):  # renaming a link onto its own file does
                tmp = dst.with_name(dst.name + ".restoring")  # nothing (POSIX): left as it is
                tmp.unlink(missing_ok=True)
                _link_or_copy(src, tmp)
                os.replace(tmp, dst)
        shutil.rmtree(self.saved_dir, ignore_errors=True)
        self._tidy()
        return True

    def _tidy(self) -> None:
        for stray in self.run_dir.glob("*.restoring"):  # left by a restore that was killed
            stray.unlink(missing_ok=True)

    def discard(self) -> None:
        import shutil

        shutil.rmtree(self.saved_dir, ignore_errors=True)
        self._tidy()
        if self.complete_here():
            shutil.rmtree(self.partial_dir, ignore_errors=True)


def _link_or_copy(src, dst) -> None:
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def live_run_in(workdir: Path) -> str | None:
    """Another run active in ``workdir`` on this machine, named (biasflow's pid, host, start, command; or the
    Snakemake process), or None."""
    from biasflow import progress

    try:
        owner = json.loads((workdir / ".snakemake" / "biasflow" / "owner.json").read_text())
    except (OSError, json.JSONDecodeError):
        owner = None
    if owner and progress.owner_alive(owner) is True:
        return f"{progress.owner_text(owner)}: {owner.get('command')}"
    pids = _snakemake_alive_in(workdir)
    if pids:
        return f"Snakemake pid {pids[0]} on {socket.gethostname()}, running in {workdir.resolve()}"
    return None


def _snakemake_alive_in(workdir: Path) -> list[int]:
    """Processes on this machine running Snakemake in ``workdir`` (its main process holds the lock)."""
    found = []
    target = workdir.resolve()
    for pid_dir in Path("/proc").glob("[0-9]*"):
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
            if not any(a.endswith(b"snakemake") for a in argv[:3]) or b"--mode" in argv:  # not a cluster job step
                continue
            cwd = Path(os.readlink(pid_dir / "cwd")).resolve()
        except OSError:
            continue
        if cwd == target and int(pid_dir.name) != os.getpid():
            found.append(int(pid_dir.name))
    return found


def clear_stale_lock(workdir: Path, unlock_cmd, root: Path, env: dict[str, str]) -> None:
    """A lock left by a killed Snakemake (kill -9 leaves .snakemake/locks/ behind): if the run that took it is
    recorded here and gone, and no Snakemake runs in this folder on this machine, unlock as ``snakemake --unlock``
    does. A lock of a run biasflow did not start is left alone (Snakemake then says so, with the unlock command)."""
    from biasflow import progress

    locks = workdir / ".snakemake" / "locks"
    if not locks.is_dir() or not any(locks.iterdir()):
        return
    try:
        owner = json.loads((workdir / ".snakemake" / "biasflow" / "owner.json").read_text())
    except (OSError, json.JSONDecodeError):
        return
    if progress.owner_alive(owner) is not False or _snakemake_alive_in(workdir):
        return
    print(f"biasflow: {locks} holds a stale lock: the run that took it ({progress.owner_text(owner)}) is gone. "
          f"Unlocking (snakemake --unlock) and resuming.", file=sys.stderr, flush=True)
    proc = subprocess.run(unlock_cmd(), cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)


def partial_results(outcome: RunOutcome, plan_path: str) -> None:
    """After failed jobs: the finished jobs' results as a partial report (and in MLflow), every unfinished job
    listed with its state and cause; a report even when no job finished. Fills ``outcome``'s ``unfinished``,
    ``partial_report`` and ``run_level_failure``."""
    from biasflow import progress, stages

    plan, root = outcome.plan, outcome.workdir
    doc = json.loads(Path(plan_path).read_text())
    states = progress.job_states(doc, root)
    print("\n" + progress.status_text(doc, root), file=sys.stderr)
    outcome.unfinished = [s for s in states if s.state != "done"]
    if not outcome.unfinished:  # every job finished: the run-level step failed
        from biasflow.report.timing import RUN_TIMES

        run_dir = root / plan.run_dir
        try:  # the report is this run's when the aggregate job wrote its times (its last file) since it started
            times = json.loads((run_dir / RUN_TIMES).read_text())
            reported = times.get("complete", True) and float(times.get("finished", 0)) >= outcome.started_at
        except (OSError, ValueError):
            reported = False
        outcome.run_level_failure = ("mlflow" if reported and not (run_dir / "mlflow.json").exists()
                                     else "report")
        return
    cwd = os.getcwd()
    os.chdir(root)  # the plan's paths are relative to the project root
    try:
        if not Path(plan.path).exists():  # the partial run folder is complete enough for `biasflow log` later
            stages.write_plan(plan_path, plan.path)
        kept = outcome.kept_complete
        # beside the last complete report, never over it
        stages.aggregate_run(plan_path, str(kept.partial_dir) if kept else plan.run_dir, partial=True)
        outcome.partial_report = True
        if kept:  # MLflow keeps the complete run's results too
            print(f"biasflow: MLflow keeps the last complete results of this plan; the partial report is in "
                  f"{kept.partial_dir}/report.html", file=sys.stderr)
        elif _tracking_enabled(plan):
            try:
                stages.log_mlflow(plan_path, plan.run_dir, None, partial=True)
            except BiasflowError as exc:
                print(f"biasflow: MLflow: {exc}", file=sys.stderr)
    finally:
        os.chdir(cwd)


def failure_text(outcome: RunOutcome) -> str:
    """Why the run did not finish and what to do, in a few lines (the command line prints it; the API raises it)."""
    plan = outcome.plan
    if outcome.live_run:
        return (f"biasflow: another run is active in this folder ({outcome.live_run}); this run did not start and "
                f"changed nothing. Follow it with  biasflow status  and run again when it has finished (or stop it "
                f"first). Do not unlock the folder while that run lives.")
    if outcome.locked:
        shown = outcome.resume.removeprefix("biasflow run ").split(" -- ")[0]
        return LOCK_HINT.format(args=shown)
    if outcome.signal:
        return (f"biasflow: the run was stopped ({outcome.signal}). Finished jobs are kept; interrupted ones are "
                f"redone. Resume with:\n  {outcome.resume}")
    results = plan.paths["results"]
    if outcome.run_level_failure == "mlflow":
        return (f"Every job finished: results in {plan.run_dir}/report.html. Logging to MLflow failed (the error is "
                f"above; log: {results}/logs/mlflow/{plan.plan_hash}.log). When the store is reachable, log the run "
                f"with:\n  biasflow log {plan.run_dir}")
    if outcome.run_level_failure == "report":
        return (f"Every job finished, but the run's report failed (the error is above; log: "
                f"{results}/logs/aggregate/{plan.plan_hash}.log). Fix it and resume with:\n  {outcome.resume}")
    if outcome.partial_report:
        done = len(plan.jobs) - len(outcome.unfinished)
        kept = outcome.kept_complete
        where = f"{plan.run_dir}/partial/report.html" if kept else f"{plan.run_dir}/report.html"  # the one to open
        lines = [f"partial results ({done} of {len(plan.jobs)} jobs finished): {where} (the unfinished jobs are "
                 f"listed at its top, with their state and cause)."]
        if kept:
            lines.append(f"The last complete report and tables stay in {plan.run_dir}/ (from {kept.when}) until a "
                         f"complete run replaces them.")
        lines.append(f"Resume with:\n  {outcome.resume}")
        return " ".join(lines[:-1]) + " " + lines[-1]
    where = f"; Snakemake's full output: {outcome.full_log}" if outcome.full_log else ""
    return (f"biasflow: Snakemake failed (exit {outcome.exit_code}); the log of the failed job (named above) holds "
            f"its traceback{where}.")
