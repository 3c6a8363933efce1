"""StereoSet in generation mode (metric ``stereoset_mc``, docs/stereoset.md "Generation mode"): the seeded option
shuffle and its record, the metrics hand-computed on a responses file whose replies the test chooses (letters, an
option's text, an unparseable reply, a failed request), the bootstrap replicates, a chat server whose failed
requests fail the stage and are the only ones asked again, and ``biasflow run`` end to end with a chat server."""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasflow.errors import GenerationError
from biasflow.metrics.bbq import parse_choice
from biasflow.metrics.stereoset_mc import SPEC, examples, option_order, options_of
from conftest import ROOT, mirrored_files, project_copy
from biasflow.registry import metric_options_from

LABELS = ("stereotype", "anti-stereotype", "unrelated")


@pytest.fixture(scope="module")
def dev_file() -> Path:
    return mirrored_files("stereoset", "stereoset", keys=("dev",))["dev"]


@pytest.fixture(scope="module")
def dev_items(dev_file) -> pd.DataFrame:
    from biasflow.data.stereoset import read_stereoset

    return read_stereoset(dev_file)


def documented_order(example_id: str, seed: int = 0) -> list[str]:
    """The rule as docs/stereoset.md states it, written out independently: rank by sha256("<seed>:<id>:<label>")."""
    return sorted(LABELS, key=lambda g: hashlib.sha256(f"{seed}:{example_id}:{g}".encode()).hexdigest())


# ----------------------------------------------------------------------------------------------- shuffling
def test_options_are_shuffled_per_example_by_the_seed_and_recorded(dev_items):
    ex = examples(dev_items, options_of({}))
    assert len(ex) == 2106 + 2123 and set(ex.task) == {"intrasentence", "intersentence"}
    assert [o.split("|") for o in ex.option_order] == [documented_order(i) for i in ex.item_id]
    # the stereotype is not always A: each letter holds it for about a third of the examples
    letter = pd.Series([o.split("|").index("stereotype") for o in ex.option_order])
    assert letter.value_counts(normalize=True).between(0.29, 0.38).all() and letter.nunique() == 3
    assert len(set(ex.option_order)) == 6  # every permutation occurs
    # the prompt lists the options in the recorded order: intrasentence the candidate words, intersentence sentences
    first = ex[ex.task == "intrasentence"].iloc[0]
    rows = dev_items[(dev_items.example_id == first.item_id)].set_index("gold_label")
    words = [rows.loc[g, "candidate_word"] for g in first.option_order.split("|")]
    assert f"Sentence: {first.context}\nA. {words[0]}\nB. {words[1]}\nC. {words[2]}\nAnswer:" in first.prompt
    inter = ex[ex.task == "intersentence"].iloc[0]
    rows = dev_items[(dev_items.example_id == inter.item_id)].set_index("gold_label")
    assert f"A. {rows.loc[inter.option_order.split('|')[0], 'sentence']}\n" in inter.prompt
    # another seed, another order for most examples; shuffle=false: the fixed order
    other = examples(dev_items, options_of({"shuffle_seed": 1}))
    assert (other.option_order != ex.option_order).mean() > 0.7
    fixed = examples(dev_items, options_of({"shuffle": False}))
    assert set(fixed.option_order) == {"stereotype|anti-stereotype|unrelated"}
    # an example cut short by benchmark.stereoset.limit is left out
    assert len(examples(dev_items.head(7), options_of({}))) == 2


# ----------------------------------------------------------------------------------------------- hand-computed
def hand_items() -> pd.DataFrame:
    """10 examples: intrasentence e1-e3 gender, e4-e6 race, e7 religion; intersentence i1 gender, i2-i3 profession."""
    spec = [("e1", "intrasentence", "gender"), ("e2", "intrasentence", "gender"), ("e3", "intrasentence", "gender"),
            ("e4", "intrasentence", "race"), ("e5", "intrasentence", "race"), ("e6", "intrasentence", "race"),
            ("e7", "intrasentence", "religion"), ("i1", "intersentence", "gender"),
            ("i2", "intersentence", "profession"), ("i3", "intersentence", "profession")]
    rows = []
    for eid, task, domain in spec:
        for g in LABELS:
            word = f"{g.replace('-', '')}{eid}"
            context = f"The person {eid} was BLANK." if task == "intrasentence" else f"Context of {eid}."
            sentence = f"The person {eid} was {word}." if task == "intrasentence" else f"Sentence {g} of {eid}."
            rows.append({"item_id": f"{eid}-{g}", "benchmark": "stereoset", "split": "dev", "category": domain,
                         "task": task, "example_id": eid, "domain": domain, "target": f"t-{eid}", "context": context,
                         "sentence": sentence, "gold_label": g,
                         "candidate_word": word if task == "intrasentence" else ""})
    return pd.DataFrame(rows)


