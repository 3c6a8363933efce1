"""Issue 37's opt-in causal fast paths on a CPU: the vocabulary head in chunks (``model.head_chunk``) and the compiled
RMSNorm / gated-MLP / rotary blocks (``model.compile: blocks``), each against the plain path.

Stated tolerances (float32): 1e-5 per token log-probability for both (measured: chunked head <= ~1e-6, compiled blocks
<= ~1e-6). Batch invariance is exact (==): a text's numbers alone equal its numbers among others. The chunked head's
memory bound is checked structurally: the largest logits block it makes is rows x chunk (never rows x vocabulary) and
the head module itself is never called. The GPU counterparts are in ``tests/test_gpu.py``.
"""
from __future__ import annotations

import copy
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from biasflow.models.chunked_head import AUTO_CHUNK, ChunkedHead, head_chunk_for
from biasflow.models.onednn import use_onednn_linears
from biasflow.scoring.causal import _head_rows, next_token_logprobs, shared_prefix_logprobs

TOL = 1e-5
VOCAB = 97  # prime: no chunk size divides it


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _decoder(model_type: str, tied: bool = True):
    """A random 2-layer decoder (vocabulary 97) as transformers builds it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = {"gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64),
             "opt": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                         word_embed_proj_dim=32, max_position_embeddings=64)}
    llama_like = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=64, head_dim=8)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                  tie_word_embeddings=tied, **sizes.get(model_type, llama_like))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def _adapter(model, chunk: int | None = None, onednn: bool = True):
    """The causal_lm adapter's scoring state: chunked head built first, then the oneDNN linears (as ``CausalLM``)."""
    model = copy.deepcopy(model)
    head = None if chunk is None else ChunkedHead.of(model, chunk)
    if onednn:
        use_onednn_linears(model)
    return SimpleNamespace(model=model, tokenizer=SimpleNamespace(pad_token_id=0), device=torch.device("cpu"),
                           name="tiny", bos_token_id=1, chunked_head=head)


def _texts(seed: str) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (2, 5, 5, 9, 3, 17, 5, 30, 12)]


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b) if len(x))


# ------------------------------------------------------------------------------------------------ chunked head
@pytest.mark.parametrize("model_type,tied", [("gpt2", True), ("llama", False), ("qwen3", True), ("opt", True)])
@pytest.mark.parametrize("chunk", [10, 64, 97])
def test_chunked_head_equals_the_plain_head(model_type, tied, chunk):
    """Packed (gpt2, llama, qwen3) and padded (opt) passes, a tied and an untied head, chunks that do not divide the
    vocabulary (10, 64) and one chunk of all of it: every token within 1e-5 of the plain head's value."""
    model = _decoder(model_type, tied)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    ids = _texts(model_type)
    plain = next_token_logprobs(_adapter(model), ids, batch_tokens=40)
    chunked = next_token_logprobs(_adapter(model, chunk), ids, batch_tokens=40)
    assert _max_diff(plain, chunked) < TOL


def test_chunked_head_keeps_batch_invariance_and_its_memory_bound():
    """A text alone and among others (other budgets, so other packs): equal to the bit; the largest logits block is
    rows x chunk, the vocabulary head module is never called; the shared-prefix (tree) path agrees too."""
    model = _decoder("llama", tied=False)
    adapter = _adapter(model, 10)
    calls = []
    adapter.model.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    ids = _texts("invariance")
    together = next_token_logprobs(adapter, ids, batch_tokens=60)
    for seq, lp in zip(ids, together):
        alone = next_token_logprobs(adapter, [seq], batch_tokens=4096)[0]
        assert np.array_equal(alone, lp)
    rows = _head_rows("cpu", VOCAB, 1 << 26, adapter.chunked_head)
    assert adapter.chunked_head.peak_logits == rows * 10 < rows * VOCAB
    assert adapter.chunked_head.chunks()[-1] == (90, 97)
    assert not calls
    long = [ids[i] for i in (3, 5, 7)]  # 9, 17 and 30 tokens
    prefixes, branches = [s[:4] for s in long], [[s[4:], s[1:3]] for s in long]
    got = shared_prefix_logprobs(adapter, prefixes, branches, batch_tokens=30)
    want = shared_prefix_logprobs(_adapter(model), prefixes, branches, batch_tokens=30)
    assert max(float(np.abs(a - b).max()) for g, w in zip(got, want) for a, b in zip(g, w)) < TOL
    assert not calls


def test_head_chunk_option_is_off_by_default_and_auto_only_on_cuda():
    assert head_chunk_for(None, "cpu") is None and head_chunk_for(False, "cuda") is None
    assert head_chunk_for("auto", "cpu") is None and head_chunk_for("auto", "cuda") == AUTO_CHUNK
    assert head_chunk_for(4096, "cpu") == 4096
    with pytest.raises(ValueError, match="head_chunk"):
        head_chunk_for(0, "cpu")
    # the rows of a chunked head's fixed tile: on a GPU one tile of gpu_tile_rows(chunk) rows (2,048 x 8,192 logits
    # for Llama-3's 128,256 words), on a CPU HEAD_ROWS; the plain head's slices are unchanged
    llama3 = ChunkedHead(torch.zeros(128_256, 4), None, AUTO_CHUNK)
    assert _head_rows("cuda", 128_256, 1 << 26, llama3) == 2048 and _head_rows("cpu", 128_256, 1 << 26, llama3) == 128
    assert _head_rows("cuda", 128_256, 1 << 26) == 1024 and _head_rows("cpu", 128_256, 1 << 26) == 128
    assert llama3.chunks()[-1] == (15 * AUTO_CHUNK, 128_256)


