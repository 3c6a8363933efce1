"""A model kind is declared once (biasflow.model_kinds) and every table that knows model kinds is derived from it."""
from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from biasflow import model_kinds
from biasflow.errors import ConfigError
from biasflow.model_kinds import Answer, ModelKindSpec, Resources, register_model_kind
from biasflow.models import load_model
from conftest import ROOT
from biasflow.registry import metric_options_from

SMALL = Resources(mem_mb=1000, cpus=1, runtime_min=10, gpu_capable=False)


@pytest.fixture
def kinds(restore_registries):
    """The registry, restored after the test (kinds a test registers disappear)."""
    return model_kinds.KINDS


def request_kinds() -> set[str]:
    from biasflow.interface import requests

    return {cls.kind for cls in vars(requests).values()
            if inspect.isclass(cls) and issubclass(cls, requests.Request) and cls.kind}


def revisions() -> dict[tuple[str, str], int]:
    """(model kind, request kind) -> answerer revision, where it is not 1."""
    return {(k, r): a.revision for k, s in model_kinds.KINDS.items() for r, a in s.answers.items() if a.revision != 1}


def test_every_reader_of_model_kinds_reads_the_declarations():
    from pydantic import TypeAdapter

    from biasflow import scheduling, schema
    from biasflow.scoring import answer

    declared = set(model_kinds.KINDS)
    assert {"masked_lm", "causal_lm", "bert_nsp", "word_vectors", "sentence_encoder", "ngram", "lmc_process",
            "served_causal_lm", "generator", "text_classifier"} <= declared
    # the schema takes every declared kind and nothing else
    adapter = TypeAdapter(schema.ModelKind)
    assert all(adapter.validate_python(kind) == kind for kind in declared)
    with pytest.raises(Exception, match="not a known model kind"):
        adapter.validate_python("nope")
    # a factory, scheduling defaults, and answerers of real request kinds for every kind, each read where it is used
    for kind, spec in model_kinds.KINDS.items():
        assert spec.answers and set(spec.answers) <= request_kinds(), kind
        for request_kind, ans in spec.answers.items():
            assert answer.can_answer(kind, request_kind) and kind in model_kinds.kinds_answering(request_kind)
            assert answer.cache_kind(kind, request_kind) == (
                request_kind if ans.revision == 1 else f"{request_kind}.r{ans.revision}")
            assert ans.load_as is None or ans.load_as in declared
        first = scheduling.score_resources({"kind": kind, "device": "cuda"})
        assert (first["mem_mb"], first["cpus"], first["runtime_min"], first["gpus"]) == (
            spec.resources.mem_mb, spec.resources.cpus, spec.resources.runtime_min, int(spec.resources.gpu_capable))
        assert spec.like is None or spec.like in declared
    assert not answer.can_answer("nope", "pll") and model_kinds.answer_for("nope", "pll") is None
    assert scheduling.score_resources({"kind": "nope"})["mem_mb"] == scheduling.FALLBACK["mem_mb"]


def test_every_declared_factory_and_answerer_imports():
    """The strings name real callables (the declaration itself imports none of them)."""
    for kind, spec in model_kinds.KINDS.items():
        factory = model_kinds.resolve(spec.factory)
        assert callable(factory), kind
        if inspect.isclass(factory) and hasattr(factory, "kind") and isinstance(factory.kind, str):
            assert factory.kind == kind or kind in ("ngram", "lmc_process"), f"{kind}: {factory} says {factory.kind}"
        for request, ans in spec.answers.items():
            assert callable(model_kinds.resolve(ans.target)), f"{kind} answering {request}: {ans.target}"


def test_every_metric_names_declared_model_kinds():
    from biasflow.registry import METRICS, load_all

    load_all()
    unknown = {f"{name}: {kind}" for name, spec in METRICS.items() for kind in spec.model_kinds
               if kind not in model_kinds.KINDS}
    assert not unknown


