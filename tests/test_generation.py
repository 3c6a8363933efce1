"""Generation against a local OpenAI-compatible server (http.server in a thread), the answer cache and files."""
from __future__ import annotations

import pandas as pd
import pytest

from biasflow.errors import ConfigError, DataFormatError, GenerationError
from biasflow.generation import GenerationSettings, OpenAIChatBackend, RateLimiter, read_responses_file
from biasflow.models.generator import Generator
from biasflow.scoring.answer import answer_requests
from fake_openai import FakeChatServer


def model_cfg(server, **kw):
    """A ``generator`` model config as the plan writes it for ``+generator=openai_compatible``."""
    cfg = {"name": "fake-model", "kind": "generator", "generator": "openai_compatible", "model_id": "fake-model",
           "base_url": server.url, "timeout_s": 0.25, "max_retries": 2, "backoff_s": 0.001, "concurrency": 4,
           "api_key_env": "BIASFLOW_TEST_KEY"}
    cfg.update(kw)
    return cfg


def backend(server, **kw):
    return Generator(model_cfg(server, **kw)).backend


def generate(prompts, cfg, settings, root, model=None, **kw):
    """The answers to ``settings.count`` Generation requests per prompt, one row per request, in order."""
    out = answer_requests(settings.requests(prompts), cfg, root, model=model, progress=False, **kw)
    return out.set_index("key").loc[[r.key for r in settings.requests(prompts)]].reset_index()


PROMPTS = ["alpha", "beta", "flaky one", "rate me", "fail500 here", "slow poke", "bad input"]


def test_http_generator_caches_records_failures_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("BIASFLOW_TEST_KEY", "sekrit")
    settings = GenerationSettings(count=2, system_prompt="Be brief.", temperature=0.7, max_tokens=16, seed=5)
    with FakeChatServer() as server:
        out = generate(PROMPTS, model_cfg(server, flush_every=3), settings, tmp_path)
        assert len(out) == len(PROMPTS) * 2
        by = {(p, i): r for p, i, r in zip(out["prompt"], out["sample_index"], out.to_dict("records"))}
        # good, flaky (retried after a 500) and rate-limited (retried after a 429) prompts all succeed
        for p in ["alpha", "beta", "flaky one", "rate me"]:
            for i in (0, 1):
                row = by[(p, i)]
                assert row["status"] == "ok", row
                assert row["response"] == f"echo|{p}|{5 + i}|Be brief."
        # the 500 and the timeout are recorded as failures with their error, and the run went on
        for i in (0, 1):
            assert by[("fail500 here", i)]["status"] == "failed"
            assert "HTTP 500" in by[("fail500 here", i)]["error"]
            assert by[("slow poke", i)]["status"] == "failed"
            timeout_error = by[("slow poke", i)]["error"]
            assert "no reply within generator.timeout_s=" in timeout_error and "Timeout" in timeout_error
            assert "gave up after 3 attempts" in timeout_error
            assert "HTTP 400" in by[("bad input", i)]["error"]
        # retries: 500 and timeout 3 attempts per sample (max_retries 2); 400 once; flaky/rate twice
        counts = pd.Series([r["prompt"] for r in server.log]).value_counts()
        assert counts["fail500 here"] == 6 and counts["slow poke"] == 6
        assert counts["bad input"] == 2 and counts["flaky one"] == 4 and counts["rate me"] == 4
        assert counts["alpha"] == 2
        assert all(r["path"] == "/v1/chat/completions" and r["auth"] == "Bearer sekrit" for r in server.log)
        # failed answers are cached too (with their error), each request's best row once
        cached = pd.concat(pd.read_parquet(p) for p in tmp_path.rglob("generation/part-*.parquet"))
        assert (cached["status"] == "failed").sum() == 6 and cached["key"].is_unique

        # re-run: nothing answered before is sent again; failed ones are retried and now succeed
        server.broken = False
        server.log.clear()
        again = generate(PROMPTS, model_cfg(server), settings, tmp_path)
        sent = sorted({r["prompt"] for r in server.log})
        assert sent == ["bad input", "fail500 here", "slow poke"]
        ok_before = out["status"] == "ok"
        assert (again.loc[ok_before, "response"].values == out.loc[ok_before, "response"].values).all()
        assert (again.set_index(["prompt", "sample_index"]).loc[("fail500 here", 1), "response"]
                == "echo|fail500 here|6|Be brief.")

        # third run: everything that succeeded is served from the cache; only still-failing prompts are sent
        server.log.clear()
        third = generate(PROMPTS, model_cfg(server), settings, tmp_path)
        assert sorted({r["prompt"] for r in server.log}) == ["bad input", "slow poke"]
        assert (third["status"] == "ok").sum() == len(PROMPTS) * 2 - 4

        # a setting in the key (temperature) changes: those are new requests
        server.log.clear()
        hot = GenerationSettings(count=1, system_prompt="Be brief.", temperature=1.0, max_tokens=16, seed=5)
        generate(["alpha"], model_cfg(server), hot, tmp_path)
        assert [r["prompt"] for r in server.log] == ["alpha"]