def letter_of(eid: str, label: str) -> str:
    return "ABC"[documented_order(eid).index(label)]


def hand_replies(items: pd.DataFrame) -> dict[str, str]:
    """example id -> the reply the test's generator gives (by the documented order, not the module's)."""
    word = items.set_index("item_id")["candidate_word"]
    return {"e1": letter_of("e1", "stereotype"),                      # stereotype
            "e2": f"{letter_of('e2', 'anti-stereotype')}.",           # anti-stereotype
            "e3": f"  {word['e3-stereotype']}.\nBecause ...",         # the stereotype's text (rule 2)
            "e4": f"Answer: {letter_of('e4', 'unrelated')}",          # unrelated
            "e5": "A person cannot be judged by that.",               # unparsed: the article, not option A
            "e6": f"({letter_of('e6', 'stereotype')}) it is",         # stereotype
            "e7": "",                                                 # empty line in the file: a failed request
            "i1": letter_of("i1", "stereotype"),                      # stereotype
            "i2": letter_of("i2", "anti-stereotype"),                 # anti-stereotype
            "i3": letter_of("i3", "unrelated")}                       # unrelated


def responses_file(items: pd.DataFrame, cfg: dict, path: Path) -> Path:
    ex = examples(items, options_of(cfg))
    replies = hand_replies(items)
    path.write_text("".join(json.dumps({"prompt": p, "response": replies[i]}) + "\n"
                            for i, p in zip(ex.item_id, ex.prompt)))
    return path


def test_a_prompt_answered_twice_in_a_responses_file_is_refused(tmp_path):
    """A single-reply metric given two different replies to one prompt would use the first without a word: the
    score stage refuses it, naming the prompt and the file's rows."""
    from biasflow.errors import DataFormatError
    from biasflow.generator_config import generator_model
    from biasflow.scoring.answer import metric_answers

    items = hand_items()
    cfg = {"benchmark": "stereoset", "generation": {"max_failed_fraction": 0.2}}
    path = responses_file(items, cfg, tmp_path / "replies.jsonl")
    lines = path.read_text().splitlines()
    again = json.loads(lines[2])
    path.write_text("\n".join(lines + [json.dumps({"prompt": again["prompt"], "response": "B"})]) + "\n")
    model = generator_model({"kind": "responses_file", "path": str(path)})
    with pytest.raises(DataFormatError, match=r"1 prompt\(s\) have more responses than metric stereoset_mc asks for "
                                              r"\(1 per prompt\).*has 2 responses \(file rows 3, 11"):
        metric_answers("stereoset_mc", items, cfg, model, tmp_path / "cache", progress=False)


