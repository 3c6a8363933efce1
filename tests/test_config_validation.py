"""Plan-time validation: every bad option fails before anything runs, naming the option and what is allowed;
names that become paths cannot leave results/; secrets never come from (or land in) the configuration."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from biasflow.errors import ConfigError
from biasflow.plan import build_plan

CROWS = ["metric=[crows_pairs]"]


@pytest.mark.parametrize("override, message", [
    ("benchmark.crows_pairs.limit=0", r"benchmark\.crows_pairs\.limit=0: must be greater than or equal to 1"),
    ("benchmark.crows_pairs.limit=-5", r"benchmark\.crows_pairs\.limit=-5"),
    ("metric.crows_pairs.variants=[nope]", r"metric\.crows_pairs\.variants\.0='nope': must be 'pll' or 'fill_mask'"),
    ("metric.crows_pairs.variants=[]", r"metric\.crows_pairs\.variants.*at least 1"),
    ("stats.level=1.5", r"stats\.level=1\.5: must be less than 1"),
    ("stats.n_boot=-3", r"stats\.n_boot=-3: must be greater than or equal to 0"),
    ("metric.crows_pairs.diff_threshold=abc", r"metric\.crows_pairs\.diff_threshold='abc'"),
    ("+metric.crows_pairs.diff_treshold=0.1", r"metric\.crows_pairs\.diff_treshold: unknown option(.|\n)*diff_threshold"),
    ("model.dtype=float8", r"model\.dtype='float8'"),
    ("model.device=gpu", r"model\.device='gpu'"),
    ("run.mode=exact", r"run\.mode='exact': must be 'parity' or 'corrected'"),
    ("benchmark.stereoset.split=train", r"benchmark\.stereoset\.split='train': must be one of \['dev', 'test'\]"),
    # a served model's or generator's URL is checked at plan time, not in the score job an hour later
    ("model=served_llm model.base_url=not-a-url", r"model\.base_url='not-a-url': must be an http:// or https:// URL"),
    ("model=served_llm model.base_url=http://h:99999/v1", r"model\.base_url='http://h:99999/v1': not a valid URL"),
    ("+generator=openai_compatible generator.model=m generator.base_url=ftp://x",
     r"generator\.base_url='ftp://x': must be an http:// or https:// URL"),
])
def test_bad_options_fail_at_plan_time_naming_the_option(override, message):
    with pytest.raises(ConfigError, match=message):
        build_plan(CROWS + override.split(" "))


@pytest.mark.parametrize("override, message", [
    # pydantic's lax mode read these as 1 (one item, one bootstrap replicate) or as true, silently
    ("benchmark.crows_pairs.limit=true", r"benchmark\.crows_pairs\.limit=True: must be an integer, not a boolean"),
    ("stats.n_boot=true", r"stats\.n_boot=True: must be an integer, not a boolean"),
    ("stats.level=true", r"stats\.level=True: must be a number, not a boolean"),
    ("metric.crows_pairs.diff_threshold=false", r"diff_threshold=False: must be a number, not a boolean"),
    ("metric.crows_pairs.fill_mask_top_k=true", r"fill_mask_top_k=True: must be an integer"),
    ("model.lowercase=1", r"model\.lowercase=1: must be true or false"),
    ("model.lowercase=yes", r"model\.lowercase='yes': must be true or false"),
    ("tracking.enabled=0", r"tracking\.enabled=0: must be true or false"),
    ("benchmark.crows_pairs.limit='10'", r"benchmark\.crows_pairs\.limit='10': must be a number, not a string"),
    ("metric.honest.k=[true]", r"metric\.honest\.k: item 0: must be an integer"),
])
def test_scalars_take_only_their_own_type(override, message):
    with pytest.raises(ConfigError, match=message):
        build_plan(["metric=[crows_pairs,honest]", override])
    plan = build_plan(["metric=[crows_pairs]", "benchmark.crows_pairs.limit=3", "stats.n_boot=7"])
    assert (plan.jobs[0].benchmark_cfg["limit"], plan.jobs[0].stats["n_boot"]) == (3, 7)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        build_plan(CROWS + ["stats.n_boot=-1", "benchmark.crows_pairs.limit=0"])
    assert "stats.n_boot" in str(err.value) and "benchmark.crows_pairs.limit" in str(err.value)


def test_a_bad_value_in_one_sweep_job_fails_the_whole_plan():
    with pytest.raises(ConfigError, match=r"metric\.crows_pairs\.diff_threshold=1\.5"):
        build_plan(CROWS + ["metric.crows_pairs.diff_threshold=0.1,1.5"], multirun=True)


@pytest.mark.parametrize("name", ["../../../X", "a/b", "..", ".hidden", "x" * 200, "a b"])
def test_names_that_become_paths_cannot_escape_results(name):
    with pytest.raises(ConfigError, match=r"model\.name=.*not a valid name"):
        build_plan(CROWS + [f"model.name={json.dumps(name)}"])


def test_good_names_plan_under_results():
    plan = build_plan(CROWS + ["model.name=my-bert_v1.2"])
    assert all(Path(j.metric_dir).resolve().is_relative_to(Path("results").resolve()) for j in plan.jobs)


def test_every_shipped_config_and_experiment_validates():
    conf = Path("conf")
    for exp in sorted((conf / "experiment").glob("*.yaml")):
        build_plan([f"+experiment={exp.stem}"])
    for model in sorted((conf / "model").glob("*.yaml")):
        if "???" in model.read_text():
            continue
        build_plan([f"model={model.stem}", "metric=[crows_pairs,weat,seat,winobias_mc,crows_pairs_causal]"])


@pytest.mark.parametrize("override", ["tracking.uri=postgresql://bob:hunter2hunter2@db/mlflow",
                                      "+generator=openai_compatible generator.model=m +generator.api_key=sk-abcdefghijklmnop"])
def test_secrets_on_the_command_line_are_refused(override):
    with pytest.raises(ConfigError, match="password or key") as err:
        build_plan(CROWS + override.split())
    assert "hunter2" not in str(err.value) and "sk-abc" not in str(err.value)


def test_api_key_option_is_refused_whatever_it_looks_like():
    with pytest.raises(ConfigError, match="api_key_env"):
        build_plan(["metric=[langfair_stereotype]", "+generator=openai_compatible", "generator.model=m",
                    "+generator.api_key=plain"])


def test_tracking_password_from_the_environment_is_never_written(monkeypatch, tmp_path):
    uri = "postgresql://bob:hunter2hunter2@127.0.0.1:5432/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    plan = build_plan(CROWS + ["tracking=server", f"paths.results={tmp_path}"])
    assert plan.tracking["uri"] == "postgresql://127.0.0.1:5432/mlflow"
    text = Path(plan.write()).read_text()
    assert "hunter2" not in text and "bob" not in text
    from biasflow.secrets import tracking_uri

    assert tracking_uri(plan.tracking["uri"]) == uri  # the stage reconnects with the environment's URI


@pytest.mark.parametrize("override", ["run.name=${oc.env:OPENAI_API_KEY}", "tracking.experiment=x${oc.env:HF_TOKEN}x"])
def test_a_secret_variable_never_reaches_the_plan(monkeypatch, tmp_path, override):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-abcdefgh12345678")
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecretsecret123")
    name = override.split("oc.env:")[1].split("}")[0]
    with pytest.raises(ConfigError, match=f"holds the value of the secret environment variable {name}") as err:
        build_plan(CROWS + [override, f"paths.results={tmp_path}"])
    assert "sk-live" not in str(err.value) and "hf_secret" not in str(err.value)
    assert not list(tmp_path.rglob("plan.json"))
    build_plan(CROWS + ["run.name=${oc.env:USER,me}", f"paths.results={tmp_path}"])  # other variables are fine


def test_environment_snapshot_survives_a_variable_deleted_meanwhile(monkeypatch):
    """MLflow's telemetry thread deletes a variable while secrets are read (KeyError in 1 of 7 server logs)."""
    import os

    from biasflow.secrets import environ_snapshot, secret_env_values

    monkeypatch.setenv("VANISHING_TOKEN", "value-123456")
    real_getitem = type(os.environ).__getitem__

    def getitem(self, key):
        if key == "VANISHING_TOKEN":
            raise KeyError(key)  # deleted between listing the keys and reading this one
        return real_getitem(self, key)

    monkeypatch.setattr(type(os.environ), "__getitem__", getitem)
    assert "VANISHING_TOKEN" not in environ_snapshot()
    assert "value-123456" not in secret_env_values()


