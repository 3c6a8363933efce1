"""An honest DAG: every file a job writes is a declared output of its rule, every file it reads a declared input.

A small plan (CrowS-Pairs with a two-value threshold sweep, Winogender, whose metric writes a table beside its own,
and StereoSet with ``export_predictions``) runs under ``strace``, which sees every file each job's process opens,
renames or deletes, C++ readers (pyarrow) included. Each stage records its process id and what its rule declares
(``stages.start_stage`` with ``BIASFLOW_AUDIT_DIR``), and the test compares the two. Then what a user relies on:
parsing writes nothing under results/, ``--summary`` lists every file with nothing pending, and deleting any
report or metadata file rebuilds it.

Not compared, each for its reason: the stores every run shares, outside the DAG by design (the answer cache
``results/cache``, content-addressed by model fingerprint and request; the verified downloads' ``.verified/`` store
and wheel mirror; the MLflow store, whose record ``mlflow.json`` is the rule's output), Snakemake's own records
(``.snakemake/``, ``results/benchmarks/``: the stage-times table reads the latter, which Snakemake writes after each
job; declaring them would make a lost timing record re-run a model), and files outside the project (Python, the
installed packages, /proc).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import ROOT, mirrored_files, project_copy, snakemake_job_stats
from test_stereoset_export import with_tiny_bert_and_small_stereoset

pytestmark = pytest.mark.slow

STRACE = shutil.which("strace")
INSTALL_HINT = "strace is missing: apt-get install strace (CI installs it: .ci/run)"

OVERRIDES = ["metric=[crows_pairs,winogender,stereoset]", "model=tiny_bert_pt", "benchmark.crows_pairs.limit=12",
             "benchmark.winogender.limit=24", "stats.n_boot=20", "metric.crows_pairs.diff_threshold=0.05,0.1"]
EXPORT = "exports/stereoset_predictions.json"


def snakemake(project: Path, overrides, extra=(), env_extra=None, strace_to: Path | None = None) -> str:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(project),
           "--cores", "2", "--config", f"overrides={json.dumps(list(overrides))}", "multirun=true", *extra]
    if strace_to is not None:
        cmd = [STRACE, "-f", "-ff", "-qq", "-y", "-s", "4096", "-e", "signal=none", "-o", str(strace_to / "trace"),
               "-e", "trace=openat,open,creat,rename,renameat,renameat2,unlink,unlinkat,clone,clone3,fork,vfork",
               *cmd]
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), HF_HUB_OFFLINE="1", **(env_extra or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory, crows_csv):
    return with_tiny_bert_and_small_stereoset(project_copy(
        tmp_path_factory.mktemp("dag-project"),
        {"crows_pairs/crows_pairs_anonymized.csv": crows_csv,
         **{f"winogender/{p.name}": p for p in mirrored_files("winogender", "winogender").values()}}))


def overrides(project: Path) -> list[str]:
    return [*OVERRIDES, f"metric.stereoset.export_predictions={project / EXPORT}"]


# ------------------------------------------------------------------------------------------------ the strace trace
LINE = re.compile(r"^(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+)(?:<(?P<fdpath>[^>]*)>)?")
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def read_traces(folder: Path) -> tuple[dict[int, list[tuple]], dict[int, list[int]]]:
    """Per thread id: its file events [(call, paths, flags)]; and thread id -> the thread / process ids it
    started (clone, fork)."""
    events: dict[int, list[tuple]] = defaultdict(list)
    children: dict[int, list[int]] = defaultdict(list)
    for path in folder.glob("trace.*"):
        tid = int(path.suffix[1:])
        for line in path.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if not m or int(m["ret"]) < 0:
                continue
            call, args = m["call"], m["args"]
            if call in ("clone", "clone3", "fork", "vfork"):
                children[tid].append(int(m["ret"]))
            elif call in ("openat", "open", "creat"):
                if m["fdpath"] and "O_DIRECTORY" not in args:
                    write = call == "creat" or any(f in args for f in ("O_WRONLY", "O_RDWR", "O_CREAT"))
                    events[tid].append(("write" if write else "read", (m["fdpath"],)))
            elif call.startswith("rename"):
                events[tid].append(("rename", tuple(STRING.findall(args)[:2])))
            elif call.startswith("unlink"):
                events[tid].append(("unlink", tuple(STRING.findall(args)[:1])))
    return events, children


def job_threads(pid: int, children: dict[int, list[int]]) -> set[int]:
    todo, seen = [pid], set()
    while todo:
        tid = todo.pop()
        if tid not in seen:
            seen.add(tid)
            todo += children.get(tid, [])
    return seen


def within(path: str, declared: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in declared)


def audit(project: Path, traces: Path, records: Path) -> tuple[list[str], dict[str, int]]:
    """What each job wrote outside its declared outputs or read outside its declared inputs."""
    events, children = read_traces(traces)
    work = str(project.resolve())
    exempt = [f"{work}/results/cache", f"{work}/.snakemake", f"{work}/results/benchmarks",
              # stores shared by every run, like a server: the MLflow store (the embedded default, sqlite and its
              # artifact folder; mlflow.json is the rule's record of what it logged), the downloads' wheel mirror
              f"{work}/results/mlflow.db", f"{work}/results/.mlflow.db.lock", f"{work}/results/mlartifacts",
              f"{work}/resources/wheels"]
    problems, rules = [], defaultdict(int)
    for rec_path in sorted(records.glob("*.json")):
        rec = json.loads(rec_path.read_text())
        rules[rec["rule"]] += 1
        absolute = lambda p: os.path.normpath(p if os.path.isabs(p) else os.path.join(rec["cwd"], p))  # noqa: E731
        inputs = [absolute(p) for p in rec["input"]]
        outputs = [absolute(p) for p in rec["output"]] + [absolute(p) for p in rec["log"]]
        written, renamed_away, removed, read = set(), set(), set(), set()
        for tid in job_threads(rec["pid"], children):
            for kind, paths in events.get(tid, []):
                paths = [absolute(p) for p in paths]
                if kind == "write" and re.fullmatch(r"#\d+", os.path.basename(paths[0])):
                    continue  # an unnamed O_TMPFILE (filelock probes the folder with one): never a file in the tree
                if kind == "write":
                    written.add(paths[0])
                elif kind == "read":
                    read.add(paths[0])
                elif kind == "rename" and len(paths) == 2:
                    renamed_away.add(paths[0])
                    written.add(paths[1])
                elif kind == "unlink" and paths:
                    removed.add(paths[0])
        # the verified downloads' content-addressed store (.verified/ beside the files: never deleted from) is
        # a store as well; directories opened to sync them are not files
        mine = lambda p: (p.startswith(work + "/") and not within(p, exempt) and "/.verified/" not in p  # noqa: E731
                          and not os.path.isdir(p))
        for path in sorted(p for p in written - renamed_away - removed if mine(p)):
            if not within(path, outputs):
                problems.append(f"{rec['rule']} wrote {os.path.relpath(path, work)}, not a declared output")
        for path in sorted(p for p in read if mine(p) and p not in written):
            if not within(path, inputs) and not within(path, outputs):
                problems.append(f"{rec['rule']} read {os.path.relpath(path, work)}, not a declared input")
    return sorted(set(problems)), dict(rules)


@pytest.fixture(scope="module")
def traced(project, tmp_path_factory):
    if STRACE is None:
        pytest.skip(INSTALL_HINT)
    traces = tmp_path_factory.mktemp("strace")
    records = tmp_path_factory.mktemp("declared")
    out = snakemake(project, overrides(project), env_extra={"BIASFLOW_AUDIT_DIR": str(records)}, strace_to=traces)
    return out, traces, records


def test_every_job_reads_and_writes_only_what_its_rule_declares(project, traced):
    _, traces, records = traced
    problems, rules = audit(project, traces, records)
    # every stage ran and was audited: the metric with a table of its own (winogender) and the export have rules
    # of their own
    assert {"plan", "prepare", "score", "metric", "metric_winogender", "export_0", "aggregate",
            "log_mlflow"} <= set(rules), rules
    assert problems == []


def test_parsing_writes_nothing_under_results(project, traced, tmp_path):
    from test_workflow import run_dir

    before = sorted(p for p in (project / "results").rglob("*") if "benchmarks" not in p.parts)
    changed = [*overrides(project)[:-1], "stats.n_boot=21", f"metric.stereoset.export_predictions={project / EXPORT}"]
    out = snakemake(project, changed, extra=["--dry-run"])
    assert snakemake_job_stats(out)["aggregate"] == 1  # a new plan, with jobs to run
    after = sorted(p for p in (project / "results").rglob("*") if "benchmarks" not in p.parts)
    assert after == before
    assert not run_dir(project, changed, True).exists()


def test_summary_lists_every_output_with_nothing_pending(project, traced):
    out = snakemake(project, overrides(project), extra=["--summary"])
    rows = [line.split("\t") for line in out.splitlines() if "\t" in line]
    head, rows = rows[0], rows[1:]
    files = {r[head.index("output_file")]: r[head.index("status")] for r in rows}
    run_files = [f for f in files if "/runs/" in f]
    names = {Path(f).name for f in run_files}
    from biasflow.report import RUN_FILES

    assert set(RUN_FILES) | {"plan.json", "mlflow.json", "plots"} <= names
    assert any(f.endswith(".parquet.meta.json") and "/items/" in f for f in files)
    assert any(f.endswith(".parquet.meta.json") and "/scores/" in f for f in files)
    assert any(f.endswith("/occupations.csv") for f in files)
    assert str(project / EXPORT) in files
    # a dataset file placed by hand (as this test places CrowS-Pairs and Winogender) has no download record, and
    # --summary says so; nothing else is pending
    placed = {str(p) + ".source.json" for p in (project / "resources" / "datasets").glob("[cw]*/*")
              if not p.name.endswith(".source.json")}
    pending = {f: s for f, s in files.items() if s != "ok"}
    assert set(pending) == placed and set(pending.values()) == {"missing"}
    for change in ("input", "code", "params"):
        listed = snakemake(project, overrides(project), extra=["--list-changes", change])
        assert not [line for line in listed.splitlines() if str(project) in line], (change, listed)


@pytest.mark.parametrize("name, rules", [
    ("runs/{run}/leaderboard.tex", {"aggregate", "log_mlflow"}),
    ("runs/{run}/report.html", {"aggregate", "log_mlflow"}),
    ("runs/{run}/paired_tests.md", {"aggregate", "log_mlflow"}),
    ("runs/{run}/plan.json", {"plan", "aggregate", "log_mlflow"}),
    ("metrics/{winogender}/occupations.csv", {"metric_winogender", "aggregate", "log_mlflow"}),
    ("items/{crows_items}.meta.json", {"prepare", "score", "metric", "aggregate", "log_mlflow"}),
])
def test_a_deleted_file_is_rebuilt(project, traced, name, rules):
    from test_workflow import run_dir

    results = project / "results"
    rdir = run_dir(project, overrides(project), True)
    path = results / name.format(run=rdir.name,
                                 winogender=next(results.glob("metrics/*/winogender/*")).relative_to(
                                     results / "metrics"),
                                 crows_items=next(results.glob("items/crows_pairs-*.parquet")).name)
    assert path.exists()
    before = path.read_bytes() if path.suffix in (".json", ".csv", ".tex", ".md") and "meta" not in path.name \
        and "plan" not in path.name else None
    path.unlink()
    out = snakemake(project, overrides(project))
    assert path.exists()
    stats = snakemake_job_stats(out)
    for key in ("all", "total"):
        stats.pop(key, None)
    assert set(stats) == rules, stats
    if before is not None:
        assert path.read_bytes() == before
    assert snakemake_job_stats(snakemake(project, overrides(project), extra=["--dry-run"])) == {}