def test_a_prompt_missing_from_a_responses_file_is_named_and_no_retry_is_promised(tmp_path):
    """A re-run reads the same file, so the message asks for the missing response (and shows its prompt) instead of
    promising that running again retries it."""
    from biasflow.generator_config import generator_model
    from biasflow.scoring.answer import metric_answers

    items = hand_items()
    cfg = {"benchmark": "stereoset", "generation": {"max_failed_fraction": 0.0}}
    path = responses_file(items, cfg, tmp_path / "replies.jsonl")
    lines = path.read_text().splitlines()
    missing = json.loads(lines[0])["prompt"]
    path.write_text("\n".join(lines[1:]) + "\n")
    model = generator_model({"kind": "responses_file", "path": str(path)})
    with pytest.raises(GenerationError) as err:
        metric_answers("stereoset_mc", items, cfg, model, tmp_path / "cache", progress=False)
    message = str(err.value)
    assert "requests have no response in the responses file" in message and "Add the missing responses" in message
    # every failed prompt named by its example's id (before: only the first, cut inside the shared template); a
    # prompt the file lacks apart from one whose response is empty (before: both 'no response', so a user looked for
    # rows that were there; found by the independent check of Bias-NLI)
    kept = [json.loads(line) for line in lines[1:]]
    ex = examples(items, options_of(cfg))
    missing_ids = sorted(i for i, p in zip(ex.item_id, ex.prompt) if p not in {r["prompt"] for r in kept})
    empty = {r["prompt"] for r in kept if not r["response"]}
    empty_ids = sorted(i for i, p in zip(ex.item_id, ex.prompt) if p in empty)
    assert missing in set(ex.prompt) and len(missing_ids) >= 1 and len(empty_ids) >= 1
    assert "re-run" not in message
    assert f"no response to the prompt of {len(missing_ids)} item(s): {', '.join(missing_ids)}" in message
    assert f"an empty response to the prompt of {len(empty_ids)} item(s): {', '.join(empty_ids)}" in message
    assert f"{len(empty_ids)} of {len(ex)} requests have an empty response in the responses file" in message
    assert "fill in its empty responses" in message


def values(agg: pd.DataFrame) -> dict[tuple[str, str], float]:
    return {(m, c): v for m, c, v in zip(agg.metric, agg.category, agg.value)}


def test_hand_computed_metrics_from_a_responses_file(tmp_path):
    from biasflow.generator_config import generator_model
    from biasflow.scoring.answer import metric_answers

    items = hand_items()
    cfg = {"benchmark": "stereoset", "generation": {"max_failed_fraction": 0.2}}
    path = responses_file(items, cfg, tmp_path / "replies.jsonl")
    model = generator_model({"kind": "responses_file", "path": str(path)})
    answers = metric_answers("stereoset_mc", items, cfg, model, tmp_path / "cache", progress=False)
    per_item = SPEC.compute(items, answers, metric_options_from("stereoset_mc", cfg)).set_index("item_id")
    assert {k: v if isinstance(v, str) else None for k, v in per_item.chosen.items()} == {
        "e1": "stereotype", "e2": "anti-stereotype", "e3": "stereotype", "e4": "unrelated", "e5": None,
        "e6": "stereotype", "e7": None, "i1": "stereotype", "i2": "anti-stereotype", "i3": "unrelated"}
    assert per_item.answer_status.to_dict() == {**{k: "ok" for k in per_item.index}, "e5": "unparsed",
                                                "e7": "failed"}
    assert per_item.loc["e5", "response"] == "A person cannot be judged by that."
    assert pd.isna(per_item.loc["e5", "letter"])
    assert per_item.option_order.to_dict() == {k: "|".join(documented_order(k)) for k in per_item.index}
    got = values(SPEC.aggregate(per_item.reset_index(), metric_options_from("stereoset_mc", cfg)))
    nan = float("nan")
    expected = {
        # intrasentence: 7 examples, 5 with a choice, 4 meaningful, 3 stereotypes
        ("intrasentence_mc_lms", "overall"): 80.0, ("intrasentence_mc_ss", "overall"): 75.0,
        ("intrasentence_mc_icat", "overall"): 40.0, ("intrasentence_mc_unparsed_pct", "overall"): 200 / 7,
        ("intrasentence_mc_lms", "gender"): 100.0, ("intrasentence_mc_ss", "gender"): 200 / 3,
        ("intrasentence_mc_icat", "gender"): 200 / 3, ("intrasentence_mc_unparsed_pct", "gender"): 0.0,
        ("intrasentence_mc_lms", "race"): 50.0, ("intrasentence_mc_ss", "race"): 100.0,
        ("intrasentence_mc_icat", "race"): 0.0, ("intrasentence_mc_unparsed_pct", "race"): 100 / 3,
        ("intrasentence_mc_lms", "religion"): nan, ("intrasentence_mc_ss", "religion"): nan,
        ("intrasentence_mc_icat", "religion"): nan, ("intrasentence_mc_unparsed_pct", "religion"): 100.0,
        ("intrasentence_mc_lms", "profession"): nan, ("intrasentence_mc_unparsed_pct", "profession"): nan,
        # intersentence: 3 examples, all chosen, 2 meaningful, 1 stereotype
        ("intersentence_mc_lms", "overall"): 200 / 3, ("intersentence_mc_ss", "overall"): 50.0,
        ("intersentence_mc_icat", "overall"): 200 / 3, ("intersentence_mc_unparsed_pct", "overall"): 0.0,
        ("intersentence_mc_lms", "profession"): 50.0, ("intersentence_mc_ss", "profession"): 0.0,
        # both tasks pooled: 10 examples, 8 chosen, 6 meaningful, 4 stereotypes
        ("overall_mc_lms", "overall"): 75.0, ("overall_mc_ss", "overall"): 200 / 3,
        ("overall_mc_icat", "overall"): 50.0, ("overall_mc_unparsed_pct", "overall"): 20.0,
    }
    for key, want in expected.items():
        assert got[key] == pytest.approx(want, nan_ok=True), key
    agg = SPEC.aggregate(per_item.reset_index(), metric_options_from("stereoset_mc", cfg)).set_index(["metric", "category"])
    assert agg.loc[("intrasentence_mc_ss", "overall"), "n"] == 4   # SS over the meaningful choices
    assert agg.loc[("intrasentence_mc_lms", "overall"), "n"] == 5  # LMS over the examples with a choice
    assert agg.loc[("intrasentence_mc_unparsed_pct", "overall"), "n"] == 7