def test_the_tables_keep_their_numbers():
    """Answer cache folders, answerer revisions and fingerprints follow from the declarations as they did from
    the four lists they replace."""
    from biasflow.models.fingerprint import config_fingerprint
    from biasflow.scheduling import score_resources
    from biasflow.scoring.answer import cache_kind

    assert revisions() == {
        ("causal_lm", "token_logprobs"): 2, ("causal_lm", "continuation_logprobs"): 2,
        ("causal_lm", "stereoset_sentence_logprobs"): 3, ("served_causal_lm", "token_logprobs"): 2,
        ("served_causal_lm", "continuation_logprobs"): 2, ("served_causal_lm", "stereoset_sentence_logprobs"): 2,
        ("text_classifier", "classification"): 2}  # 2: a multi-label classifier's probabilities are sigmoids
    assert {(k, r): a.load_as for k, s in model_kinds.KINDS.items() for r, a in s.answers.items() if a.load_as} \
        == {("masked_lm", "next_sentence"): "bert_nsp"}
    assert cache_kind("causal_lm", "token_logprobs") == "token_logprobs.r2" and cache_kind("masked_lm", "pll") == "pll"
    # the values the code gave before the kinds were declared in one place (the server's address is where it runs,
    # not what it computes: not in the fingerprint)
    served = {"name": "s", "kind": "served_causal_lm", "served_model_name": "m", "revision": "r"}
    assert config_fingerprint(served) == config_fingerprint(dict(served, base_url="http://x:1/v1")) \
        == "e40fdbb3ce9cb673"
    # an omitted dtype is the default float32 (normalised before hashing: one model key for fp32 / float32 / none);
    # before that normalisation this config hashed to da1c3fe5addaf9dd
    assert config_fingerprint({"kind": "causal_lm", "hub_id": "gpt2"}) == "9d0cc5501345a1b9" == config_fingerprint(
        {"kind": "causal_lm", "hub_id": "gpt2", "dtype": "fp32"})
    assert config_fingerprint({"kind": "ngram", "order": 3, "level": "word"}) == "195e07bed432d565"
    assert score_resources({"kind": "causal_lm", "device": "cuda"}) == {"mem_mb": 16000, "gpus": 1, "cpus": 4,
                                                                         "runtime_min": 240}
    assert score_resources({"kind": "word_vectors", "device": "cuda"})["gpus"] == 0


def test_a_second_model_kind_under_a_taken_name_is_refused_naming_both_modules(kinds):
    taken = ModelKindSpec(name="causal_lm", factory="my_project.models:Other", answers={}, resources=SMALL)
    with pytest.raises(ValueError, match="model kind 'causal_lm' is registered twice: by biasflow.kinds.hf and "
                                         "by my_project.kinds; give one of them another name"):
        register_model_kind(taken, module="my_project.kinds")
    # from this module: the caller's name is the declaring module
    with pytest.raises(ValueError, match=f"by biasflow.kinds.hf and by {__name__}"):
        register_model_kind(taken)
    mine = ModelKindSpec(name="mine", factory="my_project.models:Mine", answers={"pll": "my_project.models:pll"},
                         resources=SMALL)
    assert register_model_kind(mine).module == __name__
    assert register_model_kind(mine).module == __name__  # the same declaration again (a re-import): fine
    with pytest.raises(ValueError, match=f"model kind 'mine' is registered twice in {__name__}, differently"):
        register_model_kind(dataclasses.replace(mine, factory="my_project.models:Changed"))
    with pytest.raises(ValueError, match=f"model kind 'mine' is registered twice: by {__name__} and by other.mod"):
        register_model_kind(mine, module="other.mod")


def test_a_registered_kind_is_read_by_every_reader(kinds):
    from biasflow import scheduling
    from biasflow.schema import validate_model_config
    from biasflow.scoring.answer import answerer, can_answer, cache_kind

    def answer_pll(model, requests, budget):
        raise AssertionError("not called here")

    register_model_kind(ModelKindSpec(
        name="toy", factory="my_project.models:Toy", like="masked_lm", resources=SMALL,
        answers={"pll": Answer(answer_pll, revision=3)}))
    assert answerer("toy", "pll") is answer_pll and can_answer("toy", "pll")
    assert not can_answer("toy", "token_logprobs")
    assert cache_kind("toy", "pll") == "pll.r3"
    with pytest.raises(ModuleNotFoundError, match="my_project"):  # load_model imports the declared factory
        load_model({"name": "t", "kind": "toy"})
    assert scheduling.score_resources({"kind": "toy", "device": "cuda"}) == {"mem_mb": 1000, "gpus": 0, "cpus": 1,
                                                                              "runtime_min": 10}
    validate_model_config({"name": "t", "kind": "toy"})  # the schema takes it
    # a metric written for masked_lm takes a kind declared like it
    assert model_kinds.accepts(("masked_lm",), "toy") and not model_kinds.accepts(("causal_lm",), "toy")
    assert not model_kinds.accepts(("masked_lm",), "nope")


