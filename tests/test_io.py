"""biasflow.io: atomic writes give files the permissions of a normal write (0o666 minus the umask)."""
from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

from biasflow.io import atomic_path, atomic_write, write_json, write_parquet, write_text
from biasflow.scoring.cache import AnswerCache


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    write_text("x\n", tmp_path / "a.txt")
    write_json({"a": 1}, tmp_path / "sub" / "a.json")
    write_parquet(pd.DataFrame({"a": [1]}), tmp_path / "a.parquet")
    with atomic_write(tmp_path / "b.bin") as fh:
        fh.write(b"x")
    with atomic_path(tmp_path / "c.csv", suffix=".csv") as tmp:
        pd.DataFrame({"a": [1]}).to_csv(tmp)
    part = AnswerCache(tmp_path / "cache", "fp", "kind").put(pd.DataFrame({"key": ["k"], "v": [1]}))
    for p in ("a.txt", "sub/a.json", "a.parquet", "b.bin", "c.csv", part):
        assert mode(tmp_path / p) == expected, p
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files left


def test_failed_write_leaves_the_old_file(tmp_path, umask):
    write_text("old\n", tmp_path / "a.txt")
    with pytest.raises(RuntimeError):
        with atomic_write(tmp_path / "a.txt", "w") as fh:
            fh.write("new")
            raise RuntimeError("writer failed")
    assert (tmp_path / "a.txt").read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]
