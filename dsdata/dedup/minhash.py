"""MinHash signatures for whole batches of documents, vectorised with numpy.

Folding, shingling, hashing and the permutations: docs/dedup.md ("How it works").  With numba, the
shingle hashing and the minima run as compiled loops (numba_kernels.py); the numpy code below
computes identical signatures (tests compare the two).
"""
from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dsdata.compiled import import_compiled

# Scripts written without spaces between words: word shingles would see one giant "word".
_NO_SPACE_RANGES = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3400, 0x4DBF),  # CJK Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0x20000, 0x3FFFF),  # CJK Extensions B–H
)
# Share of a document's word characters from those scripts above which it is shingled by
# characters.  Low on purpose: Chinese technical text is full of Latin option names, and character
# shingles still work on the Latin part, whereas word shingles fail on the Chinese part.
CHAR_SCRIPT_SHARE = 0.2
_U64 = np.uint64
_POLY_BASE = 0x9E3779B97F4A7C15  # odd, so invertible mod 2^64
_POLY_BASE_INV = pow(_POLY_BASE, -1, 1 << 64)
_TOKEN_BASE = 0xC2B2AE3D27D4EB4F  # odd; the second-level polynomial runs over token hashes
_TOKEN_BASE_INV = pow(_TOKEN_BASE, -1, 1 << 64)

# Character classes: 0 = separator (punctuation, symbols, spaces, controls), 1 = word character
# (letters, marks, digits), 2 = word character of a script without spaces.  Code points above the
# table count as word characters.
_NON_WORD, _WORD, _WORD_NO_SPACE = 0, 1, 2
_TABLE_SIZE = 0x40000


@lru_cache(maxsize=1)
def _classes_table() -> np.ndarray:
    table = np.zeros(_TABLE_SIZE, dtype=np.uint8)
    for cp in range(_TABLE_SIZE):
        if unicodedata.category(chr(cp))[0] in "LMN":
            table[cp] = _WORD
    for lo, hi in _NO_SPACE_RANGES:
        seg = table[lo: min(hi, _TABLE_SIZE - 1) + 1]
        seg[seg == _WORD] = _WORD_NO_SPACE
    return table


def _classify(codepoints: np.ndarray) -> np.ndarray:
    return _classes_table()[np.minimum(codepoints, _TABLE_SIZE - 1)]


def fold(text: str) -> str:
    """NFKC and lower-case: the first step of both normalisations."""
    # str.lower has an ASCII fast path that casefold lacks; the two differ only on a few letters (ß).
    return unicodedata.normalize("NFKC", text).lower()


def normalise_for_shingles(text: str) -> str:
    """NFKC, lower-case, and turn each run of non-word characters (not letter/mark/digit) into one space."""
    folded = fold(text)
    cps = np.frombuffer(folded.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).copy()
    cps[_classify(cps) == _NON_WORD] = 32
    return " ".join(cps.tobytes().decode("utf-32-le", "surrogatepass").split())


