"""Interpolated modified Kneser-Ney n-gram estimation (Chen & Goodman 1998, as in KenLM's lmplz).

Adjusted counts, discounts D1, D2, D3+ per order, interpolation down to the uniform distribution
and the ARPA form (p(w | h) stored, γ(h) as backoff weight): docs/difficulty.md.  Pruning recomputes
the affected backoff weights (Σ_w p(w | h) = 1).  N-grams are numbered level by level:
key = prefix_id * vocab_size + last_word (int64 for any order).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

# Used when the corpus is too small for the count-of-counts formula (KenLM's --discount_fallback).
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


class EstimationError(ValueError):
    """The corpus or the options cannot produce a model (e.g. an empty corpus)."""


@dataclass
class NgramLevel:
    """All n-grams of one order, sorted by key; order 1 is dense (id == word id, unseen words count 0)."""

    order: int
    keys: np.ndarray            # int64, sorted
    raw_counts: np.ndarray      # int64
    first_word: np.ndarray      # int64 first word of each n-gram
    suffix: np.ndarray          # int64 id of the (n-1)-gram without the first word (-1 for order 1)
    adjusted: np.ndarray | None = None   # int64 adjusted counts (see module docstring)
    prob: np.ndarray | None = None       # float64 interpolated p(w | h)
    backoff: np.ndarray | None = None    # float64 γ of this n-gram as a context (1.0 if it has none)
    keep: np.ndarray | None = None       # bool: survives pruning


@dataclass
class KneserNeyModel:
    """An estimated model: per-order levels and the discounts used."""

    order: int
    vocab_size: int
    bos: int
    eos: int
    unk: int
    levels: list[NgramLevel]
    discounts: list[tuple[float, float, float]]
    uniform_size: int           # |V|: the number of predictable words (the vocabulary minus <s>)

    def _lookup(self, words: Sequence[int]) -> int:
        """Id of an n-gram in its level, or -1 when it is not in the (pruned) model."""
        node = -1
        for n, w in enumerate(words, start=1):
            if n == 1:
                node = int(w)
                continue
            level = self.levels[n - 1]
            key = node * self.vocab_size + int(w)
            i = int(np.searchsorted(level.keys, key))
            if i >= len(level.keys) or level.keys[i] != key or not level.keep[i]:
                return -1
            node = i
        return node

    def prob(self, word: int, history: Sequence[int]) -> float:
        """p(word | history) by backoff over the stored (possibly pruned) model."""
        if not 0 <= word < self.vocab_size:
            word = self.unk
        history = [h if 0 <= h < self.vocab_size else self.unk for h in history]
        history = history[len(history) - (self.order - 1):] if self.order > 1 and history else []
        backoff = 1.0
        while True:
            gid = self._lookup(history + [word])
            if gid >= 0:
                return backoff * float(self.levels[len(history)].prob[gid])
            hid = self._lookup(history)
            if hid >= 0:
                backoff *= float(self.levels[len(history) - 1].backoff[hid])
            history = history[1:]


def compute_discounts(adjusted: np.ndarray, fallback: tuple[float, float, float] | None = FALLBACK_DISCOUNTS
                      ) -> tuple[float, float, float]:
    """Modified-KN discounts (D1, D2, D3+) from the (positive) adjusted counts of one order."""
    t = [int(np.count_nonzero(adjusted == k)) for k in (1, 2, 3, 4)]
    if min(t) == 0:
        if fallback is None:
            raise EstimationError(f"count-of-counts {t} has a zero: the corpus is too small for this order")
        return tuple(float(x) for x in fallback)
    y = t[0] / (t[0] + 2 * t[1])
    d = tuple(k - (k + 1) * y * t[k] / t[k - 1] for k in (1, 2, 3))
    if not all(0 < d[k - 1] < k for k in (1, 2, 3)):
        if fallback is None:
            raise EstimationError(f"discounts {d} out of range for count-of-counts {t}")
        return tuple(float(x) for x in fallback)
    return d


def _count_levels(tokens: np.ndarray, sent: np.ndarray, order: int, vocab: int) -> list[NgramLevel]:
    """Count every n-gram (orders 1..order) that lies inside one padded sentence."""
    length = len(tokens)
    levels = []
    prev_ids = tokens
    levels.append(NgramLevel(order=1, keys=np.arange(vocab, dtype=np.int64),
                             raw_counts=np.bincount(tokens, minlength=vocab).astype(np.int64),
                             first_word=np.arange(vocab, dtype=np.int64),
                             suffix=np.full(vocab, -1, dtype=np.int64)))
    for n in range(2, order + 1):
        span = length - n + 1
        if span <= 0:
            empty = np.zeros(0, dtype=np.int64)
            levels.append(NgramLevel(order=n, keys=empty, raw_counts=empty, first_word=empty, suffix=empty))
            prev_ids = np.full(length, -1, dtype=np.int64)
            continue
        valid = np.zeros(length, dtype=bool)
        valid[:span] = sent[:span] == sent[n - 1:]
        pos = np.flatnonzero(valid)
        keys = prev_ids[pos] * vocab + tokens[pos + n - 1]
        uniq, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
        ids = np.full(length, -1, dtype=np.int64)
        ids[pos] = inverse
        first_pos = pos[first]
        # The suffix of the n-gram at position i is the (n-1)-gram at position i + 1.
        suffix_ids = tokens if n == 2 else prev_ids
        levels.append(NgramLevel(order=n, keys=uniq, raw_counts=counts.astype(np.int64),
                                 first_word=tokens[first_pos].astype(np.int64),
                                 suffix=suffix_ids[first_pos + 1].astype(np.int64)))
        prev_ids = ids
    return levels


def estimate(sentences: Iterable[Sequence[int]], order: int, vocab_size: int, *, bos: int, eos: int, unk: int,
             prune: Sequence[int] | None = None, discounts: Sequence[tuple[float, float, float]] | None = None,
             discount_fallback: tuple[float, float, float] | None = FALLBACK_DISCOUNTS) -> KneserNeyModel:
    """Estimate an interpolated modified-KN model from sentences of word ids (without <s>/</s>).

    prune: per order (unigrams first, never pruned), drop n-grams with raw count <= the value; must
    not decrease with order.  discounts: fixed (D1, D2, D3+) per order, for tests."""
    if order < 1:
        raise EstimationError(f"order must be >= 1 (got {order})")
    thresholds = _prune_thresholds(prune, order)
    tokens, sent = _token_stream(sentences, vocab_size, bos, eos)
    levels = _count_levels(tokens, sent, order, vocab_size)
    del tokens, sent

    for level in levels:
        level.adjusted = level.raw_counts.copy()
    # Lower orders: count distinct left extensions, except n-grams that begin with <s>.
    for n in range(1, order):
        lower, upper = levels[n - 1], levels[n]
        left_ext = np.bincount(upper.suffix, minlength=len(lower.keys)).astype(np.int64)
        lower.adjusted = np.where(lower.first_word == bos, lower.raw_counts, left_ext)
    # <s> is never predicted: it takes no part in the unigram distribution.
    uni = levels[0]
    is_bos = uni.keys == bos
    uni.adjusted[is_bos] = 0
    uniform_size = vocab_size - 1

    used_discounts = _interpolate(levels, vocab_size, is_bos, discounts, discount_fallback)
    levels[-1].backoff = np.ones(len(levels[-1].keys))

    if any(thresholds[1:]):
        _prune(levels, thresholds, vocab_size)
    return KneserNeyModel(order=order, vocab_size=vocab_size, bos=bos, eos=eos, unk=unk, levels=levels,
                          discounts=used_discounts, uniform_size=uniform_size)


def _interpolate(levels: list[NgramLevel], vocab_size: int, is_bos: np.ndarray,
                 discounts: Sequence[tuple[float, float, float]] | None,
                 discount_fallback: tuple[float, float, float] | None) -> list[tuple[float, float, float]]:
    """Each level's interpolated probabilities and its context's backoff weights, lowest order
    first (each order interpolates with the one below); returns the discounts used per order."""
    uniform_size = vocab_size - 1
    used_discounts = []
    for n, level in enumerate(levels, start=1):
        a = level.adjusted
        if discounts is not None:
            d = tuple(float(x) for x in discounts[n - 1])
        else:
            d = compute_discounts(a[a > 0], discount_fallback)
        used_discounts.append(d)
        disc = np.select([a == 0, a == 1, a == 2], [0.0, d[0], d[1]], d[2])
        if n == 1:
            ctx = np.zeros(len(a), dtype=np.int64)
            n_ctx = 1
        else:
            ctx = level.keys // vocab_size
            n_ctx = len(levels[n - 2].keys)
        denom = np.bincount(ctx, weights=a, minlength=n_ctx)
        mass = (d[0] * np.bincount(ctx, weights=(a == 1), minlength=n_ctx)
                + d[1] * np.bincount(ctx, weights=(a == 2), minlength=n_ctx)
                + d[2] * np.bincount(ctx, weights=(a >= 3), minlength=n_ctx))
        safe = np.where(denom > 0, denom, 1.0)
        gamma = np.where(denom > 0, mass / safe, 1.0)
        u = (a - disc) / safe[ctx]
        if n == 1:
            if denom[0] == 0:
                raise EstimationError("the corpus has no words")
            level.prob = np.where(is_bos, 0.0, u + gamma[0] / uniform_size)
        else:
            level.prob = u + gamma[ctx] * levels[n - 2].prob[level.suffix]
            levels[n - 2].backoff = gamma
        level.keep = np.ones(len(a), dtype=bool)
    return used_discounts


def _prune_thresholds(prune: Sequence[int] | None, order: int) -> list[int]:
    thresholds = [0] * order
    if prune:
        prune = [int(x) for x in prune]
        thresholds = (prune + [prune[-1]] * order)[:order]
        if any(b < a for a, b in zip(thresholds[1:], thresholds[2:])):
            raise EstimationError(f"prune thresholds must not decrease with order (got {list(prune)})")
    return thresholds


def _token_stream(sentences: Iterable[Sequence[int]], vocab_size: int, bos: int, eos: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """All sentences as one token array with <s>/</s> around each, and each token's sentence number."""
    chunks = []
    sent_chunks = []
    n_sent = 0
    for sentence in sentences:
        arr = np.asarray(sentence, dtype=np.int64)
        if len(arr) and (arr.min() < 0 or arr.max() >= vocab_size):
            raise EstimationError(f"word id out of range [0, {vocab_size}) in sentence {n_sent}")
        chunks.append(np.concatenate(([bos], arr, [eos])).astype(np.int64))
        sent_chunks.append(np.full(len(arr) + 2, n_sent, dtype=np.int64))
        n_sent += 1
    if n_sent == 0:
        raise EstimationError("the corpus has no sentences")
    return np.concatenate(chunks), np.concatenate(sent_chunks)


