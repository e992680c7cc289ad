"""Compiled n-gram repetition statistics for the `rules` stage: the same numbers as its pure-Python
`_top_ngram_char_frac` / `_dup_ngram_char_frac`, for every n at once, in one numba call per document.

Imported only when numba is installed (and DSDATA_NO_NUMBA is not set); otherwise the stage runs
its pure-Python functions, which stay the reference — tests/test_rules_kernels.py checks that both
give identical verdicts and details on real and generated text.

Exact by construction, not by a hash that is "unlikely" to collide.  Tokens become dense integer ids
in the kernel: an FNV-1a hash of their code points, every hash match confirmed by comparing the
code points (equal ids ⇔ equal strings).  They cross into it as one space-joined string
(`str.join`/`lower`/`encode` at C speed), because a Python dict lookup per token cost more than the
whole n-gram kernel.  The class of the n-gram at position i is then built from two
shorter ones: class_n[i] = id of the pair (class_p[i], class_g[i+p]) with p + g = n, looked up in an
open-addressing table whose keys are the pair itself (class_p·K_g + class_g, an injective encoding),
compared in full on every probe.  A hash collision only lengthens a probe; two n-grams get the
same class exactly when their tokens are equal.  Classes are numbered in order of first occurrence,
so "the first of the most frequent n-grams" (what `Counter.most_common(1)` returns on a tie) is
the smallest class with the highest count, and the fractions are the same integer ratios
count·chars / total_chars, divided in Python as the reference does.

Cost: one pass per n-gram size in the plan (9 for the default Latin sizes 2…10, 11 for the CJK
sizes 4, 6, …, 20 because each size reuses a shorter one), instead of building a tuple per n-gram;
a position whose left or right part occurs once in the document is unique without a lookup, so in
prose the table is only touched for the few n-grams that can repeat.
`cache=True` keeps the machine code beside this file (or in numba's user cache when the package
directory is read-only): the first run in a fresh environment compiles for a few seconds, later
processes load it in a fraction of a second.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

_FIB = np.uint64(0x9E3779B97F4A7C15)


# Long on purpose: one compiled loop over the bytes; split into calls, numba would pass state between
# them through arrays or tuples each step (the point of the kernel is one pass without that).
@njit(cache=True, nogil=True, boundscheck=False)
def _ngram_char_counts(tok, tok_len, plan, sizes, top_slots, dup_slots):
    """(top_chars, dup_chars, total_chars) as integers.

    tok: dense token ids (first occurrence order), tok_len: characters per token; plan: rows
    (left_slot, right_slot) building slot r+1 from two earlier slots (slot 0 = single tokens);
    sizes: n-gram size of each slot; top_slots / dup_slots: the slot of each requested size.
    top_chars[k] = count·chars of the first most frequent n-gram; dup_chars[k] = characters of
    repeated n-grams, each repeat skipped over as a whole (the first occurrence not counted)."""
    n_tok = tok.shape[0]
    n_slots = plan.shape[0] + 1
    prefix = np.zeros(n_tok + 1, np.int64)
    for i in range(n_tok):
        prefix[i + 1] = prefix[i] + tok_len[i]
    classes = np.empty((n_slots, max(n_tok, 1)), np.int32)
    freq = np.zeros((n_slots, max(n_tok, 1)), np.int32)  # occurrences of each class
    n_classes = np.zeros(n_slots, np.int64)
    vocab = 0
    for i in range(n_tok):
        classes[0, i] = tok[i]
        freq[0, tok[i]] += 1
        if tok[i] >= vocab:
            vocab = tok[i] + 1
    n_classes[0] = vocab
    bits = 1
    while (1 << bits) < 2 * n_tok + 2:
        bits += 1
    cap = 1 << bits
    mask = cap - 1
    shift = np.uint64(64 - bits)
    keys = np.empty(cap, np.int64)
    vals = np.empty(cap, np.int32)
    for r in range(plan.shape[0]):
        left = plan[r, 0]
        right = plan[r, 1]
        out = r + 1
        width = n_tok - sizes[out] + 1
        if width <= 0:
            continue  # fewer tokens than one n-gram: the statistic is 0, as in the reference
        radix = n_classes[right]
        offset = sizes[left]
        keys[:] = -1
        count = 0
        for i in range(width):
            a = classes[left, i]
            b = classes[right, i + offset]
            if freq[left, a] == 1 or freq[right, b] == 1:
                # A part that occurs once in the document makes the whole n-gram unique: a new
                # class without a table lookup (in prose most n-grams of 3+ words take this path).
                classes[out, i] = count
                freq[out, count] = 1
                count += 1
                continue
            key = np.int64(a) * radix + b
            h = np.int64((np.uint64(key) * _FIB) >> shift)
            while True:
                k = keys[h]
                if k == key:
                    c = vals[h]
                    classes[out, i] = c
                    freq[out, c] += 1
                    break
                if k == -1:
                    keys[h] = key
                    vals[h] = count
                    classes[out, i] = count
                    freq[out, count] = 1
                    count += 1
                    break
                h = (h + 1) & mask
        n_classes[out] = count

    top_chars = np.zeros(top_slots.shape[0], np.int64)
    for t in range(top_slots.shape[0]):
        slot = top_slots[t]
        n = sizes[slot]
        if n_tok - n + 1 <= 0:
            continue
        best = 0
        for c in range(1, n_classes[slot]):
            if freq[slot, c] > freq[slot, best]:  # strict: a tie keeps the earlier n-gram, as most_common does
                best = c
        start = 0
        while classes[slot, start] != best:  # its first occurrence
            start += 1
        top_chars[t] = np.int64(freq[slot, best]) * (prefix[start + n] - prefix[start])

    dup_chars = np.zeros(dup_slots.shape[0], np.int64)
    for t in range(dup_slots.shape[0]):
        slot = dup_slots[t]
        n = sizes[slot]
        if n_tok - n + 1 <= 0 or n_classes[slot] == n_tok - n + 1:
            continue  # no n-gram at all, or every one unique: nothing repeats
        seen = np.zeros(n_classes[slot], np.bool_)
        total = 0
        i = 0
        while i <= n_tok - n:
            c = classes[slot, i]
            if seen[c]:
                total += prefix[i + n] - prefix[i]
                i += n
            else:
                seen[c] = True
                i += 1
        dup_chars[t] = total
    return top_chars, dup_chars, prefix[n_tok]


@lru_cache(maxsize=64)
def _plan(wanted: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
    """Rows (left_slot, right_slot) that build every wanted n-gram size from shorter ones, each
    size as (largest size already built) + (the rest), so Latin 2…10 is a chain of 9 steps and
    CJK 4, 6, …, 20 takes 11; the slot sizes; and size → slot."""
    slot_of = {1: 0}
    rows: list[tuple[int, int]] = []

    def build(size: int) -> None:
        if size in slot_of:
            return
        left = max(s for s in slot_of if s < size)
        build(size - left)
        rows.append((slot_of[left], slot_of[size - left]))
        slot_of[size] = len(rows)

    for size in sorted(wanted):
        build(size)
    sizes = np.zeros(len(rows) + 1, np.int64)
    for size, slot in slot_of.items():
        sizes[slot] = size
    return np.array(rows, np.int64).reshape(-1, 2), sizes, slot_of


_SPACE = 32
# FNV-1a over code points: the token hash (a match is always confirmed by comparing code points).
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


# Long on purpose: one compiled loop over the bytes; split into calls, numba would pass state between
# them through arrays or tuples each step (the point of the kernel is one pass without that).
@njit(cache=True, nogil=True, boundscheck=False)
def _token_ids(cps):
    """(dense token ids in first-occurrence order, characters per token) of code points holding
    tokens separated by single spaces.  Tokens are hashed, and a hash match is confirmed by
    comparing the code points, so equal ids ⇔ equal tokens (a collision only lengthens a probe)."""
    n = cps.shape[0]
    n_tok = 0
    if n > 0:
        n_tok = 1
        for j in range(n):
            if cps[j] == _SPACE:
                n_tok += 1
    starts = np.empty(n_tok, np.int64)
    ends = np.empty(n_tok, np.int64)
    t = 0
    start = 0
    for j in range(n + 1):
        if j == n or cps[j] == _SPACE:
            if n > 0:
                starts[t] = start
                ends[t] = j
                t += 1
            start = j + 1
    bits = 1
    while (1 << bits) < 2 * n_tok + 2:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    slot_tok = np.full(1 << bits, -1, np.int64)  # the first token with this slot's hash
    slot_hash = np.zeros(1 << bits, np.uint64)
    ids = np.empty(n_tok, np.int32)
    lengths = np.empty(n_tok, np.int64)
    id_of_first = np.empty(n_tok, np.int32)
    count = 0
    for t in range(n_tok):
        a = starts[t]
        b = ends[t]
        lengths[t] = b - a
        h = _FNV_OFFSET
        for j in range(a, b):
            h = (h ^ np.uint64(cps[j])) * _FNV_PRIME
        s = np.int64((h * _FIB) >> shift)
        while True:
            first = slot_tok[s]
            if first == -1:
                slot_tok[s] = t
                slot_hash[s] = h
                ids[t] = count
                id_of_first[t] = count
                count += 1
                break
            if slot_hash[s] == h and ends[first] - starts[first] == b - a:
                fa = starts[first]
                same = True
                for j in range(b - a):
                    if cps[fa + j] != cps[a + j]:
                        same = False
                        break
                if same:
                    ids[t] = id_of_first[first]
                    break
            s = (s + 1) & mask
    return ids, lengths


@njit(cache=True, nogil=True)
def _ngram_char_counts_of_text(cps, plan, sizes, top_slots, dup_slots):
    ids, lengths = _token_ids(cps)
    return _ngram_char_counts(ids, lengths, plan, sizes, top_slots, dup_slots)


def ngram_char_fractions(
    tokens: list[str], top_ns: list[int], dup_ns: list[int], lower: bool = False
) -> tuple[list[float], list[float]]:
    """The rules stage's top n-gram and duplicated n-gram character fractions of `tokens` (lower-cased
    first when `lower`), for each n in top_ns and dup_ns (every n ≥ 1) — equal to
    `_top_ngram_char_frac(toks, n)` and `_dup_ngram_char_frac(toks, n)` of the same tokens.

    Tokens must not contain a space (the rules stage's words never hold whitespace): they cross
    into the kernel as one space-separated string of code points, so that no Python code runs per
    token.  Lower-casing that string equals lower-casing each token: a space is neither cased nor
    case-ignorable, so it bounds the context of the final-sigma rule exactly as a token's ends do,
    and no character lower-cases to a space."""
    joined = " ".join(tokens)
    if lower:
        joined = joined.lower()
    cps = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32)
    plan, sizes, slot_of = _plan(tuple(sorted(set(top_ns) | set(dup_ns))))
    top, dup, total = _ngram_char_counts_of_text(
        cps, plan, sizes,
        np.array([slot_of[n] for n in top_ns], np.int64), np.array([slot_of[n] for n in dup_ns], np.int64),
    )
    # Python int / int, as the reference computes count * chars / total (correctly rounded).
    total = int(total)
    if not total:
        return [0.0] * len(top_ns), [0.0] * len(dup_ns)
    return [int(v) / total for v in top], [int(v) / total for v in dup]