def test_interrupted_run_keeps_flushed_answers(tmp_path):
    """A crash mid-run loses at most ``flush_every`` answers: the flushed ones are not asked again."""
    settings = GenerationSettings(count=1, temperature=0.0, max_tokens=8, seed=None)
    prompts = [f"p{i}" for i in range(6)]
    with FakeChatServer() as server:
        cfg = model_cfg(server, concurrency=1, flush_every=2)
        model = Generator(cfg)
        real, answered = model.backend.generate, []

        def dies_after_three(reqs, s):
            for row in real(reqs, s):
                if len(answered) == 3:
                    raise KeyboardInterrupt
                answered.append(row)
                yield row

        model.backend.generate = dies_after_three
        with pytest.raises(KeyboardInterrupt):
            generate(prompts, cfg, settings, tmp_path, model=model)
        server.log.clear()
        out = generate(prompts, cfg, settings, tmp_path)
        # p0, p1 were flushed; p2 was answered in the chunk the crash cut short: at most flush_every lost
        assert sorted(r["prompt"] for r in server.log) == ["p2", "p3", "p4", "p5"]
        assert (out["status"] == "ok").all()


def test_no_key_means_no_auth_header_and_body_fields(tmp_path, monkeypatch):
    monkeypatch.delenv("BIASFLOW_TEST_KEY", raising=False)
    with FakeChatServer() as server:
        out = generate(["alpha"], model_cfg(server, concurrency=1),
                       GenerationSettings(count=1, temperature=0.0, max_tokens=4, seed=None), None)
        assert server.log[0]["auth"] is None and server.log[0]["seed"] is None
        assert out.loc[0, "response"] == "echo|alpha|None|None"


