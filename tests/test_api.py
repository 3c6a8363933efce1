"""biasflow.api: the notebook's cells run, `evaluate` gives the numbers `biasflow run` gives on the same responses,
and bad input is an error naming it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import pandas as pd
import pytest

from conftest import ROOT, project_copy

pytestmark = pytest.mark.slow

NOTEBOOK = ROOT / "docs" / "python_api.ipynb"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return project_copy(tmp_path_factory.mktemp("apiproject"))


@pytest.fixture()
def in_project(project, monkeypatch):
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    monkeypatch.setenv("BIASFLOW_ROOT", str(ROOT))
    monkeypatch.chdir(project)
    return project


def test_the_notebook_runs(tmp_path, monkeypatch):
    """Every code cell, in order, in one namespace (as a kernel would run them), in a fresh folder that is no
    biasflow checkout (no conf/, no Snakefile, no BIASFLOW_ROOT): it writes only under results/ and resources/ (downloads)."""
    monkeypatch.delenv("BIASFLOW_CONF", raising=False)
    monkeypatch.delenv("BIASFLOW_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    assert cells
    namespace: dict = {}
    for i, cell in enumerate(cells):
        exec(compile("".join(cell["source"]), f"{NOTEBOOK.name}[{i}]", "exec"), namespace)
    run, scores = namespace["run"], namespace["scores"]
    assert (tmp_path / run.run_dir / "report.html").exists() and not run.leaderboard.empty
    assert set(scores.aggregate["model"]) == {"my_chatbot"}
    assert run.leaderboard["langfair_stereotype", "stereotypical_associations", "value"].notna().all()
    assert {p.name for p in tmp_path.iterdir()} <= {"results", "resources", ".snakemake"}, sorted(tmp_path.iterdir())


def test_evaluate_equals_biasflow_run_on_the_same_responses(in_project, tmp_path, tiny_toxicity_classifier_dir):
    """HELM's representation and the toxicity of the same responses (a tiny classifier built by the tests): the
    same tables from ``evaluate`` as from one ``biasflow run`` of both, whose report shows the toxicity numbers."""
    import biasflow.api as bf

    responses = pd.DataFrame({
        "prompt": ["Write a letter about my mother.", "Write a letter about my sister."] * 2,
        "response": ["She is caring and emotional.", "My sister is a nurse and she is kind.",
                     "He is confident.", "My brother is strong and he is a doctor."]})
    classifier = f"metric.toxicity.classifier.model={tiny_toxicity_classifier_dir}"
    ours = {"helm_representation": bf.evaluate("helm_representation", responses, "stats.n_boot=100",
                                               name="api_model").aggregate,
            "toxicity": bf.evaluate("toxicity", responses, "stats.n_boot=100", classifier,
                                    name="api_model").aggregate}
    path = tmp_path / "responses.csv"
    responses.to_csv(path, index=False)
    proc = subprocess.run([sys.executable, "-m", "biasflow.cli", "run", "metric=[helm_representation,toxicity]",
                           "+generator=responses_file", f"generator.path={path}", "generator.name=api_model",
                           classifier, "stats.n_boot=100", "--cores", "1", "--", "--directory", str(in_project)],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = next(line.split("report:  ", 1)[1].split("/report.html")[0] for line in proc.stdout.splitlines()
                   if line.startswith("report:  "))
    aggregate = pd.read_parquet(in_project / run_dir / "aggregate.parquet")
    assert set(aggregate["benchmark"]) == {"prompts_file"}  # the user's responses, not BOLD's or LangFair's prompts
    assert "bold" not in proc.stdout + proc.stderr.lower()
    cols = ["metric", "category", "value", "ci_low", "ci_high", "n"]
    for metric, table in ours.items():
        theirs = aggregate[aggregate["metric_family"] == metric]
        mine = table[cols].sort_values(["metric", "category"]).reset_index(drop=True)
        theirs = theirs[cols].sort_values(["metric", "category"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, theirs)
        assert mine["value"].notna().any()
    report = (in_project / run_dir / "report.md").read_text()
    assert "expected_maximum_toxicity" in report and "toxicity_probability" in report
    from mlflow.tracking import MlflowClient  # and MLflow has them as every metric's numbers

    client = MlflowClient(tracking_uri=f"sqlite:///{in_project / 'results' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("biasflow").experiment_id])
    logged = {k: v for r in runs for k, v in r.data.metrics.items() if "toxicity" in k}
    want = ours["toxicity"].set_index(["metric", "category"])["value"]
    assert logged["expected_maximum_toxicity.overall"] == pytest.approx(want[("expected_maximum_toxicity", "overall")])


def test_bad_input_names_it(in_project):
    import biasflow.api as bf
    from biasflow.errors import ConfigError, DataFormatError

    with pytest.raises(DataFormatError, match="responses has no column 'response'"):
        bf.evaluate("langfair_stereotype", pd.DataFrame({"prompt": ["x"]}))
    with pytest.raises(ConfigError, match="scores neither generated text nor a table of your outputs; one of "
                                          "bold_sentiment, counterfactual, helm_representation, honest, "
                                          "langfair_stereotype, toxicity, classification_fairness, "
                                          "recommendation_fairness"):
        bf.evaluate("crows_pairs", pd.DataFrame({"prompt": ["x"], "response": ["y"]}))
    with pytest.raises(ConfigError, match="stats.n_boot"):
        bf.evaluate("langfair_stereotype", pd.DataFrame({"prompt": ["x"], "response": ["y"]}), "stats.n_boot=-1")
    with pytest.raises(ConfigError, match="overrides are strings"):
        bf.plan(3)
    # a name with ../ is made folder-safe: the job stays inside results/metrics
    res = bf.evaluate("langfair_stereotype", pd.DataFrame({"prompt": ["x"], "response": ["y"]}), name="../up")
    for folder in res.jobs:
        assert ".." not in folder.parts and folder.resolve().is_relative_to((in_project / "results").resolve())


def test_a_run_that_could_not_start_promises_no_resume(tmp_path, monkeypatch):
    """No Snakefile where the run looks for one: RunFailed says the run did not start and why (in the exception,
    not only on the console), not that running the same call again resumes."""
    from biasflow import api

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BIASFLOW_ROOT", str(tmp_path))
    with pytest.raises(api.RunFailed, match=r"did not start: BIASFLOW_ROOT=.* holds no Snakefile") as err:
        api.run("metric=[crows_pairs]", "benchmark.crows_pairs.limit=5")
    assert "resume" not in str(err.value).lower() and err.value.unfinished == []


def test_evaluate_on_responses_fetches_nothing_and_names_the_users_data(in_project, monkeypatch, caplog):
    """Issue 46: HELM's numbers on one's own responses read the responses only: no BOLD download (every fetch
    fails here), no BOLD item warnings, the tables name prompts_file (the user's prompts), a repeated prompt is one
    item, and an undefined number says why in the report's words."""
    import logging

    import biasflow.api as bf
    from biasflow import stages
    from biasflow.registry import get_metric
    from biasflow.report.explain import cell_reason

    copy = stages.download_file

    def no_fetch(sources, *args, **kwargs):  # the user's own file (file://) is copied in, nothing else is fetched
        assert all(s["url"].startswith("file://") for s in sources), f"fetched {sources}"
        return copy(sources, *args, **kwargs)

    monkeypatch.setattr(stages, "download_file", no_fetch)
    responses = pd.DataFrame({"prompt": ["Tell me about my mother.", "Tell me about my sister.",
                                         "Tell me about my mother."],
                              "response": ["She is caring and emotional.", "My sister is kind.", "He is a doctor."]})
    with caplog.at_level(logging.WARNING):
        res = bf.evaluate("helm_representation", responses, "stats.n_boot=20", name="mine")
    agg = res.aggregate.set_index("metric")
    assert set(res.aggregate["benchmark"]) == {"prompts_file"} and set(res.aggregate["model"]) == {"mine"}
    assert agg.loc["representation_gender", "n"] == 3  # every response counts
    assert "repeat" not in caplog.text and "bold" not in caplog.text.lower()
    race = agg.loc["representation_race"]
    assert pd.isna(race["value"])  # no surname of HELM's race lists in these responses
    why = cell_reason(get_metric("helm_representation"), "representation_race", race["value"], race["ci_low"],
                      race["ci_high"], race["n"], True)
    assert why == "undefined: no response has a word of any of the groups' lists (3 items)"
    # the same on the command line's plan; a metric that needs its benchmark's rows (HONEST's templates) keeps them
    from biasflow.plan import build_plan

    path = in_project / "mine.csv"
    responses.to_csv(path, index=False)
    plan = build_plan(["metric=[helm_representation,honest]", "+generator=responses_file", f"generator.path={path}"])
    benchmarks = {job.metric: job.benchmark for job in plan.jobs}
    assert benchmarks == {"helm_representation": "prompts_file", "honest": "honest"}
    (helm,) = [job for job in plan.jobs if job.metric == "helm_representation"]
    assert helm.benchmark_cfg["distinct"] and [s["url"] for s in helm.benchmark_cfg["files"]["responses"]["sources"]] \
        == [path.resolve().as_uri()]
    chosen = build_plan(["metric=[helm_representation]", "+generator=responses_file", f"generator.path={path}",
                         "metric.helm_representation.benchmark=bold"])
    assert chosen.jobs[0].benchmark == "bold"  # the user's choice wins


def test_evaluate_takes_any_name_as_text(in_project):
    """A name holding override grammar is the model's name, made folder-safe, never a parse error, a sweep or an
    interpolation (an independent check: 'bot<x>' and "bot'q" raised LexerNoViableAltException, 'bot,2' asked for
    -m, '${...}' would have been resolved)."""
    import biasflow.api as bf

    responses = pd.DataFrame({"prompt": ["Tell me about my mother."], "response": ["She is kind."]})
    for name, label in (("bot<x>", "bot_x"), ("bot'q", "bot_q"), ("bot,2", "bot_2"),
                        ("${oc.env:HOME}", "oc.env_HOME")):
        res = bf.evaluate("langfair_stereotype", responses, "stats.n_boot=0", name=name)
        assert set(res.aggregate["model"]) == {label}, name


def test_a_responses_file_without_the_metrics_prompts_fails_saying_so(in_project):
    """counterfactual asks LangFair's prompts and their variants; a file holding other prompts gave a
    non-completion rate of 1.0 and no other number, without a word (an independent check). Now the score stage fails
    naming how many prompts the file lacks and how to accept them."""
    import biasflow.api as bf
    from biasflow.errors import GenerationError

    responses = pd.DataFrame({"prompt": ["Write a letter for my son.", "Write a letter for my daughter."],
                              "response": ["He is kind.", "She is kind."]})
    with pytest.raises(GenerationError, match=r"requests have no response in the responses file, more than "
                                              r"generator.max_failed_fraction=0; first error: no response 1 to this "
                                              r"prompt"):
        bf.evaluate("counterfactual", responses, "stats.n_boot=0", "benchmark.langfair_prompts.limit=2")
