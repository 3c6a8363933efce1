"""Masked-LM pseudo-log-likelihood: the batched fast path against the plain one-mask-at-a-time loop.

Sentences: ``tests/fixtures/crows_sample.csv``, 30 real CrowS-Pairs sentences (Nangia et al. 2020, CC BY-SA 4.0).
Models: tiny random BERT (the real WordPiece vocabulary of the packaged all-MiniLM-L6-v2) and tiny random RoBERTa
(a byte-level BPE trained here), built in-process. Also: token-budget batching properties, de-duplication,
the fp32 head under bf16, the cache, and out-of-memory back-off with a fake adapter that fails above a size.
"""
from __future__ import annotations

import csv
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from biasflow.models.masked_lm import MaskedLM, OneDNNLinear
from biasflow.scoring.batching import is_out_of_memory, padded_width, run_with_backoff, token_budget_batches
from biasflow.scoring.answer import answer_requests
from biasflow.scoring.cache import AnswerCache
from biasflow.scoring.masked import encode, pseudo_log_likelihoods, scored_positions
from biasflow.interface.requests import PseudoLogLikelihood

FIXTURE = Path(__file__).parent / "fixtures" / "crows_sample.csv"
TOL = 1e-4


def crows_sentences() -> list[str]:
    with open(FIXTURE, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    assert len(rows) == 15
    return [r[c] for r in rows for c in ("sent_more", "sent_less")]


SENTENCES = crows_sentences()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def roberta_tokenizer():
    """A small byte-level BPE with RoBERTa's special tokens and template (<s> text </s>), trained in-process."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(SENTENCES[::2], trainer)  # half the sentences: the others get unseen merges
    tk.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                      special_tokens=[("<s>", 0), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", mask_token="<mask>")


def _bert_model(tok):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=37, max_position_embeddings=128)
    return BertForMaskedLM(cfg).eval()


def _roberta_model(tok):
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(1)
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=160, pad_token_id=tok.pad_token_id,
                        bos_token_id=0, eos_token_id=2)
    return RobertaForMaskedLM(cfg).eval()


def _tiny_bert(tok, dtype="float32", cpu_linear="auto"):
    return MaskedLM.from_model(_bert_model(tok), tok, name="tiny-bert", dtype=dtype, cpu_linear=cpu_linear)


def _tiny_roberta(tok):
    return MaskedLM.from_model(_roberta_model(tok), tok, name="tiny-roberta")


@pytest.fixture(scope="module")
def tiny_bert(bert_tokenizer):
    return _tiny_bert(bert_tokenizer)


@pytest.fixture(scope="module", params=["bert", "roberta"])
def tiny_mlm(request, bert_tokenizer, roberta_tokenizer):
    """(adapter, reference PLL of SENTENCES from the naive loop on an untouched copy of the same model)."""
    if request.param == "bert":
        adapter, plain, tok = _tiny_bert(bert_tokenizer), _bert_model(bert_tokenizer), bert_tokenizer
    else:
        adapter, plain, tok = _tiny_roberta(roberta_tokenizer), _roberta_model(roberta_tokenizer), roberta_tokenizer
    return adapter, naive_pll(plain, tok, SENTENCES)


def naive_pll(model, tok, texts):
    """The reference shape written plainly: one masked copy per forward pass, full model, full vocabulary."""
    special = set(tok.all_special_ids)
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tok.encode(text)
            lp = np.full(len(ids), np.nan)
            for i, t in enumerate(ids):
                if t in special:
                    continue
                masked = list(ids)
                masked[i] = tok.mask_token_id
                logits = model(input_ids=torch.tensor([masked])).logits[0, i].float()
                lp[i] = torch.log_softmax(logits, -1)[t].item()
            out.append(lp)
    return out


def _assert_same(fast, slow, tol=TOL):
    assert len(fast) == len(slow)
    for f, s in zip(fast, slow):
        assert f.shape == s.shape
        assert np.array_equal(np.isnan(f), np.isnan(s))
        np.testing.assert_allclose(f[~np.isnan(f)], s[~np.isnan(s)], rtol=0, atol=tol)


# -------------------------------------------------------------------------------------------- same numbers
@pytest.mark.parametrize("batch_tokens", [1, 300, 8192])
def test_batched_pll_equals_one_mask_at_a_time(tiny_mlm, batch_tokens):
    tiny_mlm, slow = tiny_mlm
    if torch.backends.mkldnn.is_available():
        assert tiny_mlm.onednn_linears > 0  # the fast CPU path is what is being checked
    ids = encode(tiny_mlm, SENTENCES)
    fast = pseudo_log_likelihoods(tiny_mlm, ids, batch_tokens=batch_tokens, progress=False)
    _assert_same(fast, slow)
    # every non-special token is scored and lengths vary, so batches mixed lengths and padding was exercised
    assert sum(int(np.isfinite(x).sum()) for x in fast) == sum(len(scored_positions(tiny_mlm.tokenizer, i))
                                                                for i in ids)
    assert len({len(i) for i in ids}) > 5


def test_special_positions_are_nan_and_scored_positions_skip_them(bert_tokenizer):
    ids = bert_tokenizer("Koreans have been known to eat cat.")["input_ids"]
    pos = scored_positions(bert_tokenizer, ids)
    assert pos == list(range(1, len(ids) - 1))  # [CLS] ... [SEP]


def test_duplicates_are_scored_once(tiny_bert):
    calls = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def logits_at(self, input_ids, attention_mask, rows, cols):
            calls.append(len(rows))
            return self.inner.logits_at(input_ids, attention_mask, rows, cols)

    texts = SENTENCES[:4]
    ids = encode(tiny_bert, texts)
    once = pseudo_log_likelihoods(Counting(tiny_bert), ids, progress=False)
    rows_once = sum(calls)
    calls.clear()
    twice = pseudo_log_likelihoods(Counting(tiny_bert), ids + ids[::-1] + ids[:1], progress=False)
    assert sum(calls) == rows_once == sum(len(scored_positions(tiny_bert.tokenizer, i)) for i in ids)
    _assert_same(twice, once + once[::-1] + once[:1], tol=0)
    twice[0][1] = 123.0  # results are independent arrays, not views of one shared array
    assert twice[-1][1] != 123.0


def test_bf16_runs_head_in_fp32_and_stays_close(bert_tokenizer):
    fp32 = _tiny_bert(bert_tokenizer)
    bf16 = _tiny_bert(bert_tokenizer, dtype="bfloat16")
    assert bf16.head_fp32 is not None and fp32.head_fp32 is None
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    ids = encode(fp32, SENTENCES[:6])
    a = np.concatenate(pseudo_log_likelihoods(fp32, ids, progress=False))
    b = np.concatenate(pseudo_log_likelihoods(bf16, ids, progress=False))
    diff = np.abs(a - b)[~np.isnan(a)]
    # bf16 keeps 8 mantissa bits: close to fp32 but not equal (if it were equal, bf16 would not be running)
    assert 0 < diff.max() < 0.05


def test_bf16_where_onednn_cannot_run_it(bert_tokenizer, caplog):
    """A CPU without AVX-512 (most laptops, AMD Zen 2/3): bf16 linear layers run as float32 oneDNN products of their
    bf16 weights and inputs, rounded back to bf16 (float32 accumulation, as oneDNN's bf16 does, at float32 speed;
    torch's own bf16 kernels there are ~10x slower), with one warning; the numbers stay close to fp32 and to torch's
    own bf16 layers; cpu_linear=onednn asks for exactly this. On other CPUs tests/test_batch_invariance.py runs this
    test in a subprocess that restricts oneDNN to AVX2."""
    from biasflow.models.onednn import onednn_runs_bf16

    if onednn_runs_bf16():
        pytest.skip("this CPU's oneDNN runs bf16: test_batch_invariance.py::test_on_a_cpu_without_avx512 runs this "
                    "test with ONEDNN_MAX_CPU_ISA=AVX2")
    with caplog.at_level(logging.WARNING, logger="biasflow.models.onednn"):
        bf16 = _tiny_bert(bert_tokenizer, dtype="bfloat16")
    assert "oneDNN cannot run bfloat16 linear layers here" in caplog.text and "float32 products" in caplog.text
    layers = [m for m in bf16.model.modules() if isinstance(m, OneDNNLinear)]
    assert layers and all(m.widened and m.weight.dtype == torch.float32 for m in layers)
    assert any(isinstance(m, OneDNNLinear) and not m.widened for m in bf16.head_fp32.modules())  # fp32 head as is
    fp32 = _tiny_bert(bert_tokenizer)
    torch_bf16 = _tiny_bert(bert_tokenizer, dtype="bfloat16", cpu_linear="default")
    assert not any(isinstance(m, OneDNNLinear) for m in torch_bf16.model.modules())
    ids = encode(fp32, SENTENCES[:6])
    a, b, c = (np.concatenate(pseudo_log_likelihoods(m, ids, progress=False)) for m in (fp32, bf16, torch_bf16))
    ok = ~np.isnan(a)
    assert 0 < np.abs(a - b)[ok].max() < 0.05 and np.abs(b - c)[ok].max() < 0.05
    explicit = _tiny_bert(bert_tokenizer, dtype="bfloat16", cpu_linear="onednn")
    d = np.concatenate(pseudo_log_likelihoods(explicit, ids, progress=False))
    assert np.array_equal(b[ok], d[ok])


def test_onednn_linears_are_optional_and_agree(bert_tokenizer):
    fast = _tiny_bert(bert_tokenizer)
    plain = _tiny_bert(bert_tokenizer, cpu_linear="default")
    assert plain.onednn_linears == 0 and not any(isinstance(m, OneDNNLinear) for m in plain.model.modules())
    if torch.backends.mkldnn.is_available():
        assert any(isinstance(m, OneDNNLinear) for m in fast.model.modules())
    ids = encode(plain, SENTENCES[:4])
    _assert_same(pseudo_log_likelihoods(fast, ids, progress=False), pseudo_log_likelihoods(plain, ids, progress=False),
                 tol=1e-5)
    from biasflow.errors import ConfigError

    # validated as a model config (schema.model_options): the plan's message for the same option
    with pytest.raises(ConfigError, match=r"model\.cpu_linear='fast': must be 'auto', 'onednn' or 'default'"):
        _tiny_bert(bert_tokenizer, cpu_linear="fast")


def test_pll_answers_use_the_cache_and_match_direct(tiny_bert, tmp_path):
    texts = SENTENCES[:5] + SENTENCES[:2]
    requests = [PseudoLogLikelihood(t) for t in texts]
    first = answer_requests(requests, tiny_bert.cfg, tmp_path, model=tiny_bert, progress=False)
    cache = AnswerCache(tmp_path, tiny_bert.fingerprint, "pll")
    assert len(first) == 5 and len(cache.store.parts()) == 1
    again = answer_requests(requests[::-1], tiny_bert.cfg, tmp_path, model=tiny_bert, progress=False)
    assert len(cache.store.parts()) == 1  # everything was served from the cache
    # the model lowercases (an uncased model), not the request
    direct = pseudo_log_likelihoods(tiny_bert, encode(tiny_bert, [t.lower() for t in SENTENCES[:5]]), progress=False)
    by_text = dict(zip(again["text"], again["logprobs"]))
    _assert_same([np.asarray(by_text[t]) for t in SENTENCES[:5]], direct, tol=1e-12)
    np.testing.assert_allclose(first["total"], [np.nansum(x) for x in direct], atol=1e-9)


# ------------------------------------------------------------------------------------- token-budget batching
def test_token_budget_batches_properties():
    rng = random.Random(7)
    lengths = [rng.randint(1, 60) for _ in range(500)]
    jobs = list(range(500))
    for budget, max_batch in [(1, 1024), (64, 1024), (512, 16), (4096, 1024)]:
        batches = list(token_budget_batches(jobs, lengths, budget, max_batch=max_batch))
        flat = [j for b in batches for j in b]
        assert sorted(flat) == jobs  # every job exactly once
        assert [lengths[j] for j in flat] == sorted(lengths)  # length-sorted (buckets of similar length)
        for b in batches:
            width = padded_width(max(lengths[j] for j in b))
            assert len(b) <= max_batch
            assert len(b) == 1 or len(b) * width <= budget
            assert {padded_width(lengths[j]) for j in b} == {width}  # one canonical width per batch
        # greedy within a width: a batch is cut short only by the budget, max_batch or the next width
        for b, nxt in zip(batches, batches[1:]):
            if len(b) < max_batch and padded_width(lengths[nxt[0]]) == padded_width(lengths[b[0]]):
                assert (len(b) + 1) * padded_width(lengths[b[0]]) > budget

    # padding: only up to the canonical width, which pads a row by less than 1/16 of its length
    long = [rng.randint(1, 600) for _ in range(500)]
    batches = list(token_budget_batches(jobs, long, 2048))
    padding = sum(len(b) * padded_width(max(long[j] for j in b)) - sum(long[j] for j in b) for b in batches)
    assert padding < sum(long) / 16
    assert list(token_budget_batches([], [], 10)) == []
    with pytest.raises(ValueError, match="3 jobs but 2 lengths"):
        list(token_budget_batches([1, 2, 3], [1, 2], 10))


# ------------------------------------------------------------------------------------------ out-of-memory
class FailsAboveSize:
    """Adapter whose forward pass raises like a full GPU when a batch holds more than ``limit`` tokens."""

    def __init__(self, inner, limit, error):
        self.inner, self.limit, self.error, self.failures, self.sizes = inner, limit, error, 0, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def logits_at(self, input_ids, attention_mask, rows, cols):
        if input_ids.numel() > self.limit:
            self.failures += 1
            raise self.error
        self.sizes.append(input_ids.numel())
        return self.inner.logits_at(input_ids, attention_mask, rows, cols)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: "
                                                "can't allocate memory: you tried to allocate 123 bytes")])
def test_out_of_memory_halves_the_budget_and_gives_the_same_numbers(tiny_bert, error):
    ids = encode(tiny_bert, SENTENCES[:8])
    fake = FailsAboveSize(tiny_bert, limit=200, error=error)
    got = pseudo_log_likelihoods(fake, ids, batch_tokens=8192, progress=False)
    assert fake.failures >= 1 and max(fake.sizes) <= 200
    _assert_same(got, pseudo_log_likelihoods(tiny_bert, ids, progress=False), tol=1e-6)


def test_out_of_memory_on_a_single_row_is_a_clear_error(tiny_bert):
    fake = FailsAboveSize(tiny_bert, limit=5, error=torch.OutOfMemoryError("out of memory"))
    with pytest.raises(MemoryError, match="does not fit in memory"):
        pseudo_log_likelihoods(fake, encode(tiny_bert, SENTENCES[:1]), progress=False)


def test_other_errors_are_not_retried():
    seen = []

    def run(batch):
        seen.append(len(batch))
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_with_backoff(list(range(10)), [5] * 10, 100, run)
    assert seen == [10]
    assert is_out_of_memory(torch.OutOfMemoryError("x")) and not is_out_of_memory(ValueError("out of memory"))


def test_backoff_keeps_the_smaller_budget():
    budgets, done = [], []

    def run(batch):
        if len(batch) * 4 > 16:
            raise RuntimeError("CUDA out of memory")
        done.extend(batch)

    final = run_with_backoff(list(range(20)), [4] * 20, 64, run, on_backoff=lambda old, new: budgets.append(new))
    assert sorted(done) == list(range(20))
    assert budgets == [32, 16] and final == 16


# ------------------------------------------------------------------------------- causal fast path vs plain model
@pytest.mark.parametrize("first_token", ["prefix", "none"])
def test_causal_fast_path_equals_the_plain_model_loop(tiny_gpt2, first_token):
    """The causal_lm adapter's scorer (oneDNN linears with GPT-2's gelu_new fused in, batched, padded) against the
    untouched transformers model (Conv1D + NewGELUActivation), one text and one forward per token: 1e-4 per token."""
    from transformers import AutoModelForCausalLM

    from biasflow.models.onednn import OneDNNLinear
    from biasflow.scoring.causal import causal_token_logprobs, encode

    plain = AutoModelForCausalLM.from_pretrained(tiny_gpt2.source).eval()
    assert not any(isinstance(m, OneDNNLinear) for m in plain.modules())
    fused = [m for m in tiny_gpt2.model.modules() if isinstance(m, OneDNNLinear) and m.fused_activation == "gelu"]
    assert len(fused) == plain.config.n_layer  # every block's c_fc carries its GELU
    texts = SENTENCES[:8] + ["x", "A much longer sentence with many more words in it than the others have."]
    ids = encode(tiny_gpt2, texts)
    got = causal_token_logprobs(tiny_gpt2, ids, first_token=first_token, batch_tokens=40, progress=False)
    bos = tiny_gpt2.bos_token_id
    with torch.no_grad():
        for seq, lp in zip(ids, got):
            for i, token in enumerate(seq):
                context = [bos] + seq[:i] if first_token == "prefix" else seq[:i]
                if not context:
                    assert np.isnan(lp[i])
                    continue
                want = torch.log_softmax(plain(torch.tensor([context])).logits[0, -1], -1)[token]
                assert abs(lp[i] - float(want)) < 1e-4


def _tiny_decoder(model_type: str):
    """A random decoder-only LM of ``model_type`` (vocabulary of 97, 2 layers), untouched and as the causal_lm
    adapter runs it (oneDNN linears)."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    from biasflow.models.onednn import use_onednn_linears

    sizes = {"gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64),
             "opt": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                         word_embed_proj_dim=32, max_position_embeddings=64),
             "gpt_neox": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                              max_position_embeddings=64)}
    # llama-style: grouped-query attention (2 key/value heads for 4 query heads), rotary positions
    llama_like = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=64, head_dim=8)
    config = AutoConfig.for_model(model_type, vocab_size=97, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                  **sizes.get(model_type, llama_like))
    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    fast = copy.deepcopy(plain)
    use_onednn_linears(fast)
    return plain, fast


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "mistral", "qwen2", "qwen3", "opt", "gpt_neox"])
def test_causal_scorer_equals_the_plain_model_for_each_decoder_type(model_type, monkeypatch):
    """Packed (gpt2, llama-style with grouped-query attention) or padded (opt, gpt_neox): every token's
    log-probability within 1e-4 of the untouched model run on that text alone; texts of one length share a batch."""
    from types import SimpleNamespace

    from biasflow.models.packed import PACKABLE_TYPES
    from biasflow.scoring import causal
    from biasflow.scoring.causal import causal_token_logprobs

    plain, fast = _tiny_decoder(model_type)
    calls = []
    real = causal._packed_target_logprobs
    monkeypatch.setattr(causal, "_packed_target_logprobs", lambda model, seqs, *args: calls.append(
        [len(s) for s in seqs]) or real(model, seqs, *args))
    rng = random.Random(model_type)
    ids = [[rng.randrange(3, 97) for _ in range(n)] for n in (1, 5, 5, 9, 3, 17, 5, 30)]
    adapter = SimpleNamespace(model=fast, tokenizer=SimpleNamespace(pad_token_id=0), device=torch.device("cpu"),
                              name=model_type, bos_token_id=1)
    got = causal_token_logprobs(adapter, ids, first_token="prefix", batch_tokens=40, progress=False)
    assert bool(calls) == (model_type in PACKABLE_TYPES)
    if calls:  # several texts of different lengths per pass (the prefix token included)
        assert sorted(sum(calls, [])) == sorted(len(seq) + 1 for seq in ids) and max(map(len, calls)) > 2
    with torch.no_grad():
        for seq, lp in zip(ids, got):
            want = torch.log_softmax(plain(torch.tensor([[1] + seq])).logits[0, :-1].float(), -1)
            assert np.abs(lp - want[torch.arange(len(seq)), torch.tensor(seq)].numpy()).max() < 1e-4


