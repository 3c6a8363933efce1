"""biasflow run's compact console (issue 46): jobs done of total, what runs (with the scorer's progress), each
failure as it happens with its cause and log, Snakemake's full output in a log file named at the start and the end;
`-v` gives Snakemake's raw stream. Built on Snakemake's logger-plugin interface (the `biasflow` plugin turns its log
records into JSON events) and the scorers' progress files, never on console text."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, project_copy

ANSI_CURSOR = re.compile(r"\x1b\[[0-9;?]*[A-HJKSTfhlnsu]")  # cursor moves, erases, shows/hides
ANSI = re.compile(r"\x1b\[")


# ---------------------------------------------------------------------------------------------- the plugin
def record(msg, level=logging.INFO, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("snakemake.logging", level, __file__, 1, msg, None, None)
    rec.__dict__.update(extra)
    return rec


def test_snakemake_finds_the_plugin_by_its_package_name():
    from snakemake_interface_logger_plugins.registry import LoggerPluginRegistry

    import snakemake_logger_plugin_biasflow as plugin

    assert LoggerPluginRegistry().get_plugin("biasflow").log_handler is plugin.LogHandler


def test_the_plugin_writes_snakemakes_records_as_json_events(tmp_path, monkeypatch):
    from snakemake_interface_logger_plugins.common import LogEvent

    from snakemake_logger_plugin_biasflow import LogHandler

    log = tmp_path / "score.log"
    log.write_text("2026-01-01 00:00:00,000 ERROR biasflow: error: model 'x': no config.json\nTraceback ...\n")
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("BIASFLOW_EVENTS", str(events))
    monkeypatch.chdir(tmp_path)
    handler = LogHandler(None, None)
    assert not handler.writes_to_stream and not handler.writes_to_file  # Snakemake keeps its own stream
    handler.emit(record("stats", event=LogEvent.RUN_INFO, stats={"score": 2, "metric": 2, "total": 4}))
    handler.emit(record("Execute 1 jobs...", event=LogEvent.JOB_STARTED, jobs=[3]))
    handler.emit(record(" Rule: score, Jobid: 3", event=LogEvent.JOB_INFO, jobid=3, rule_name="score",
                        rule_msg=None, wildcards={"model_key": "tiny-1a2b3c4d", "metric": "crows_pairs"},
                        output=["results/scores/tiny-1a2b3c4d/crows_pairs-x.parquet"], log=["score.log"],
                        resources={"_cores": 1, "mem_mb": 1000}, threads=1, local=False))
    handler.emit(record("Error in rule score", logging.ERROR, event=LogEvent.JOB_ERROR, jobid=3, rule_name="score",
                        rule_msg=None, log=["score.log"], output=[], aux={}))
    handler.emit(record("Finished jobid: 4", event=LogEvent.JOB_FINISHED, job_id=4))
    handler.emit(record(None, event=LogEvent.PROGRESS, done=1, total=4))
    handler.emit(record("Select jobs to execute..."))  # plain info: not an event
    handler.emit(record("biasflow: no SLURM account set"))  # biasflow's own words (biasflow.slurm), info or not
    handler.emit(record("Exiting because a job execution failed.", logging.ERROR))
    handler.close()
    got = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in got] == ["run_info", "job_started", "job_info", "job_error", "job_finished",
                                         "progress", "message", "message"]
    info = got[2]
    assert info["output"] == [str(tmp_path / "results/scores/tiny-1a2b3c4d/crows_pairs-x.parquet")]  # absolute
    assert info["log"] == [str(log)] and info["resources"] == {"mem_mb": 1000}
    assert got[3]["cause"] == "model 'x': no config.json"  # read as the job failed (a retry starts a new log)
    assert got[5] == {"event": "progress", "done": 1, "total": 4, "t": got[5]["t"]}


def test_without_the_variable_the_plugin_writes_nothing(tmp_path, monkeypatch):
    from snakemake_interface_logger_plugins.common import LogEvent

    from snakemake_logger_plugin_biasflow import LogHandler

    monkeypatch.delenv("BIASFLOW_EVENTS", raising=False)
    monkeypatch.chdir(tmp_path)
    handler = LogHandler(None, None)
    handler.emit(record(None, event=LogEvent.PROGRESS, done=1, total=4))
    handler.close()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- progress files
def test_a_bar_reports_to_the_progress_folder_and_a_silent_one_stays_silent(tmp_path, monkeypatch, capsys):
    from biasflow.bars import progress_bar, progress_file

    monkeypatch.setenv("BIASFLOW_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("BIASFLOW_JOB_OUTPUTS", os.pathsep.join(["out/scores.parquet", "out/score.log"]))
    bar = progress_bar(total=10, desc="PLL tiny", unit="mask", disable=True)
    for _ in range(4):
        bar.update(1)
    bar._bf_report(force=True)
    state = json.loads(Path(progress_file(tmp_path)).read_text())
    assert state["n"] == 4 and state["total"] == 10 and state["unit"] == "mask" and state["desc"] == "PLL tiny"
    assert state["outputs"][0] == os.path.abspath("out/scores.parquet") and state["rate"] > 0
    bar.close()
    assert json.loads(Path(progress_file(tmp_path)).read_text())["finished"] is True
    assert capsys.readouterr().err == ""  # disable=True: nothing on stderr
    assert [p.name for p in tmp_path.iterdir()] == [Path(progress_file(tmp_path)).name]  # no temp file left
    for _ in progress_bar(range(3), desc="encode"):  # iterating works as tqdm's does
        pass
    assert json.loads(Path(progress_file(tmp_path)).read_text())["n"] == 3


def test_without_the_variable_a_bar_is_plain_tqdm(monkeypatch):
    from tqdm.auto import tqdm

    from biasflow.bars import progress_bar

    monkeypatch.delenv("BIASFLOW_PROGRESS_DIR", raising=False)
    bar = progress_bar(total=3, disable=True)
    assert type(bar) is tqdm
    bar.close()


# ---------------------------------------------------------------------------------------------- the view
PLAN = {"plan_hash": "abc123abc123", "paths": {"results": "results"}, "jobs": []}


def synthetic_run(console, tmp_path: Path) -> None:
    log = tmp_path / "results" / "logs" / "score" / "broken.log"
    log.parent.mkdir(parents=True)
    log.write_text("x ERROR biasflow: error: model 'tiny_broken': /m is not a model folder: no config.json\n")
    t = time.time() - 20
    events = [{"event": "run_info", "stats": {"score": 2, "metric": 1, "total": 3}},
              {"event": "job_started", "jobs": [1, 2]},
              {"event": "job_info", "jobid": 1, "rule": "score", "output": [str(tmp_path / "s1.parquet")],
               "log": [str(tmp_path / "s1.log")], "wildcards": {"model_key": "tiny_ok-1a2b3c4d",
                                                                "metric": "crows_pairs", "shash": "ff"}},
              {"event": "job_info", "jobid": 2, "rule": "score", "output": [str(tmp_path / "s2.parquet")],
               "log": [str(log)], "wildcards": {"model_key": "tiny_broken-9a8b7c6d", "metric": "crows_pairs",
                                                "shash": "ee"}},
              {"event": "job_error", "jobid": 2, "rule": "score", "log": [str(log)], "msg": None, "aux": {}},
              {"event": "job_finished", "jobid": 1},
              {"event": "progress", "done": 1, "total": 3},
              {"event": "job_info", "jobid": 3, "rule": "metric", "output": [str(tmp_path / "m/aggregate.parquet")],
               "log": [str(tmp_path / "m.log")], "wildcards": {"model_key": "tiny_ok-1a2b3c4d",
                                                               "metric": "crows_pairs", "chash": "aa"}}]
    for i, e in enumerate(events):
        console.handle({**e, "t": t + i})


def test_plain_view_is_one_line_per_event_without_cursor_codes(tmp_path, monkeypatch):
    from biasflow.console import RunConsole

    out = io.StringIO()
    console = RunConsole(PLAN, tmp_path, stream=out, live=False, plain_every_s=0.0, poll_s=0.05)
    monkeypatch.setenv("BIASFLOW_PROGRESS_DIR", str(console.progress_dir))
    console.start(["snakemake", "--cores", "1"])
    assert (tmp_path / console.log_shown).read_text().startswith("+ snakemake --cores 1")  # the command, logged
    synthetic_run(console, tmp_path)
    # the running metric job's bar writes its progress file; the view shows it
    from biasflow.bars import write_progress

    write_progress(str(console.progress_dir), {"outputs": [str(tmp_path / "m/aggregate.parquet")], "desc": "boot",
                                               "n": 30, "total": 120, "unit": "sample", "rate": 15.0,
                                               "remaining": 6.0, "time": time.time()})
    console._last_progress_poll = 0.0
    console._last_plain = 0.0
    console._poll()
    console.stop(1)
    text = out.getvalue()
    lines = text.splitlines()
    assert not ANSI.search(text)
    assert lines[0] == f"biasflow: running plan abc123abc123 with Snakemake; its full log: {console.log_shown}"
    assert console.log_shown.startswith("results/logs/run/abc123abc123-") and lines[-1].endswith(console.log_shown)
    assert re.search(r"^\[1/3\] done score tiny_ok crows_pairs \(0m0\ds\)$", text, re.M), text
    failed = lines.index(next(ln for ln in lines if ln.startswith("FAILED")))
    assert lines[failed] == ("FAILED score tiny_broken crows_pairs (attempt 1): model 'tiny_broken': /m is not a "
                             "model folder: no config.json")
    assert lines[failed + 1].strip() == f"log: {tmp_path}/results/logs/score/broken.log"
    running = [ln for ln in lines if "running metric" in ln][-1]
    assert "metric tiny_ok crows_pairs: boot 30/120 sample, 15 sample/s, 0m06s left" in running
    assert "1/3 jobs done" in running and "1 failed" in running
    assert "1 of 3 job(s) done, 1 failed" in lines[-1]
    assert not console.channel.exists()  # the events and progress files are removed


def test_a_retried_job_is_named_again_and_snakemakes_own_error_is_said_once(tmp_path):
    from biasflow.console import RunConsole

    out = io.StringIO()
    console = RunConsole(PLAN, tmp_path, stream=out, live=False, plain_every_s=None)
    console.start()
    console.handle({"event": "job_info", "jobid": 5, "rule": "download", "output": [], "log": [],
                    "wildcards": {"benchmark": "bold", "filename": "gender.json"}})
    console.handle({"event": "job_error", "jobid": 5, "rule": "download", "log": [], "msg": "SLURM TIMEOUT"})
    console.handle({"event": "job_info", "jobid": 5, "rule": "download", "output": [], "log": [],
                    "wildcards": {"benchmark": "bold", "filename": "gender.json"}})
    console.handle({"event": "job_finished", "jobid": 5})
    console.stop(0)
    text = out.getvalue()
    assert "FAILED download bold/gender.json (attempt 1): SLURM TIMEOUT" in text
    assert "retrying download bold/gender.json (attempt 2)" in text and "[1/?] done download bold/gender.json" in text
    out = io.StringIO()
    console = RunConsole(PLAN, tmp_path, stream=out, live=False, plain_every_s=None)
    console.start()
    console.handle({"event": "error", "exception": "SyntaxError", "msg": "SyntaxError in file Snakefile, line 3:\n"
                                                                          "Expected name\n  File x"})
    console.handle({"event": "message", "level": "WARNING", "msg": "biasflow: the SLURM controller does not answer"})
    console.handle({"event": "message", "level": "WARNING", "msg": "Select jobs to execute..."})
    console.stop(1)
    text = out.getvalue()
    assert text.count("Snakemake stopped: SyntaxError in file Snakefile, line 3: Expected name") == 1
    assert "biasflow: the SLURM controller does not answer" in text and "Select jobs" not in text


def test_live_view_on_a_terminal_ends_with_the_summary(tmp_path):
    """On a terminal (a pty here) rich draws the live view; it leaves the done and failed lines and the summary."""
    import pty

    from biasflow.console import RunConsole, is_terminal

    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w", buffering=1)
    assert is_terminal(stream) or os.environ.get("TERM") == "dumb"
    chunks = []
    try:
        console = RunConsole(PLAN, tmp_path, stream=stream, live=True, poll_s=0.05)
        console.start()
        synthetic_run(console, tmp_path)
        time.sleep(0.3)
        console.stop(1)
        stream.flush()
        os.set_blocking(master, False)
        while True:
            try:
                chunk = os.read(master, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        stream.close()
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "done score tiny_ok crows_pairs" in plain and "FAILED score tiny_broken crows_pairs" in plain
    assert "1 of 3 job(s) done, 1 failed" in plain and console.log_shown in plain


# ---------------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_bert_dir, crows_csv):
    work = tmp_path_factory.mktemp("console")
    conf = project_copy(work) / "conf"
    broken = work / "broken_model"
    broken.mkdir()
    (broken / "README.txt").write_text("weights still uploading")
    for name, path in (("tiny_ok", tiny_bert_dir), ("tiny_broken", broken)):
        (conf / "model" / f"{name}.yaml").write_text(
            f"name: {name}\nkind: masked_lm\npath: {path}\nlowercase: true\ndevice: cpu\nbatch_tokens: 2048\n")
    raw = work / "resources" / "datasets" / "crows_pairs" / "crows_pairs_anonymized.csv"
    raw.parent.mkdir(parents=True)
    shutil.copy(crows_csv, raw)
    return work


SWEEP = ["-m", "model=tiny_ok,tiny_broken", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10",
         "stats.n_boot=0"]


def biasflow(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), BIASFLOW_ROOT=str(ROOT), HF_HUB_OFFLINE="1")
    env.pop("TERM", None)
    return subprocess.run([sys.executable, "-m", "biasflow.cli", "run", *args, "--cores", "2", "--",
                           "--directory", str(project)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def full_log(out: str, project: Path) -> Path:
    """The full log the console names in its first and last lines."""
    named = re.findall(r"full log: (\S+\.log)", out)
    assert named and named[0] == named[-1], out[-3000:]
    path = Path(named[0])
    return path if path.is_absolute() else project / path


@pytest.mark.slow
def test_a_sweep_with_a_failing_job_is_a_short_console_and_a_full_log(project):
    proc = biasflow(project, *SWEEP)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    lines = out.splitlines()
    # 9 Snakemake jobs: a line each when done or failed (+ its log, a retry), the start and end, biasflow's own
    # closing status and partial-results lines; Snakemake's raw output of this run is ~250 lines
    assert len(lines) <= 40, out
    assert not ANSI_CURSOR.search(out) and "\r" not in out  # not a terminal: no redraws
    assert "rule score:" not in out and "wildcards:" not in out and "input:" not in out  # no job blocks
    assert "Writing model shards" not in out and "PLL tiny_ok" not in out  # nor the jobs' own output
    log = full_log(out, project)
    assert lines[0].startswith("+ ") or "full log" in lines[0]
    assert "full log:" in " ".join(lines[:3])
    raw = log.read_text()
    assert "rule score:" in raw and "wildcards:" in raw and "Error in rule score" in raw  # all of it is there
    score_log = next(project.glob("results/logs/score/tiny_broken-*/crows_pairs-*.log"))
    failure = [i for i, ln in enumerate(lines) if ln.startswith("FAILED score tiny_broken crows_pairs")]
    assert failure, out
    assert "is not a model folder" in lines[failure[-1]]
    assert lines[failure[-1] + 1].strip() == f"log: {score_log}"
    assert re.search(r"^\[\d+/9\] done score tiny_ok crows_pairs \(\d+m\d\ds\)$", out, re.M), out
    assert re.search(r"^\[\d+/9\] done metric tiny_ok crows_pairs", out, re.M), out
    # biasflow's own closing words are all still there
    assert "1 done" in out and "1 failed" in out and "partial results (1 of 2 jobs finished)" in out
    assert "Resume with:\n  biasflow run -m" in out
    assert not list((project / ".snakemake" / "biasflow" / "console").glob("*/events.jsonl"))  # cleaned up


@pytest.mark.slow
def test_verbose_shows_snakemakes_raw_job_blocks(project):
    proc = biasflow(project, "-v", *SWEEP)  # the broken job runs again (and fails again)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "rule score:" in out and "wildcards: model_key=tiny_broken" in out and "Error in rule score" in out
    assert "full log:" not in out and "FAILED score" not in out
    assert "partial results (1 of 2 jobs finished)" in out  # the closing words are the same


@pytest.mark.slow
def test_a_complete_run_ends_with_the_report_and_mlflow(project):
    proc = biasflow(project, "model=tiny_ok", "metric=[crows_pairs]", "benchmark.crows_pairs.limit=10",
                    "stats.n_boot=0")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert len(out.splitlines()) <= 15, out
    tail = proc.stdout.strip().splitlines()[-2:]
    assert tail[0].startswith("report:  ") and "report.html" in tail[0] and tail[1].startswith("MLflow:  "), out
    assert "full log:" in proc.stdout.strip().splitlines()[-4] or "full log:" in proc.stdout.strip().splitlines()[-3]
    assert full_log(out, project).exists()


def test_a_jobs_warning_reaches_the_console_once(tmp_path, monkeypatch):
    """biasflow's warnings in a job (a repeated item, a store re-pointed) are shown as they happen, with the job."""
    import logging as pylogging

    from biasflow.bars import report_warnings
    from biasflow.console import RunConsole

    out = io.StringIO()
    console = RunConsole(PLAN, tmp_path, stream=out, live=False, plain_every_s=None)
    console.start()
    monkeypatch.setenv("BIASFLOW_PROGRESS_DIR", str(console.progress_dir))
    monkeypatch.setenv("BIASFLOW_JOB_OUTPUTS", str(tmp_path / "items.parquet"))
    console.handle({"event": "job_info", "jobid": 1, "rule": "prepare", "output": [str(tmp_path / "items.parquet")],
                    "log": [], "wildcards": {"benchmark": "crows_pairs", "bhash": "ab"}})
    logger = pylogging.getLogger("biasflow")
    report_warnings()
    report_warnings()  # installed once
    try:
        logger.warning("crows_pairs: %d item(s) repeat another item's content", 3)
        logger.error("error: the job's own failure is its FAILED line")
        console._poll()
        console._last_progress_poll = 0.0
        console._poll()
    finally:
        for h in [h for h in logger.handlers if getattr(h, "_biasflow_notes", False)]:
            logger.removeHandler(h)
    console.stop(0)
    text = out.getvalue()
    assert text.count("warning (prepare crows_pairs): crows_pairs: 3 item(s) repeat another item's content") == 1
    assert "FAILED line" not in text
