"""The part-file caches: append-only, resumable, safe under concurrent writers, checked before every read."""
from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import random
import shutil
import signal
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from biasflow.part_store import PartStore
from biasflow.scoring.answer import answer_requests
from biasflow.scoring.cache import AnswerCache
from biasflow.interface.requests import PseudoLogLikelihood


def rows(keys, value=1.0):
    return pd.DataFrame({"key": keys, "total": [value] * len(keys)})


class FakeModel:
    """A model of kind ``fake`` whose PLL answer of a text is its length; it records what it was asked."""

    kind = "fake"
    fingerprint = "fake-fp"
    name = "fake"

    def __init__(self, fail_on=None):
        self.asked, self.fail_on = [], fail_on

    def answer(self, model, requests, budget):
        self.asked.append([r.text for r in requests])
        if self.fail_on and any(r.text == self.fail_on for r in requests):
            raise KeyboardInterrupt  # the run is killed while answering this chunk
        return pd.DataFrame({"total": [float(len(r.text)) for r in requests]})


def fake_kind(answer_pll):
    """Model kind ``fake``, answering PLL requests with ``answer_pll`` (declared as any model kind is)."""
    from biasflow.model_kinds import ModelKindSpec, Resources

    return ModelKindSpec(name="fake", factory=FakeModel, answers={"pll": answer_pll}, module=__name__,
                         resources=Resources(mem_mb=1000, cpus=1, runtime_min=1, gpu_capable=False))


@pytest.fixture
def fake_model(monkeypatch):
    from biasflow import model_kinds

    model = FakeModel()
    monkeypatch.setitem(model_kinds.KINDS, "fake", fake_kind(model.answer))
    return model


def ask(model, texts, root, **kw):
    return answer_requests([PseudoLogLikelihood(t) for t in texts], {"kind": "fake"}, root, model=model, **kw)


def test_only_missing_requests_are_answered(tmp_path, fake_model):
    out = ask(fake_model, ["a", "bb", "a", "ccc"], tmp_path)
    assert list(out.text) == ["a", "bb", "ccc"] and list(out.total) == [1.0, 2.0, 3.0]  # de-duplicated, in order
    out = ask(fake_model, ["ccc", "dddd", "a"], tmp_path)
    assert list(out.text) == ["ccc", "dddd", "a"] and list(out.total) == [3.0, 4.0, 1.0]  # request order
    assert fake_model.asked == [["a", "bb", "ccc"], ["dddd"]]
    assert set(out.key) == {PseudoLogLikelihood(t).key for t in ["ccc", "dddd", "a"]} and set(out.kind) == {"pll"}


def test_interrupted_answering_keeps_finished_chunks(tmp_path, fake_model):
    texts = [f"k{i}" for i in range(6)]
    fake_model.fail_on = "k3"
    with pytest.raises(KeyboardInterrupt):
        ask(fake_model, texts, tmp_path, chunk_size=3)
    cache = AnswerCache(tmp_path, "fake-fp", "pll")
    assert cache.keys() == {PseudoLogLikelihood(t).key for t in texts[:3]}
    fake_model.fail_on, fake_model.asked = None, []
    ask(fake_model, texts, tmp_path, chunk_size=3)
    assert fake_model.asked == [["k3", "k4", "k5"]]  # the restart redoes nothing that finished


def test_out_of_memory_halves_the_token_budget_and_answers_again(tmp_path, monkeypatch):
    from biasflow import model_kinds

    budgets = []

    def answer_pll(model, requests, budget):
        budgets.append(budget.batch_tokens)
        if budget.batch_tokens > 1024:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return pd.DataFrame({"total": [1.0] * len(requests)})

    monkeypatch.setitem(model_kinds.KINDS, "fake", fake_kind(answer_pll))
    out = answer_requests([PseudoLogLikelihood("a")], {"kind": "fake", "batch_tokens": 4096}, tmp_path,
                          model=FakeModel())
    assert budgets == [4096, 2048, 1024] and list(out.total) == [1.0]
    monkeypatch.setitem(model_kinds.KINDS, "fake", fake_kind(lambda m, r, b: (_ for _ in ()).throw(ValueError("bad"))))
    with pytest.raises(ValueError, match="bad"):  # anything else is not retried
        answer_requests([PseudoLogLikelihood("b")], {"kind": "fake"}, tmp_path, model=FakeModel())