def test_team_members_plan_the_same_run(monkeypatch, tmp_path):
    """Two people, one server, their own credentials: one plan hash, one plan file, so one parent run."""
    texts = set()
    for user, password in (("alice", "alicepass1"), ("bob", "bobpass22")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://{user}:{password}@127.0.0.1:5000")
        plan = build_plan(CROWS + ["tracking=server", f"paths.results={tmp_path}"])
        text = Path(plan.write()).read_text()
        assert user not in text and password not in text
        texts.add(text)
    assert len(texts) == 1
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5001")  # another server: another run
    assert build_plan(CROWS + ["tracking=server", f"paths.results={tmp_path}"]).plan_hash not in "".join(texts)


def test_user_files_are_keyed_by_content(tmp_path):
    """A predictions file replaced in place gives a new score and metric job, never the old file's numbers."""
    preds = tmp_path / "preds.json"
    preds.write_text('{"intrasentence": [], "intersentence": []}')
    args = ["metric=[stereoset]", f"metric.stereoset.predictions_file={preds}"]
    first = build_plan(args).jobs[0]
    assert first.user_files["metric.stereoset.predictions_file"]["path"] == str(preds.resolve())
    preds.write_text('{"intrasentence": [{"id": "x", "score": 1}], "intersentence": []}')
    second = build_plan(args).jobs[0]
    assert first.metric_dir != second.metric_dir
    assert first.score_hash(("predictions_file",)) != second.score_hash(("predictions_file",))


def test_a_missing_user_file_fails_at_plan_time():
    with pytest.raises(ConfigError, match=r"metric\.stereoset\.predictions_file='/no/such\.json': no such file"):
        build_plan(["metric=[stereoset]", "metric.stereoset.predictions_file=/no/such.json"])


@pytest.mark.parametrize("bench", ["benchmark=[stereoset]", "benchmark=stereoset", "benchmark=[winobias,stereoset]"])
def test_any_benchmark_list_plans_with_every_description(bench):
    plan = build_plan(["metric=[stereoset]", bench])
    assert {"stereoset", "bold_wikipedia", "crows_pairs"} <= set(plan.benchmarks)


def test_an_unknown_benchmark_in_the_list_is_named():
    with pytest.raises(ConfigError, match=r"no dataset config \['nope'\]"):
        build_plan(["metric=[stereoset]", "benchmark=[nope]"])


def test_user_files_are_the_options_marked_so_where_they_are_declared():
    """The user-file options come from markers on the options models, nested models included (a metric's
    ``generator.path``, ``classifier.model``), never from a list kept elsewhere."""
    from typing import Optional

    from pydantic import BaseModel, Field

    from biasflow.plan import user_file_options
    from biasflow.schema import USER_FILE, USER_FILE_OR_HUB_ID, marked_options

    class Inner(BaseModel):
        model: Optional[str] = Field(None, json_schema_extra=USER_FILE_OR_HUB_ID)
        size: int = 1

    class Outer(BaseModel):
        table: Optional[str] = Field(None, json_schema_extra=USER_FILE)
        inner: Optional[Inner] = None
        many: dict[str, Inner] = Field(default_factory=dict)
        plain: str = "x"

    assert marked_options(Outer, "user_file") == {"table": "path", "inner.model": "hub_id", "many.model": "hub_id"}
    langfair = user_file_options("langfair_stereotype")
    assert langfair["metric"]["classifier.model"] == "hub_id" and langfair["metric"]["stop_words"] == "path"
    assert langfair["model"] == {"path": "path"} and langfair["benchmark"] == {}
    assert user_file_options("crows_pairs")["metric"] == {}
    # a dataset's user files are its loader's (declared on the options model it registers)
    assert user_file_options("lpbs", "lpbs_templates")["benchmark"] == {"templates_file": "path",
                                                                         "attribute_files": "path"}
    assert user_file_options("weat", "weat_lists")["benchmark"] == {"lists_dir": "path"}
    assert user_file_options("crows_pairs", "crows_pairs")["benchmark"] == {}


def test_a_dataset_is_validated_by_its_loaders_options_model():
    """Each loader declares the options it reads with its registration (``register_loader(options=...)``): an option
    only another loader reads is refused naming it and listing this loader's options; a loader's own option keeps
    its type; a dataset whose loader declares none takes only the options every dataset has."""
    with pytest.raises(ConfigError) as err:
        build_plan(["metric=[crows_pairs]", "benchmark.crows_pairs.categories=[race-color]"])
    assert "benchmark.crows_pairs.categories: unknown option" in str(err.value)
    assert "(options of benchmark.crows_pairs: files, limit, loader, split)" in str(err.value)
    with pytest.raises(ConfigError, match=r"benchmark\.bec_pro\.language='fr': must be 'en' or 'de'"):
        build_plan(["metric=[bec_pro]", "benchmark.bec_pro.language=fr"])
    with pytest.raises(ConfigError, match=r"benchmark\.honest\.per_group: unknown option"):
        build_plan(["metric=[honest]", "benchmark.honest.per_group=2"])
    (job,) = build_plan(["metric=[honest]", "benchmark.honest.dedupe=false"]).jobs
    assert job.benchmark_cfg["dedupe"] is False


def test_a_loader_options_model_must_extend_the_datasets_base():
    from pydantic import BaseModel

    from biasflow.registry import register_loader

    class NotADataset(BaseModel):
        x: int = 1

    with pytest.raises(ValueError, match="options must be a biasflow.schema.BenchmarkConfig subclass"):
        register_loader("not_a_dataset", options=NotADataset)


def test_the_run_mode_is_set_by_the_stages_not_in_a_metrics_config():
    """run.mode reaches every metric as its typed ``run_mode`` option, set by the stages from the plan (which stores
    it once per job, as the value used); setting it in a metric's config is refused, naming run.mode; a value that is
    no mode is refused naming the option."""
    from biasflow.plan import build_plan
    from biasflow.registry import get_metric

    with pytest.raises(ConfigError, match=r"metric\.crows_pairs\.run_mode: set by the stages from the plan.*run\.mode"):
        build_plan(["metric=[crows_pairs]", "metric.crows_pairs.run_mode=corrected"])
    plan = build_plan(["metric=[crows_pairs]", "run.mode=corrected"])
    (job,) = plan.jobs
    assert job.mode == "corrected" and "run_mode" not in job.metric_cfg
    from biasflow.stages import metric_options

    spec = get_metric("crows_pairs")
    assert metric_options(spec, job.params()).run_mode == "corrected"
    assert metric_options(spec, job.score_params()).run_mode == "corrected"
    with pytest.raises(ConfigError, match=r"metric\.crows_pairs.*run_mode='other'"):
        metric_options(spec, dict(job.score_params(), mode="other"))


def test_the_plans_options_are_what_validating_them_again_gives():
    """The plan stores each metric's options as their canonical dump, and each stage rebuilds the options model from
    it: for every metric, validating the stored options again gives them back (ordered options as lists, a generator
    section as written), and the stage's options are the metric's options model with the job's run mode."""
    from biasflow.registry import METRICS, load_all
    from biasflow.schema import filled_options
    from biasflow.stages import metric_options

    load_all()
    names = sorted(METRICS)
    jobs = [job for model in ("gpt2", "bert_base_uncased")
            for job in build_plan([f"metric=[{','.join(names)}]", f"model={model}",
                                   "metric.toxicity.classifier.model=s-nlp/roberta_toxicity_classifier"]).jobs]
    # the metrics of a sentence-pair classifier (Bias-NLI) run on neither: an NLI model of kind text_classifier
    jobs += build_plan(["metric=[bias_nli]", "model=roberta_large_mnli"]).jobs
    # UnQover's extractive-QA metric: a model of kind question_answering, on the QA questions
    jobs += build_plan(["metric=[unqover_qa]", "model=distilbert_squad"]).jobs
    assert {job.metric for job in jobs} == set(names)
    for job in jobs:
        spec = METRICS[job.metric]
        options = metric_options(spec, job.params())
        assert isinstance(options, spec.options) and options.run_mode == job.mode, job.metric
        stored = dict(job.metric_cfg)
        again = {k: v for k, v in filled_options(spec.options, stored).items() if k != "run_mode"}
        assert again == stored, job.metric


def test_a_password_in_a_refused_option_is_masked_in_the_error(tmp_path, monkeypatch):
    """An option no model kind takes, in the user's own model file, holding a URI with a password: the error names
    the option and masks the password (the console, logs and CI output keep no secret)."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mine.yaml").write_text(
        "name: mine\nkind: masked_lm\nhub_id: org/mine\nnotes: postgresql://user:hunter2pw@db.example/mlflow\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        build_plan(["model=mine", "metric=[crows_pairs]"])
    assert "model.notes=" in str(err.value) and "takes no option 'notes'" in str(err.value)
    assert "hunter2pw" not in str(err.value)
