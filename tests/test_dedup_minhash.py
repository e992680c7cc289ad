"""MinHash core: shingles, determinism, estimator accuracy, LSH band choice (no Beam)."""
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsdata.dedup.lsh import band_keys, candidate_probability, choose_bands_rows
from dsdata.dedup.minhash import MinHasher, exact_hash, normalise_for_shingles, shingle_strings
from dsdata.stages.base import StageConfigError
from dsdata.stages.dedup import DedupStage

REPO = Path(__file__).resolve().parents[1]


def _paragraphs(path: Path, min_len: int, limit: int) -> list[str]:
    docs, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            current.append(line.strip())
        if sum(map(len, current)) >= min_len:
            docs.append(" ".join(current))
            current = []
        if len(docs) >= limit:
            break
    return docs


def test_normalisation_and_script_choice():
    assert normalise_for_shingles("Hello,  WORLD!! it's\tfine") == "hello world it s fine"
    assert shingle_strings("one two three four five six") == ["one two three four five", "two three four five six"]
    # Chinese: character 5-grams with punctuation and spaces removed, not one giant "word".
    assert shingle_strings("中文文本，没有 空格。") == ["中文文本没", "文文本没有", "文本没有空", "本没有空格"]
    # Shorter than one shingle: the whole text is one shingle; nothing left: no shingle.
    assert shingle_strings("a b") == ["a b"]
    assert shingle_strings("!!! ???") == []
    batch = MinHasher().shingle(["English words here", "中文文本没有空格", "mixed 中文文本内容 with words", "english with 中文"])
    assert batch.char_mode.tolist() == [False, True, True, False]  # share of CJK letters ≥ 0.2


def test_vectorised_shingles_match_reference_strings(shared_data):
    hasher = MinHasher()
    texts = _paragraphs(shared_data / "prose-en.txt", 1500, 40) + _paragraphs(shared_data / "prose-zh.txt", 800, 40)
    sets = hasher.shingle_sets(texts)
    for text, hashes in zip(texts, sets):
        assert len(hashes) == len(set(shingle_strings(text)))
    # The per-document distinct 32-bit keys used by exact verification, computed with one sort.
    top = hasher.distinct_top32(hasher.shingle(texts))
    for full, short in zip(sets, top):
        assert np.array_equal(np.unique((full >> np.uint64(32)).astype(np.uint32)), short)
    # A shingle hashes the same wherever it occurs (position-independent span hashing).
    a, b = hasher.shingle_sets(["xx yy one two three four five", "one two three four five zz"])
    assert len(np.intersect1d(a, b)) == 1


def _perturb(words: list[str], rate: float, rnd: random.Random) -> list[str]:
    return [w if rnd.random() > rate else f"zz{rnd.randrange(10**6)}" for w in words]


def test_estimate_tracks_exact_jaccard(shared_data):
    rnd = random.Random(3)
    base = _paragraphs(shared_data / "prose-en.txt", 2000, 300)
    copies = [" ".join(_perturb(t.split(), rnd.uniform(0.0, 0.08), rnd)) for t in base]
    hasher = MinHasher()
    sig_a, _ = hasher.signatures(base)
    sig_b, _ = hasher.signatures(copies)
    sets_a, sets_b = hasher.shingle_sets(base), hasher.shingle_sets(copies)
    exact = np.array([len(np.intersect1d(a, b)) / len(np.union1d(a, b)) for a, b in zip(sets_a, sets_b)])
    est = (sig_a == sig_b).mean(axis=1)
    assert abs(float((est - exact).mean())) < 0.01  # unbiased
    mid = (exact > 0.1) & (exact < 0.95)
    z = (est - exact)[mid] / np.sqrt(exact[mid] * (1 - exact[mid]) / 128)
    assert 0.8 < float(z.std()) < 1.2  # binomial spread: the 128 permutations behave independently


