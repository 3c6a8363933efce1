"""A text's scores do not depend on which other texts are scored with it (issue 9, item 13).

A resumed run scores only what the cache lacks, a sweep scores a benchmark's texts beside others: in every case a
text must get bit-identical per-token scores, or CrowS-Pairs' 3-decimal rounding flips pairs between runs. Checked
three ways -- (a) all at once, (b) in two resumed halves (the cache holds the first half when the whole set is asked
for), (c) inside a larger set with other texts -- plus other token budgets, for the masked-LM PLL scorer (tiny BERT
of the conftest on the default oneDNN linears, and a 384-wide BERT on MKL linears, whose results do depend on the
row count on this CPU) and the causal scorer (tiny GPT-2), and through the CrowS-Pairs metric's per-item table.
Equality is exact.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from biasflow.metrics import crows_pairs as cp
from biasflow.models.batch_invariant import batch_invariant, tile_rows
from biasflow.models.masked_lm import MaskedLM, OneDNNLinear
from biasflow.scoring.batching import padded_width, token_budget_batches
from biasflow.scoring.answer import answer_requests, metric_answers
from biasflow.scoring.masked import PLL_KIND
from biasflow.interface.requests import PseudoLogLikelihood, StereoSetSentenceLogprobs, TokenLogprobs

FIXTURE = Path(__file__).parent / "fixtures" / "crows_sample.csv"


def crows_items() -> pd.DataFrame:
    with open(FIXTURE, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    return pd.DataFrame({"item_id": [int(r["source_row"]) for r in rows],
                         "direction": [r["stereo_antistereo"] for r in rows],
                         "category": [r["bias_type"] for r in rows],
                         "sent_more": [r["sent_more"] for r in rows], "sent_less": [r["sent_less"] for r in rows]})


ITEMS = crows_items()
TEXTS = cp.pair_texts(ITEMS)
# other texts a sweep would score in the same job: other lengths, and some of the same lengths
OTHERS = [f"{s.split(',')[0]} and {t.split(' ')[-1]}" for s, t in zip(TEXTS, TEXTS[1:])] + \
         [" ".join(s.split()[::-1]) for s in TEXTS[::3]] + ["Short.", "Two words", "A few more words here."]


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    """Both cores: thread splits are one of the things that depend on the batch shape."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def wide_bert(tiny_bert):
    """A 2-layer BERT of width 384 (MiniLM's) on torch's own (MKL) linear layers, whose kernels change with the
    row count: the fixed-tile path of ``batch_invariant`` (the tiny models run the default oneDNN path)."""
    from transformers import BertConfig, BertForMaskedLM

    tok = tiny_bert.tokenizer
    torch.manual_seed(3)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=384, num_hidden_layers=2, num_attention_heads=6,
                     intermediate_size=1536, max_position_embeddings=128)
    return MaskedLM.from_model(BertForMaskedLM(cfg).eval(), tok, name="wide-bert", cpu_linear="default")


def rows_of(table: pd.DataFrame, adapter, texts: list[str]) -> pd.DataFrame:
    """The rows of ``texts``, in that order."""
    return table.set_index("text").loc[texts]


def three_ways(score, root: Path, kind: str, adapter, texts: list[str], others: list[str]) -> list[pd.DataFrame]:
    """Rows of ``texts`` from ``score(texts, cache_root)`` run (a) at once, (b) resumed in halves, (c) among
    others."""
    def run(name, *batches):
        for batch in batches:
            table = score(batch, root / name)
        return rows_of(table, adapter, texts)

    half, cut = len(texts) // 2, len(others) * 2 // 3
    return [run("at_once", texts), run("resumed", texts[:half], texts),
            run("among_others", others[:cut] + texts[::-1] + others[cut:])]


def assert_identical(tables: list[pd.DataFrame]) -> None:
    first = tables[0]
    for other in tables[1:]:
        assert other.index.tolist() == first.index.tolist()
        for text in first.index:
            a, b = np.asarray(first.at[text, "logprobs"]), np.asarray(other.at[text, "logprobs"])
            assert np.array_equal(a, b, equal_nan=True), (text, np.nanmax(np.abs(a - b)))
        assert first["total"].tolist() == other["total"].tolist()


# the wide model is slower: fewer texts, and the small budget (few rows per batch) where row counts matter most
@pytest.mark.parametrize("model, batch_tokens, n_texts", [("tiny_bert", 300, None), ("tiny_bert", 8192, None),
                                                          ("wide_bert", 300, 12)])
def test_pll_of_a_text_is_the_same_whatever_else_is_scored(model, batch_tokens, n_texts, request, tmp_path):
    adapter = request.getfixturevalue(model)
    texts, others = TEXTS[:n_texts], OTHERS[:n_texts]

    def score(batch, cache_root, budget=batch_tokens):
        return answer_requests([PseudoLogLikelihood(t) for t in batch], dict(adapter.cfg, batch_tokens=budget),
                               cache_root, model=adapter, progress=False)

    tables = three_ways(score, tmp_path, PLL_KIND, adapter, texts, others)
    assert_identical(tables)
    # the budget changes only how many rows share a batch: the numbers stay the same
    assert_identical([tables[0], rows_of(score(texts, None, budget=8192 if batch_tokens < 8192 else 999), adapter,
                                         texts)])