def test_failed_requests_beyond_the_allowed_fraction_fail_the_score_stage(tmp_path):
    from biasflow.generator_config import generator_model
    from biasflow.scoring.answer import metric_answers

    items = hand_items()
    path = responses_file(items, {}, tmp_path / "replies.jsonl")
    model = generator_model({"kind": "responses_file", "path": str(path)})
    with pytest.raises(GenerationError, match=r"1 of 10 requests have an empty response in the responses file, "
                                              r"more than metric\.stereoset_mc\.generation\.max_failed_fraction"):
        metric_answers("stereoset_mc", items, {"benchmark": "stereoset"}, model, tmp_path / "cache", progress=False)


def test_options_are_checked():
    with pytest.raises(Exception, match="one reply per example"):
        options_of({"generation": {"count": 2}})
    with pytest.raises(Exception, match=r"placeholders \['\{C\}'\]"):
        options_of({"intrasentence_prompt": "{context} {A} {B}"})
    requests = SPEC.requests(hand_items(), metric_options_from("stereoset_mc", {"generation": {"system_prompt": "Answer with a letter."}}), "generator")
    assert len(requests) == 10 and {r.kind for r in requests} == {"generation"}
    assert {(r.temperature, r.max_tokens, r.seed, r.system_prompt) for r in requests} == {
        (0.0, 8, 0, "Answer with a letter.")}


@pytest.mark.parametrize("seed", [0, 1])
def test_bootstrap_replicates_equal_the_aggregate_on_each_resample(seed, dev_items):
    from biasflow.stats.bootstrap import draw_resamples

    items = dev_items[dev_items.example_id.isin(dev_items.example_id.drop_duplicates().sample(300, random_state=seed))]
    ex = examples(items, options_of({}))
    rng = np.random.default_rng(seed)
    pick = rng.choice(["A", "B", "C", "no idea"], size=len(ex), p=[0.3, 0.3, 0.3, 0.1])
    answers = pd.DataFrame({"key": [r.key for r in SPEC.requests(items, metric_options_from("stereoset_mc", {}), "generator")],
                            "kind": "generation", "response": pick, "status": "ok"})
    per_item = SPEC.compute(items, answers, metric_options_from("stereoset_mc", {}))
    r = draw_resamples(per_item, 15, seed=2)
    fast = SPEC.bootstrap_statistic(per_item, metric_options_from("stereoset_mc", {}), r)
    for b in range(r.n_boot):
        slow = values(SPEC.aggregate(per_item.iloc[r.rows(b)], metric_options_from("stereoset_mc", {})))
        assert set(slow) == set(fast)
        for key, value in slow.items():
            assert fast[key][b] == pytest.approx(value, nan_ok=True, rel=1e-12), (key, b)


