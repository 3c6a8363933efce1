"""``biasflow`` command line: Hydra overrides in, one Snakemake DAG out.

  biasflow run [-m] [overrides ...] [--cores N] [-n] [-v] [-- more snakemake args]
                                               -v: Snakemake's whole output instead of the compact view
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
import subprocess
import sys
from pathlib import Path

from biasflow.errors import BiasflowError
from biasflow.runner import _tracking_enabled, project_root
from biasflow.secrets import public_uri, redact_uri


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


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


def cmd_run(args, extra: list[str]) -> int:
    """``biasflow run``: the plan, ``runner.execute``, and its outcome in words."""
    from biasflow.plan import build_plan
    from biasflow.runner import execute, failure_text

    plan = build_plan(args.overrides, multirun=args.multirun)  # fail fast with a readable config error
    # where a full disk is looked for when an error names no file (errors.full_disk_text)
    os.environ.setdefault("BIASFLOW_JOB_OUTPUTS", os.pathsep.join(
        str(Path(plan.paths[k]).absolute()) for k in ("results", "resources") if plan.paths.get(k)))
    outcome = execute(plan, args.overrides, multirun=args.multirun, cores=args.cores, dry_run=args.dry_run,
                      snakemake_args=extra, compact=not args.verbose)
    report = outcome.run_dir / "report.md"
    if outcome.ok and not args.dry_run and report.exists():
        print(f"\nreport:  {plan.run_dir}/report.html  (open it in a browser; beside it report.md, aggregate.csv, "
              f"per_item.parquet, leaderboard.md, plots/)")
        uri = (plan.tracking or {}).get("uri")
        if uri and _tracking_enabled(plan):
            record = outcome.run_dir / "mlflow.json"
            page = json.loads(record.read_text()).get("ui", "") if record.exists() else ""
            if uri.startswith(("http://", "https://")):  # no user:***@: browsers refuse links with credentials
                print(f"MLflow:  {public_uri(uri).rstrip('/')}/{page}")
            else:
                print(f"MLflow:  mlflow ui --backend-store-uri {redact_uri(uri)}   "
                      f"then open http://127.0.0.1:5000/{page}")
    elif not outcome.ok:
        print("\n" + failure_text(outcome), file=sys.stderr)
    return outcome.exit_code


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
    elif not args.overrides and not args.multirun and last_run_plan(Path.cwd()) is not None:
        plan_path = last_run_plan(Path.cwd())  # the run made here last, running or not
        print(f"the last run in this folder ({plan_path.parent}):")
    else:
        from biasflow.plan import build_plan

        plan_path = None
        doc = json.loads(build_plan(args.overrides, multirun=args.multirun).to_json())  # status writes nothing
    if plan_path is not None:
        doc = json.loads(plan_path.read_text())
    workdir = (progress.read_owner(doc) or {}).get("workdir") or root  # where the run's Snakemake works
    print(progress.status_text(doc, workdir, cores=args.cores))
    return 0


def last_run_plan(workdir: Path) -> Path | None:
    """The plan of the last ``biasflow run`` in ``workdir`` (its owner record names it), or None."""
    try:
        owner = json.loads((workdir / ".snakemake" / "biasflow" / "owner.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for candidate in (owner.get("run_dir") and workdir / owner["run_dir"] / "plan.json", owner.get("plan")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


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
            p.add_argument("-v", "--verbose", action="store_true",
                           help="show Snakemake's whole output as it runs (by default: a compact view of jobs done, "
                                "running and failed; the whole output goes to a log file it names)")
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
        from biasflow.errors import full_disk, full_disk_text

        if full_disk(exc) is not None:
            print(f"biasflow: error: {full_disk_text(exc)}", file=sys.stderr)
            return 2
        where = exc.filename or "a file"
        print(f"biasflow: error: cannot write {where}: {exc.strerror} (results go under paths.results; give a "
              f"writable folder with paths.results=DIR, or free space there)", file=sys.stderr)
        return 2


# the file-system errors a user fixes by pointing biasflow elsewhere (or freeing space): one line, no traceback
UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}


if __name__ == "__main__":
    sys.exit(main())
