"""Locality-sensitive hashing over MinHash signatures: choosing bands × rows, and band keys.

A signature of `num_perm` values is cut into `bands` bands of `rows` values.  Two documents whose
shingle sets have Jaccard similarity s agree on one band with probability s^rows, so they share at
least one band bucket (become a candidate pair) with probability

    P(s) = 1 − (1 − s^rows)^bands                                   (the S-curve)

whose steepest point is near (1/bands)^(1/rows).  Given a Jaccard `threshold` t, `choose_bands_rows`
picks the (bands, rows) with bands·rows ≤ num_perm that minimise

    w_fp · ∫_0^t P(s) ds  +  w_fn · ∫_t^1 (1 − P(s)) ds

(the weighted areas of false positives below t and false negatives above t, as datasketch does).
When candidates are verified by their signature estimate afterwards, false positives cost only
work, so the default weights there favour recall (w_fp = 0.05, w_fn = 0.95): with num_perm = 128,
t = 0.8 that gives 16 bands × 8 rows:

    s      0.5    0.6    0.7    0.75   0.8    0.85   0.9
    P(s)   0.061  0.237  0.613  0.815  0.947  0.994  1.000

Without verification the weights are equal (datasketch's choice): 9 bands × 13 rows, where
P(0.8) = 0.40 and P(0.85) = 0.69 — the reason a plain MinHashLSH at threshold 0.8 misses
near-duplicates just above it.
"""
from __future__ import annotations

import numpy as np

_U64 = np.uint64


def candidate_probability(similarity, bands: int, rows: int):
    """P(two documents with Jaccard `similarity` share at least one band bucket)."""
    s = np.asarray(similarity, dtype=np.float64)
    return 1.0 - (1.0 - s**rows) ** bands


def _area(fn, lo: float, hi: float, steps: int = 400) -> float:
    xs = np.linspace(lo, hi, steps + 1)
    ys = fn(xs)
    return float(np.sum((ys[1:] + ys[:-1]) * np.diff(xs)) / 2.0)


def choose_bands_rows(
    threshold: float, num_perm: int, false_positive_weight: float = 0.5, false_negative_weight: float = 0.5
) -> tuple[int, int]:
    """(bands, rows) minimising the weighted false-positive and false-negative areas of the S-curve."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be between 0 and 1 (exclusive), got {threshold}")
    best, best_cost = (1, num_perm), float("inf")
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            fp = _area(lambda s: candidate_probability(s, bands, rows), 0.0, threshold)
            fn = _area(lambda s: 1.0 - candidate_probability(s, bands, rows), threshold, 1.0)
            cost = false_positive_weight * fp + false_negative_weight * fn
            if cost < best_cost - 1e-12:
                best, best_cost = (bands, rows), cost
    return best


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents × bands) uint64: one 64-bit hash of each band's `rows` signature values."""
    n_docs = signatures.shape[0]
    cut = signatures[:, : bands * rows].reshape(n_docs, bands, rows).astype(np.uint64)
    key = np.full((n_docs, bands), 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for r in range(rows):
            key ^= cut[:, :, r]
            key *= _U64(0x100000001B3)
            key ^= key >> _U64(29)
        key += np.arange(bands, dtype=np.uint64) * _U64(0x9E3779B97F4A7C15)
        key ^= key >> _U64(31)
        key *= _U64(0xBF58476D1CE4E5B9)
        key ^= key >> _U64(32)
    return key
