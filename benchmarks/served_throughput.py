"""Throughput of a served causal LM (``model.kind: served_causal_lm``) at several client concurrencies.

Starts the tests' vLLM-like completions server (``tests/served_server.py``, wrapping the tests' tiny random GPT-2)
in a subprocess on 127.0.0.1, then scores CrowS-Pairs sentences (``TokenLogprobs``, ``first_token=prefix``) through
``biasflow.models.served`` at each ``--concurrency`` and prints requests/s and scored tokens/s with the load average.
The server is a Python HTTP server doing one CPU forward pass per request, so the figures measure biasflow's client
and the HTTP round trip, not what vLLM on a GPU gives (there, the server batches concurrent requests).

It also prints what one CrowS-Pairs pair costs: requests, words, characters and server tokens (WordPiece, here).

    python benchmarks/served_throughput.py                      # CrowS-Pairs from resources/ or the test cache
    python benchmarks/served_throughput.py --sentences 400 --concurrency 1,4,16
    python benchmarks/served_throughput.py --server-delay-ms 50     # a server whose answers take 50 ms each
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CROWS = [ROOT / "resources" / "datasets" / "crows_pairs" / "crows_pairs_anonymized.csv",
         Path(os.environ.get("BIASFLOW_TEST_CACHE", Path.home() / ".cache" / "biasflow-tests"))
         / "crows_pairs_anonymized.csv"]


def serve(delay_ms: float) -> None:
    """The server process: build the tiny GPT-2, serve it, print the URL, run until killed."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from conftest import build_tiny_gpt2
    from served_server import CompletionsServer

    from biasflow.models import load_model

    torch.set_num_threads(1)
    path = build_tiny_gpt2(Path(tempfile.mkdtemp()))
    adapter = load_model({"name": "tiny-gpt2", "kind": "causal_lm", "path": str(path), "device": "cpu"})
    with CompletionsServer(adapter) as server:
        server.delay_s = delay_ms / 1000.0
        print(server.base_url, flush=True)
        while True:
            time.sleep(3600)


def crows_pairs(path: Path | None):
    import pandas as pd

    found = path or next((p for p in CROWS if p.exists()), None)
    if found is None:
        raise SystemExit(f"no CrowS-Pairs CSV at {[str(p) for p in CROWS]}: run the pipeline or the tests once, or "
                         "pass --crows")
    return pd.read_csv(found), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--crows", type=Path, default=None)
    ap.add_argument("--sentences", type=int, default=400, help="sentences scored per concurrency level")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--server-delay-ms", type=float, default=0.0,
                    help="the server sleeps this long per request before answering (a remote GPU server's latency; "
                         "sleeping holds no CPU, as a server batching requests on a GPU)")
    args = ap.parse_args()
    if args.serve:
        return serve(args.server_delay_ms)

    from biasflow.models.served import ServedCausalLM, answer_token_logprobs
    from biasflow.scoring.answer import Budget
    from biasflow.interface.requests import TokenLogprobs

    pairs, source = crows_pairs(args.crows)
    texts = list(dict.fromkeys([*pairs["sent_more"], *pairs["sent_less"]]))
    words = sum(len(t.split()) for t in texts) / len(texts)
    chars = sum(len(t) for t in texts) / len(texts)
    print(f"CrowS-Pairs ({source}): {len(pairs)} pairs, {len(texts)} distinct sentences, {words:.1f} words and "
          f"{chars:.0f} characters per sentence")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--server-delay-ms", str(args.server_delay_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    try:
        base_url = proc.stdout.readline().strip()
        if not base_url.startswith("http"):
            raise SystemExit("the server did not start")
        print(f"server: tests/served_server.py (tiny GPT-2, 1 torch thread, {args.server_delay_ms:g} ms added "
              f"latency per request, pid {proc.pid}) at {base_url}")
        rows = []
        offset = 0
        for conc in [int(c) for c in args.concurrency.split(",")]:
            model = ServedCausalLM({"name": "tiny-gpt2", "kind": "served_causal_lm", "base_url": base_url,
                                    "bos_text": "[CLS]", "revision": "bench", "concurrency": conc})
            model.prefix()  # the one probe, outside the timing
            sent, tokens = model.requests_sent, model.tokens_scored
            batch = texts[offset:offset + args.sentences]  # fresh sentences for every level
            offset += args.sentences
            load = os.getloadavg()[0]
            start = time.perf_counter()
            out = answer_token_logprobs(model, [TokenLogprobs(t) for t in batch], Budget(progress=False))
            wall = time.perf_counter() - start
            n_req, n_tok = model.requests_sent - sent, model.tokens_scored - tokens
            rows.append((conc, len(out), n_req, wall, n_tok / len(out), n_req / wall, n_tok / wall, load,
                         os.getloadavg()[0]))
    finally:
        proc.kill()
        proc.wait()
    print("| concurrency | sentences | requests | wall s | server tokens per request | requests/s | tokens/s | "
          "load 1-min before -> after |")
    print("|---|---|---|---|---|---|---|---|")
    for conc, n, n_req, wall, per, rps, tps, l0, l1 in rows:
        print(f"| {conc} | {n} | {n_req} | {wall:.1f} | {per:.1f} | {rps:.1f} | {tps:.0f} | {l0:.1f} -> {l1:.1f} |")


if __name__ == "__main__":
    main()