def exact_hash(text: str, folded: str | None = None) -> bytes:
    """16-byte blake2b digest of the exact-dedup normalisation of `text` (pass `folded` =
    `fold(text)` when it is already at hand)."""
    folded = fold(text) if folded is None else folded
    return hashlib.blake2b(" ".join(folded.split()).encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _uses_char_shingles(n_word: int, n_no_space: int) -> bool:
    return n_no_space > CHAR_SCRIPT_SHARE * np.maximum(n_word, 1)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (in place on a uint64 array)."""
    x ^= x >> _U64(30)
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """np.unique(values) for a 1-D integer array, by one stable sort: numpy 2.3+ answers np.unique
    by hashing, then sorting what is left, several times slower on shingle hashes."""
    out = np.sort(values, kind="stable")
    if len(out) > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out


def _powers(base: int, n: int) -> np.ndarray:
    arr = np.full(n, base, dtype=np.uint64)
    arr[:1] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(arr, dtype=np.uint64)


class _PowerTable:
    """base^i and base^-i mod 2^64 for i < n, grown on demand."""

    def __init__(self, base: int, inverse: int):
        self.base, self.inverse = base, inverse
        self.pow = self.inv = np.ones(0, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.pow) < n:
            size = max(n, 2 * len(self.pow), 1024)
            self.pow, self.inv = _powers(self.base, size), _powers(self.inverse, size)
        return self.pow[:n], self.inv[:n]


def _span_hashes(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, table: _PowerTable) -> np.ndarray:
    """Polynomial hash Σ values[j]·B^(j−s) of every span [s, e), via prefix sums mod 2^64."""
    n = len(values)
    pw, inv = table.get(n + 1)
    prefix = np.zeros(n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.cumsum(values * pw[:n], out=prefix[1:])
        return (prefix[ends] - prefix[starts]) * inv[starts]


BACKENDS = ("auto", "numba", "numpy")


@lru_cache(maxsize=1)
def numba_kernels():
    """dsdata.dedup.numba_kernels, or None when numba is not installed (or DSDATA_NO_NUMBA=1)."""
    return import_compiled("dsdata.dedup.numba_kernels") or None


@dataclass
class ShingledBatch:
    """Shingle hashes of a batch: `hashes[offsets[i]:offsets[i+1]]` belong to document i."""

    hashes: np.ndarray  # uint64, one per shingle occurrence
    offsets: np.ndarray  # int64, len = documents + 1
    char_mode: np.ndarray  # bool per document: shingled by characters


class MinHasher:
    """Batched MinHash: texts → (documents × num_perm) uint32 signatures.

    ngram: words per shingle for space-separated text; char_ngram: characters per shingle for
    scripts without spaces; seed: selects the permutations (same seed ⇒ same signatures);
    backend: "auto" (numba when installed, else numpy), "numba" or "numpy" — all give the same values.
    """

    def __init__(self, num_perm: int = 128, ngram: int = 5, char_ngram: int = 5, seed: int = 1,
                 backend: str = "auto"):
        if num_perm < 1 or ngram < 1 or char_ngram < 1:
            raise ValueError("num_perm, ngram and char_ngram must be positive")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        self.kernels = numba_kernels() if backend != "numpy" else None
        if backend == "numba" and self.kernels is None:
            raise ValueError("backend='numba' needs numba: pip install numba (or use backend='auto')")
        self.backend = "numba" if self.kernels is not None else "numpy"
        self.num_perm, self.ngram, self.char_ngram, self.seed = num_perm, ngram, char_ngram, seed
        digests = (hashlib.blake2b(repr(("dsdata.minhash", seed, k)).encode(), digest_size=8).digest()
                   for k in range(num_perm))
        params = [int.from_bytes(d, "little") for d in digests]
        self.a = np.array([(p & 0xFFFFFFFF) | 1 for p in params], dtype=np.uint32)
        self.b = np.array([p >> 32 for p in params], dtype=np.uint32)
        self._char_powers = _PowerTable(_POLY_BASE, _POLY_BASE_INV)
        self._token_powers = _PowerTable(_TOKEN_BASE, _TOKEN_BASE_INV)

    # -- shingling -------------------------------------------------------------------------------
    def shingle(self, texts: list[str], folded: list[str] | None = None) -> ShingledBatch:
        """Normalise and shingle a batch; returns the 64-bit hash of every shingle occurrence.

        folded: `[fold(t) for t in texts]` when the caller already has it."""
        n_docs = len(texts)
        folded = [fold(t) for t in texts] if folded is None else folded
        # One separator after every document keeps tokens from running across documents.
        doc_start = np.zeros(n_docs + 1, dtype=np.int64)
        np.cumsum([len(t) + 1 for t in folded], out=doc_start[1:])
        cps = np.frombuffer(("\x00".join(folded) + "\x00").encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        if self.kernels is not None:
            hashes, offsets, char_mode = self.kernels.shingle_hashes(
                cps, _classes_table(), doc_start, self.ngram, self.char_ngram, CHAR_SCRIPT_SHARE,
                _U64(_POLY_BASE), _U64(_TOKEN_BASE))
            return ShingledBatch(hashes, offsets, char_mode)
        cls = _classify(cps)
        word = cls != _NON_WORD
        n_word = np.add.reduceat(word, doc_start[:-1], dtype=np.int64) if n_docs else np.zeros(0, np.int64)
        n_no_space = (
            np.add.reduceat(cls == _WORD_NO_SPACE, doc_start[:-1], dtype=np.int64) if n_docs else np.zeros(0, np.int64)
        )
        char_mode = _uses_char_shingles(n_word, n_no_space)
        # Tokens: every word character of a character-shingled document; maximal runs of word
        # characters otherwise.
        per_char = np.repeat(char_mode, np.diff(doc_start))
        prev_word = np.zeros_like(word)
        prev_word[1:] = word[:-1]
        next_word = np.zeros_like(word)
        next_word[:-1] = word[1:]
        tok_start = np.flatnonzero(word & (per_char | ~prev_word))
        tok_end = np.flatnonzero(word & (per_char | ~next_word)) + 1
        token_hash = _mix64(_span_hashes(cps.astype(np.uint64), tok_start, tok_end, self._char_powers))
        tok_doc = np.searchsorted(doc_start, tok_start, side="right") - 1
        n_tok = len(tok_start)
        tokens_per_doc = np.bincount(tok_doc, minlength=n_docs)
        width = np.where(char_mode, self.char_ngram, self.ngram)
        # Shingle j of a document spans tokens j … j+width−1; a document with fewer tokens than
        # one shingle becomes one shingle of all its tokens.
        span = np.minimum(width, np.maximum(tokens_per_doc, 1))[tok_doc]
        last = np.arange(n_tok) + span - 1
        valid = last < n_tok
        valid[valid] &= tok_doc[last[valid]] == tok_doc[valid]
        first = np.flatnonzero(valid)
        hashes = _mix64(_span_hashes(token_hash, first, last[first] + 1, self._token_powers))
        offsets = np.zeros(n_docs + 1, dtype=np.int64)
        np.cumsum(np.bincount(tok_doc[first], minlength=n_docs), out=offsets[1:])
        return ShingledBatch(hashes, offsets, char_mode)

    def shingle_sets(self, texts: list[str]) -> list[np.ndarray]:
        """Distinct shingle hashes per document (for exact Jaccard in tests and benchmarks)."""
        batch = self.shingle(texts)
        return [np.unique(batch.hashes[batch.offsets[i]: batch.offsets[i + 1]]) for i in range(len(texts))]

    @staticmethod
    def distinct_top32(batch: ShingledBatch) -> list[np.ndarray]:
        """Per document, the sorted distinct top-32-bit shingle hashes (one sort for the batch)."""
        n_docs = len(batch.offsets) - 1
        doc = np.repeat(np.arange(n_docs, dtype=np.uint64), np.diff(batch.offsets))
        keys = sorted_distinct((doc << _U64(32)) | (batch.hashes >> _U64(32)))
        bounds = np.searchsorted(keys >> _U64(32), np.arange(n_docs + 1, dtype=np.uint64))
        values = (keys & _U64(0xFFFFFFFF)).astype(np.uint32)
        return [values[bounds[i]: bounds[i + 1]] for i in range(n_docs)]

    # -- signatures ------------------------------------------------------------------------------
    def signatures_from_shingles(self, batch: ShingledBatch) -> tuple[np.ndarray, np.ndarray]:
        """(signatures uint32 [docs × num_perm], has_shingles bool [docs]).

        A document without shingles (empty after normalisation) gets all-0xFFFFFFFF and False."""
        n_docs = len(batch.offsets) - 1
        counts = np.diff(batch.offsets)
        has = counts > 0
        if self.kernels is not None:
            sig = np.empty((n_docs, self.num_perm), dtype=np.uint32)
            x = (batch.hashes >> _U64(32)).astype(np.uint32)
            self.kernels.signatures(x, batch.offsets.astype(np.int64), self.a, self.b, sig)
            return sig, has
        sig = np.full((n_docs, self.num_perm), 0xFFFFFFFF, dtype=np.uint32)
        if not has.any():
            return sig, has
        x = (batch.hashes >> _U64(32)).astype(np.uint32)
        starts = batch.offsets[:-1][has]
        rows = np.flatnonzero(has)
        tmp = np.empty_like(x)
        out = np.empty((len(starts), self.num_perm), dtype=np.uint32)
        for k in range(self.num_perm):
            np.multiply(x, self.a[k], out=tmp)
            tmp += self.b[k]
            out[:, k] = np.minimum.reduceat(tmp, starts)
        sig[rows] = out
        return sig, has

    def signatures(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Signatures of a batch of texts; see `signatures_from_shingles`."""
        return self.signatures_from_shingles(self.shingle(texts))


def shingle_strings(text: str, ngram: int = 5, char_ngram: int = 5) -> list[str]:
    """The shingles `MinHasher.shingle` hashes, as strings (for peers in benchmarks and tests)."""
    norm = normalise_for_shingles(text)
    if not norm:
        return []
    cls = _classify(np.frombuffer(norm.encode("utf-32-le", "surrogatepass"), dtype=np.uint32))
    if _uses_char_shingles(int((cls != _NON_WORD).sum()), int((cls == _WORD_NO_SPACE).sum())):
        chars = norm.replace(" ", "")
        n = min(char_ngram, len(chars))
        return [chars[i: i + n] for i in range(len(chars) - n + 1)]
    words = norm.split(" ")
    n = min(ngram, len(words))
    return [" ".join(words[i: i + n]) for i in range(len(words) - n + 1)]
