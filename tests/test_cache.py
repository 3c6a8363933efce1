"""The part-file caches: append-only, resumable, safe under concurrent writers, checked before every read."""
from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from biasflow.part_store import PartStore
from biasflow.scoring.cache import ScoreCache, request_key


def rows(keys, value=1.0):
    return pd.DataFrame({"key": keys, "total": [value] * len(keys)})


def test_fetch_or_compute_only_computes_missing(tmp_path):
    cache = ScoreCache(tmp_path, "fp", "pll")
    calls = []

    def compute(chunk):
        calls.append(list(chunk.key))
        return rows(list(chunk.key))

    req = pd.DataFrame({"key": ["a", "b", "c"]})
    out = cache.fetch_or_compute(req, compute)
    assert list(out.key) == ["a", "b", "c"]
    out = cache.fetch_or_compute(pd.DataFrame({"key": ["c", "d", "a"]}), compute)
    assert list(out.key) == ["c", "d", "a"]  # request order
    assert calls == [["a", "b", "c"], ["d"]]


def test_interrupted_compute_keeps_finished_chunks(tmp_path):
    cache = ScoreCache(tmp_path, "fp", "pll")
    seen = []

    def flaky(chunk):
        seen.extend(chunk.key)
        if "k3" in set(chunk.key):
            raise KeyboardInterrupt  # the run is killed while scoring the second chunk
        return rows(list(chunk.key))

    req = pd.DataFrame({"key": [f"k{i}" for i in range(6)]})
    with pytest.raises(KeyboardInterrupt):
        cache.fetch_or_compute(req, flaky, chunk_size=3)
    assert cache.keys() == {"k0", "k1", "k2"}
    seen.clear()
    cache.fetch_or_compute(req, lambda c: (seen.extend(c.key), rows(list(c.key)))[1], chunk_size=3)
    assert seen == ["k3", "k4", "k5"]  # the restart redoes nothing that finished


def _writer(args):
    root, worker = args
    cache = ScoreCache(root, "fp", "pll")
    for i in range(10):
        cache.put(rows([f"w{worker}-{i}", "shared"], value=float(worker)))


def test_concurrent_writers_do_not_corrupt(tmp_path):
    with mp.get_context("spawn").Pool(4) as pool:
        pool.map(_writer, [(str(tmp_path), w) for w in range(4)])
    cache = ScoreCache(tmp_path, "fp", "pll")
    assert cache.keys() == {f"w{w}-{i}" for w in range(4) for i in range(10)} | {"shared"}
    got = cache.get(["shared", "w2-3"])
    assert len(got) == 2  # duplicate keys from racing writers collapse to one row


def test_request_key_depends_on_every_part():
    base = request_key("fp", "pll", {"text": "a"}, {"x": 1})
    assert base == request_key("fp", "pll", {"text": "a"}, {"x": 1})
    assert len({base, request_key("fp2", "pll", {"text": "a"}, {"x": 1}),
                request_key("fp", "aul", {"text": "a"}, {"x": 1}),
                request_key("fp", "pll", {"text": "b"}, {"x": 1}),
                request_key("fp", "pll", {"text": "a"}, {"x": 2})}) == 5


# ----------------------------------------------------------------------------------------- integrity (issue 9/14)
INPUTS = ["The nurse was tired.", "A cat sat.", "He fixed the car quickly.", "She is an engineer.",
          "They went home early today.", "Old people are slow."]


class FakeBackend:
    """A generation backend that answers from the prompt alone and records what it was asked."""

    fingerprint = "fake-backend"
    model_id = "fake-model"

    def __init__(self):
        self.sent = []

    def generate(self, requests, settings):
        for req in requests:
            self.sent.append(req.key)
            yield {"key": req.key, "prompt": req.prompt, "sample_index": req.sample_index,
                   "response": f"answer|{req.prompt}|{req.sample_index}", "status": "ok", "error": None,
                   "latency_s": 0.0, "created_at": 0.0}


class FakeEncoder:
    """A sentence encoder whose vector of a text is a function of the text alone."""

    fingerprint = "fake-encoder"
    pooling = "mean"

    def encode(self, texts, pooling, batch_size=None, progress=False):
        return np.stack([np.frombuffer(hashlib.sha256(t.encode()).digest(), dtype=np.uint8)[:8].astype(np.float32)
                         for t in texts])


def _scores(request, root, texts):
    from biasflow.scoring.masked import PLL_KIND, pll_table

    model = request.getfixturevalue("tiny_bert")
    table = pll_table(model, texts, cache=ScoreCache(root, model.fingerprint, PLL_KIND), progress=False)
    # bytes of the float64 vector: exact, and NaN (special tokens) compares equal to NaN
    return {t: (tot, np.asarray(lp, dtype=np.float64).tobytes()) for t, tot, lp in
            zip(table.text, table.total, table.logprobs)}


class FakeGenerator:
    """A model of kind ``generator`` whose backend is ``FakeBackend``."""

    kind = "generator"
    fingerprint = "fake-backend"
    name = "fake-model"

    def __init__(self):
        self.backend = FakeBackend()


def _generations(request, root, texts):
    from biasflow.generation import GenerationSettings
    from biasflow.scoring.answer import answer_requests

    out = answer_requests(GenerationSettings(count=2).requests(texts), {"kind": "generator"}, root,
                          model=FakeGenerator(), progress=False)
    return {(p, i): r for p, i, r in zip(out.prompt, out.sample_index, out.response)}