def test_packed_layout_and_batches():
    from biasflow.models.packed import PackedLayout
    from biasflow.scoring.batching import packed_batches

    layout = PackedLayout.of([2, 2, 3, 5])
    assert layout.groups == ((0, 2, 2), (4, 1, 3), (7, 1, 5)) and layout.starts() == [0, 2, 4, 7]
    assert layout.position_ids().tolist() == [[0, 1, 0, 1, 0, 1, 2, 0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="adjacent"):
        PackedLayout.of([2, 3, 2])
    lengths = [7, 3, 9, 3, 1, 20, 7]
    batches = list(packed_batches(list("abcdefg"), lengths, 12))
    assert sorted(sum(batches, [])) == list("abcdefg")
    by_job = dict(zip("abcdefg", lengths))
    for batch in batches:  # within budget unless a job alone is over it; lengths in order, so equal ones adjacent
        assert sum(by_job[j] for j in batch) <= 12 or len(batch) == 1
        assert [by_job[j] for j in batch] == sorted(by_job[j] for j in batch)
    assert batches == [["e", "b", "d"], ["a"], ["g"], ["c"], ["f"]]


def test_a_text_longer_than_the_model_context_is_an_error_naming_it(tiny_gpt2):
    from biasflow.scoring.causal import causal_token_logprobs, context_limit, encode

    limit = context_limit(tiny_gpt2.model)
    ids = encode(tiny_gpt2, ["A short one.", "word " * (limit + 5)])
    message = rf"takes at most {limit} tokens per text; 1 text\(s\) are longer.*starts '.*word"
    with pytest.raises(ValueError, match=message):
        causal_token_logprobs(tiny_gpt2, ids, progress=False)
    exact = encode(tiny_gpt2, ["word " * limit])[0][: limit - 1]  # with the prefix token: exactly the limit
    assert np.isfinite(causal_token_logprobs(tiny_gpt2, [exact], progress=False)[0]).all()


# ------------------------------------------------------------------------ a context scored once for its options
def test_shared_prefix_layout_by_hand():
    """A tree of prefix 2 with branches of 2 and 1 tokens, then a prefix of 1 with an empty branch: positions continue
    the prefix in every branch; each branch sees the prefix and itself, causally."""
    from biasflow.models.packed import SharedPrefixLayout

    layout = SharedPrefixLayout.of_trees([(2, [2, 1]), (1, [0])])
    assert layout.lengths == (5, 1) and layout.starts() == [0, 5]
    assert layout.position_ids().tolist() == [[0, 1, 2, 3, 2, 0]]
    assert SharedPrefixLayout.tree_mask(2, [2, 1]).int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1]]
    assert [m.shape for m in layout.group_masks()] == [(1, 1, 5, 5), (1, 1, 1, 1)]
    with pytest.raises(ValueError, match="prefix of at least one token"):
        SharedPrefixLayout.of_trees([(0, [2])])


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "qwen3", "opt"])
def test_shared_prefix_equals_one_text_per_branch(model_type, monkeypatch):
    """Each branch's log-probabilities after a prefix computed once equal those of prefix + branch scored as one text
    (within float rounding; exactly where the model does not pack and runs them as texts), branches of one token
    included; a tree scores the same, to the bit, alone and among others, however the budget splits the trees."""
    from types import SimpleNamespace

    from biasflow.models.packed import PACKABLE_TYPES
    from biasflow.scoring import causal
    from biasflow.scoring.causal import next_token_logprobs, shared_prefix_logprobs

    _plain, fast = _tiny_decoder(model_type)
    adapter = SimpleNamespace(model=fast, tokenizer=SimpleNamespace(pad_token_id=0), device=torch.device("cpu"),
                              name=model_type, bos_token_id=1)
    trees = []
    real = causal._packed_tree_logprobs
    monkeypatch.setattr(causal, "_packed_tree_logprobs", lambda model, batch, *a: trees.append(len(batch))
                        or real(model, batch, *a))
    rng = random.Random(model_type)
    prefixes = [[rng.randrange(3, 97) for _ in range(n)] for n in (1, 7, 7, 12, 3, 25)]
    branches = [[[rng.randrange(3, 97) for _ in range(m)] for m in sizes]
                for sizes in ([1], [3, 1, 4], [2, 2], [5, 1, 1, 6], [9], [2, 3, 4])]
    got = shared_prefix_logprobs(adapter, prefixes, branches, batch_tokens=30)
    joined = [p + b for p, bs in zip(prefixes, branches) for b in bs]
    want = iter(next_token_logprobs(adapter, joined, batch_tokens=30))
    exact = model_type not in PACKABLE_TYPES
    assert bool(trees) == (not exact) and (exact or max(trees) > 1)
    for p, bs, lps in zip(prefixes, branches, got):
        for b, lp in zip(bs, lps):
            ref = next(want)[len(p) - 1:]
            assert len(lp) == len(b)
            if exact:
                assert np.array_equal(lp, ref)
            else:
                assert np.abs(lp - ref).max() < 1e-5
    for p, bs, lps in zip(prefixes, branches, got):
        alone = shared_prefix_logprobs(adapter, [p], [bs], batch_tokens=4096)[0]
        assert all(np.array_equal(a, b) for a, b in zip(alone, lps))


