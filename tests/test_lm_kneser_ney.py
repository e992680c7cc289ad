"""The Kneser-Ney estimator against hand-computed values, normalisation, pruning, and KenLM round trip."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from dsdata.lm.arpa import write_arpa
from dsdata.lm.kneser_ney import EstimationError, compute_discounts, estimate

UNK, BOS, EOS, A, B, C = range(6)
WORDS = ["<unk>", "<s>", "</s>", "a", "b", "c"]
TOY = [[A, B], [A, B], [A, C], [B]]
FIXED = [(0.5, 1.0, 1.5), (0.5, 1.0, 1.5)]


@pytest.fixture(scope="module")
def toy():
    return estimate(TOY, 2, len(WORDS), bos=BOS, eos=EOS, unk=UNK, discounts=FIXED)


def test_adjusted_counts_are_left_extension_counts(toy):
    uni = toy.levels[0]
    # a: preceded only by <s>; b: by a and <s>; c: by a; </s>: by b and c; <s> is never predicted.
    assert uni.adjusted[[A, B, C, EOS, UNK, BOS]].tolist() == [1, 2, 1, 2, 0, 0]
    big = toy.levels[1]
    assert sorted(big.raw_counts.tolist()) == [1, 1, 1, 2, 3, 3]
    assert big.adjusted.tolist() == big.raw_counts.tolist()  # highest order: raw counts


def test_unigrams_match_hand_computation(toy):
    # Σ a = 6; γ(ε) = (0.5·N1 + 1.0·N2) / 6 = (0.5·2 + 1·2) / 6 = 0.5; |V| = 5 (no <s>).
    assert toy.prob(A, []) == pytest.approx((1 - 0.5) / 6 + 0.5 / 5)      # 0.18333
    assert toy.prob(B, []) == pytest.approx((2 - 1.0) / 6 + 0.5 / 5)      # 0.26667
    assert toy.prob(EOS, []) == pytest.approx((2 - 1.0) / 6 + 0.5 / 5)
    assert toy.prob(UNK, []) == pytest.approx(0.5 / 5)                    # only the uniform share


def test_bigrams_match_hand_computation(toy):
    p_a, p_b, p_c, p_eos = 0.5 / 6 + 0.1, 1 / 6 + 0.1, 0.5 / 6 + 0.1, 1 / 6 + 0.1
    # context a: children b (2), c (1); denominator 3; γ(a) = (0.5·1 + 1·1) / 3 = 0.5
    assert toy.prob(B, [A]) == pytest.approx((2 - 1.0) / 3 + 0.5 * p_b)   # 0.46667
    assert toy.prob(C, [A]) == pytest.approx((1 - 0.5) / 3 + 0.5 * p_c)   # 0.25833
    assert toy.prob(A, [A]) == pytest.approx(0.5 * p_a)                   # unseen: backoff only
    # context <s>: a (3), b (1); denominator 4; γ(<s>) = (0.5·1 + 1.5·1) / 4 = 0.5
    assert toy.prob(A, [BOS]) == pytest.approx((3 - 1.5) / 4 + 0.5 * p_a)
    assert toy.prob(B, [BOS]) == pytest.approx((1 - 0.5) / 4 + 0.5 * p_b)
    # context b: </s> (3) only; γ(b) = 1.5 / 3
    assert toy.prob(EOS, [B]) == pytest.approx((3 - 1.5) / 3 + 0.5 * p_eos)
    # an unseen context backs off entirely to the unigram distribution
    assert toy.prob(B, [EOS]) == pytest.approx(p_b)


def test_discounts_from_count_of_counts():
    adjusted = np.array([1] * 10 + [2] * 5 + [3] * 3 + [4] * 2 + [7])
    # Y = 10 / (10 + 2·5) = 0.5; D1 = 1 - 2Y·5/10; D2 = 2 - 3Y·3/5; D3+ = 3 - 4Y·2/3
    assert compute_discounts(adjusted) == pytest.approx((0.5, 1.1, 3 - 4 * 0.5 * 2 / 3))
    with pytest.raises(EstimationError, match="count-of-counts"):
        compute_discounts(np.array([1, 1, 2]), fallback=None)
    assert compute_discounts(np.array([1, 1, 2])) == (0.5, 1.0, 1.5)


def _random_corpus(seed: int, vocab: int, n: int):
    rng = random.Random(seed)
    # Zipf-like draws so every order has a realistic count-of-counts.
    weights = [1 / (i + 1) for i in range(vocab - 3)]
    return [rng.choices(range(3, vocab), weights, k=rng.randint(1, 12)) for _ in range(n)]


def _ngrams(model) -> list[int]:
    return [int(level.keep.sum()) for level in model.levels]


@pytest.mark.parametrize("order,prune", [(3, None), (4, None), (3, [0, 1]), (4, [0, 1, 2, 2])])
def test_probabilities_normalise(order, prune):
    vocab = 40
    corpus = _random_corpus(order, vocab, 800)
    model = estimate(corpus, order, vocab, bos=1, eos=2, unk=0, prune=prune)
    words = [w for w in range(model.vocab_size) if w != model.bos]  # every word given mass
    rng = random.Random(1)
    histories = [[], [1], [1, 3], [3, 4], [3, 4, 5], [2, 2], [39, 38, 37]] + [s[:k] for s in corpus[:6] for k in (1, 2, 3)]
    histories += [[rng.randrange(3, vocab) for _ in range(order - 1)] for _ in range(5)]
    for history in histories:
        total = sum(model.prob(int(w), history) for w in words)
        assert total == pytest.approx(1.0, abs=1e-9), history
    if prune:
        full = estimate(corpus, order, vocab, bos=1, eos=2, unk=0)
        assert sum(_ngrams(model)) < sum(_ngrams(full))


def test_estimated_discounts_are_used_per_order():
    corpus = _random_corpus(7, 30, 600)
    model = estimate(corpus, 3, 30, bos=1, eos=2, unk=0)
    top = model.levels[2]
    assert model.discounts[2] == pytest.approx(compute_discounts(top.adjusted))
    for d1, d2, d3 in model.discounts[1:]:  # 27 unigrams are too few for count-of-counts
        assert 0 < d1 < 1 and 0 < d2 < 2 and 0 < d3 < 3
        assert (d1, d2, d3) != (0.5, 1.0, 1.5)  # computed, not the fallback


@pytest.mark.parametrize("prune,suffix", [(None, ".arpa"), ([0, 1, 1], ".arpa.gz")])
def test_kenlm_reads_the_arpa_and_agrees(tmp_path, prune, suffix):
    kenlm = pytest.importorskip("kenlm")
    vocab = 25
    corpus = _random_corpus(3, vocab, 500)
    model = estimate(corpus, 3, vocab, bos=1, eos=2, unk=0, prune=prune)
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, vocab)]
    path = str(tmp_path / f"lm{suffix}")
    counts = write_arpa(model, words, path)
    assert counts == {str(n + 1): c for n, c in enumerate(_ngrams(model))}
    lm = kenlm.Model(path)
    assert lm.order == 3
    tests = corpus[:30] + [[5, 5, 5, 9, 4], [24, 23, 22]]
    for sentence in tests:
        history = [1]
        scores = list(lm.full_scores(" ".join(words[w] for w in sentence)))
        for (log10p, _, _), w in zip(scores, sentence + [2]):
            assert math.log10(model.prob(w, history)) == pytest.approx(log10p, abs=1e-5)
            history.append(w)
    # A word outside the vocabulary gets <unk>'s probability in both.
    assert list(lm.full_scores("zzz", bos=False, eos=False))[0][0] == pytest.approx(
        math.log10(model.prob(0, [])), abs=1e-5)


def test_bad_inputs_are_rejected_with_a_reason():
    with pytest.raises(EstimationError, match="no sentences"):
        estimate([], 3, 10, bos=1, eos=2, unk=0)
    with pytest.raises(EstimationError, match="out of range"):
        estimate([[3, 99]], 2, 10, bos=1, eos=2, unk=0)
    with pytest.raises(EstimationError, match="must not decrease"):
        estimate([[3, 4]], 3, 10, bos=1, eos=2, unk=0, prune=[0, 2, 1])
