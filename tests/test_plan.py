"""Hydra overrides -> plan: sweeps, shared score files, clear config errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from biasflow.errors import ConfigError
from biasflow.plan import build_plan, expand_sweep
from biasflow.registry import get_metric


def test_expand_sweep_is_a_cartesian_product():
    jobs = expand_sweep(["model=a,b", "metric.crows_pairs.diff_threshold=0.05,0.1,0.2", "x=1"], multirun=True)
    assert len(jobs) == 6
    assert ["model=a", "metric.crows_pairs.diff_threshold=0.05", "x=1"] in jobs


def test_sweep_without_multirun_is_an_error():
    with pytest.raises(ConfigError, match="is a sweep: add -m"):
        expand_sweep(["model=a,b"], multirun=False)


def test_threshold_sweep_shares_one_score_file_per_model():
    plan = build_plan(["model=demo_bert,bert_base_uncased", "metric=[crows_pairs]",
                       "metric.crows_pairs.diff_threshold=0.05,0.1,0.2"], multirun=True)
    crows = [j for j in plan.jobs if j.metric == "crows_pairs"]
    assert len(crows) == 6
    keys = get_metric("crows_pairs").score_keys
    assert len({j.scores_path(keys) for j in crows}) == 2  # one per model
    assert len({j.metric_dir for j in crows}) == 6
    assert len({j.items_path for j in crows}) == 1


def test_unknown_config_key_names_the_key():
    with pytest.raises(ConfigError, match="metric.crows_pairs.diff_treshold"):
        build_plan(["metric.crows_pairs.diff_treshold=0.1"])


def test_unknown_model_config_names_it():
    with pytest.raises(ConfigError, match="no_such_model"):
        build_plan(["model=no_such_model"])


def test_unknown_metric_is_an_error():
    with pytest.raises(ConfigError, match="no_such_metric"):
        build_plan(["metric=[no_such_metric]"])


def test_benchmark_options_change_items_path_but_not_other_jobs():
    a = build_plan(["metric=[crows_pairs]"]).jobs[0]
    b = build_plan(["metric=[crows_pairs]", "benchmark.crows_pairs.limit=20"]).jobs[0]
    assert a.items_path != b.items_path and a.metric_dir != b.metric_dir


@pytest.mark.parametrize("overrides", [
    [],
    ["model=gpt2"],
    ["model=gpt2", "metric=[crows_pairs_causal,winobias_mc]", "metric.crows_pairs_causal.aggregation=mean"],
    ["metric=[crows_pairs]", "metric.crows_pairs.diff_threshold=0.2", "metric.crows_pairs.variants=[pll]"],
    ["paths.results=/tmp/elsewhere", "model=bert_base_uncased"],  # interpolated by tracking.uri: Hydra's path
    ["+experiment=meade2022_bias_bench", "model=roberta_base", "metric.stereoset.word_prefix_space=true"],
    ["metric=[langfair_stereotype]", "+generator=openai_compatible", "generator.model=m", "generator.count=3"],
    ["model=glove_6b_50d", "benchmark.crows_pairs.limit=5", "stats.n_boot=0", "model.lowercase=false"],
    ["benchmark=[stereoset]", "benchmark.stereoset.split=test", "+model.mem_mb=1000"],
])
def test_fast_composition_equals_hydra(overrides):
    """compose() composes each choice of groups once, fills in the options' defaults and sets plain values on the
    resolved config: the result must be exactly Hydra's own composition of the groups, with the defaults filled in,
    and Hydra's own override code applying the values."""
    from biasflow.plan import compose

    want = _hydra_composition(overrides)
    assert compose(overrides) == want
    assert compose(overrides) == want  # and again from the caches


