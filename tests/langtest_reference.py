"""The tiny model and the rows behind the LangTest 2.7.0 reference values (tests/fixtures/langtest/).

A random BERT says nothing useful in a fill-mask test (every candidate word is far outside the top 5), so this
model is random *except* that the output bias favours a fixed list of words: the pronouns of WinoBias and the
words that differ between the two sentences of the first CrowS-Pairs rows. Their probabilities then vary from
sentence to sentence around the test thresholds, and the tests see kept, dropped, passed and failed samples.

Every weight comes from numpy's seeded generator (not from transformers' initialisers, which change between
versions), so the model is the same whichever transformers version builds it; ``weights_digest`` checks that.
"""
from __future__ import annotations

import hashlib
import string
from pathlib import Path

import numpy as np

SEED = 20240611
BOOST_ROWS = 300          # the favoured CrowS-Pairs words come from the first rows of the raw CSV
PRONOUNS = ("he", "she", "his", "her", "him")
MIN_COUNT = 5             # a CrowS-Pairs word is favoured when it differs in at least this many of those rows
WEIGHT_STD = 0.3          # every other weight ~ N(0, WEIGHT_STD)
FAVOURED_BIAS = 12.0      # output bias of the favoured words (all others 0)


def boosted_words(crows_rows) -> list[str]:
    """Pronouns plus the lowercased, punctuation-stripped words that differ within at least MIN_COUNT rows."""
    counts: dict[str, int] = {}
    for more, less in crows_rows:
        a, b = more.split(), less.split()
        if len(a) == len(b):
            for x, y in zip(a, b):
                if x != y:
                    for w in (x, y):
                        w = w.strip(string.punctuation).lower()
                        counts[w] = counts.get(w, 0) + 1
    return list(PRONOUNS) + sorted(w for w, n in counts.items() if n >= MIN_COUNT and w and w not in PRONOUNS)


def build_reference_bert(out: Path, crows_rows) -> Path:
    """``crows_rows``: (sent_more, sent_less) of the first ``BOOST_ROWS`` rows of crows_pairs_anonymized.csv."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from conftest import minilm_vocab_dir

    tok = AutoTokenizer.from_pretrained(minilm_vocab_dir())
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, tie_word_embeddings=False)
    model = BertForMaskedLM(cfg).eval()
    rng = np.random.default_rng(SEED)
    ids = []
    for w in boosted_words(crows_rows):
        pieces = tok(w, add_special_tokens=False)["input_ids"]
        if len(pieces) == 1:
            ids.append(pieces[0])
    ids = sorted(set(ids))
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("LayerNorm.weight"):
                value = np.ones(param.shape)
            elif name.endswith("bias"):
                value = np.zeros(param.shape)
            else:
                value = rng.normal(0.0, WEIGHT_STD, size=param.shape)
            param.copy_(torch.from_numpy(value.astype(np.float32)))
        # the state at the mask must come from the other words: no mask, position or segment signal, and
        # uniform attention (zero query and key weights), so the prediction follows the sentence's words
        model.get_input_embeddings().weight[tok.mask_token_id] = 0.0
        for name, param in model.named_parameters():
            if "position_embeddings" in name or "token_type_embeddings" in name or ".query." in name or ".key." in name:
                param.zero_()
        # transformers 4 reads the output bias from cls.predictions.bias, 5 from the decoder's own: set both
        for bias in {id(b): b for b in (model.cls.predictions.bias, model.get_output_embeddings().bias)}.values():
            bias[ids] = FAVOURED_BIAS
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def weights_digest(model_dir: Path) -> str:
    """sha256 over the parameter tensors (name, shape, float32 bytes) in name order."""
    from safetensors.numpy import load_file

    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    h = hashlib.sha256()
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name], dtype=np.float32)
        h.update(name.encode() + str(arr.shape).encode() + arr.tobytes())
    return h.hexdigest()


def dataset_digest(triples) -> str:
    """sha256 of sorted (sentence, mask1, mask2) triples, one JSON array per line (compares sample sets)."""
    import json

    lines = sorted(json.dumps(list(t), ensure_ascii=False) for t in triples)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
