"""The run folder's files that have nothing to show in this run, written anyway: the aggregate rule declares every
file of ``biasflow.report.RUN_FILES`` as an output, so each exists after every run (a table with its header and no
rows; a Markdown or LaTeX file saying why it is empty)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from biasflow.io import atomic_path, write_text
from biasflow.report import RUN_FILES

# why a file can be empty, in the words its Markdown / LaTeX stand-in uses
WHY = {
    "leaderboard": "no metric of this run has a headline value",
    "paired_tests": "paired tests compare two or more models on the same items; this run has no such pair",
    "paper_tables": "no experiment preset (conf/experiment/) with published numbers is part of this run",
}


def empty_columns() -> dict[str, list[str]]:
    from biasflow.report import compare as cmp, leaderboard as lb, timing

    return {"leaderboard.csv": list(lb.COLUMNS), "paired_tests.csv": list(cmp.PAIRED_COLUMNS),
            "curves.csv": list(cmp.CURVE_COLUMNS), "stage_times.csv": list(timing.COLUMNS),
            # published.compare's columns
            "comparison.csv": ["experiment", "model", "hub_id", "split", "metric_family", "metric", "category",
                               "published", "ours", "ci_low", "ci_high", "n", "delta", "published_in_ci"]}


def write_empty_run_files(out: Path, plan: Mapping[str, Any]) -> list[str]:
    """Write each run file the report did not write (nothing to show); return their names."""
    written = []
    columns = empty_columns()
    for name in RUN_FILES:
        path = Path(out) / name
        if path.exists():
            continue
        stem, suffix = name.rsplit(".", 1)
        if suffix == "csv":
            with atomic_path(path, suffix=".csv") as tmp:
                pd.DataFrame(columns=columns.get(name, [])).to_csv(tmp, index=False)
        elif suffix == "md":
            write_text(f"Nothing to show: {WHY.get(stem, 'nothing of this kind in this run')} (run {plan['plan_hash']}).\n",
                       path)
        elif suffix == "tex":
            write_text(f"% Nothing to show: {WHY.get(stem, 'nothing of this kind in this run')} "
                       f"(run {plan['plan_hash']}).\n", path)
        else:
            continue  # the tables, report.md and report.html are always written by the report itself
        written.append(name)
    (Path(out) / "plots").mkdir(parents=True, exist_ok=True)
    return written


def is_placeholder(path: Path) -> bool:
    """Whether a run file is a stand-in with nothing to show (a CSV with its header only, a "Nothing to show" note):
    not worth an MLflow artifact."""
    path = Path(path)
    if path.suffix == ".csv":
        with open(path) as fh:
            return sum(1 for _ in zip(range(2), fh)) <= 1
    if path.suffix in (".md", ".tex"):
        with open(path) as fh:
            return fh.read(40).lstrip("% ").startswith("Nothing to show")
    return False
