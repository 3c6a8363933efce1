"""A full disk (issue 45): the message names the folder that filled (its free and total space), what was being
written and by which job, without Python's "--- Logging error ---" tracebacks; the fix is to free space and resume.
On a real, small tmpfs (needs root to mount one; skipped, saying so, elsewhere)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture()
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or 'not root'}); run as root to test a full "
                    f"disk")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def run_stage(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_a_stage_that_fills_the_disk_names_the_folder_and_the_job(small_disk, tmp_path):
    log = small_disk / "logs" / "score.log"
    proc = run_stage(f"""
        from types import SimpleNamespace
        from biasflow.stages import start_stage
        job = SimpleNamespace(rule="score", wildcards=dict(model_key="tiny-1", metric="crows_pairs").items and
                              SimpleNamespace(items=lambda: [("model_key", "tiny-1"), ("metric", "crows_pairs")]),
                              input=[], output=[{str(small_disk / "scores.parquet")!r}], log=[{str(log)!r}])
        start_stage({str(log)!r}, job)
        import logging
        with open({str(small_disk / "scores.parquet")!r}, "wb") as fh:
            for _ in range(100):
                fh.write(b"0" * 65536)
                logging.getLogger("biasflow").info("wrote a block")
        """, tmp_path)
    assert proc.returncode != 0
    err = proc.stderr
    assert "--- Logging error ---" not in err and "Traceback" not in err
    line = next(line for line in err.splitlines() if line.startswith("biasflow: error: the disk is full"))
    assert f"writing {small_disk / 'scores.parquet'}" in line and f"the folder {small_disk}" in line
    assert "free of" in line and "rule score (model_key=tiny-1, metric=crows_pairs)" in line
    assert "resume with the same command" in line


def test_a_download_onto_a_full_disk_names_the_resources_folder(small_disk, tmp_path):
    """The dataset download that filled resources/ said 'results go under paths.results'."""
    import hashlib

    source = tmp_path / "big.csv"
    source.write_bytes(b"x,y\n" * 200_000)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    dest = small_disk / "resources" / "datasets" / "crows_pairs" / "big.csv"
    proc = run_stage(f"""
        from biasflow.stages import start_stage, download_file
        start_stage(None)
        download_file([{{"url": {source.as_uri()!r}, "sha256": {digest!r}}}], {str(dest)!r},
                      {str(tmp_path / "wheels")!r})
        """, tmp_path)
    assert proc.returncode != 0
    err = proc.stderr
    assert "--- Logging error ---" not in err and "results go under paths.results" not in err
    line = next(line for line in err.splitlines() if "the disk is full" in line)
    assert str(dest.parent) in line or str(small_disk) in line
    assert not dest.exists()  # nothing half-written is left as the dataset


def test_an_error_naming_no_file_names_the_full_folder_among_the_runs_folders(small_disk, tmp_path, monkeypatch):
    """The run's closing summary named the project folder (59 GiB free) instead of the full results disk: an error
    that names no file is matched against the run's folders (results, resources), the one on a full disk named."""
    import errno

    from biasflow.errors import full_disk_text

    (small_disk / "fill").write_bytes(b"\0" * 1024)
    with pytest.raises(OSError):
        with open(small_disk / "filler", "wb") as fh:
            fh.write(b"\0" * (1 << 20))
    monkeypatch.setenv("BIASFLOW_JOB_OUTPUTS", os.pathsep.join([str(tmp_path / "resources"),
                                                                 str(small_disk / "results")]))
    text = full_disk_text(OSError(errno.ENOSPC, "No space left on device"))
    assert f"the folder {small_disk}" in text and str(tmp_path / "resources") not in text
