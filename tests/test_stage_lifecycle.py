"""A stage dies with the Snakemake process that started it (kill -9 must not leave jobs writing behind it)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from biasflow.io import atomic_write
    from biasflow.stages import start_stage
    start_stage(sys.argv[1])
    beat = Path(sys.argv[2])
    try:
        with atomic_write(sys.argv[3]) as fh:   # a long write that must never appear half-done
            while True:
                beat.write_text(str(time.time()))
                fh.write(b"x" * 10)
                time.sleep(0.05)
    finally:
        beat.with_suffix(".exited").write_text("clean")
""")

# The parent: named `snakemake` (as `python -m snakemake` is), it starts the stage through a shell, as Snakemake does.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    subprocess.Popen(["/bin/sh", "-c", " ".join(sys.argv[1:])])
    time.sleep(600)
""")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_kill_9_of_snakemake_stops_its_jobs(tmp_path):
    child, parent = tmp_path / "child.py", tmp_path / "snakemake"
    child.write_text(CHILD)
    parent.write_text(PARENT)
    beat, out, log = tmp_path / "beat", tmp_path / "out.bin", tmp_path / "stage.log"
    proc = subprocess.Popen([sys.executable, str(parent), sys.executable, str(child), str(log), str(beat), str(out)])
    deadline = time.monotonic() + 60
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert beat.exists(), "the stage did not start"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while not beat.with_suffix(".exited").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert beat.with_suffix(".exited").exists(), "the stage kept running after Snakemake was killed"
    last = beat.read_text()
    time.sleep(0.5)
    assert beat.read_text() == last  # and it stopped writing
    assert not out.exists() and not list(tmp_path.glob(".out.bin.*"))  # no half-written output, no temp file
    assert "Snakemake (pid" in log.read_text() and "is gone" in log.read_text()


def test_failing_stage_writes_its_traceback_to_the_rule_log(tmp_path):
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent("""
        import sys
        from biasflow.stages import start_stage
        from biasflow.errors import DataFormatError
        start_stage(sys.argv[1])
        def load(): raise DataFormatError("items.csv, line 3: wrong number of fields")
        load()
    """))
    log = tmp_path / "logs" / "x.log"
    proc = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True)
    assert proc.returncode != 0
    text = log.read_text()
    assert "items.csv, line 3: wrong number of fields" in text and "Traceback" in text and "in load" in text


@pytest.mark.parametrize("torch_first", [False, True])
def test_set_threads_holds_whether_or_not_torch_is_imported_yet(torch_first):
    """A score job served by the cache imports no torch; one that loads a model imports it after set_threads."""
    code = ("import torch\n" if torch_first else "") + textwrap.dedent("""
        from biasflow.stages import set_threads
        set_threads(1)
        import torch
        print(torch.get_num_threads())
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"