def _embeddings(request, root, texts):
    from biasflow.scoring.embeddings import encode_cached

    return {t: tuple(v) for t, v in zip(texts, encode_cached(FakeEncoder(), texts, root))}


# harness: (run the cache's user on some inputs -> {input: result}, folder of the parts, column to tamper with)
HARNESSES = {
    "scores": (_scores, lambda root, request: root / request.getfixturevalue("tiny_bert").fingerprint / "pll",
               "total"),
    "generations": (_generations, lambda root, request: root / "fake-backend" / "generation", "response"),
    "embeddings": (_embeddings, lambda root, request: root / "fake-encoder" / "mean", "vector"),
}


def _tamper(path, column):
    """Rewrite a part with other values in ``column``: still a valid Parquet file with the same schema."""
    table = pq.read_table(path)
    df = table.to_pandas()
    if column == "response":
        df[column] = "tampered"
    elif column == "vector":
        df[column] = [[-float(x) for x in v] for v in df[column]]
    else:
        df[column] = df[column] * 2 + 1
    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False), path)


def _keys_of(paths):
    return {k for p in paths for k in pq.read_table(p, columns=["key"]).column("key").to_pylist()}


@pytest.mark.parametrize("damage", ["truncate", "alter"])
@pytest.mark.parametrize("cache", sorted(HARNESSES))
def test_a_damaged_part_is_quarantined_with_a_warning_and_its_rows_computed_again(cache, damage, tmp_path,
                                                                                  request, caplog):
    run, folder, column = HARNESSES[cache]
    run(request, tmp_path, INPUTS[:3])  # a first run: part 1
    expected = run(request, tmp_path, INPUTS)  # the rest: part 2
    parts_dir = folder(tmp_path, request)
    parts = sorted(parts_dir.glob("part-*.parquet"))
    assert len(parts) == 2
    victim = parts[0]
    held = _keys_of([victim])
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    else:
        _tamper(victim, column)

    with caplog.at_level(logging.WARNING, logger="biasflow.part_store"):
        again = run(request, tmp_path, INPUTS)
    assert again == expected  # the damaged values are never served: they were computed again
    assert not victim.exists() and (parts_dir / "quarantine" / victim.name).exists()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    reason = "truncated" if damage == "truncate" else "content altered"
    assert any(str(victim) in w and reason in w for w in warnings), warnings
    new_parts = set(parts_dir.glob("part-*.parquet")) - set(parts)
    assert _keys_of(new_parts) == held  # exactly what the damaged part held, nothing else

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="biasflow.part_store"):
        assert run(request, tmp_path, INPUTS) == expected
    assert set(parts_dir.glob("part-*.parquet")) == set(parts[1:]) | new_parts  # nothing more computed
    assert not caplog.records


def test_parts_carry_their_checksum_and_older_parts_are_adopted(tmp_path, caplog):
    cache = ScoreCache(tmp_path, "fp", "pll")
    path = cache.put(rows(["a", "b"]))
    assert path.name.endswith(f"-sha256-{hashlib.sha256(path.read_bytes()).hexdigest()}.parquet")
    # parts written before checksums existed: read whole once, then renamed to carry their checksum
    rows(["c"], 3.0).to_parquet(cache.dir / "part-100-1-aaaa.parquet", index=False)
    rows(["d"], 4.0).to_parquet(cache.dir / "part-101-1-bbbb.parquet", index=False)
    broken = cache.dir / "part-101-1-bbbb.parquet"
    broken.write_bytes(broken.read_bytes()[:-20])
    with caplog.at_level(logging.WARNING, logger="biasflow.part_store"):
        got = cache.get(["a", "c", "d"])
    assert sorted(got.key) == ["a", "c"]
    assert [p.name.split("-sha256-")[0] for p in cache.store.parts()] == ["part-100-1-aaaa", path.name.split("-sha256-")[0]]
    assert (cache.dir / "quarantine" / broken.name).exists()
    assert any("part-101-1-bbbb.parquet" in r.getMessage() and "unreadable" in r.getMessage() for r in caplog.records)


def _write_forever(root: str, die_in_fsync: bool) -> None:
    import os
    import signal

    from biasflow.part_store import PartStore

    if die_in_fsync:  # killed after the bytes were written, before the part was published
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
    store = PartStore(root)
    big = pd.DataFrame({"key": [f"k{i}" for i in range(50_000)], "total": np.arange(50_000, dtype=float)})
    while True:
        store.write(big)


@pytest.mark.parametrize("die_in_fsync", [True, False])
def test_a_writer_killed_mid_write_leaves_no_half_part(tmp_path, die_in_fsync, caplog):
    proc = mp.get_context("spawn").Process(target=_write_forever, args=(str(tmp_path), die_in_fsync))
    proc.start()
    if die_in_fsync:
        proc.join(60)
    else:  # kill -9 at some moment while it writes part after part
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("part-*.parquet"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(random.random() * 0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    store = PartStore(tmp_path)
    with caplog.at_level(logging.WARNING, logger="biasflow.part_store"):
        parts = store.parts()
        table = store.read()
    assert not caplog.records and not (tmp_path / "quarantine").exists()  # every visible part is whole
    assert len(parts) == (0 if die_in_fsync else len(list(tmp_path.glob("part-*.parquet"))))
    assert (table is None and not parts) or table.num_rows == 50_000 * len(parts)
    leftovers = [p.name for p in tmp_path.iterdir() if p not in parts]
    assert all(name.startswith(".part-") for name in leftovers)  # at most a hidden temporary file
    assert leftovers or not die_in_fsync