def test_shared_context_requests_answer_like_one_request_per_option(tiny_gpt2, tmp_path):
    """Through the answer cache: the same token ids and totals within 1e-5 as ``ContinuationLogprobs``, in the order
    asked, each kind in a cache folder of its own; a start token and an option repeated across contexts."""
    from biasflow.interface.requests import ContinuationLogprobs, SharedContextContinuation

    contexts = ["The nurse said that", "Q: who was late?\nA:", "The nurse said that"]
    options = [" she was tired.", " he was tired.", " The doctor"]
    pairs = [(c, o, s) for c in contexts[:2] for o in options for s in (False, True)]
    pairs += [(c, o, False) for c, o in zip(contexts, options)]  # repeats, interleaved
    shared = answer_requests([SharedContextContinuation(*p) for p in pairs], tiny_gpt2.cfg, tmp_path,
                             model=tiny_gpt2, progress=False)
    separate = answer_requests([ContinuationLogprobs(*p) for p in pairs], tiny_gpt2.cfg, tmp_path,
                               model=tiny_gpt2, progress=False)
    assert len(shared) == len(separate) == len(set(pairs))
    assert [(r.context, r.continuation, r.start_token) for r in shared.itertuples()] == list(dict.fromkeys(pairs))
    assert shared.token_ids.map(list).tolist() == separate.token_ids.map(list).tolist()
    np.testing.assert_allclose(shared.total, separate.total, atol=1e-5, rtol=0)
    folders = {p.name for p in tmp_path.glob("*/*") if p.is_dir()}
    assert {"shared_context_continuation", "continuation_logprobs.r2"} <= folders