def _hydra_composition(overrides):
    """Hydra's own composition of ``overrides`` with the options' defaults filled in: what compose() must equal."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    from biasflow.plan import conf_dir, with_every_benchmark
    from biasflow.plan.composition import _config_groups, _fill_option_defaults, _is_group_override

    cdir = conf_dir()
    full = with_every_benchmark(overrides, sorted(p.stem for p in (cdir / "benchmark").glob("*.yaml")))
    groups = _config_groups(cdir)
    with initialize_config_dir(config_dir=str(cdir), version_base="1.3"):
        cfg = hydra_compose("config", overrides=[o for o in full if _is_group_override(o, groups)])
    with open_dict(cfg):
        _fill_option_defaults(cfg)
    values = [o for o in full if not _is_group_override(o, groups)]
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(values), cfg)
    return OmegaConf.to_container(cfg, resolve=True)


def test_every_model_config_swapped_in_equals_hydra():
    """A model sweep resolves each model file on its own and swaps it into one composition (the fast path of a
    1,000-model plan): for every shipped model config, with a value override and with an override of a path the
    model reads, the result is Hydra's own composition. Reading the result twice gives the same config, and a
    caller's change to compose()'s result never reaches the next composition."""
    from biasflow.plan import compose, conf_dir

    import yaml

    for path in sorted((conf_dir() / "model").glob("*.yaml")):
        # a mandatory value (???) the user sets: set here too
        required = [f"model.{k}=x" for k, v in (yaml.safe_load(path.read_text()) or {}).items() if v == "???"]
        for overrides in ([f"model={path.stem}", *required, "metric.crows_pairs.diff_threshold=0.2"],
                          [f"model={path.stem}", *required, "paths.resources=/tmp/elsewhere"]):
            want = _hydra_composition(overrides)
            got = compose(overrides)
            assert got == want, overrides
            got["model"]["name"] = "changed"
            got["benchmark"]["crows_pairs"]["limit"] = 3
            assert compose(overrides) == want, overrides


def test_a_plan_built_twice_is_the_same_plan():
    """build_plan shares unchanged sections between its sweep jobs' configs instead of copying them: a second build in
    the same process (the caches warm) gives the same plan file, byte for byte."""
    overrides = ["model=bert_base_uncased,roberta_base,gpt2", "metric=[crows_pairs,stereoset,crows_pairs_causal]",
                 "metric.crows_pairs.diff_threshold=0.05,0.1"]
    first = build_plan(overrides, multirun=True).to_json()
    assert build_plan(overrides, multirun=True).to_json() == first


@pytest.mark.parametrize("overrides", [
    ["paths.results=/tmp/elsewhere", "model=bert_base_uncased"],
    ["metric=[langfair_stereotype]", "+generator=openai_compatible", "generator.model=m", "generator.count=3"],
    ["model=gpt2", "metric=[crows_pairs_causal,winobias_mc]", "metric.crows_pairs_causal.aggregation=mean"],
])
def test_composition_on_a_hydra_whose_private_function_changed(overrides, monkeypatch):
    """Where Hydra's private override function is not the code biasflow was written for, Hydra's public compose does
    the whole job: the same config."""
    from biasflow.plan import composition

    want = composition.compose(overrides)
    monkeypatch.setitem(composition._HYDRA, "changed", True)
    monkeypatch.setattr(composition, "_apply_values_fast", lambda *a: None)  # force the path that needs Hydra
    assert composition.compose(overrides) == want


def test_a_saved_plan_reads_back_without_composing(tmp_path, monkeypatch):
    import biasflow.plan as plan_mod
    from biasflow.plan import Plan, build_plan

    plan = build_plan(["metric=[crows_pairs,weat]", "metric.crows_pairs.diff_threshold=0.05,0.1", "model=gpt2,demo_bert"],
                      multirun=True)
    path = plan.write(str(tmp_path / "plan.json"))
    from biasflow.plan import composition

    never = lambda *a: pytest.fail("a saved plan must not be composed again")  # noqa: E731
    monkeypatch.setattr(plan_mod, "compose", never)
    monkeypatch.setattr(composition, "compose", never)
    again = Plan.read(path)
    assert again.plan_hash == plan.plan_hash and again.to_json() == plan.to_json()
    assert [j.scores_path() for j in again.jobs] == [j.scores_path() for j in plan.jobs]
    doc = json.loads(Path(path).read_text())
    doc["jobs"][0]["metric_cfg"]["diff_threshold"] = 0.3  # edited by hand: its paths no longer match
    Path(path).write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="does not match"):
        Plan.read(path)


def test_snakemake_reparses_reuse_the_plan_until_an_input_changes(tmp_path, monkeypatch):
    import shutil

    import biasflow.workflow as wf
    from conftest import ROOT

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.setenv("BIASFLOW_CONF", str(tmp_path / "conf"))
    monkeypatch.chdir(tmp_path)
    preds = tmp_path / "p.json"
    preds.write_text("{}")
    calls = []
    real = wf.build_plan
    monkeypatch.setattr(wf, "build_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    config = {"overrides": ["metric=[stereoset]", f"metric.stereoset.predictions_file={preds}"]}
    first, _ = wf.load_plan(config)
    second, _ = wf.load_plan(config)
    assert len(calls) == 1 and first.to_json() == second.to_json()
    preds.write_text('{"intrasentence": []}')  # a user file changed: its digest is in the job paths
    third, _ = wf.load_plan(config)
    assert len(calls) == 2 and third.jobs[0].metric_dir != first.jobs[0].metric_dir
    cfg = tmp_path / "conf" / "metric" / "stereoset.yaml"
    cfg.write_text(cfg.read_text().replace("  benchmark: stereoset", "  benchmark: stereoset\n  word_prefix_space: true"))
    fourth, _ = wf.load_plan(config)
    assert len(calls) == 3 and fourth.jobs[0].metric_cfg["word_prefix_space"] is True


def test_a_long_list_override_parses_as_hydra_parses_it():
    """Long lists are parsed in chunks (Hydra's parser is quadratic in a list's length): the same values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from biasflow.plan import LIST_CHUNK, parse_overrides

    odd = ["'a, b'", '"q\\"x"', "{x: 1, y: [2, 3]}", "[4, [5]]", "${oc.env:HOME}", "true", "null", "2.5", " spaced "]
    elements = [odd[i % len(odd)] if i % 7 == 0 else f"w{i}" for i in range(3 * LIST_CHUNK + 5)]
    line = f"+metric.cbs.whatever=[{','.join(elements)}]"
    ours, = parse_overrides([line])
    hydra, = OverridesParser.create().parse_overrides([line])
    assert ours.value() == hydra.value() and len(ours.value()) == len(elements)
    assert (ours.key_or_group, ours.type, ours.input_line) == (hydra.key_or_group, hydra.type, hydra.input_line)
    # a sweep or a malformed list is left to Hydra whole
    with pytest.raises(ConfigError, match="could not parse"):
        expand_sweep(["x=[" + "a," * 3000 + "'unclosed]"], multirun=False)


