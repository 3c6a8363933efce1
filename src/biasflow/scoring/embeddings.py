"""Sentence embeddings as answers: ``SentenceEmbedding`` requests answered by a ``sentence_encoder`` model.

The vectors live in the one answer cache (``scoring.cache.AnswerCache`` through ``scoring.answer.answer_requests``)
as list<float32> columns, keyed by the encoder's fingerprint and the request (text, pooling).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def answer_sentence_embedding(encoder, requests, budget) -> pd.DataFrame:
    """Answerer of ``SentenceEmbedding`` requests: ``vector`` and ``pooling_used``, one encoding pass per pooling
    (batches of ``model.batch_size`` texts, sorted by length)."""
    pooling = [r.pooling or encoder.pooling for r in requests]
    vectors: list = [None] * len(requests)
    for mode in dict.fromkeys(pooling):
        rows = [i for i, p in enumerate(pooling) if p == mode]
        encoded = encoder.encode([requests[i].text for i in rows], pooling=mode, progress=budget.progress)
        for i, vec in zip(rows, encoded):
            vectors[i] = vec
    # float32 arrays: Parquet stores them as list<float32>
    return pd.DataFrame({"vector": [np.asarray(v, dtype=np.float32) for v in vectors], "pooling_used": pooling})