@pytest.mark.parametrize("change, message", [
    ({"name": "has space"}, "model kind name 'has space'"),
    ({"factory": "no_colon"}, "model kind 'k': factory='no_colon' must be 'package.module:function'"),
    ({"answers": {"pll": "nope"}}, r"model kind 'k': answers\['pll'\]: target='nope' must be"),
    ({"resources": {"mem_mb": 0, "cpus": 1, "runtime_min": 1, "gpu_capable": False}},
     "resources.mem_mb=0 must be a positive integer"),
    ({"like": "k"}, "like='k' must name another model kind"),
])
def test_a_declaration_that_cannot_work_is_refused_naming_the_field(change, message):
    base = {"name": "k", "factory": "m:f", "answers": {}, "resources": SMALL}
    with pytest.raises(ValueError, match=message):
        ModelKindSpec(**{**base, **change})


def test_an_answerer_revision_below_one_is_refused():
    with pytest.raises(ValueError, match="revision=0 must be an integer >= 1"):
        Answer("m:f", revision=0)


def test_a_declaration_naming_an_undeclared_kind_is_refused(kinds):
    with pytest.raises(ValueError, match="model kind 'k' refers to model kind 'causal', which is not registered; "
                                         "known: bert_nsp, causal_lm, "):
        register_model_kind(ModelKindSpec(name="k", factory="m:f", answers={}, resources=SMALL, like="causal"))
    with pytest.raises(TypeError, match="register_model_kind takes a ModelKindSpec"):
        register_model_kind("k")  # the old decorator form


def test_an_unknown_kind_in_a_config_is_one_line_listing_the_known_kinds(tmp_path):
    from biasflow.errors import ConfigError
    from biasflow.models import load_model
    from biasflow.plan import build_plan

    known = ", ".join(sorted(model_kinds.KINDS))
    with pytest.raises(ConfigError) as err:
        build_plan(["metric=[crows_pairs]", "model.kind=masked_llm", f"paths.results={tmp_path}"])
    lines = [line.strip() for line in str(err.value).splitlines() if "model.kind" in line]
    assert lines == [f"model.kind='masked_llm': not a known model kind; known: {known}"]
    with pytest.raises(ConfigError, match=f"^model.kind='masked_llm' is not a known model kind; known: {known}$"):
        load_model({"kind": "masked_llm"})


def test_langfairs_classifier_config_is_of_a_declared_kind():
    from biasflow.metrics.langfair import classifier_model
    from biasflow.metrics.langfair import Classifier

    cfg = classifier_model(Classifier(model="org/stereotype-classifier"))
    assert cfg["kind"] == "text_classifier" in model_kinds.KINDS and cfg["batch_size"] == 32
    from biasflow.schema import model_options

    assert model_options(cfg).hub_id == "org/stereotype-classifier"  # what it is loaded by validates (no hub id name)
    assert model_kinds.KINDS["text_classifier"].resources.gpu_capable


# ------------------------------------------------------------------------------------------------ config options
def test_a_model_option_the_kind_never_reads_is_refused_naming_the_kinds_that_do():
    """model.pooling on a masked LM (or dtype on word vectors) was silently ignored: now a plan-time error naming the
    option, its value, the kind and the kinds that read it."""
    from biasflow.plan import build_plan

    cases = {("model=bert_base_uncased", "+model.pooling=mean"):
             "model.pooling='mean': kind masked_lm takes no option 'pooling' (an option of kind sentence_encoder)",
             ("model=gpt2", "+model.build=demo_mlm"):
             "model.build='demo_mlm': kind causal_lm takes no option 'build' (an option of kind masked_lm)",
             ("model=glove_6b_50d", "metric=[weat]", "+model.dtype=bfloat16"):
             "kind word_vectors takes no option 'dtype' (an option of kinds bert_nsp, causal_lm, masked_lm, "}
    for overrides, message in cases.items():
        with pytest.raises(ConfigError) as err:
            build_plan(list(overrides))
        assert message in str(err.value), str(err.value)
    # what every kind reads is accepted (the configs of conf/model/ set most of it)
    build_plan(["model=bert_base_uncased", "+model.threads=2", "+model.cpu_linear=default",
                "+model.attn_implementation=eager"])
    build_plan(["model=gpt2", "metric=[crows_pairs_causal]", "+model.batch_size=4"])