def test_a_100kb_override_plans_quickly():
    words = ",".join(f"word{i}" for i in range(11000))  # ~100 kB: 71 s before (Hydra parsed it three times)
    plan = build_plan(["metric=[cbs]", f"benchmark.cbs.targets=[{words}]"])
    assert len(plan.jobs[0].benchmark_cfg["targets"]) == 11000


def test_local_checkpoints_are_named_after_their_folders(tmp_path):
    """model=local_masked_lm without model.name: each checkpoint is named after its folder (results paths, report,
    MLflow); two folders of one name get a short suffix; model.name wins."""
    for folder in ("a/tinyA", "a/tinyB", "b/tinyA"):
        (tmp_path / folder).mkdir(parents=True)
    plan = build_plan(["model=local_masked_lm", f"model.path={tmp_path}/a/tinyA,{tmp_path}/a/tinyB",
                       "metric=[crows_pairs]"], multirun=True)
    assert sorted(j.model["name"] for j in plan.jobs) == ["tinyA", "tinyB"]
    assert all(f"/metrics/{j.model['name']}-" in j.metric_dir for j in plan.jobs)
    same = build_plan(["model=local_masked_lm", f"model.path={tmp_path}/a/tinyA,{tmp_path}/b/tinyA",
                       "metric=[crows_pairs]"], multirun=True)
    names = sorted(j.model["name"] for j in same.jobs)
    assert len(set(names)) == 2 and all(n.startswith("tinyA-") and len(n) == len("tinyA-") + 4 for n in names)
    mine = build_plan(["model=local_masked_lm", f"model.path={tmp_path}/a/tinyA", "model.name=mine",
                       "metric=[crows_pairs]"])
    assert mine.jobs[0].model["name"] == "mine"