def test_a_row_that_does_not_fit_is_one_clear_error_not_a_retry_of_the_chunk(tmp_path, monkeypatch):
    """One back-off loop (batching.halving_on_out_of_memory): a scorer's single row that does not fit at any budget
    fails the job at once, naming it, instead of the chunk being answered again at every smaller budget; a chunk
    that still runs out of memory at the smallest budget is an error naming the chunk."""
    from biasflow import model_kinds
    from biasflow.scoring.batching import DoesNotFit, run_with_backoff

    calls = []

    def answer_pll(model, requests, budget):
        calls.append(budget.batch_tokens)

        def run(batch):
            raise RuntimeError("CUDA out of memory")

        run_with_backoff(list(range(len(requests))), [40] * len(requests), budget.batch_tokens, run)

    monkeypatch.setitem(model_kinds.KINDS, "fake", fake_kind(answer_pll))
    with pytest.raises(DoesNotFit, match=r"one row of 40 tokens does not fit in memory \(token budget already down "
                                         r"to 40\)"):
        answer_requests([PseudoLogLikelihood("a"), PseudoLogLikelihood("b")], {"kind": "fake", "batch_tokens": 4096},
                        tmp_path, model=FakeModel())
    assert calls == [4096]

    def always_out_of_memory(model, requests, budget):
        calls.append(budget.batch_tokens)
        raise RuntimeError("CUDA out of memory")

    calls.clear()
    monkeypatch.setitem(model_kinds.KINDS, "fake", fake_kind(always_out_of_memory))
    with pytest.raises(DoesNotFit, match=r"a chunk of 1 pll requests does not fit in memory \(token budget already "
                                         r"down to 16\)"):
        answer_requests([PseudoLogLikelihood("c")], {"kind": "fake", "batch_tokens": 64}, tmp_path, model=FakeModel())
    assert calls == [64, 32, 16]


def test_a_model_kind_that_cannot_answer_a_request_says_which_can(tmp_path):
    from biasflow.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.kind='causal_lm' cannot answer 'pll'.*crows_pairs.*masked_lm"):
        answer_requests([PseudoLogLikelihood("a")], {"kind": "causal_lm"}, tmp_path, model=FakeModel(),
                        metric="crows_pairs")


def _writer(args):
    root, worker = args
    cache = AnswerCache(root, "fp", "pll")
    for i in range(10):
        cache.put(rows([f"w{worker}-{i}", "shared"], value=float(worker)))


def test_concurrent_writers_do_not_corrupt(tmp_path):
    with mp.get_context("spawn").Pool(4) as pool:
        pool.map(_writer, [(str(tmp_path), w) for w in range(4)])
    cache = AnswerCache(tmp_path, "fp", "pll")
    assert cache.keys() == {f"w{w}-{i}" for w in range(4) for i in range(10)} | {"shared"}
    got = cache.get(["shared", "w2-3"])
    assert len(got) == 2  # duplicate keys from racing writers collapse to one row


def test_request_key_depends_on_the_kind_and_every_field():
    from biasflow.interface.requests import REQUEST_TYPES, TokenLogprobs, UnmaskedLogprobs

    base = TokenLogprobs("a", "prefix").key
    assert base == TokenLogprobs("a", "prefix").key == TokenLogprobs(text="a").key
    assert len({base, TokenLogprobs("b").key, TokenLogprobs("a", "none").key, PseudoLogLikelihood("a").key,
                UnmaskedLogprobs("a").key}) == 5
    assert REQUEST_TYPES["pll"] is PseudoLogLikelihood  # every kind names one type