def test_backoff_and_rate_limiter():
    be = OpenAIChatBackend("http://x/v1", "m", backoff_s=0.5, max_backoff_s=3.0)
    assert [be._delay(a, None) for a in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert be._delay(0, "2") == 2.0 and be._delay(0, "soon") == 0.5
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    limiter = RateLimiter(4.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        limiter.acquire()
    assert slept == pytest.approx([0.25, 0.25, 0.25, 0.25])
    with pytest.raises(ConfigError):
        OpenAIChatBackend("http://x/v1", "m", concurrency=0)
    with pytest.raises(ConfigError):
        GenerationSettings(count=0)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_responses_file_formats(tmp_path, fmt):
    df = pd.DataFrame({"prompt": ["p1", " p1", "p2"], "response": ["a, b", "", "c"], "extra": [1, 2, 3]})
    path = tmp_path / f"r.{fmt}"
    {"csv": lambda: df.to_csv(path, index=False), "jsonl": lambda: df.to_json(path, orient="records", lines=True),
     "parquet": lambda: df.to_parquet(path)}[fmt]()
    out = read_responses_file(path)
    assert out["sample_index"].tolist() == [0, 1, 0]  # prompts matched without surrounding whitespace
    assert out["status"].tolist() == ["ok", "failed", "ok"]
    assert out["response"].tolist()[0] == "a, b" and out["extra"].tolist() == [1, 2, 3]
    # the file as a generator: the answer to (prompt, sample index) is that response; an absent one fails
    cfg = {"name": "r", "kind": "generator", "generator": "responses_file", "path": str(path)}
    same = generate(["p1", "p3"], cfg, GenerationSettings(count=2), tmp_path / "cache")
    assert same["response"].tolist()[:2] == out["response"].tolist()[:2]
    assert same["status"].tolist() == ["ok", "failed", "failed", "failed"]
    assert "empty response" in same["error"][1] and "no response 1 to this prompt" in same["error"][2]


def test_responses_file_errors_name_file_and_column(tmp_path):
    path = tmp_path / "mine.csv"
    pd.DataFrame({"prompt": ["p"], "text": ["t"]}).to_csv(path, index=False)
    with pytest.raises(DataFormatError, match=r"mine\.csv.*'response'"):
        read_responses_file(path)
    with pytest.raises(DataFormatError, match="unknown format"):
        (tmp_path / "x.txt").write_text("hi")
        read_responses_file(tmp_path / "x.txt")
    with pytest.raises(DataFormatError, match="does not exist"):
        read_responses_file(tmp_path / "nope.csv")
    pd.DataFrame({"prompt": [], "response": []}).to_csv(tmp_path / "empty.csv", index=False)
    with pytest.raises(DataFormatError, match=r"empty\.csv has no rows"):
        read_responses_file(tmp_path / "empty.csv")
    pd.DataFrame({"prompt": ["a", "b", "c"], "response": [1.5, None, 3.0]}).to_parquet(tmp_path / "numbers.parquet")
    with pytest.raises(DataFormatError, match=r"numbers\.parquet, row 1: response is not text but float 1\.5 \(2 "
                                              r"such row"):
        read_responses_file(tmp_path / "numbers.parquet")


def test_evaluate_refuses_empty_and_non_text_responses(tmp_path, monkeypatch):
    """An empty table gave non_completion_rate 1.0 with n = 0, and numbers a TypeError inside the metric."""
    from biasflow import api

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataFormatError, match="responses is empty"):
        api.evaluate("langfair_stereotype", pd.DataFrame({"prompt": [], "response": []}))
    with pytest.raises(DataFormatError, match=r"row 2: response is not text but int 7"):
        api.evaluate("langfair_stereotype", pd.DataFrame({"prompt": ["p", "q"], "response": ["fine", 7]},
                                                         dtype=object))


# ------------------------------------------------------------------------------------- secrets and failures
KEY = "Zq7PlainValue0123456789abc"  # matches no secret-looking pattern: only the key's own value can hide it


def quotes_the_key(body):
    return body["messages"][-1]["content"].startswith("quote")


def test_api_key_from_a_file_wins_and_is_sent(tmp_path, monkeypatch):
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv("BIASFLOW_TEST_KEY", "from-the-environment")
    settings = GenerationSettings(count=1, temperature=0.0, max_tokens=4, seed=None)
    with FakeChatServer() as server:
        generate(["alpha"], model_cfg(server, api_key_file=str(key_file)), settings, None)
        generate(["beta"], model_cfg(server), settings, None)
        assert [r["auth"] for r in server.log] == [f"Bearer {KEY}", "Bearer from-the-environment"]
    with pytest.raises(ConfigError, match=r"cannot read the key file .*nope\.txt"):
        backend(server, api_key_file=str(tmp_path / "nope.txt"))


def langfair_score(tmp_path, generator, items, **metric):
    """The score stage of a LangFair job whose text comes from ``generator`` (a ``+generator=`` config)."""
    from biasflow import stages
    from biasflow.generator_config import generator_model

    items_path = tmp_path / "items.parquet"
    items.assign(item_id=[str(i) for i in range(len(items))]).to_parquet(items_path)
    params = {"metric": "langfair_stereotype", "model": generator_model(generator), "mode": "parity",
              "metric_cfg": {"generator": generator, **metric}}
    return stages.score(params, str(items_path), str(tmp_path / "scores.parquet"), str(tmp_path / "cache"))


def test_a_key_quoted_in_an_error_body_is_never_stored_or_logged(tmp_path, caplog):
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY)
    settings = GenerationSettings(count=2, temperature=0.0, max_tokens=4, seed=0)
    with FakeChatServer(fail_first=quotes_the_key) as server, caplog.at_level("DEBUG"):
        cfg = model_cfg(server, api_key_file=str(key_file), max_retries=0)
        out = generate(["quote me", "alpha"], cfg, settings, tmp_path / "cache")
        assert server.log[0]["auth"] == f"Bearer {KEY}"
        with pytest.raises(GenerationError):
            langfair_score(tmp_path, {"kind": "openai_compatible", "base_url": server.url, "model": "m",
                                      "api_key_file": str(key_file), "max_retries": 0, "count": 1},
                           pd.DataFrame({"prompt": ["quote again"]}))
    failed = out[out["status"] == "failed"]
    assert len(failed) == 2 and failed["error"].str.contains("request with key ***", regex=False).all()
    parts = list((tmp_path / "cache").rglob("part-*.parquet"))
    stored = pd.concat(pd.read_parquet(p) for p in parts)
    assert stored["error"].notna().sum() == 3
    for path in tmp_path.rglob("*"):  # cache parts, and no scores file was written
        if path.is_file() and path != key_file:
            assert KEY.encode() not in path.read_bytes(), path
    assert not (tmp_path / "scores.parquet").exists()
    assert KEY not in caplog.text and "request with key ***" in caplog.text