def test_an_export_never_overwrites_what_the_plan_reads_or_keeps(tmp_path):
    """metric.stereoset.export_predictions is its own rule's output, written where the user says: refused (naming
    the option and why) where it would overwrite another job's export, a file the plan reads, or the pipeline's own
    files, or where a folder is; a fresh path outside them is planned as an export rule."""
    predictions = tmp_path / "given.json"
    predictions.write_text("{}")
    base = ["metric=[stereoset]", "model=bert_base_uncased", f"paths.results={tmp_path}/results",
            f"paths.resources={tmp_path}/resources", f"paths.cache={tmp_path}/results/cache"]
    out = tmp_path / "exports" / "predictions.json"
    plan = build_plan([*base, f"metric.stereoset.export_predictions={out}"])
    assert [j.exports for j in plan.jobs] == [{"export_predictions": str(out)}]
    (tmp_path / "a_folder").mkdir()
    bad = {
        f"{tmp_path}/results/x.json": "inside paths.results",
        f"{tmp_path}/resources/datasets/stereoset/dev.json": "inside paths.resources",
        str(tmp_path / "a_folder"): "that is a folder",
    }
    for path, why in bad.items():
        with pytest.raises(ConfigError, match=f"metric.stereoset.export_predictions={path}: .*{why}"):
            build_plan([*base, f"metric.stereoset.export_predictions={path}"])
    with pytest.raises(ConfigError, match="is the input metric.stereoset.predictions_file of this plan; exporting there"):
        build_plan([*base, f"metric.stereoset.predictions_file={predictions}",
                    f"metric.stereoset.export_predictions={predictions}"])
    with pytest.raises(ConfigError, match="two jobs of this plan would write that file"):
        build_plan(["model=bert_base_uncased,roberta_base", *base[:1], *base[2:],
                    f"metric.stereoset.export_predictions={out}"], multirun=True)


def test_dtype_aliases_and_an_omitted_dtype_are_one_model():
    """fp32, float32 and no dtype are one computation: one model key, one cache (and bf16 = bfloat16)."""
    def keys(*overrides):
        return {j.model_key for j in build_plan(["metric=[crows_pairs]", *overrides]).jobs}

    assert keys("model.dtype=fp32") == keys("model.dtype=float32") == keys("~model.dtype") == keys()
    assert keys("model.dtype=bf16") == keys("model.dtype=bfloat16") != keys()


def test_the_demo_model_build_depends_only_on_what_it_reads(tmp_path):
    """The build rule's params are the recipe and its training settings: scoring options never rebuild the model
    (Snakemake re-runs a rule whose params change, and rebuilt the demo model for model.dtype=bfloat16)."""
    from biasflow.workflow import Lookups

    def build_params(*overrides):
        plan = build_plan(["metric=[crows_pairs]", *overrides])
        (path,) = {j.model["path"] for j in plan.jobs}
        return Lookups(plan, "").build_params(path)

    base = build_params()
    assert base == {"build": "demo_mlm", "train": build_plan(["metric=[crows_pairs]"]).jobs[0].model["train"]}
    for change in ("model.dtype=bfloat16", "model.batch_tokens=512", "model.device=cpu", "model.name=other"):
        assert build_params(change) == base, change
    assert build_params("model.train.steps=3") != base  # what the build reads does rebuild it
    rule = (Path(__file__).parents[1] / "workflow" / "rules" / "models.smk").read_text()
    assert "W.build_params(" in rule


