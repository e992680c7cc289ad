"""Optional numba kernel for `dsdata.clean.html._tag_names_python`: the same answer from one pass over the
page's UTF-8 bytes in machine code (the Python path stays the reference; tests compare both).

A raw-text start tag (script, …) skips to the first case-insensitive `</name` as Python's
re.IGNORECASE finds it (`ſ` matches `s`, `İ`/`ı` match `i`).  UTF-8 keeps every ASCII byte for
itself, so the byte scan sees the tags the text scan sees.  Names are exact keys of an
open-addressing table sized for the worst case up front.
"""
from __future__ import annotations

import numpy as np

from dsdata.compiled import export, njit

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)

# Entry flags.
_NO_LEVEL_FLAG = 1
_RAW_FLAG = 2


@njit(cache=True, nogil=True, inline="always")
def _lower(c):
    return c + 32 if 65 <= c <= 90 else c


@njit(cache=True, nogil=True, inline="always")
def _is_letter(c):
    return (65 <= c <= 90) or (97 <= c <= 122)


@njit(cache=True, nogil=True, inline="always")
def _is_name_char(c):
    return (65 <= c <= 90) or (97 <= c <= 122) or (48 <= c <= 57) or c == 58 or c == 45


@njit(cache=True, nogil=True, boundscheck=False)
def _hash(b, start, length):
    h = _FNV_OFFSET
    for k in range(start, start + length):
        h ^= np.uint64(_lower(b[k]))
        h *= _FNV_PRIME
    return h


@njit(cache=True, nogil=True, boundscheck=False)
def _end_tag_at(b, p, end, store, key_start, key_len):
    """Whether `</name` (as re.IGNORECASE matches it on text) starts at byte p and ends by `end`."""
    if p + 1 >= end or b[p] != 60 or b[p + 1] != 47:
        return False
    q = p + 2
    for k in range(key_start, key_start + key_len):
        c = store[k]
        if q < end and _lower(b[q]) == c:
            q += 1
        elif c == 115 and q + 1 < end and b[q] == 0xC5 and b[q + 1] == 0xBF:  # ſ U+017F for s
            q += 2
        elif c == 105 and q + 1 < end and b[q] == 0xC4 and (b[q + 1] == 0xB0 or b[q + 1] == 0xB1):  # İ ı for i
            q += 2
        else:
            return False
    return True


# Long on purpose: one compiled loop over the bytes; split into calls, numba would pass state between
# them through arrays or tuples each step (the point of the kernel is one pass without that).
@export(
        "Tuple((boolean, boolean, uint8[::1], int64[::1], int64[::1], int8[::1], int64))(uint8[::1], "
        "int64, int64, uint8[::1], int64[::1], int64[::1])",
        cache=True, nogil=True, boundscheck=False)
def tag_scan(b, end, max_depth, known, known_offsets, known_flags):
    """Scan b[:end] (end: just after the page's last `>`).

    known / known_offsets / known_flags: the names that open no level or are raw-text elements
    (lower-case ASCII, concatenated), with their flags.  Returns (within, saw_raw, store,
    key_start, key_len, seen, longest): within is False when the count sum went above max_depth
    (the scan stops there); otherwise the names of every tag met (start or end, raw-text start
    tags excepted) are the entries with seen == 1, their bytes store[key_start:key_start +
    key_len], and saw_raw tells whether a raw-text start tag was met (the Python path's empty
    name).  longest: the most bytes from a tag's `<` to its `>` (excluded) among the tags scanned."""
    # Every table is sized up front (a page cannot have more names than `<`, nor more name bytes
    # than bytes): arrays that may be swapped inside the loop cost a reference count per step.
    n_known = known_flags.shape[0]
    tags = 0
    for i in range(end):
        tags += b[i] == 60
    max_entries = n_known + tags
    cap = 64
    while cap < 2 * max_entries:
        cap *= 2
    mask = np.uint64(cap - 1)
    slots = np.full(cap, -1, np.int64)
    key_start = np.empty(max_entries, np.int64)
    key_len = np.empty(max_entries, np.int64)
    key_hash = np.empty(max_entries, np.uint64)
    flags = np.zeros(max_entries, np.int64)
    counts = np.zeros(max_entries, np.int64)
    seen = np.zeros(max_entries, np.int8)
    store = np.empty(known.shape[0] + end, np.uint8)
    n_entries = 0
    store_len = 0

    # The known names go in first.
    for e in range(n_known):
        s, n = known_offsets[e], known_offsets[e + 1] - known_offsets[e]
        for k in range(n):
            store[store_len + k] = known[s + k]
        h = _hash(store, store_len, n)
        slot = np.int64(h & mask)
        while slots[slot] != -1:
            slot = (slot + 1) & (cap - 1)
        slots[slot] = n_entries
        key_start[n_entries], key_len[n_entries], key_hash[n_entries] = store_len, n, h
        flags[n_entries] = known_flags[e]
        n_entries += 1
        store_len += n

    depth = 0
    saw_raw = False
    within = True
    longest = 0
    i = 0
    while i < end:
        if b[i] != 60:  # '<'
            i += 1
            continue
        j = i + 1
        closing = False
        if j < end and b[j] == 47:  # '/'
            closing = True
            j += 1
        if j >= end or not _is_letter(b[j]):
            i += 1
            continue
        name_start = j
        while j < end and _is_name_char(b[j]):
            j += 1
        name_len = j - name_start
        # The tag ends at the next '>' (there is one: b[end - 1] is the page's last '>').
        gt = j
        while gt < end and b[gt] != 62:
            gt += 1
        if gt - i > longest:
            longest = gt - i
        # Find or add the name.
        h = _hash(b, name_start, name_len)
        slot = np.int64(h & mask)
        entry = -1
        while True:
            e = slots[slot]
            if e == -1:
                break
            if key_hash[e] == h and key_len[e] == name_len:
                same = True
                ks = key_start[e]
                for k in range(name_len):
                    if store[ks + k] != _lower(b[name_start + k]):
                        same = False
                        break
                if same:
                    entry = e
                    break
            slot = (slot + 1) & (cap - 1)
        if entry != -1 and not closing and (flags[entry] & _RAW_FLAG) != 0:
            saw_raw = True
            p = gt + 1
            found = end
            while p < end:
                if b[p] == 60 and _end_tag_at(b, p, end, store, key_start[entry], key_len[entry]):
                    found = p
                    break
                p += 1
            i = found
            continue
        if entry == -1:
            for k in range(name_len):
                store[store_len + k] = _lower(b[name_start + k])
            slots[slot] = n_entries
            key_start[n_entries], key_len[n_entries], key_hash[n_entries] = store_len, name_len, h
            entry = n_entries
            n_entries += 1
            store_len += name_len
        seen[entry] = 1
        if (flags[entry] & _NO_LEVEL_FLAG) == 0:
            if closing:
                if counts[entry] > 0:
                    counts[entry] -= 1
                    depth -= 1
            else:
                counts[entry] += 1
                depth += 1
                if depth > max_depth:
                    within = False
                    break
        i = gt + 1
    return within, saw_raw, store[:store_len], key_start[:n_entries], key_len[:n_entries], seen[:n_entries], longest