def test_failures_over_the_threshold_fail_with_counts_and_a_rerun_sends_only_them(tmp_path):
    cfg = {"kind": "openai_compatible", "model": "m", "api_key_env": None, "max_retries": 0, "count": 2,
           "temperature": 0.0, "concurrency": 1}
    items = pd.DataFrame({"prompt": ["alpha", "fail500 one", "beta", "fail500 two"]})
    with FakeChatServer() as server:
        cfg["base_url"] = server.url
        with pytest.raises(GenerationError, match=r"4 of 8 requests failed, more than "
                                                  r"generator\.max_failed_fraction=0\b.*retry exactly the 4 failed"):
            langfair_score(tmp_path, cfg, items)
        assert len(server.log) == 8
        # accepted within the threshold: returned, reported as failed rows, retried (and failing) again
        server.log.clear()
        out = langfair_score(tmp_path, {**cfg, "max_failed_fraction": 0.5}, items)
        assert (out["status"] == "failed").sum() == 4
        assert sorted(r["prompt"] for r in server.log) == ["fail500 one"] * 2 + ["fail500 two"] * 2
        # the server recovers: a plain re-run sends exactly the 4 failed requests and succeeds
        server.broken = False
        server.log.clear()
        out = langfair_score(tmp_path, cfg, items)
        assert (out["status"] == "ok").all()
        assert sorted((r["prompt"], r["seed"]) for r in server.log) == [
            ("fail500 one", 0), ("fail500 one", 1), ("fail500 two", 0), ("fail500 two", 1)]
    for bad in (-0.1, 1.5, "lots"):
        with pytest.raises(ConfigError, match=r"generator\.max_failed_fraction(=| must be a number in \[0, 1\])"):
            langfair_score(tmp_path, {**cfg, "max_failed_fraction": bad}, items)


def test_a_generator_kind_is_one_declaration_read_by_the_schema_the_plan_checks_and_the_generator_model():
    """A new generator kind is one ``register_generator_kind`` call: the options schema accepts it, the plan refuses
    a key it does not read (naming the kinds that do), writes the job's model config with it, and ``model.kind:
    generator`` builds its backend."""
    from biasflow.errors import ConfigError
    from biasflow.generator_config import check_generator_keys, generator_model
    from biasflow.generator_kinds import GENERATOR_KINDS, GeneratorKindSpec, register_generator_kind
    from biasflow.models.generator import Generator
    from biasflow.schema import GeneratorConfig

    class Echo:
        model_id, fingerprint = "echo", "echo-v1"

    spec = GeneratorKindSpec(
        name="echo_test", reads=("kind", "name", "count"),
        job_model=lambda gen: {"name": gen.get("name") or "echo", "kind": "generator", "generator": "echo_test"},
        backend=lambda cfg: Echo())
    register_generator_kind(spec)
    try:
        assert GeneratorConfig.model_validate({"kind": "echo_test"}).kind == "echo_test"
        with pytest.raises(ConfigError, match=r"generator\.temperature=0\.5 is not read by generator kind echo_test.*"
                                              r"hf_generate, openai_compatible"):
            check_generator_keys({"kind": "echo_test", "temperature": 0.5})
        model = generator_model({"kind": "echo_test", "name": "mine"})
        assert model == {"name": "mine", "kind": "generator", "generator": "echo_test"}
        assert isinstance(Generator(model).backend, Echo) and Generator(model).name == "mine"
    finally:
        GENERATOR_KINDS.pop("echo_test")
    with pytest.raises(Exception, match="not a known generator kind; known: hf_generate, openai_compatible, "
                                        "responses_file"):
        GeneratorConfig.model_validate({"kind": "echo_test"})
    with pytest.raises(ConfigError, match="is not a generator backend of model.kind=generator; known: "
                                          "openai_compatible, responses_file"):
        Generator({"name": "x", "kind": "generator", "generator": "hf_generate"})