@pytest.mark.parametrize("overrides, message", [
    (["metric=[bbq]", "+generator=openai_compatible", "generator.model=m", "generator.temperature=0.7"],
     r"generator.temperature=0.7 would be ignored: metric bbq answers with its own generation settings \("
     r"metric.bbq.generation.temperature=0.0.*Set metric.bbq.generation.temperature instead"),
    (["metric=[bbq]", "+generator=openai_compatible", "generator.model=m", "generator.count=3"],
     r"generator.count=3 would be ignored: metric bbq"),
    (["metric=[stereoset_mc]", "+generator=openai_compatible", "generator.model=m", "generator.max_tokens=100"],
     r"generator.max_tokens=100 would be ignored: metric stereoset_mc"),
    (["metric=[bbq]", "+generator=openai_compatible", "generator.model=m", "generator.max_failed_fraction=0.5"],
     r"generator.max_failed_fraction=0.5 would be ignored"),
    (["metric=[bbq]", "+generator=openai_compatible", "generator.model=m", "+generator.use_chat_template=true"],
     r"generator.use_chat_template=True is not read by generator kind openai_compatible.*read by: hf_generate"),
    (["metric=[langfair_stereotype]", "+generator=openai_compatible", "generator.model=m", "+generator.device=cuda"],
     r"generator.device='cuda' is not read by generator kind openai_compatible"),
    (["metric=[stereoset_mc]", "+generator=responses_file", "generator.path=x.csv", "+generator.temperature=0.2"],
     r"generator.temperature=0.2 is not read by generator kind responses_file"),
])
def test_generator_settings_that_would_be_ignored_are_refused(overrides, message):
    """Issue 31: the metric's generation settings win over these, or the generator kind never reads them."""
    with pytest.raises(ConfigError, match=message):
        build_plan(overrides)


def test_generator_settings_that_are_read_are_accepted():
    assert build_plan(["metric=[bbq]", "+generator=openai_compatible", "generator.model=m",
                       "generator.concurrency=8", "metric.bbq.generation.max_tokens=16"]).jobs
    # LangFair's metric takes the generator's sampling settings: they are read, so allowed
    job, = build_plan(["metric=[langfair_stereotype]", "+generator=openai_compatible", "generator.model=m",
                       "generator.temperature=0.7"]).jobs
    assert job.model["kind"] == "generator"


@pytest.mark.parametrize("overrides, message", [
    (["metric=[reddit_bias]", "benchmark.reddit_bias.categories=[genderx]"],
     r"benchmark.reddit_bias.categories: unknown dimension\(s\) \['genderx'\] \(did you mean 'gender'\?\)"),
    (["metric=[bbq]", "benchmark.bbq.categories=[age]"],
     r"benchmark.bbq.categories=\['age'\]: unknown category \['age'\] \(did you mean 'Age'\?\)"),
])
def test_category_names_are_checked_when_planning_before_any_download(overrides, message, tmp_path, monkeypatch):
    """They were checked in prepare, after the downloads, and the jobs were then reported as waiting."""
    from biasflow.data import download

    monkeypatch.setattr(download, "fetch_verified", lambda *a, **k: pytest.fail("downloaded"))
    with pytest.raises(ConfigError, match=message):
        build_plan(overrides)


@pytest.mark.parametrize("override, message", [
    ("metric.crows_pairs.diff_treshold=0.1", r"^metric.crows_pairs.diff_treshold=0.1: metric.crows_pairs has no option "
                                             r"'diff_treshold' \(did you mean 'diff_threshold'\?\); its options: "),
    ("model.dtyp=bf16", r"^model.dtyp=bf16: model has no option 'dtyp' \(did you mean 'dtype'\?\)"),
    ("benchmark.crows_pairs.limt=5", r"did you mean 'limit'"),
])
def test_a_mistyped_option_gets_a_did_you_mean_in_the_users_words(override, message):
    """Hydra's "Could not override" quoted a benchmark=[...] override the user never typed and advised `+`."""
    with pytest.raises(ConfigError, match=message) as err:
        build_plan(["metric=[crows_pairs]", override])
    assert "benchmark=[" not in str(err.value) and "+" not in str(err.value)