def _prune(levels: list[NgramLevel], thresholds: list[int], vocab: int) -> None:
    """Drop n-grams with raw count <= threshold and renormalise the backoff of their contexts
    (thresholds not decreasing with order keep every kept n-gram's prefix and suffix)."""
    for n in range(2, len(levels) + 1):
        level, lower = levels[n - 1], levels[n - 2]
        level.keep = level.raw_counts > thresholds[n - 1]
        if n > 2:
            # A kept n-gram's context must be kept too (true for raw counts, enforced for safety).
            level.keep &= lower.keep[level.keys // vocab]
        ctx = level.keys // vocab
        kept = level.keep
        n_ctx = len(lower.keys)
        # γ'(h) = (1 - Σ_{w: hw kept} p(w|h)) / (1 - Σ_{w: hw kept} p(w|h')) keeps Σ_w p(w|h) = 1.
        num = 1.0 - np.bincount(ctx[kept], weights=level.prob[kept], minlength=n_ctx)
        # p(w|h') of a kept hw is the stored probability of its suffix h'w (kept too, see above).
        den = 1.0 - np.bincount(ctx[kept], weights=lower.prob[level.suffix[kept]], minlength=n_ctx)
        safe = np.where(den > 1e-12, den, 1.0)
        lower.backoff = np.clip(np.where(den > 1e-12, num / safe, 1.0), 0.0, None)