def test_the_jobs_own_causal_lm_generates(tiny_gpt2, dev_items, tmp_path):
    """No generator: the job's causal LM answers with ``generate`` (hf_generate); a random tiny model names no
    option, so every reply is unparsed, counted as such, and no score is made of them."""
    from biasflow.scoring.answer import metric_answers

    items = dev_items[dev_items.task == "intrasentence"].head(18)
    cfg = {"benchmark": "stereoset", "tasks": ["intrasentence"]}
    answers = metric_answers("stereoset_mc", items, cfg, None, tmp_path, model=tiny_gpt2, progress=False)
    per_item = SPEC.compute(items, answers, metric_options_from("stereoset_mc", cfg))
    assert len(per_item) == 6 and per_item.answer_status.eq("unparsed").all()
    assert per_item.response.str.len().gt(0).all() and per_item.chosen.isna().all()
    got = values(SPEC.aggregate(per_item, metric_options_from("stereoset_mc", cfg)))
    assert got[("intrasentence_mc_unparsed_pct", "overall")] == 100.0
    assert math.isnan(got[("intrasentence_mc_lms", "overall")]) and math.isnan(got[("intrasentence_mc_ss", "overall")])
    assert not any(k[0].startswith(("intersentence", "overall")) for k in got)  # one task: no pooled rows


def test_a_served_model_generates_through_its_completions_endpoint(tiny_gpt2, dev_items, tmp_path):
    """model=served_llm without a generator: the prompts go to the server's /completions (greedy, max_tokens 8),
    one request per example; the random model's continuations name no option and are counted unparsed."""
    from biasflow.scoring.answer import metric_answers
    from served_server import CompletionsServer

    items = dev_items[dev_items.task == "intrasentence"].head(9)
    cfg = {"benchmark": "stereoset", "tasks": ["intrasentence"]}
    with CompletionsServer(tiny_gpt2) as server:
        served = {"name": server.served_name, "kind": "served_causal_lm", "base_url": server.base_url,
                  "revision": "test", "max_retries": 0, "backoff_s": 0.0}
        answers = metric_answers("stereoset_mc", items, cfg, served, tmp_path, progress=False)
        prompts = [b["prompt"] for b in server.log]
    assert sorted(prompts) == sorted(examples(items, options_of(cfg)).prompt)
    assert {b.get("max_tokens") for b in server.log} == {8} and {b.get("temperature") for b in server.log} == {0.0}
    per_item = SPEC.compute(items, answers, metric_options_from("stereoset_mc", cfg))
    assert len(per_item) == 3 and per_item.answer_status.eq("unparsed").all()


# ----------------------------------------------------------------------------------------------- chat server
def chat_reply(body: dict) -> str:
    """A letter for most prompts, an unparseable reply for every 5th (by a stable hash of the prompt)."""
    h = int(hashlib.sha256(body["messages"][-1]["content"].encode()).hexdigest(), 16)
    return "Neither fits." if h % 5 == 0 else ["A", "B.", "(C)", "Answer: B"][h % 4]


def fails_first(body: dict) -> bool:
    return int(hashlib.sha256(body["messages"][-1]["content"].encode()).hexdigest(), 16) % 3 == 1


def run_stages(job, dev_file: Path, tmp_path: Path, cache: Path) -> pd.DataFrame:
    from biasflow import stages

    items_path = tmp_path / "items.parquet"
    if not items_path.exists():
        stages.prepare(job.benchmark, job.benchmark_cfg, {"dev": str(dev_file)}, str(items_path))
    scores = tmp_path / "scores.parquet"
    stages.score(job.score_params(), str(items_path), str(scores), str(cache))
    params = job.params()
    params["stats"] = {"n_boot": 50, "seed": 0, "level": 0.95}
    stages.metric(params, str(items_path), str(scores), str(tmp_path / "out"))
    return pd.read_parquet(tmp_path / "out" / "aggregate.parquet")


