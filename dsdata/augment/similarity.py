"""chrF, which decides whether a back-translated copy is a useful paraphrase: sacreBLEU's default
sentence-level chrF (orders 1..6, beta = 2, whitespace ignored), scaled to 0..1.
"""
from __future__ import annotations

from collections import Counter

CHRF_ORDER = 6
CHRF_BETA = 2.0


def _char_ngrams(text: str, n: int) -> Counter:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def chrf(hypothesis: str, reference: str, order: int = CHRF_ORDER, beta: float = CHRF_BETA) -> float:
    """chrF of `hypothesis` against `reference` in [0, 1]; 1.0 for identical non-empty strings."""
    hyp = "".join(hypothesis.split())
    ref = "".join(reference.split())
    factor = beta * beta
    precision_sum = recall_sum = 0.0
    effective_order = 0
    for n in range(1, order + 1):
        hyp_grams = _char_ngrams(hyp, n)
        ref_grams = _char_ngrams(ref, n)
        if not hyp_grams or not ref_grams:
            continue
        matches = sum((hyp_grams & ref_grams).values())
        precision_sum += matches / sum(hyp_grams.values())
        recall_sum += matches / sum(ref_grams.values())
        effective_order += 1
    if effective_order == 0:
        return 0.0
    precision = precision_sum / effective_order
    recall = recall_sum / effective_order
    if precision + recall == 0:
        return 0.0
    return (1 + factor) * precision * recall / (factor * precision + recall)
