"""Stage-by-stage time accounting from Snakemake's own ``benchmark:`` files.

Every rule writes ``<results>/benchmarks/<rule>/<key>.tsv``, where ``key`` is the job's output path relative to
its folder without the extension (``metric/<model_key>/<metric>/<hash>``, ``score/<model_key>/<metric>-<hash>``,
``prepare/<benchmark>-<hash>``, ``download/<benchmark>/<file>``, ``build_demo_model/<model>``,
``aggregate|log_mlflow/<plan hash>``). Snakemake writes one after the job ends (wall seconds ``s``, peak
``max_rss`` in MB, ``cpu_time``, ...); a job skipped because its output was up to date keeps the file of the run
that built it. The run report sums them per rule for the jobs of its plan.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import pandas as pd

# the rules whose jobs the run report accounts for, in pipeline order (aggregate writes the report itself, and
# log_mlflow runs after it: their files are read by benchmarks/pipeline_stages.py)
REPORTED_RULES = ("download", "build_demo_model", "prepare", "score", "metric")
RULES = ("plan", *REPORTED_RULES, "export", "aggregate", "log_mlflow")
COLUMNS = ["rule", "job", "wall_s", "cpu_s", "max_rss_mb", "finished"]


def benchmark_file(results: str, rule: str, key: str) -> str:
    """Where the ``benchmark:`` directive of ``rule`` writes the record of the job ``key`` (wildcards allowed)."""
    return f"{results}/benchmarks/{rule}/{key}.tsv"


def read_benchmark(path: str | os.PathLike) -> dict[str, Any] | None:
    """One Snakemake benchmark record (the last, if the job was repeated): wall s, CPU s, peak RSS MB; None if the
    file is missing or unreadable (a job that ended before its record was written)."""
    try:
        df = pd.read_csv(path, sep="\t", na_values=["NA", "-"])
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return None
    if df.empty or "s" not in df:
        return None
    last = df.iloc[-1]
    number = lambda col: float(last[col]) if col in df and pd.notna(last[col]) else float("nan")  # noqa: E731
    return {"wall_s": number("s"), "cpu_s": number("cpu_time"), "max_rss_mb": number("max_rss"),
            "finished": clock_text(os.path.getmtime(path))}


def clock_text(seconds: float) -> str:
    """Seconds since the epoch as the UTC time the tables show (to the millisecond, so the run's span read back
    from them is not moved by up to a second)."""
    return pd.Timestamp(seconds, unit="s").isoformat(sep=" ", timespec="milliseconds")


def epoch_seconds(values: Any) -> pd.Series:
    """Times (text, or datetimes of any resolution: pandas 3 parses text to datetime64[us], older pandas to [ns])
    as float seconds since the epoch, UTC where no zone is given. The difference to the epoch is a Timedelta, so
    no integer of an assumed unit is read."""
    times = pd.to_datetime(pd.Series(values), utc=True)
    return (times - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)


def _key(path: str, folder: str) -> str:
    return os.path.splitext(os.path.relpath(path, folder))[0]


def plan_jobs(plan: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(rule, key) of every job the plan's results depend on, each once (the aggregate and MLflow jobs excluded)."""
    from biasflow.plan import Job
    from biasflow.registry import get_metric

    results = plan["paths"]["results"]
    seen: set[tuple[str, str]] = set()

    def once(rule: str, key: str) -> Iterator[tuple[str, str]]:
        if (rule, key) not in seen:
            seen.add((rule, key))
            yield rule, key

    # a sweep job's own dataset descriptions where it overrode one, else the plan's (written once)
    configs = [{"benchmark": plan.get("benchmarks") or {}, **s.get("config", {})} for s in plan.get("sweep", [])]
    for doc in plan["jobs"]:
        for spec in ((doc.get("benchmark_cfg") or {}).get("files") or {}).values():
            yield from once("download", f"{doc['benchmark']}/{spec['filename']}")
        model = doc["model"]
        if model.get("build"):  # the demo model, and the BOLD Wikipedia files it trains on
            for cfg in configs:
                texts = (cfg.get("benchmark") or {}).get("bold_wikipedia", {}).get("files", {})
                for spec in texts.values():
                    yield from once("download", f"bold_wikipedia/{spec['filename']}")
            yield from once("build_demo_model", os.path.basename(os.path.normpath(model["path"])))
        if doc.get("items_path"):
            yield from once("prepare", _key(doc["items_path"], f"{results}/items"))
        job = Job(metric=doc["metric"], model=model, metric_cfg=doc["metric_cfg"], benchmark=doc.get("benchmark"),
                  benchmark_cfg=doc.get("benchmark_cfg"), stats=doc["stats"], mode=doc["mode"], results=results,
                  user_files=doc.get("user_files") or {})
        if job.metric_dir == doc["metric_dir"]:  # the plan's own hashes: the score path is the one the DAG had
            scores = job.scores_path(get_metric(job.metric).score_keys)
            yield from once("score", _key(scores, f"{results}/scores"))
        yield from once("metric", os.path.relpath(doc["metric_dir"], f"{results}/metrics"))