def test_shared_context_refuses_an_empty_option_or_context(tiny_gpt2):
    from biasflow.scoring.answer import Budget
    from biasflow.scoring.causal_options import answer_shared_context
    from biasflow.interface.requests import SharedContextContinuation

    with pytest.raises(ValueError, match="option '' has no tokens"):
        answer_shared_context(tiny_gpt2, [SharedContextContinuation("Q:", " A"), SharedContextContinuation("Q:", "")],
                              Budget(progress=False))
    with pytest.raises(ValueError, match="empty prompt"):
        answer_shared_context(tiny_gpt2, [SharedContextContinuation("", " A")], Budget(progress=False))
    assert len(answer_shared_context(tiny_gpt2, [SharedContextContinuation("", " A", start_token=True)],
                                     Budget(progress=False))) == 1


def test_every_metric_asking_continuations_lets_the_user_choose_the_context_pass():
    """The multiple-choice metrics on causal LMs have ``context_pass`` among their options (default ``once``) and
    their score keys (a scores file of one pass is never read for the other); no metric module builds a
    ``ContinuationLogprobs`` itself (``continuation_request`` picks the pass's kind)."""
    from biasflow.registry import METRICS, load_all
    from biasflow.interface.requests import CONTINUATION_REQUESTS, ContinuationLogprobs

    load_all()
    asking = {name for name, spec in METRICS.items() if spec.options is not None
              and "context_pass" in spec.options.model_fields}
    assert asking == {"bbq", "stereoset", "winobias_mc", "winogender_mc"}
    for name in asking:
        spec = METRICS[name]
        assert "context_pass" in spec.score_keys and spec.options().context_pass == "once", name
    assert set(CONTINUATION_REQUESTS) == {"once", "per_option"}
    assert all(issubclass(k, ContinuationLogprobs) for k in CONTINUATION_REQUESTS.values())
    metrics_dir = Path(__file__).resolve().parents[1] / "src" / "biasflow" / "metrics"
    assert not [f.name for f in metrics_dir.glob("*.py") if "ContinuationLogprobs(" in f.read_text()]


