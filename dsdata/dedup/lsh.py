"""Locality-sensitive hashing over MinHash signatures: choosing bands × rows, and band keys.

`choose_bands_rows` picks (bands, rows) for a threshold by the weighted false-positive and
false-negative areas of the S-curve P(s) = 1 − (1 − s^rows)^bands, as datasketch does (docs/dedup.md).
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
