"""Two runs in one folder (issue 45): a run started while another is active here is refused before Snakemake
starts, naming the live run (pid, host, start, command), without suggesting to unlock the folder, and without
touching the live run's owner record (biasflow status keeps showing it as running)."""
from __future__ import annotations

import json
import subprocess
import sys

from biasflow import progress, runner
from biasflow.plan import build_plan


def test_a_second_run_names_the_live_one_and_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = build_plan(["metric=[crows_pairs]"])
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        record = progress.owner_record(live.pid, None, "biasflow run metric=[crows_pairs]", str(tmp_path))
        owner_file = tmp_path / ".snakemake" / "biasflow" / "owner.json"
        owner_file.parent.mkdir(parents=True)
        owner_file.write_text(json.dumps(record))
        before = owner_file.read_bytes()
        started = []
        monkeypatch.setattr(runner, "run_snakemake", lambda *a, **k: started.append(a) or (0, False))
        staged = set((tmp_path / ".snakemake").rglob("*"))
        outcome = runner.execute(plan, ["metric=[crows_pairs]"])
        assert started == []  # Snakemake never started, so it took no lock and wrote nothing
        assert set((tmp_path / ".snakemake").rglob("*")) == staged  # not even its staged plan
        assert outcome.exit_code != 0 and outcome.locked
        text = runner.failure_text(outcome)
        assert f"pid {live.pid}" in text and record["host"] in text and "biasflow run metric=[crows_pairs]" in text
        assert "--unlock" not in text and "Do not unlock" in text
        assert owner_file.read_bytes() == before
        assert progress.owner_alive(json.loads(owner_file.read_text())) is True
    finally:
        live.kill()
        live.wait()
    # once the live run is gone, the same command starts (the stale record is no obstacle)
    outcome = runner.execute(plan, ["metric=[crows_pairs]"])
    assert outcome.live_run is None and len(started) == 1


def test_a_refused_snakemake_start_restores_the_owner_record(tmp_path, monkeypatch):
    """When Snakemake itself finds the folder locked (a lock biasflow cannot attribute), the owner record written
    as it started is put back as it was."""
    monkeypatch.chdir(tmp_path)
    plan = build_plan(["metric=[crows_pairs]"])
    owner_file = tmp_path / ".snakemake" / "biasflow" / "owner.json"
    owner_file.parent.mkdir(parents=True)
    owner_file.write_text('{"pid": 1, "host": "elsewhere", "ended": 1.0}')

    def locked_snakemake(cmd, root, env, on_start=None):
        on_start(12345)  # biasflow records itself when Snakemake starts ...
        return 1, True  # ... which then reports "Directory cannot be locked"

    monkeypatch.setattr(runner, "run_snakemake", locked_snakemake)
    outcome = runner.execute(plan, ["metric=[crows_pairs]"])
    assert outcome.locked and outcome.live_run is None
    assert json.loads(owner_file.read_text()) == {"pid": 1, "host": "elsewhere", "ended": 1.0}
    assert not (tmp_path / plan.run_dir / "owner.json").exists()


def test_status_without_arguments_shows_the_last_run_made_in_the_folder(tmp_path, monkeypatch, capsys):
    """Issue 46: `biasflow status` with no argument reported the default plan ("9 waiting"), not the run just made
    in that folder."""
    from biasflow import cli

    monkeypatch.chdir(tmp_path)
    plan = build_plan(["metric=[crows_pairs]", "benchmark.crows_pairs.limit=7"])
    monkeypatch.setattr(runner, "run_snakemake", lambda cmd, root, env, on_start=None: (on_start(4242), (0, False))[1])
    runner.execute(plan, ["metric=[crows_pairs]", "benchmark.crows_pairs.limit=7"])
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"plan {plan.plan_hash}" in out and "the last run in this folder" in out
    default = build_plan([]).plan_hash
    assert default != plan.plan_hash and f"plan {default}" not in out