def test_every_model_config_of_the_project_sets_only_its_kinds_options():
    import yaml

    from biasflow.schema import validate_model_config

    for path in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        validate_model_config(yaml.safe_load(path.read_text()), f"conf/model/{path.name}")


def test_each_kind_declares_its_config_model_and_an_option_shared_by_kinds_means_the_same_in_each():
    """A config is validated by its kind's own model (a union keyed on kind); where kinds share an option name, its
    type, default and markers agree (the fingerprint and the user-file digests read the markers by name)."""
    from biasflow.schema import ModelOptions, model_config_model, model_config_models

    models = model_config_models()
    assert set(models) == set(model_kinds.KINDS) - {"generator"}  # the plan writes a generator's model configs
    assert model_config_model("generator") is ModelOptions and model_config_model("nope") is None
    by_name: dict[str, dict] = {}
    for kind, model in models.items():
        assert issubclass(model, ModelOptions), kind
        for name, info in model.model_fields.items():
            seen = (str(info.annotation), repr(info.default), repr(info.json_schema_extra))
            by_name.setdefault(name, {}).setdefault(seen, []).append(kind)
    differing = {name: variants for name, variants in by_name.items() if len(variants) > 1}
    assert differing == {}


SCRATCH_KIND = (
    "from typing import Optional\n"
    "from pydantic import Field\n"
    "from biasflow.model_kinds import ModelKindSpec, Resources, register_model_kind\n"
    "from biasflow.schema import IDENTITY_WHEN_SET, ModelOptions\n"
    "class TableConfig(ModelOptions):\n"
    "    table: Optional[str] = Field(None, json_schema_extra=IDENTITY_WHEN_SET)\n"
    "register_model_kind(ModelKindSpec(name='{name}', factory='x.y:Model', like='{like}', config=TableConfig,\n"
    "    answers={{}}, resources=Resources(mem_mb=1, cpus=1, runtime_min=1, gpu_capable=False)))\n")


@pytest.fixture
def fresh_registry(tmp_path, monkeypatch, restore_registries):
    """An empty registry that reads the declaration modules again on its first read (from a scratch folder on
    sys.path too), and the real one back after the test."""
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))
    dict.clear(model_kinds.KINDS)
    monkeypatch.setattr(model_kinds.KINDS, "_state", "no")
    for name in [m for m in sys.modules if m == "biasflow.kinds" or m.startswith(("biasflow.kinds.", "my_"))]:
        monkeypatch.delitem(sys.modules, name)
    yield tmp_path
    monkeypatch.undo()


def test_a_kind_declared_in_a_module_of_its_own_is_found_without_an_edit_elsewhere(fresh_registry, monkeypatch):
    """The declaration modules are discovered (``model_kinds.KINDS.packages``): a new module in the package
    declares a kind, its config model validates its configs, and a kind it refers to may be declared in a module
    imported after it."""
    from biasflow.schema import validate_model_config

    package = fresh_registry / "my_kinds"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a_first.py").write_text(SCRATCH_KIND.format(name="table_lm", like="z_base"))
    (package / "z_base.py").write_text(
        "from biasflow.model_kinds import ModelKindSpec, Resources, register_model_kind\n"
        "register_model_kind(ModelKindSpec(name='z_base', factory='my_kinds.z_base:Model', answers={},\n"
        "    resources=Resources(mem_mb=1, cpus=1, runtime_min=1, gpu_capable=False)))\n")
    monkeypatch.setattr(model_kinds.KINDS, "packages", [*model_kinds.KINDS.packages, "my_kinds"])
    assert {"table_lm", "z_base", "causal_lm"} <= set(model_kinds.KINDS)
    assert model_kinds.accepts(["z_base"], "table_lm")
    validate_model_config({"kind": "table_lm", "table": "t.tsv"})
    with pytest.raises(ConfigError, match="kind table_lm takes no option 'dtype'"):
        validate_model_config({"kind": "table_lm", "dtype": "bfloat16"})
    with pytest.raises(ConfigError, match="kind causal_lm takes no option 'table' .an option of kind table_lm"):
        validate_model_config({"kind": "causal_lm", "hub_id": "x", "table": "t.tsv"})