def test_signatures_do_not_depend_on_batch_or_process():
    texts = [f"document {i} " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(60)) for i in range(20)]
    texts += ["中文文本没有空格所以用字符切分这是测试", ""]
    hasher = MinHasher(seed=7)
    whole, has = hasher.signatures(texts)
    one_by_one = np.vstack([hasher.signatures([t])[0] for t in texts])
    assert np.array_equal(whole, one_by_one)
    assert has.tolist() == [True] * 21 + [False]
    code = (
        "import sys, json, hashlib; from dsdata.dedup.minhash import MinHasher; "
        "texts = json.loads(sys.stdin.read()); "
        "print(hashlib.sha256(MinHasher(seed=7).signatures(texts)[0].tobytes()).hexdigest())"
    )
    import hashlib
    import json

    digests = {
        subprocess.run(
            [sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True, check=True,
            cwd=REPO, env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert digests == {hashlib.sha256(whole.tobytes()).hexdigest()}
    assert not np.array_equal(whole, MinHasher(seed=8).signatures(texts)[0])


def test_exact_hash_normalises_case_and_whitespace():
    assert exact_hash("Hello  World\n") == exact_hash("hello world")
    assert exact_hash("hello world") != exact_hash("hello, world")


def test_lone_surrogates_from_json_do_not_break_a_batch():
    text = "abc \ud800 def ghi jkl mno pqr"  # json.loads accepts "\ud800"
    sig, has = MinHasher().signatures([text, "plain text here"])
    assert has.tolist() == [True, True]
    assert exact_hash(text) != exact_hash(text.replace("\ud800", ""))
    assert shingle_strings(text)[0] == "abc def ghi jkl mno"


def test_band_choice_and_s_curve():
    assert choose_bands_rows(0.8, 128) == (9, 13)  # equal weights: datasketch's choice
    assert choose_bands_rows(0.8, 128, 0.05, 0.95) == (16, 8)  # recall-first when verifying
    p = candidate_probability(np.array([0.5, 0.8, 0.85, 0.9]), 16, 8)
    assert p[0] < 0.1 and p[1] > 0.94 and p[2] > 0.99 and np.all(np.diff(p) > 0)
    sig = np.arange(256, dtype=np.uint32).reshape(2, 128)
    keys = band_keys(sig, 16, 8)
    assert keys.shape == (2, 16) and len(set(keys.ravel().tolist())) == 32
    sig[1, :8] = sig[0, :8]  # same first band → same first key, other bands differ
    keys = band_keys(sig, 16, 8)
    assert keys[0, 0] == keys[1, 0] and not np.any(keys[0, 1:] == keys[1, 1:])


@pytest.mark.parametrize(
    "params, message",
    [
        ({"threshold": 1.5}, "threshold must be"),
        ({"bands": 20, "rows": 8}, "exceeds num_perm"),
        ({"bands": 4}, "set both bands and rows"),
        ({"keep": "newest"}, "keep must be one of"),
        ({"num_perm": 0}, "num_perm must be an integer between 1 and 4096"),
        ({"exact": False, "near": False}, "at least one of exact, near, url and lines must be true"),
    ],
)
def test_bad_parameters_name_the_problem(params, message):
    with pytest.raises(StageConfigError, match=message):
        DedupStage(**params)


def test_numba_and_numpy_backends_give_identical_signatures(shared_data):
    """The optional numba kernels must reproduce the numpy definition bit for bit."""
    from dsdata.dedup.minhash import numba_kernels

    if numba_kernels() is None:
        pytest.skip("numba not installed (or DSDATA_NO_NUMBA=1): only the numpy backend exists")
    texts = _paragraphs(shared_data / "prose-en.txt", 1500, 30) + _paragraphs(shared_data / "prose-zh.txt", 800, 30)
    texts += ["", "!!! ???", "a", "中", "a b", "mixed 中文文本内容 with words", "abc \ud800 def ghi"]
    fast, slow = MinHasher(seed=3, backend="numba"), MinHasher(seed=3, backend="numpy")
    assert (fast.backend, slow.backend) == ("numba", "numpy")
    for size in (1, 5, len(texts)):
        for i in range(0, len(texts), size):
            batch = texts[i: i + size]
            a, b = fast.shingle(batch), slow.shingle(batch)
            assert np.array_equal(a.hashes, b.hashes) and np.array_equal(a.offsets, b.offsets)
            sig_a, has_a = fast.signatures_from_shingles(a)
            sig_b, has_b = slow.signatures_from_shingles(b)
            assert np.array_equal(sig_a, sig_b) and np.array_equal(has_a, has_b)
    # Small widths exercise the short-document rule on both paths.
    small_a = MinHasher(num_perm=7, ngram=2, char_ngram=1, backend="numba").signatures(texts)
    small_b = MinHasher(num_perm=7, ngram=2, char_ngram=1, backend="numpy").signatures(texts)
    assert np.array_equal(small_a[0], small_b[0])


def test_numpy_backend_is_used_when_numba_is_disabled():
    code = "from dsdata.dedup.minhash import MinHasher; print(MinHasher().backend)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={"DSDATA_NO_NUMBA": "1", "PATH": "/usr/bin:/bin"}).stdout.strip()
    assert out == "numpy"
    with pytest.raises(ValueError, match="backend must be one of"):
        MinHasher(backend="gpu")


@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.int64])
def test_sorted_distinct_is_numpys_unique(dtype):
    from dsdata.dedup.minhash import sorted_distinct

    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 3, 50, 5000):
        for high in (2, 40, 1 << 30):
            values = rng.integers(0, high, size=n).astype(dtype)
            got, want = sorted_distinct(values), np.unique(values)
            assert got.dtype == want.dtype and got.tolist() == want.tolist()
