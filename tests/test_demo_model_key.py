"""Issue 44: the demo model is trained by the workflow (``model.train``), so each training setting is another model.
Its key (and with it the score files, the metric folders and the answer cache) must change with every training
option that changes the weights; settings that only say how it is scored keep it. Composition only: no training."""
from __future__ import annotations

import pytest

from biasflow.errors import ConfigError
from biasflow.models.fingerprint import config_fingerprint
from biasflow.plan import build_plan, compose

from conftest import ROOT

BASE = ["metric=[crows_pairs]", "model=demo_bert"]


@pytest.fixture(autouse=True)
def conf(monkeypatch):
    monkeypatch.setenv("BIASFLOW_CONF", str(ROOT / "conf"))


def job(*overrides: str):
    [j] = build_plan([*BASE, *overrides]).jobs
    return j


def test_every_training_option_names_another_model():
    """Every option of the demo config's ``train`` section changes the weights (models/demo.py reads each: steps,
    batch size, sequence length, trainable layers, learning rate, seed, torch threads)."""
    train = compose(BASE)["model"]["train"]
    assert set(train) == {"steps", "batch_size", "max_length", "trainable_layers", "lr", "seed", "threads"}
    base = job()
    changed = {"steps": 10, "batch_size": 8, "max_length": 32, "trainable_layers": 1, "lr": 1.0e-4, "seed": 1,
               "threads": 1}
    seen = {base.model_key}
    for key, value in changed.items():
        assert value != train[key]
        other = job(f"model.train.{key}={value}")
        assert other.model_key != base.model_key, key  # before: demo_bert-63c2e327 for every setting
        assert other.scores_path() != base.scores_path() and other.metric_dir != base.metric_dir, key
        assert config_fingerprint(other.model) != config_fingerprint(base.model), key  # the answer cache's key
        seen.add(other.model_key)
    assert len(seen) == 1 + len(changed)


def test_scoring_settings_keep_the_demo_models_key():
    base = job()
    for override in ("model.batch_tokens=4096", "model.device=cpu"):
        assert job(override).model_key == base.model_key, override


def test_other_models_keep_their_keys():
    """``train`` and ``build`` count only when set: the keys of models that are not built stay as they were."""
    assert build_plan(["metric=[crows_pairs]", "model=bert_base_uncased"]).jobs[0].model_key \
        == "bert_base_uncased-e2a8333d"
    assert build_plan(["metric=[crows_pairs_causal]", "model=gpt2"]).jobs[0].model_key == "gpt2-d3e3c15d"


def test_a_sweep_over_training_settings_is_two_models_and_needs_two_folders(tmp_path):
    """Two training settings in one plan are two jobs (before: one, both settings scored on whichever model was
    built). Built into one folder, the build rule could serve only one of them: refused, naming the fix."""
    from biasflow.workflow import Lookups

    plan = build_plan([*BASE, "model.train.steps=10,150", f"paths.results={tmp_path}/results"], multirun=True)
    assert len({j.model_key for j in plan.jobs}) == 2
    with pytest.raises(ConfigError, match=r"model\.path=.*demo_bert: this plan builds 2 different models.*"
                                          r"\"steps\": 10.*\"steps\": 150"):
        Lookups(plan, plan.write())  # the workflow's parse, before any job
    own = build_plan([*BASE, f"paths.results={tmp_path}/results", "model.train.steps=10",
                      f"model.path={tmp_path}/models/demo_bert_steps10"])
    assert Lookups(own, own.write()).build_params(own.jobs[0].model["path"])["train"]["steps"] == 10