@pytest.mark.parametrize("which", ["bert", "roberta"])
def test_a_text_longer_than_the_positions_fails_naming_model_limit_and_text(bert_tokenizer, roberta_tokenizer,
                                                                          which):
    """A masked LM takes as many tokens as its position table holds (RoBERTa: two fewer, its positions start after
    the padding index): a text of exactly that many scores; one token more fails before the model runs, naming the
    model, the limit and the text, not with torch's index error."""
    from biasflow.models.masked_lm import position_table
    from biasflow.scoring.masked import pseudo_log_likelihoods

    adapter = _tiny_bert(bert_tokenizer) if which == "bert" else _tiny_roberta(roberta_tokenizer)
    _, limit = position_table(adapter.model)
    assert limit == (128 if which == "bert" else 160 - 2)
    tok = adapter.tokenizer
    body = tok("word " * 400, add_special_tokens=False)["input_ids"]
    first, *_, last = tok("word")["input_ids"]  # the special tokens around a text
    fits = [first, *body[:limit - 2], last]
    assert len(fits) == limit
    assert np.isfinite(np.nansum(pseudo_log_likelihoods(adapter, [fits], progress=False)[0]))
    over = [first, *body[:limit - 1], last]
    with pytest.raises(ValueError, match=rf"'{adapter.name}' takes at most {limit} tokens per text; a text of "
                                         rf"{limit + 1} tokens .* starts '.*word word"):
        pseudo_log_likelihoods(adapter, [fits, over], progress=False)