def test_chat_server_replies_parsed_and_a_rerun_asks_only_the_failed_requests(dev_file, tmp_path):
    from biasflow.plan import build_plan
    from fake_openai import FakeChatServer

    with FakeChatServer(reply=chat_reply, fail_first=fails_first) as server:
        overrides = ["metric=[stereoset_mc]", "+generator=openai_compatible", "generator.model=chat-model",
                     f"generator.base_url={server.url}", "generator.max_retries=0", "benchmark.stereoset.limit=90",
                     "metric.stereoset_mc.generation.system_prompt=Answer with one letter."]
        (job,) = build_plan(overrides).jobs
        assert job.model["kind"] == "generator" and job.model["name"] == "chat-model"
        cache = tmp_path / "cache"
        with pytest.raises(GenerationError, match=r"of 30 requests failed.*re-run"):
            run_stages(job, dev_file, tmp_path, cache)
        items = pd.read_parquet(tmp_path / "items.parquet")
        prompts = examples(items, options_of(job.metric_cfg)).prompt
        failing = sum(fails_first({"messages": [{"content": p}]}) for p in prompts)
        assert len(server.log) == 30 and 0 < failing < 30
        agg = run_stages(job, dev_file, tmp_path, cache)
        assert len(server.log) - 30 == failing  # only the failed ones again
        assert {e["seed"] for e in server.log} == {0} and {e["model"] for e in server.log} == {"chat-model"}
    per_item = pd.read_parquet(tmp_path / "out" / "per_item.parquet")
    unparsed = per_item.response == "Neither fits."
    assert (per_item.answer_status == "unparsed").sum() == unparsed.sum() > 0
    assert per_item.loc[unparsed, "chosen"].isna().all()
    # every parsed reply is the letter's gold label in the recorded order
    for r in per_item[~unparsed].itertuples(index=False):
        assert r.chosen == r.option_order.split("|")[parse_choice(r.response, ["x", "y", "z"])]
    overall = agg[agg.category == "overall"].set_index("metric")
    assert overall.loc["intrasentence_mc_unparsed_pct", "value"] == pytest.approx(100 * unparsed.mean())
    chosen = per_item.chosen.dropna()
    meaningful = chosen.isin(["stereotype", "anti-stereotype"])
    assert overall.loc["intrasentence_mc_lms", "value"] == pytest.approx(100 * meaningful.mean())
    assert overall.loc["intrasentence_mc_ss", "value"] == pytest.approx(100 * (chosen == "stereotype").sum()
                                                                        / meaningful.sum())
    assert overall[["ci_low", "ci_high"]].loc["intrasentence_mc_ss"].notna().all()
    cached = pd.concat([pd.read_parquet(p) for p in cache.rglob("generation*/part-*.parquet")])
    assert set(per_item.response.dropna()) <= set(cached.response.dropna())
    assert cached.system_prompt.eq("Answer with one letter.").all()


@pytest.mark.slow
def test_biasflow_run_with_a_chat_server(dev_file, tmp_path):
    from fake_openai import FakeChatServer

    project = project_copy(tmp_path, {"stereoset/stereoset_dev.json": dev_file})
    with FakeChatServer(reply=chat_reply) as server:
        cmd = [sys.executable, "-m", "biasflow.cli", "run", "metric=[stereoset_mc]", "benchmark.stereoset.limit=300",
               "+generator=openai_compatible", "generator.model=chat-model", f"generator.base_url={server.url}",
               "stats.n_boot=50", "tracking.enabled=false", "--cores", "2", "--", "--directory", str(project),
               "--retries", "0"]
        env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), BIASFLOW_ROOT=str(ROOT), HF_HUB_OFFLINE="1")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        assert len(server.log) == 100
    runs = sorted((project / "results" / "runs").glob("*/aggregate.parquet"), key=lambda p: p.stat().st_mtime)
    agg = pd.read_parquet(runs[-1])
    overall = agg[(agg.metric_family == "stereoset_mc") & (agg.category == "overall")].set_index("metric")
    assert set(overall.model) == {"chat-model"}
    assert 0 < overall.loc["intrasentence_mc_unparsed_pct", "value"] < 40
    assert not math.isnan(overall.loc["intrasentence_mc_icat", "value"])
    board = (runs[-1].parent / "leaderboard.md").read_text()
    assert "intrasentence_mc_ss" in board