def test_head_chunk_through_the_model_config(tiny_gpt2):
    """``head_chunk: 4096`` on the tiny GPT-2 of the real (30,522-word) vocabulary: a chunked head on the adapter
    and the same token log-probabilities as the default config within 1e-5; the default config has none, and the
    option is part of the fingerprint only when set."""
    from biasflow.models import load_model
    from biasflow.models.fingerprint import config_fingerprint
    from biasflow.scoring.causal import causal_token_logprobs, encode

    cfg = {"name": "tiny-gpt2", "kind": "causal_lm", "path": tiny_gpt2.source, "device": "cpu"}
    chunked = load_model(dict(cfg, head_chunk=4096))
    assert tiny_gpt2.chunked_head is None and chunked.chunked_head.chunk == 4096
    ids = encode(tiny_gpt2, ["The doctor said she was tired.", "He is a nurse.", "A much longer sentence than these."])
    want = causal_token_logprobs(tiny_gpt2, ids, progress=False)
    got = causal_token_logprobs(chunked, ids, progress=False)
    assert _max_diff(want, got) < TOL
    assert config_fingerprint(cfg) == config_fingerprint(dict(cfg, head_chunk=None, compile=None))
    assert config_fingerprint(cfg) != config_fingerprint(dict(cfg, head_chunk=4096))


def test_head_chunk_and_compile_are_validated():
    from biasflow.errors import ConfigError
    from biasflow.schema import validate_model_config

    validate_model_config(dict(kind="causal_lm", hub_id="x", head_chunk="auto", compile="blocks"))
    validate_model_config(dict(kind="causal_lm", hub_id="x", head_chunk=8192, compile=None))
    for bad in ({"head_chunk": 0}, {"head_chunk": "big"}, {"compile": "model"}, {"compile": True}, {"compile": False}):
        with pytest.raises(ConfigError, match="head_chunk|compile"):
            validate_model_config(dict(kind="causal_lm", hub_id="x", **bad))
    with pytest.raises(ConfigError, match="kind masked_lm takes no option 'head_chunk' .an option of kind causal_lm"):
        validate_model_config(dict(kind="masked_lm", hub_id="x", head_chunk=8192))


# ----------------------------------------------------------------------------------------------- compiled blocks
def test_compiled_blocks_equal_the_eager_model_and_keep_batch_invariance():
    """``compile: blocks`` on a tiny Llama (dynamic shapes: one kernel per block for every token count): the same
    log-probabilities as the eager model within 1e-5, a text alone equal to the bit to itself among others, also
    with the chunked head's reduction compiled; other Llama models of the process untouched (rotary compiled only
    while the compiled model runs)."""
    from biasflow.models.compiled import compile_blocks, compiler_problem

    if compiler_problem():
        pytest.skip(compiler_problem())
    model = _decoder("llama", tied=False)
    eager = _adapter(model, onednn=True)
    fast = _adapter(model, onednn=False)
    done = compile_blocks(fast.model, name="tiny-llama")
    use_onednn_linears(fast.model)
    assert (done.norms, done.mlps, done.rotary) == (5, 2, True) and done.seconds > 0
    assert "RMSNorm" in type(fast.model.model.norm).__name__  # batch_invariant still tiles it on a GPU
    ids = _texts("compiled")
    want = next_token_logprobs(eager, ids, batch_tokens=40)
    got = next_token_logprobs(fast, ids, batch_tokens=40)
    assert _max_diff(want, got) < TOL
    for seq, lp in zip(ids, got):
        assert np.array_equal(next_token_logprobs(fast, [seq], batch_tokens=4096)[0], lp)
    # with the chunked head's per-chunk reduction compiled too (what compile: blocks does with head_chunk set)
    fast.chunked_head = ChunkedHead.of(model, 10).compile()
    both = next_token_logprobs(fast, ids, batch_tokens=40)
    assert fast.chunked_head.compiled and _max_diff(want, both) < TOL
    for seq, lp in zip(ids[:4], both):
        assert np.array_equal(next_token_logprobs(fast, [seq], batch_tokens=4096)[0], lp)
    import transformers.models.llama.modeling_llama as llama

    rotary = llama.apply_rotary_pos_emb
    assert rotary.depth == 0  # between passes the eager function runs for every model
    again = next_token_logprobs(eager, ids, batch_tokens=40)
    assert all(np.array_equal(a, b) for a, b in zip(again, want))


def test_compiled_kernels_are_cached_per_cpu_and_kernel_limits(tmp_path, monkeypatch):
    """Kernels inductor compiled under AVX-512 and reused under AVX2 limits gave log-probabilities of 1e36 (issue 47's
    AVX2 check): each CPU and set of kernel limits gets its own cache folder under TORCHINDUCTOR_CACHE_DIR."""
    from biasflow.models.compiled import cpu_keyed_cache_dir
    from biasflow.provenance import ISA_VARIABLES, WITHOUT_AVX512

    for name in ISA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    full = cpu_keyed_cache_dir()
    assert Path(full).parent == tmp_path and Path(full).name.startswith("cpu-")
    assert cpu_keyed_cache_dir() == full  # a second model of the process: the same folder, not one inside it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    for name, value in WITHOUT_AVX512.items():
        monkeypatch.setenv(name, value)
    limited = cpu_keyed_cache_dir()
    assert Path(limited).parent == tmp_path and limited != full