def test_an_installed_package_declares_its_kinds_by_an_entry_point(fresh_registry):
    """biasflow installed from a wheel: a package of one's own names its declaration module under the entry-point
    group ``biasflow.kinds`` (no file of biasflow edited); a declaration module that fails is an error naming it."""
    (fresh_registry / "my_plugin.py").write_text(SCRATCH_KIND.format(name="plugin_lm", like="causal_lm"))
    dist = fresh_registry / "my_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{model_kinds.KINDS.entry_point_group}]\nplugin = my_plugin\n")
    assert model_kinds.accepts(["causal_lm"], "plugin_lm") and "plugin_lm" in model_kinds.known()
    # a broken declaration module: one line naming it, and the registry is read again once it is mended
    (fresh_registry / "my_plugin.py").write_text("register_model_kind(\n")
    import sys

    del sys.modules["my_plugin"]
    dict.clear(model_kinds.KINDS)
    model_kinds.KINDS._state = "no"
    with pytest.raises(ImportError, match="the model kinds declared in my_plugin could not be read: SyntaxError"):
        model_kinds.known()
    assert model_kinds.KINDS.state == "no"


def test_a_generator_kind_declared_in_a_declaration_module_is_known_without_importing_it(fresh_registry, monkeypatch):
    """A generator kind of one's own, registered in a declaration module, is known wherever the generator registry is
    read (the plan, every score job), with nothing importing that module by hand."""
    from biasflow.generator_kinds import GENERATOR_KINDS
    from biasflow.schema import GeneratorConfig

    package = fresh_registry / "my_generators"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "echo.py").write_text(
        "from biasflow.generator_kinds import GeneratorKindSpec, register_generator_kind\n"
        "def echo_model(gen):\n"
        "    return {'name': gen.get('name') or 'echo', 'kind': 'generator', 'generator': 'my_echo'}\n"
        "register_generator_kind(GeneratorKindSpec(name='my_echo', reads=('kind', 'name'), job_model=echo_model))\n")
    monkeypatch.setattr(model_kinds.KINDS, "packages", [*model_kinds.KINDS.packages, "my_generators"])
    try:
        assert dict.get(GENERATOR_KINDS, "my_echo") is None  # not imported yet
        assert GeneratorConfig.model_validate({"kind": "my_echo"}).kind == "my_echo"
        assert GENERATOR_KINDS["my_echo"].job_model({}) == {"name": "echo", "kind": "generator",
                                                            "generator": "my_echo"}
    finally:
        GENERATOR_KINDS.pop("my_echo", None)


def test_metrics_choose_requests_by_what_a_kind_answers_not_by_its_name(kinds):
    """A kind declared like causal_lm is asked what a causal LM is asked (HONEST generates, RedditBias and
    HolisticBias ask token log-probabilities); one like masked_lm what a masked LM is; no metric compares kind
    names."""
    from pathlib import Path

    import pandas as pd

    from biasflow.registry import get_metric

    def never(model, requests, budget):
        raise AssertionError("not called here")

    register_model_kind(ModelKindSpec(name="my_causal", factory="my_project.models:Causal", like="causal_lm",
                                      resources=SMALL, answers={"token_logprobs": never, "generation": never}))
    register_model_kind(ModelKindSpec(name="my_masked", factory="my_project.models:Masked", like="masked_lm",
                                      resources=SMALL, answers={"pll": never, "mask_top_k": never}))
    reddit = pd.DataFrame({"sentence_target": ["a b"], "sentence_counter": ["c d"]})
    holistic = pd.DataFrame({"text": ["I am a grandson."]})
    for kind, pseudo in (("my_causal", False), ("my_masked", True)):
        asked = {r.kind for r in get_metric("reddit_bias").requests(reddit, metric_options_from("reddit_bias", {}), kind)}
        asked |= {r.kind for r in get_metric("holistic_bias").requests(holistic, metric_options_from("holistic_bias", {}), kind)}
        assert asked == ({"pll"} if pseudo else {"token_logprobs"}), kind
    from biasflow.metrics.honest import generates

    assert generates(metric_options_from("honest", {"generator": None}), "my_causal") and not generates(metric_options_from("honest", {"generator": None}), "my_masked")
    metrics = Path(model_kinds.__file__).parent / "metrics"
    named = [f.name for f in metrics.glob("*.py")
             if re.search(r"model_kind\s*(==|!=|in\s*\()|kind\s*==\s*\"(masked|causal)", f.read_text())]
    assert named == []