@pytest.mark.parametrize("request_of, batch_tokens", [
    (lambda t: TokenLogprobs(t, "prefix"), 300), (lambda t: TokenLogprobs(t, "none"), 8192),
    (StereoSetSentenceLogprobs, 300)], ids=["prefix", "none", "stereoset"])
def test_causal_logprobs_of_a_text_are_the_same_whatever_else_is_scored(tiny_gpt2, request_of, batch_tokens,
                                                                        tmp_path):
    def score(texts, cache_root):
        return answer_requests([request_of(t) for t in texts], dict(tiny_gpt2.cfg, batch_tokens=batch_tokens),
                               cache_root, model=tiny_gpt2, progress=False)

    tables = three_ways(score, tmp_path, request_of("x").kind, tiny_gpt2, TEXTS, OTHERS)
    assert_identical(tables)


def test_crows_pairs_per_item_table_is_the_same_resumed_alone_and_in_a_sweep(tiny_bert, tmp_path):
    cfg = {"variants": ["pll"]}

    def per_item(cache_dir: Path, items: pd.DataFrame) -> pd.DataFrame:
        return cp.compute(items, metric_answers("crows_pairs", items, cfg, None, cache_dir, model=tiny_bert), metric_options_from("crows_pairs", cfg))

    alone = per_item(tmp_path / "alone", ITEMS)
    per_item(tmp_path / "resumed", ITEMS.iloc[:6])  # the first run was killed after 6 pairs
    resumed = per_item(tmp_path / "resumed", ITEMS)
    # a sweep: the same job also scored other texts (another benchmark sharing the PLL cache) first
    answer_requests([PseudoLogLikelihood(t) for t in OTHERS + TEXTS[::2]], tiny_bert.cfg, tmp_path / "sweep",
                    model=tiny_bert, progress=False)
    in_sweep = per_item(tmp_path / "sweep", ITEMS)
    assert len(alone) == len(ITEMS)
    pd.testing.assert_frame_equal(alone, resumed, check_exact=True)
    pd.testing.assert_frame_equal(alone, in_sweep, check_exact=True)


# ------------------------------------------------------------------------------------------- the mechanisms
def test_padded_width_depends_on_the_length_only_and_pads_little():
    widths = [padded_width(n) for n in range(1, 2049)]
    assert widths[:31] == list(range(1, 32))  # short rows are never padded
    assert all(w >= n for n, w in zip(range(1, 2049), widths))
    assert all((w - n) / n < 1 / 16 for n, w in zip(range(1, 2049), widths))
    assert widths == sorted(widths)


def test_batches_hold_one_width_each_and_respect_the_budget():
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(1, 200, 600)]
    jobs = list(range(600))
    for budget in (1, 64, 1000, 8192):
        batches = list(token_budget_batches(jobs, lengths, budget, max_batch=100))
        assert sorted(j for b in batches for j in b) == jobs
        for b in batches:
            assert len({padded_width(lengths[j]) for j in b}) == 1
            assert len(b) <= 100
            assert len(b) == 1 or len(b) * padded_width(lengths[b[0]]) <= budget


@pytest.mark.parametrize("layer", ["mkl", "conv1d", "onednn", "onednn-bf16", "widened-bf16", "torch-bf16"])
@pytest.mark.parametrize("in_features, out_features", [(384, 1536), (3072, 768), (384, 30522)])
def test_linear_rows_do_not_depend_on_the_row_count_inside_batch_invariant(layer, in_features, out_features):
    """Without the block, MKL and oneDNN bf16 (and oneDNN fp32 for one row) differ in the last bits here.
    widened-bf16: a bf16 layer as a float32 oneDNN product, what scores bf16 models on CPUs whose oneDNN has no bf16
    kernels (no AVX-512); torch-bf16: torch's own bf16 linear (model.cpu_linear=default there)."""
    from transformers.pytorch_utils import Conv1D

    from biasflow.models.onednn import BF16_CPU_FEATURES, onednn_runs_bf16

    torch.manual_seed(0)
    dtype = torch.bfloat16 if layer.endswith("bf16") else torch.float32
    lin = torch.nn.Linear(in_features, out_features).to(dtype)
    if layer.startswith("onednn"):
        if not torch.backends.mkldnn.is_available():
            pytest.skip("torch built without oneDNN")
        if dtype == torch.bfloat16 and not onednn_runs_bf16():
            pytest.skip(f"oneDNN cannot run bf16 on this CPU (it needs {BF16_CPU_FEATURES}); the torch-bf16 case "
                        f"covers the path bf16 takes here")
        lin = OneDNNLinear(lin)
    elif layer == "widened-bf16":
        if not torch.backends.mkldnn.is_available():
            pytest.skip("torch built without oneDNN")
        lin = OneDNNLinear(lin, widen=True)
    elif layer == "conv1d":
        lin = Conv1D(out_features, in_features)
    model = torch.nn.Sequential(lin)
    tile = tile_rows(out_features)
    x = torch.randn(max(600, 2 * tile + 7), in_features, dtype=dtype)
    with torch.inference_mode(), batch_invariant(model):
        whole = model(x)
        for rows in sorted({1, 2, 3, 13, 17, 100, 300, tile - 1, tile, tile + 1, len(x) - 1}):
            assert torch.equal(model(x[:rows]), whole[:rows]), rows
        assert torch.equal(model(x[None, 5:40]), whole[None, 5:40])  # leading dimensions are kept
    assert "forward" not in lin.__dict__  # the patch is gone after the block
    with torch.inference_mode():
        torch.testing.assert_close(model(x), whole)  # same layer, same numbers up to rounding


