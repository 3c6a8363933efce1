"""``biasflow`` command line: Hydra overrides in, one Snakemake DAG out.

  biasflow run [-m] [overrides ...] [--cores N] [-n] [-- more snakemake args]
  biasflow plan [-m] [overrides ...]          show the jobs and output folders without running anything
  biasflow status [-m] [overrides ... | RUN_DIR]  jobs done / running / queued / failed / interrupted / waiting,
                                               SLURM states and causes, time left, the command that resumes
  biasflow log <run folder or plan hash>       log a finished run to MLflow (after the store was unreachable)
  biasflow ui                                  the command that opens the MLflow UI on the local store
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from biasflow.errors import BiasflowError
from biasflow.secrets import environ_snapshot, public_uri, redact_uri


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


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

    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True, bufsize=1,
                            preexec_fn=_die_with_parent if os.name == "posix" else None)
    if on_start is not None:
        on_start(proc.pid)
    stopped: list[int] = []

    def forward(signum, _frame):
        stopped.append(signum)
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    locked = False
    try:
        for line in proc.stderr:  # watching for what needs a hint
            sys.stderr.write(line)
            locked = locked or "Directory cannot be locked" in line
        rc = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reaches Snakemake too (same process group): let it stop its jobs
        stopped.append(signal.SIGINT)
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return (-stopped[0] if stopped else rc), locked


LOCK_HINT = ("Snakemake found the directory locked. If no other biasflow/snakemake run is active here (one was "
             "killed), unlock it with:\n  biasflow run {args} -- --unlock\nthen run the same command again; "
             "finished work is kept and interrupted jobs are redone.")


def cmd_plan(args) -> int:
    from biasflow.plan import build_plan
    plan = build_plan(args.overrides, multirun=args.multirun)
    print(f"plan {plan.plan_hash}: {len(plan.sweep)} sweep job(s) -> {len(plan.jobs)} metric job(s); run dir "
          f"{plan.run_dir}")
    from biasflow.report.sweep import job_table

    # each job by its model's label and the options that tell it from the other jobs of its metric (a sweep's
    # setting), so no two rows read alike
    table = job_table(json.loads(plan.to_json())).set_index("config_hash")
    for job in plan.jobs:
        row = table.loc[job.cfg_hash]
        print(f"  {job.metric:<24} {row['model']:<24} {row['setting']}".rstrip())
        print(f"  {'':<24} {'':<24} scores {job.scores_path()}")
        print(f"  {'':<24} {'':<24} metric {job.metric_dir}")
    for msg in plan.skipped:
        print(f"  skipped: {msg}")
    return 0


def _tracking_enabled(plan) -> bool:
    """``tracking.enabled`` of the plan (the schema's default where the config leaves it out)."""
    from biasflow.schema import TrackingConfig, config_value

    return bool(config_value(TrackingConfig, plan.tracking, "enabled"))


def cmd_run(args, extra: list[str]) -> int:
    from biasflow.plan import build_plan

    from biasflow.workflow import stage_plan

    plan = build_plan(args.overrides, multirun=args.multirun)  # fail fast with a readable config error
    plan_path = stage_plan(plan)  # Snakemake's parses read it; the plan rule copies it into the run folder
    if "--directory" not in extra and Path.cwd().resolve() != project_root():
        # the plan's relative paths (results/, a responses file) are the caller's: Snakemake works where they point
        extra = [*extra, "--directory", str(Path.cwd().resolve())]
    cmd = snakemake_command(plan_path, args.cores, args.dry_run, extra)
    print("+", " ".join(cmd), flush=True)
    env = environ_snapshot()
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see docs/performance.md: spinning threads hurt shared machines
    # the MLflow runs' Source: what the user ran
    env["BIASFLOW_COMMAND"] = shlex.join(["biasflow", "run", *(["-m"] if args.multirun else []), *args.overrides])
    root = project_root()
    workdir = Path(extra[extra.index("--directory") + 1]) if "--directory" in extra[:-1] else root
    tracked = not args.dry_run and not {"--unlock", "-n", "--dry-run", "--list", "--touch", "--cleanup-metadata",
                                        "--list-untracked"} & set(extra)
    resume = resume_command(args, extra)
    owner: dict = {}
    if tracked:
        clear_stale_lock(workdir, lambda: snakemake_command(plan_path, args.cores, False, extra + ["--unlock"]),
                         root, env)

    def started(pid: int) -> None:
        if tracked:
            from biasflow.progress import owner_record

            owner.update(owner_record(os.getpid(), pid, resume, str(workdir.resolve())))
            write_owner(owner, plan.run_dir, workdir)

    rc, locked = run_snakemake(cmd, root, env, **({"on_start": started} if tracked else {}))  # real runs only
    if owner:
        import time

        owner.update(ended=time.time(), exit_code=rc)
        write_owner(owner, plan.run_dir, workdir)
    report = workdir / plan.run_dir / "report.md"
    if rc == 0 and not args.dry_run and report.exists():
        print(f"\nresults: {plan.run_dir}/report.md (tables: aggregate.csv, per_item.parquet, plots/)")
        uri = (plan.tracking or {}).get("uri")
        if uri and _tracking_enabled(plan):
            record = workdir / plan.run_dir / "mlflow.json"
            page = json.loads(record.read_text()).get("ui", "") if record.exists() else ""
            if uri.startswith(("http://", "https://")):  # no user:***@: browsers refuse links with credentials
                print(f"MLflow:  {public_uri(uri).rstrip('/')}/{page}")
            else:
                print(f"MLflow:  mlflow ui --backend-store-uri {redact_uri(uri)}   "
                      f"then open http://127.0.0.1:5000/{page}")
    elif rc != 0:
        shown = " ".join((["-m"] if args.multirun else []) + [shlex.quote(o) for o in args.overrides])
        if locked:
            print("\n" + LOCK_HINT.format(args=shown), file=sys.stderr)
        elif rc < 0 and tracked:  # stopped by a signal (SIGTERM, Ctrl-C; -9: Snakemake itself was killed)
            import signal

            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
            print(f"\nbiasflow: the run was stopped ({name}). Finished jobs are kept; interrupted ones are redone. "
                  f"Resume with:\n  {resume}", file=sys.stderr)
        elif tracked:
            os.environ["BIASFLOW_COMMAND"] = env["BIASFLOW_COMMAND"]  # the partial MLflow runs' Source too
            report_partial(plan, plan_path, workdir, resume)
        else:
            print(f"\nbiasflow: Snakemake failed (exit {rc}); the log of the failed job (named above) holds its "
                  f"traceback.", file=sys.stderr)
    return 128 - rc if rc < 0 else rc  # stopped by signal N: exit 128 + N, as a shell reports it


def resume_command(args, extra: list[str]) -> str:
    """The command that resumes this run: the same one (without a one-off --unlock)."""
    more = [a for a in extra if a != "--unlock"]
    return shlex.join(["biasflow", "run", *(["-m"] if args.multirun else []), *args.overrides,
                       *(["--cores", str(args.cores)] if str(args.cores) != "all" else []),
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


def report_partial(plan, plan_path: str, root: Path, resume: str = "the same command") -> None:
    """After failed jobs: the finished jobs' results as a partial report (and in MLflow), every unfinished job
    listed with its state and cause; a report even when no job finished."""
    from biasflow import progress, stages

    doc = json.loads(Path(plan_path).read_text())
    states = progress.job_states(doc, root)
    print("\n" + progress.status_text(doc, root), file=sys.stderr)
    run_dir = Path(plan.run_dir)
    if all(s.state == "done" for s in states):  # every job finished: the run-level step failed
        report = (root / run_dir / "report.md") if not run_dir.is_absolute() else run_dir / "report.md"
        if report.exists() and not (report.parent / "mlflow.json").exists():
            print(f"\nEvery job finished: results in {plan.run_dir}/report.md. Logging to MLflow failed (the error is "
                  f"above; log: {doc['paths']['results']}/logs/mlflow/{doc['plan_hash']}.log). When the store is "
                  f"reachable, log the run with:\n  biasflow log {plan.run_dir}", file=sys.stderr)
        else:
            print(f"\nEvery job finished, but the run's report failed (the error is above; log: "
                  f"{doc['paths']['results']}/logs/aggregate/{doc['plan_hash']}.log). Fix it and resume with:\n"
                  f"  {resume}", file=sys.stderr)
        return
    cwd = os.getcwd()
    os.chdir(root)  # the plan's paths are relative to the project root
    try:
        if not Path(plan.path).exists():  # the partial run folder is complete enough for `biasflow log` later
            stages.write_plan(plan_path, plan.path)
        stages.aggregate_run(plan_path, plan.run_dir, partial=True)
        done = sum(s.state == "done" for s in states)
        print(f"\npartial results ({done} of {len(states)} jobs finished): {plan.run_dir}/report.md (the unfinished "
              f"jobs are listed at its top, with their state and cause). Resume with:\n  {resume}", file=sys.stderr)
        if _tracking_enabled(plan):
            try:
                stages.log_mlflow(plan_path, plan.run_dir, None, partial=True)
            except BiasflowError as exc:
                print(f"biasflow: MLflow: {exc}", file=sys.stderr)
    finally:
        os.chdir(cwd)


def looks_like_run(arg: str) -> bool:
    """A run folder or plan hash rather than a Hydra override (overrides hold '=')."""
    return "=" not in arg and ("/" in arg or os.sep in arg or Path(arg).exists() or re.fullmatch(r"[0-9a-f]{12}", arg)
                               is not None)


def run_folder(arg: str) -> Path:
    """The run folder named by ``arg``: a folder holding plan.json, or a plan hash under paths.results/runs/."""
    run_dir = Path(arg)
    if not (run_dir / "plan.json").exists() and "/" not in arg and os.sep not in arg:
        from biasflow.plan import compose

        run_dir = Path(compose([])["paths"]["results"]) / "runs" / arg
    if not (run_dir / "plan.json").exists():
        runs = sorted((p.parent.parent.name for p in Path(run_dir).parent.glob("*/plan.json")), key=str)
        known = f" (runs there: {', '.join(runs[-5:])})" if runs else ""
        raise BiasflowError(f"{arg}: no run folder with a plan.json (looked for {run_dir / 'plan.json'}); give a run "
                            f"folder (results/runs/<plan hash>) or a plan hash{known}")
    return run_dir


def cmd_log(args) -> int:
    """Log a finished run's results to MLflow: a run folder or a plan hash (looked up under paths.results)."""
    from biasflow.secrets import redact_uri, uri_has_secret
    from biasflow.stages import log_mlflow

    if uri_has_secret(args.tracking_uri):
        raise BiasflowError(f"--tracking-uri {redact_uri(args.tracking_uri)}: a password on the command line ends up "
                            f"in shell histories; put the URI in MLFLOW_TRACKING_URI and pass its redacted form")
    run_dir = run_folder(args.run)
    plan_path = run_dir / "plan.json"
    record = log_mlflow(str(plan_path), str(run_dir), str(run_dir / "mlflow.json"), uri=args.tracking_uri)
    if not record.get("logged", True):
        print(f"tracking is disabled in {plan_path}: give --tracking-uri to log it anyway")
        return 0
    print(f"logged {run_dir} to MLflow {redact_uri(record['tracking_uri'])} (parent run {record['parent_run_id']}, "
          f"{len(record['children'])} job run(s))")
    return 0


def cmd_status(args) -> int:
    """Where a run stands: jobs done / running / failed / waiting, errors, and the time left."""
    from biasflow import progress

    root = project_root()
    if len(args.overrides) == 1 and looks_like_run(args.overrides[0]):
        plan_path = run_folder(args.overrides[0]) / "plan.json"
    else:
        from biasflow.plan import build_plan

        plan_path = None
        doc = json.loads(build_plan(args.overrides, multirun=args.multirun).to_json())  # status writes nothing
    if plan_path is not None:
        doc = json.loads(plan_path.read_text())
    workdir = (progress.read_owner(doc) or {}).get("workdir") or root  # where the run's Snakemake works
    print(progress.status_text(doc, workdir, cores=args.cores))
    return 0


def cmd_ui(args) -> int:
    from biasflow.plan import compose
    from biasflow.secrets import redact_uri, tracking_uri
    from biasflow.tracking.mlflow_log import ui_path

    cfg = compose([])
    uri = cfg["tracking"]["uri"]
    # this interpreter's MLflow: `biasflow ui` works without the venv activated (no `mlflow` on PATH)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri(uri), "--port", str(args.port)]
    print("+", " ".join(["mlflow", "ui", "--backend-store-uri", redact_uri(uri)] + cmd[6:]), flush=True)
    # MLflow opens experiments in its GenAI view unless told (or switched to "Model training" in the browser)
    records = sorted(Path(cfg["paths"]["results"]).glob("runs/*/mlflow.json"), key=lambda p: p.stat().st_mtime)
    experiment = json.loads(records[-1].read_text()).get("experiment_id") if records else None
    print(f"open http://127.0.0.1:{args.port}/{ui_path(experiment) if experiment else ''}", flush=True)
    return subprocess.call(cmd)


def main(argv: list[str] | None = None) -> int:
    argv, extra = _split(list(sys.argv[1:] if argv is None else argv))
    parser = argparse.ArgumentParser(prog="biasflow", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "plan", "status"):
        p = sub.add_parser(name, help=f"{name} the pipeline for a config (Hydra overrides)")
        p.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated override values")
        p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=bert_base_uncased")
        if name == "status":
            p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                           help="jobs that run at once, for the time-left estimate")
        if name == "run":
            p.add_argument("--cores", default="all", help="Snakemake --cores (default: all)")
            p.add_argument("-n", "--dry-run", action="store_true", help="show the jobs Snakemake would run")
    lg = sub.add_parser("log", help="log a finished run to MLflow (e.g. after the store was unreachable)")
    lg.add_argument("run", help="the run folder (results/runs/<plan hash>) or the plan hash")
    lg.add_argument("--tracking-uri", default=None, help="log to this store instead of the plan's")
    ui = sub.add_parser("ui", help="open the MLflow UI on the configured store")
    ui.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args, extra)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "status":
            return cmd_status(args)
        if args.command == "log":
            return cmd_log(args)
        return cmd_ui(args)
    except BiasflowError as exc:
        print(f"biasflow: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in UNWRITABLE:
            raise
        where = exc.filename or "a file"
        print(f"biasflow: error: cannot write {where}: {exc.strerror} (results go under paths.results; give a "
              f"writable folder with paths.results=DIR, or free space there)", file=sys.stderr)
        return 2


# the file-system errors a user fixes by pointing biasflow elsewhere (or freeing space): one line, no traceback
UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}


if __name__ == "__main__":
    sys.exit(main())
