"""Model adapters: loading by local path, clear errors for unknown ids and paths, fingerprints."""
from __future__ import annotations

import pytest

from biasflow.errors import ConfigError, ModelLoadError
from biasflow.models import load_model


def test_local_masked_lm_loads_in_eval_mode(tiny_bert):
    assert tiny_bert.model.training is False
    assert tiny_bert.tokenizer.mask_token == "[MASK]"
    prov = tiny_bert.provenance()
    assert prov["model.revision"].startswith("local:") and prov["model.fingerprint"] == tiny_bert.fingerprint


def test_unknown_path_names_it(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model({"name": "x", "kind": "masked_lm", "path": str(tmp_path / "nowhere")})


def test_unknown_hub_id_names_it():
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model"):
        load_model({"name": "x", "kind": "masked_lm", "hub_id": "no-such-org/no-such-model"})


def test_unknown_kind_names_it():
    with pytest.raises(ConfigError, match="model.kind='laser'"):
        load_model({"name": "x", "kind": "laser", "hub_id": "x"})


def test_fingerprint_changes_when_weights_change_in_place(tmp_path):
    """Retraining a local model in place must not let the cache serve the old model's scores."""
    from conftest import build_tiny_bert

    cfg = {"name": "a", "kind": "masked_lm", "path": str(tmp_path / "m")}
    build_tiny_bert(tmp_path / "m", seed=0)
    first = load_model(cfg).fingerprint
    assert load_model(cfg).fingerprint == first
    build_tiny_bert(tmp_path / "m", seed=1)
    assert load_model(cfg).fingerprint != first


@pytest.mark.parametrize("content", [{}, {"notes.txt": "hello"}, {"config.json": "{}"}])
def test_a_folder_that_is_not_a_model_says_what_is_missing(tmp_path, content):
    from biasflow.errors import ModelLoadError
    from biasflow.models import load_model

    for name, text in content.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ModelLoadError, match=rf"{tmp_path} is not a model folder: no .*weights.*save_pretrained"):
        load_model({"name": "x", "kind": "masked_lm", "path": str(tmp_path), "device": "cpu"})