def test_tiles_shrink_for_layers_with_many_outputs():
    assert tile_rows(32) == tile_rows(384) == 256
    assert tile_rows(1536) == 128 and tile_rows(3072) == tile_rows(30522) == 64


def _answers_by_key(requests, adapter, root, batch_tokens) -> pd.DataFrame:
    table = answer_requests(requests, dict(adapter.cfg, batch_tokens=batch_tokens), root, model=adapter,
                            progress=False)
    return table.set_index("key")


@pytest.mark.parametrize("kind", ["unmasked_logprobs_attn", "multi_mask", "blank_fill"])
def test_other_masked_lm_answers_are_the_same_whatever_else_is_asked(tiny_bert, kind, tmp_path):
    """AUL's log-probs and attention, LPBS/CBS's multi-mask matrices and StereoSet's blank fill (whose passes are
    shared between the questions about one template) at once, resumed and among other questions, bit for bit."""
    from biasflow.interface.requests import BlankFill, MultiMaskLogprobs, UnmaskedLogprobsAttention

    words = ["nurse", "doctor", "engineer", "he", "she", "teacher"]
    if kind == "unmasked_logprobs_attn":
        asked, others = [UnmaskedLogprobsAttention(t) for t in TEXTS], [UnmaskedLogprobsAttention(t) for t in OTHERS]
    elif kind == "multi_mask":
        templates = ["[MASK] is a [MASK].", "The [MASK] said that [MASK] would come.", "[MASK] likes [MASK] a lot."]
        asked = [MultiMaskLogprobs(t, (a, b), target) for t in templates for a in words[3:] for b in words[:3]
                 for target in (0, 1)]
        others = [MultiMaskLogprobs(t, (b, a), 0) for t in templates[1:] for a in words[3:] for b in words]
    else:
        contexts = [s.split(" ", 3) for s in TEXTS[:12]]
        asked = [BlankFill(" ".join(c[:2] + ["BLANK"] + c[3:]), w) for c in contexts if len(c) == 4 for w in words]
        others = [BlankFill(" ".join(c[:1] + ["BLANK"] + c[2:]), w) for c in contexts if len(c) == 4 for w in words]
    keys = [r.key for r in asked]
    at_once = _answers_by_key(asked, tiny_bert, tmp_path / "at_once", 300).loc[keys]
    _answers_by_key(asked[: len(asked) // 2], tiny_bert, tmp_path / "resumed", 8192)
    resumed = _answers_by_key(asked, tiny_bert, tmp_path / "resumed", 8192).loc[keys]
    among = _answers_by_key(others[::2] + asked[::-1] + others[1::2], tiny_bert, tmp_path / "among", 300).loc[keys]
    def plain(value):  # lists as answered, numpy arrays as read back from the cache
        return np.asarray(value).tolist() if isinstance(value, (list, tuple, np.ndarray)) else value

    for other in (resumed, among):
        for column in at_once.columns:
            assert at_once[column].map(plain).tolist() == other[column].map(plain).tolist(), column


# what ATen, MKL and oneDNN would pick on a CPU without AVX-512 (most laptops, AMD Zen 2/3)
from biasflow.provenance import WITHOUT_AVX512  # noqa: E402  (one declaration, shared with the benchmarks)
from biasflow.registry import metric_options_from


def test_on_a_cpu_without_avx512():
    """This file's batch invariance and the bf16 path hold where the kernels are AVX2's: run here in a subprocess
    with ATen, MKL and oneDNN restricted to AVX2 (on such a CPU they run in the suite itself anyway). Found this way:
    AULA's attention weights changed with the batch (batched products of another kernel), and bf16 crashed in
    oneDNN."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):
        pytest.skip("already restricted")
    tests = Path(__file__).parent
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(tests / "test_batch_invariance.py"),
         "-k", "not test_on_a_cpu_without_avx512", str(tests / "test_scoring.py") + "::test_bf16_where_onednn_cannot_run_it",
         str(tests / "test_scoring.py") + "::test_bf16_runs_head_in_fp32_and_stays_close", "-rs"],
        env={**os.environ, **WITHOUT_AVX512}, capture_output=True, text=True, timeout=900, cwd=tests.parent)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "oneDNN cannot run bf16 on this CPU" in run.stdout  # the oneDNN bf16 cases skip, saying why
    assert "this CPU's oneDNN runs bf16" not in run.stdout  # the bf16 fallback test ran, not skipped
