"""The rules stage's compiled pass: every count its checks read, from one walk over the document's
code points, and its top / duplicated n-gram character fractions for every n at once.

Imported only with numba (and DSDATA_NO_NUMBA unset); otherwise the stage runs its regex reference,
and tests/test_rules_kernels.py checks both give the same counts, fractions and verdicts.  Character
classes come from a table built from the stage's own regex classes.  Exact by construction: words,
lines and paragraphs become dense ids through a hash whose every match is confirmed by comparing
code points, and n-gram classes are keyed by the id pair itself, so a collision only lengthens a
probe.  On a tie the smallest class wins, as Counter.most_common(1) does.
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from dsdata.compiled import export, njit

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
    keys = np.full(cap, -1, np.int64)
    vals = np.empty(cap, np.int32)
    used = np.empty(cap, np.int64)  # the slots a size filled, emptied for the next (not all cap of them)
    n_used = 0
    for r in range(plan.shape[0]):
        left = plan[r, 0]
        right = plan[r, 1]
        out = r + 1
        width = n_tok - sizes[out] + 1
        if width <= 0:
            continue  # fewer tokens than one n-gram: the statistic is 0, as in the reference
        radix = n_classes[right]
        offset = sizes[left]
        for j in range(n_used):
            keys[used[j]] = -1
        n_used = count = 0
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
                    used[n_used] = h
                    n_used += 1
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
def _plan(top_ns: tuple[int, ...], dup_ns: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Rows (left_slot, right_slot) that build every wanted n-gram size from shorter ones, each
    size as (largest size already built) + (the rest), so Latin 2…10 is a chain of 9 steps and
    CJK 4, 6, …, 20 takes 11; the slot sizes; the slots of top_ns and of dup_ns."""
    slot_of = {1: 0}
    rows: list[tuple[int, int]] = []

    def build(size: int) -> None:
        if size in slot_of:
            return
        left = max(s for s in slot_of if s < size)
        build(size - left)
        rows.append((slot_of[left], slot_of[size - left]))
        slot_of[size] = len(rows)

    for size in sorted(set(top_ns) | set(dup_ns)):
        build(size)
    sizes = np.zeros(len(rows) + 1, np.int64)
    for size, slot in slot_of.items():
        sizes[slot] = size
    slots = [np.array([slot_of[n] for n in ns], np.int64) for ns in (top_ns, dup_ns)]
    return np.array(rows, np.int64).reshape(-1, 2), sizes, *slots


# Bits of the per-code-point class table; class_table gets one regex character class per name.
CLASSES = ("space", "cjk", "alnum", "letter", "sentence_end", "closer", "bullet", "terminal", "strip")
SPACE, CJK, ALNUM, LETTER, SENTENCE_END, CLOSER, BULLET, TERMINAL, STRIP = (1 << i for i in range(len(CLASSES)))
# What the stage counts, in the order _measure returns it.
COUNTS = ("sentences", "words", "lettered", "nonsym", "nonsym_chars", "cjk_nonsym", "symbols", "newlines",
          "lines", "bullet_lines", "ellipsis_lines", "punct_lines", "short_lines", "line_dup", "line_dup_chars",
          "line_chars", "paragraphs", "para_dup", "para_dup_chars", "para_chars", "stop_words")
_N_COUNTS = len(COUNTS)
_NL, _HASH, _DOT, _ELLIPSIS, _IDEO_STOP, _IDEO_BANG, _IDEO_QUERY = 10, 35, 46, 0x2026, 0x3002, 0xFF01, 0xFF1F
# FNV-1a over code points: the span hash (a match is always confirmed by comparing code points).
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@lru_cache(maxsize=4)
def class_table(**patterns: str) -> np.ndarray:
    """uint16 per code point (all 0x110000): bit i where the regex character class patterns[CLASSES[i]]
    matches it, so the kernels classify a character exactly as the stage's regexes do (~0.1 CPU-s, once)."""
    everything = np.arange(0x110000, dtype=np.uint32).tobytes().decode("utf-32-le", "surrogatepass")
    table = np.zeros(0x110000, np.uint16)
    for bit, name in enumerate(CLASSES):
        for m in re.finditer(f"(?:{patterns[name]})+", everything):
            table[m.start() : m.end()] |= 1 << bit
    return table


def code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)


@export("UniTuple(int64, 3)(uint32[::1], uint16[::1])", cache=True, nogil=True, boundscheck=False)
def prescan(cps, cls):
    """(letters, CJK letters, longest run of non-space non-CJK characters): the CJK ratio and the C4
    long-word gate of the text as it arrives."""
    letters = cjk_letters = longest = run = 0
    for i in range(cps.shape[0]):
        k = cls[cps[i]]
        if k & LETTER:
            letters += 1
            if k & CJK:
                cjk_letters += 1
        if k & (SPACE | CJK):
            run = 0
        else:
            run += 1
            longest = max(longest, run)
    return letters, cjk_letters, longest