def test_failed_answers_are_kept_but_an_ok_row_wins(tmp_path):
    cache = AnswerCache(tmp_path, "fp", "generation")
    cache.put(pd.DataFrame({"key": ["a", "b"], "status": ["failed", "failed"], "error": ["500", "timeout"]}))
    cache.put(pd.DataFrame({"key": ["a"], "status": ["ok"], "error": [None]}))
    cache.put(pd.DataFrame({"key": ["b"], "status": ["failed"], "error": ["503"]}))
    got = cache.get(["a", "b"]).set_index("key")
    assert got.status.to_dict() == {"a": "ok", "b": "failed"} and got.error["b"] == "503"  # the latest failure


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

    kind = "sentence_encoder"
    fingerprint = "fake-encoder"
    pooling = "mean"

    def encode(self, texts, pooling, batch_size=None, progress=False):
        return np.stack([np.frombuffer(hashlib.sha256(t.encode()).digest(), dtype=np.uint8)[:8].astype(np.float32)
                         for t in texts])


def _scores(request, root, texts):
    model = request.getfixturevalue("tiny_bert")
    table = answer_requests([PseudoLogLikelihood(t) for t in texts], model.cfg, root, model=model, progress=False)
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
    from biasflow.scoring.answer import answer_requests
    from biasflow.interface.requests import SentenceEmbedding

    table = answer_requests([SentenceEmbedding(t) for t in texts], {"kind": "sentence_encoder"}, root,
                            model=FakeEncoder(), progress=False)
    return {t: tuple(v) for t, v in zip(table.text, table.vector)}