def test_a_declared_option_missing_from_the_yaml_needs_no_plus():
    """model.path on a hub model's config, a metric option its YAML does not list: set like any other."""
    (job,) = build_plan(["metric=[crows_pairs]", "model=bert_base_uncased", "model.path=/models/my-bert",
                         "metric.crows_pairs.fill_mask_top_k=7"]).jobs
    assert job.model["path"] == "/models/my-bert" and job.metric_cfg["fill_mask_top_k"] == 7


def test_glob_sweeps_the_model_configs_it_matches():
    """``-m model=glob(bert_*)`` (Hydra's sweep syntax, the way to name a thousand checkpoints) sweeps every matching
    config file; a pattern that matches none is an error naming the group."""
    plan = build_plan(["model=glob(bert_base_*)", "metric=[crows_pairs]"], multirun=True)
    assert sorted(j.model["name"] for j in plan.jobs) == sorted(
        p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "model").glob("bert_base_*.yaml"))
    with pytest.raises(ConfigError, match=r"model=glob\(zzz\*\): matches no config in conf/model/"):
        build_plan(["model=glob(zzz*)", "metric=[crows_pairs]"], multirun=True)


@pytest.mark.parametrize("swept, named", [
    ("paths.results=/tmp/ra,/tmp/rb", "paths.results"),
    ("tracking.experiment=a,b", "tracking.experiment"),
    ("model.device=cpu,cuda", "model.device"),
    ("model.batch_tokens=4096,8192", "model.batch_tokens"),
])
def test_a_sweep_over_a_setting_one_plan_cannot_vary_is_refused(swept, named):
    """A plan has one results folder and one experiment, and settings outside a model's identity do not make another
    job: sweeping them would silently run the first value only. Refused, naming the setting."""
    with pytest.raises(ConfigError, match=rf"{re.escape(named)} is swept .*run each value as its own plan"):
        build_plan(["model=bert_base_uncased", "metric=[crows_pairs]", swept], multirun=True)


def test_a_returned_plan_changed_by_its_caller_leaves_later_plans_alone():
    """build_plan shares sections between its jobs' configs and its composition cache; a caller that edits the plan
    it got (paths, tracking, sweep configs) does not change the next plan."""
    overrides = ["model=bert_base_uncased,gpt2", "metric=[crows_pairs,crows_pairs_causal]"]
    first = build_plan(overrides, multirun=True)
    want = first.to_json()
    first.paths["results"] = "EVIL"
    first.tracking["experiment"] = "EVIL"
    for entry in first.sweep:
        entry["config"]["paths"]["results"] = "EVIL"
        entry["config"]["metric"]["crows_pairs"]["diff_threshold"] = 9
    assert build_plan(overrides, multirun=True).to_json() == want


def test_an_environment_variable_a_model_file_reads_is_read_again(tmp_path, monkeypatch):
    """A model config reading ${oc.env:VAR}: planning again after VAR changed gives the new value (the composition
    cache is keyed by the variables the model file reads too)."""
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(Path(__file__).resolve().parents[1] / "conf", conf)
    (conf / "model" / "env_model.yaml").write_text(
        "name: env_model\nkind: masked_lm\nhub_id: org/env-model\nrevision: ${oc.env:BF_TEST_REVISION,main}\n")
    monkeypatch.setenv("BIASFLOW_CONF", str(conf))
    monkeypatch.setenv("BF_TEST_REVISION", "aaa111")
    first = build_plan(["model=env_model,bert_base_uncased", "metric=[crows_pairs]"], multirun=True)
    monkeypatch.setenv("BF_TEST_REVISION", "bbb222")
    second = build_plan(["model=env_model,bert_base_uncased", "metric=[crows_pairs]"], multirun=True)
    revisions = [next(j.model["revision"] for j in p.jobs if j.model["name"] == "env_model") for p in (first, second)]
    assert revisions == ["aaa111", "bbb222"]