# a value of each option's type, for changing one option at a time
_SAMPLE = {"hub_id": "org/other", "path": "/models/other", "revision": "abc123", "package": "some_pkg", "format": "text",
           "header": True, "lowercase": True, "dtype": "bfloat16", "max_length": 7, "pooling": "cls",
           "attn_implementation": "eager", "order": 5, "level": "char", "predictions": 3, "command": "lm --serve",
           "base_url": "http://node-2:8000/v1", "served_model_name": "other", "bos_text": "<s>", "name": "renamed",
           "device": "cuda:1", "batch_tokens": 7, "batch_size": 3, "cpu_linear": "default", "threads": 3,
           "resources": {"mem_mb": 1}, "build": "demo_mlm", "demo": True, "train": {"epochs": 1}, "shards": 2,
           "api_key_env": "OTHER_KEY", "api_key_file": "/run/key", "concurrency": 2, "requests_per_second": 1.5,
           "timeout_s": 3.0, "max_retries": 1, "backoff_s": 2.0, "max_backoff_s": 9.0,
           "head_chunk": 4096, "compile": "blocks", "allow_pickle": True}


def test_the_fingerprint_keys_are_the_options_marked_as_the_models_identity():
    """A model option marked IDENTITY changes the fingerprint (the answer cache and output paths), one marked
    IDENTITY_WHEN_SET changes it only when set, and an unmarked one (where or how fast it runs) never does."""
    from biasflow.models.fingerprint import PROCESS_KEYS, SCORING_KEYS, config_fingerprint
    from biasflow.schema import GenerationJobModel, every_model_option, model_marked_options

    fields = every_model_option() - {"kind"}
    assert set(_SAMPLE) == fields, "give the new option a sample value here"
    marked = model_marked_options("identity")
    marked_always = {k for k, v in marked.items() if v == "always"}
    marked_when_set = {k for k, v in marked.items() if v == "when_set"}
    assert set(SCORING_KEYS) == marked_always and "kind" in marked_always
    assert set(PROCESS_KEYS) == marked_when_set | set(GenerationJobModel.model_fields)
    base = {"name": "m", "kind": "causal_lm", "hub_id": "org/m"}
    for key, value in _SAMPLE.items():
        changed = config_fingerprint({**base, key: value}) != config_fingerprint(base)
        assert changed == (key in marked_always | marked_when_set), key
    # a when-set option left out is not in the key at all (adding such an option keeps every other fingerprint)
    assert config_fingerprint({**base, "order": None}) == config_fingerprint(base)
    assert config_fingerprint({**base, "hub_id": None}) != config_fingerprint(base)
    # a served LM's URL says where it runs: not its identity (model_kinds location_keys); a generator's URL is
    served = {"name": "s", "kind": "served_causal_lm", "served_model_name": "x", "base_url": "http://a:1/v1"}
    assert config_fingerprint(served) == config_fingerprint({**served, "base_url": "http://b:2/v1"})
    generator = {"name": "g", "kind": "generator", "generator": "openai_compatible", "model_id": "x",
                 "base_url": "http://a:1/v1"}
    assert config_fingerprint(generator) != config_fingerprint({**generator, "base_url": "http://b:2/v1"})
    for key, value in {"generator": "responses_file", "model_id": "y", "extra_body": {"top_k": 1},
                       "use_chat_template": False, "generate_kwargs": {"top_p": 0.5}}.items():
        assert config_fingerprint({**generator, key: value}) != config_fingerprint(generator), key