# Long on purpose: every count of the text in one loop over its code points (words, sentence ends,
# symbols, lines, paragraphs); split into calls, each would walk the text again.
@njit(cache=True, nogil=True, boundscheck=False)
def _text_counts(cps, cls, short_limit, counts):
    """Fills counts[:13] and counts[16] (COUNTS order) and returns the spans of the stripped
    non-empty lines and of the stripped non-empty paragraphs.  A paragraph is a group of non-empty
    lines without a blank line between them (re.split(r"\\n\\s*\\n"): a whitespace run holding two
    newlines is a blank line)."""
    n = cps.shape[0]
    newlines = 0
    for i in range(n):
        newlines += cps[i] == _NL
    lines = np.empty((newlines + 1, 2), np.int64)
    paras = np.empty((newlines + 1, 2), np.int64)
    n_lines = n_paras = sentences = words = lettered = nonsym = nonsym_chars = cjk_nonsym = symbols = 0
    bullets = ellipses = terminated = short = run = run_alnum = run_letter = dots = ideo = ends = ends_cjk = 0
    line_start = 0
    blank = False
    for i in range(n + 1):
        c = cps[i] if i < n else _NL
        k = cls[c] if i < n else SPACE
        if k & (SPACE | CJK):  # a word ends; a CJK character is a word of its own
            if run:
                words += 1
                lettered += run_letter != 0
                nonsym += run_alnum != 0
                nonsym_chars += run if run_alnum else 0
            run = run_alnum = run_letter = 0
            if k & CJK:
                words += 1
                lettered += (k & LETTER) != 0
                nonsym += (k & ALNUM) != 0
                nonsym_chars += (k & ALNUM) != 0
                cjk_nonsym += (k & ALNUM) != 0
        else:
            run += 1
            run_alnum |= k & ALNUM
            run_letter |= k & LETTER
        # '#', '…' and the non-overlapping '...' and '。。。' of str.count
        symbols += (c == _HASH) + (c == _ELLIPSIS) + (0 if c == _DOT else dots // 3) + (0 if c == _IDEO_STOP else ideo // 3)
        dots = dots + 1 if c == _DOT else 0
        ideo = ideo + 1 if c == _IDEO_STOP else 0
        # _SENTENCE_END: a run of terminators followed by whitespace, a closer or the end is one
        # sentence; any other run counts its 。！？
        if k & SENTENCE_END:
            ends += 1
            ends_cjk += c == _IDEO_STOP or c == _IDEO_BANG or c == _IDEO_QUERY
        elif ends:
            sentences += 1 if k & (SPACE | CLOSER) else ends_cjk
            ends = ends_cjk = 0
        if c == _NL:  # a line ends: strip it
            a, b = line_start, i
            line_start = i + 1
            while a < b and cls[cps[a]] & SPACE:
                a += 1
            while b > a and cls[cps[b - 1]] & SPACE:
                b -= 1
            if a == b:
                blank = True
                continue
            lines[n_lines, 0], lines[n_lines, 1] = a, b
            n_lines += 1
            if blank or not n_paras:
                paras[n_paras, 0] = a
                n_paras += 1
            paras[n_paras - 1, 1] = b
            blank = False
            bullets += (cls[cps[a]] & BULLET) != 0
            e = cps[b - 1]
            ellipses += e == _ELLIPSIS or (b - a >= 3 and (e == _DOT or e == _IDEO_STOP) and cps[b - 2] == e and cps[b - 3] == e)
            terminated += (cls[e] & TERMINAL) != 0
            short += b - a < short_limit
    counts[:13] = np.array((sentences, words, lettered, nonsym, nonsym_chars, cjk_nonsym, symbols, newlines,
                            n_lines, bullets, ellipses, terminated, short))
    counts[16] = n_paras
    return lines[:n_lines], paras[:n_paras]


@njit(cache=True, nogil=True, boundscheck=False)
def _span_ids(cps, spans):
    """(dense ids in first-occurrence order, lengths) of the strings cps[a:b] for (a, b) in spans:
    hashed, and every hash match confirmed by comparing code points, so equal ids ⇔ equal strings."""
    n_span = spans.shape[0]
    bits = 1
    while (1 << bits) < 2 * n_span + 2:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    slot_span = np.full(1 << bits, -1, np.int64)  # the first span with this slot's hash
    slot_hash = np.zeros(1 << bits, np.uint64)
    ids = np.empty(n_span, np.int32)
    lengths = np.empty(n_span, np.int64)
    count = 0
    for t in range(n_span):
        a, b = spans[t, 0], spans[t, 1]
        lengths[t] = b - a
        h = _FNV_OFFSET
        for j in range(a, b):
            h = (h ^ np.uint64(cps[j])) * _FNV_PRIME
        s = np.int64((h * _FIB) >> shift)
        while True:
            first = slot_span[s]
            if first == -1:
                slot_span[s] = t
                slot_hash[s] = h
                ids[t] = count
                count += 1
                break
            fa = spans[first, 0]
            if slot_hash[s] == h and spans[first, 1] - fa == b - a:
                same = True
                for j in range(b - a):
                    if cps[fa + j] != cps[a + j]:
                        same = False
                        break
                if same:
                    ids[t] = ids[first]
                    break
            s = (s + 1) & mask
    return ids, lengths


@njit(cache=True, nogil=True)
def _dup_counts(cps, spans, counts, at):
    """counts[at:at+3] = (spans repeating an earlier one, their characters, all characters)."""
    ids, lengths = _span_ids(cps, spans)
    seen = np.zeros(ids.shape[0], np.bool_)
    for t in range(ids.shape[0]):
        if seen[ids[t]]:
            counts[at] += 1
            counts[at + 1] += lengths[t]
        seen[ids[t]] = True
        counts[at + 2] += lengths[t]


@njit(cache=True, nogil=True, boundscheck=False)
def _word_spans(cps, cls):
    """Spans of the words with a letter or digit: a CJK one is one character, any other a run of
    non-space non-CJK characters."""
    n = cps.shape[0]
    spans = np.empty((n, 2), np.int64)
    t = start = 0
    alnum = False
    for i in range(n + 1):
        k = cls[cps[i]] if i < n else SPACE
        if k & (SPACE | CJK):
            if alnum:
                spans[t, 0], spans[t, 1] = start, i
                t += 1
            alnum = False
            start = i + 1
            if k & CJK and k & ALNUM:
                spans[t, 0], spans[t, 1] = i, i + 1
                t += 1
        elif k & ALNUM:
            alnum = True
    return spans[:t]


@njit(cache=True, nogil=True, boundscheck=False)
def _stop_word_count(cps, cls, spans, ids, strip, stops, stop_lens):
    """Words that, less their leading and trailing `strip`-class characters, are a row of stops."""
    is_stop = np.zeros(ids.shape[0] + 1, np.bool_)
    done = np.zeros(ids.shape[0] + 1, np.bool_)
    found = 0
    for t in range(ids.shape[0]):
        w = ids[t]
        if not done[w]:  # each distinct word tested once
            done[w] = True
            a, b = spans[t, 0], spans[t, 1]
            while a < b and cls[cps[a]] & strip:
                a += 1
            while b > a and cls[cps[b - 1]] & strip:
                b -= 1
            for r in range(stops.shape[0]):
                if stop_lens[r] == b - a:
                    j = 0
                    while j < b - a and stops[r, j] == cps[a + j]:
                        j += 1
                    is_stop[w] = is_stop[w] or j == b - a
        found += is_stop[w]
    return found


@export(
        "int64[::1](uint32[::1], uint32[::1], uint16[::1], int64, int64, uint32[:, ::1], int64[::1], "
        "int64[:, ::1], int64[::1], int64[::1], int64[::1])",
        cache=True, nogil=True)
def _measure(cps, low, cls, short_limit, strip, stops, stop_lens, plan, sizes, top_slots, dup_slots):
    counts = np.zeros(_N_COUNTS, np.int64)
    lines, paras = _text_counts(cps, cls, short_limit, counts)
    _dup_counts(cps, lines, counts, 13)
    _dup_counts(cps, paras, counts, 17)
    spans = _word_spans(low, cls)
    ids, lengths = _span_ids(low, spans)
    counts[20] = _stop_word_count(low, cls, spans, ids, strip, stops, stop_lens)
    top, dup, total = _ngram_char_counts(ids, lengths, plan, sizes, top_slots, dup_slots)
    return np.concatenate((counts, top, dup, np.array([total])))  # one array: one boxing on return


@lru_cache(maxsize=8)
def _stop_array(words: frozenset) -> tuple[np.ndarray, np.ndarray]:
    rows = [code_points(w) for w in sorted(words)]
    stops = np.zeros((len(rows), max(map(len, rows), default=0)), np.uint32)
    for r, row in enumerate(rows):
        stops[r, : len(row)] = row
    return stops, np.array([len(row) for row in rows], np.int64)


def measure(text: str, low: str | None, table: np.ndarray, short_limit: int, stop_words: frozenset,
            strip: bool, top_ns: tuple[int, ...], dup_ns: tuple[int, ...]) -> tuple[dict[str, int], list[float], list[float]]:
    """The rules stage's counts of `text` (COUNTS) and its top / duplicated n-gram character
    fractions for each n.  The n-grams and stop words are of the words of `low` (text itself when
    None): the lower-cased text, or its words lower-cased and joined by spaces (the same words, see
    the stage).  Stop words are compared without their leading and trailing STRIP characters when
    `strip`."""
    cps = code_points(text)
    out = _measure(cps, cps if low is None else code_points(low), table, short_limit, STRIP if strip else 0,
                   *_stop_array(stop_words), *_plan(top_ns, dup_ns)).tolist()
    # Python int / int, as the reference computes count * chars / total (correctly rounded).
    total, chars = out[-1], out[_N_COUNTS:-1]
    fractions = [v / total if total else 0.0 for v in chars]
    return dict(zip(COUNTS, out)), fractions[: len(top_ns)], fractions[len(top_ns) :]