# harness: (run the cache's user on some inputs -> {input: result}, folder of the parts, column to tamper with)
HARNESSES = {
    "scores": (_scores, lambda root, request: root / request.getfixturevalue("tiny_bert").fingerprint / "pll",
               "total"),
    "generations": (_generations, lambda root, request: root / "fake-backend" / "generation", "response"),
    "embeddings": (_embeddings, lambda root, request: root / "fake-encoder" / "sentence_embedding", "vector"),
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
    cache = AnswerCache(tmp_path, "fp", "pll")
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


def _slow_pll(model, requests, budget):
    """An answerer that takes a while and records, in a shared file, every text it computed and by which process."""
    with open(os.environ["BIASFLOW_TEST_ANSWERED"], "a") as fh:
        fh.write("".join(f"{os.getpid()} {r.text}\n" for r in requests))
    time.sleep(float(os.environ.get("BIASFLOW_TEST_SLEEP", "0.3")))
    return pd.DataFrame({"total": [float(len(r.text)) for r in requests]})


def _ask_slowly(args):
    from biasflow.model_kinds import KINDS

    root, texts, log, ready_dir, jobs = args
    os.environ["BIASFLOW_TEST_ANSWERED"] = log
    KINDS["fake"] = fake_kind(_slow_pll)  # in a fresh process; the test's own process sets it back
    # start together, as two score jobs that Snakemake launched side by side
    open(os.path.join(ready_dir, str(os.getpid())), "w").close()
    while len(os.listdir(ready_dir)) < jobs:
        time.sleep(0.01)
    out = answer_requests([PseudoLogLikelihood(t) for t in texts], {"kind": "fake"}, root, model=FakeModel(),
                          chunk_size=4)
    return out.total.tolist()


def _answered(log):
    return [line.split(" ", 1) for line in log.read_text().splitlines()]


def test_two_jobs_asking_the_same_questions_share_the_work(tmp_path):
    """Two score jobs started together on the same requests (crows_pairs and crows_pairs_biasbench): they claim
    work units in turn, so each request is computed once, both jobs compute, and both get every answer."""
    texts = [f"text {i}" + "x" * (i % 7) for i in range(60)]
    log, ready = tmp_path / "answered.txt", tmp_path / "ready"
    ready.mkdir()
    with mp.get_context("spawn").Pool(2) as pool:
        results = pool.map(_ask_slowly, [(str(tmp_path / "cache"), texts, str(log), str(ready), 2)] * 2,
                           chunksize=1)
    assert results == [[float(len(t)) for t in texts]] * 2
    answered = _answered(log)
    assert sorted(text for _, text in answered) == sorted(texts)  # computed once, not twice
    assert len({pid for pid, _ in answered}) == 2  # by both jobs, not one while the other waited


def test_a_job_killed_while_answering_leaves_its_work_to_the_next(tmp_path, monkeypatch):
    """kill -9 of a job that holds claims: the claims die with it, and another job computes what it had not
    written (its finished chunks are kept)."""
    texts = [f"sentence {i}" for i in range(24)]
    log, ready = tmp_path / "answered.txt", tmp_path / "ready"
    ready.mkdir()
    os.environ["BIASFLOW_TEST_SLEEP"] = "0.5"
    try:
        ctx = mp.get_context("spawn")
        victim = ctx.Process(target=_ask_slowly, args=((str(tmp_path / "cache"), texts, str(log), str(ready), 1),))
        victim.start()
        deadline = time.time() + 60
        while (not log.exists() or len(_answered(log)) < 8) and time.time() < deadline:
            time.sleep(0.05)  # until it wrote one chunk and is answering the next
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        assert victim.exitcode == -signal.SIGKILL
        done_before = AnswerCache(tmp_path / "cache", "fake-fp", "pll").keys()
        assert 0 < len(done_before) < len(texts)
        os.environ["BIASFLOW_TEST_SLEEP"] = "0"
        from biasflow import model_kinds

        monkeypatch.setitem(model_kinds.KINDS, "fake", fake_kind(_slow_pll))  # removed after the test
        shutil.rmtree(ready)
        ready.mkdir()
        assert _ask_slowly((str(tmp_path / "cache"), texts, str(log), str(ready), 1)) == [float(len(t)) for t in texts]
    finally:
        os.environ.pop("BIASFLOW_TEST_SLEEP", None)
    by_second = [text for pid, text in _answered(log) if int(pid) == os.getpid()]
    assert sorted(by_second) == sorted(t for t in texts if PseudoLogLikelihood(t).key not in done_before)


def test_answers_of_an_earlier_answerer_revision_are_never_served(tiny_gpt2, tmp_path):
    """causal_lm's token log-probabilities are at revision 2 (packed passes): they live in their own folder, and an
    answer a revision-1 scorer left in the cache (here a planted wrong total) is not read, it is answered again."""
    from biasflow.model_kinds import answer_for
    from biasflow.scoring.answer import answer_requests, cache_kind
    from biasflow.interface.requests import TokenLogprobs

    revision = answer_for("causal_lm", "token_logprobs").revision
    assert revision >= 2
    folder = cache_kind("causal_lm", "token_logprobs")
    assert folder == f"token_logprobs.r{revision}"
    assert cache_kind("masked_lm", "pll") == "pll"  # first revisions keep the plain request kind
    request = TokenLogprobs("The nurse said hello.")
    AnswerCache(tmp_path, tiny_gpt2.fingerprint, "token_logprobs").put(pd.DataFrame(
        {"key": [request.key], "kind": [request.kind], "token_ids": [[1]], "logprobs": [[0.0]], "total": [123.0]}))
    cfg = {"name": "tiny-gpt2", "kind": "causal_lm"}
    answer = answer_requests([request], cfg, tmp_path, model=tiny_gpt2, progress=False)
    assert answer["total"].iloc[0] < 0  # computed, not the planted 123
    assert AnswerCache(tmp_path, tiny_gpt2.fingerprint, folder).keys() == {request.key}
    again = answer_requests([request], cfg, tmp_path, model=tiny_gpt2, progress=False)
    assert again["total"].iloc[0] == answer["total"].iloc[0]
