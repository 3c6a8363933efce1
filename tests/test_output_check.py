"""Damaged outputs heal (issue 45): a truncated or overwritten Parquet or JSON file under results/ made every re-run
fail reading it. Before a run, each is checked; a damaged one is moved aside (kept), named, and recomputed."""
from __future__ import annotations

import json
import os

import pandas as pd

from biasflow.output_check import DAMAGED, quarantine_damaged


def test_damaged_outputs_are_moved_aside_named_and_the_sound_ones_kept(tmp_path):
    results = tmp_path / "results"
    table = results / "scores" / "m-1" / "crows_pairs-abc.parquet"
    table.parent.mkdir(parents=True)
    pd.DataFrame({"x": range(100)}).to_parquet(table)
    truncated = results / "metrics" / "m-1" / "crows_pairs" / "h" / "aggregate.parquet"
    truncated.parent.mkdir(parents=True)
    pd.DataFrame({"x": range(100)}).to_parquet(truncated)
    truncated.write_bytes(truncated.read_bytes()[:-20])
    overwritten = results / "items" / "crows_pairs-1.parquet"
    overwritten.parent.mkdir(parents=True)
    overwritten.write_text("not a table")
    meta = results / "items" / "crows_pairs-1.parquet.meta.json"
    meta.write_text('{"rows": 3')
    good_meta = results / "scores" / "m-1" / "crows_pairs-abc.parquet.meta.json"
    good_meta.write_text('{"rows": 3}')

    lines = quarantine_damaged(results)
    assert len(lines) == 3
    for path in (truncated, overwritten, meta):
        assert not path.exists()
        line = next(line for line in lines if line.startswith(str(path)))
        assert "was damaged" in line and "runs again" in line
        kept = [p for p in (results / DAMAGED).rglob("*") if p.name.rsplit(".", 1)[0] == path.name]
        assert len(kept) == 1  # nothing is lost: the damaged file is kept for a look
    assert "Parquet magic bytes" in next(line for line in lines if "aggregate.parquet" in line)
    assert table.exists() and good_meta.exists()
    assert quarantine_damaged(results) == []  # the second look reads nothing new

    # a sound file damaged later (same size, new content and time) is found again
    before = table.stat()
    table.write_bytes(b"\0" * before.st_size)
    os.utime(table, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert [line for line in quarantine_damaged(results) if str(table) in line]
    assert json.loads((results / ".checked.json").read_text()).get(str(good_meta.relative_to(results)))