def stage_times(plan: Mapping[str, Any]) -> pd.DataFrame:
    """One row per job of the plan that has a benchmark record: rule, job key, wall s, CPU s, peak RSS MB."""
    results = plan["paths"]["results"]
    rows = []
    for rule, key in plan_jobs(plan):
        rec = read_benchmark(benchmark_file(results, rule, key))
        if rec is not None:
            rows.append({"rule": rule, "job": key, **rec})
    return pd.DataFrame(rows, columns=COLUMNS)


def per_rule(times: pd.DataFrame) -> pd.DataFrame:
    """Per rule, in pipeline order: jobs, summed and longest wall s, summed CPU s, largest peak RSS MB."""
    if times.empty:
        return pd.DataFrame(columns=["rule", "jobs", "wall_s", "longest_s", "cpu_s", "max_rss_mb"])
    g = times.groupby("rule", sort=False)
    out = pd.DataFrame({"jobs": g.size(), "wall_s": g["wall_s"].sum(), "longest_s": g["wall_s"].max(),
                        "cpu_s": g["cpu_s"].sum(min_count=1), "max_rss_mb": g["max_rss_mb"].max()}).reset_index()
    order = {r: i for i, r in enumerate(RULES)}
    return out.sort_values("rule", key=lambda s: s.map(order)).reset_index(drop=True)


STAGE_TIMES_HEAD = ["rule", "jobs", "wall s (sum)", "longest job s", "CPU s (sum)", "max RSS MB"]
STAGE_TIMES_LEGEND = (
    "From Snakemake's benchmark records (a file per job under results/benchmarks/), per rule over the jobs of this plan that have "
    "one; a job whose output was already up to date keeps the record of the run that built it (stage_times.csv has "
    "every job, with the time it finished). The aggregate row is this report's own job, timed up to the writing of "
    "the report (paired tests, curves, plots). Jobs run in parallel, so the sums can exceed the run's wall time.")


def per_rule_rows(summary: pd.DataFrame) -> list[list[str]]:
    """``per_rule`` as the report's text cells (``STAGE_TIMES_HEAD``)."""
    fmt = lambda v, spec: "" if pd.isna(v) else format(v, spec)  # noqa: E731
    return [[str(r.rule), str(r.jobs), fmt(r.wall_s, ".1f"), fmt(r.longest_s, ".1f"), fmt(r.cpu_s, ".1f"),
             fmt(r.max_rss_mb, ".0f")] for r in summary.itertuples(index=False)]


def this_job(rule: str, key: str, started: float, cpu_started: float) -> dict[str, Any]:
    """The record of the running job itself (the aggregate job writes the report before Snakemake writes its
    benchmark file): wall and CPU seconds since it started, its peak RSS so far."""
    import resource
    import time

    now = time.time()
    return {"rule": rule, "job": key, "wall_s": now - started, "cpu_s": time.process_time() - cpu_started,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,  # KiB on Linux
            "finished": clock_text(now)}


def run_span(plan: Mapping[str, Any], run_dir: Path) -> tuple[float | None, float | None]:
    """(start, end) of the run in seconds since the epoch, from the stage records of its jobs and the aggregate
    job's own record (``run_times.json`` in the run folder); None where nothing was recorded."""
    import json

    times = stage_times(plan)
    starts, ends = [], []
    if not times.empty:
        finished = epoch_seconds(times["finished"])
        starts += list(finished - times["wall_s"].fillna(0))
        ends += list(finished)
    try:
        own = json.loads((Path(run_dir) / RUN_TIMES).read_text())
        starts.append(float(own["started"]))
        ends.append(float(own["finished"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return (min(starts) if starts else None), (max(ends) if ends else None)


RUN_TIMES = "run_times.json"  # the aggregate job's start and end (the run's end: the report is written)


def write_stage_times(plan: Mapping[str, Any], out: Path,
                      aggregate_started: tuple[float, float] | None = None) -> list[list[str]]:
    """``stage_times.csv`` in the run folder; returns the report's per-rule rows (``STAGE_TIMES_HEAD``), none
    without records. ``aggregate_started``: (wall, CPU) clock at the start of the aggregate job writing this report,
    so its own row (up to the report) is in the table too."""
    from biasflow.io import atomic_path

    times = stage_times(plan)
    if aggregate_started is not None:
        own = pd.DataFrame([this_job("aggregate", plan["plan_hash"], *aggregate_started)], columns=COLUMNS)
        times = own if times.empty else pd.concat([times, own], ignore_index=True)
    if times.empty:
        return []
    with atomic_path(out / "stage_times.csv", suffix=".csv") as tmp:
        times.to_csv(tmp, index=False)
    return per_rule_rows(per_rule(times))
