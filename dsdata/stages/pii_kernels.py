"""Compiled first look for the `pii` stage's digit kinds: where in a document the number pattern
(pii_kinds._number_pattern) can match, in one numba pass over the normalised text's code points.

It finds the runs that pii_kinds._HINT finds, applies the same gate (_gate), and for each run the
first position at which one of the chosen shapes could start.  Python's `re` then runs the real
pattern from there: which shape and which end a match has (the first alternative that fits, greedy
backtracking) stays the regex's answer.  So the kernel only has to be sound — it never calls a
position hopeless where the pattern matches (tests/test_pii.py checks that against the regex on
fuzzed text) — and it spares the regex the runs where nothing can match (coordinates, ISBNs,
versions, dates, long digit strings: most of a run's cost is proving that) and the positions before
the first candidate.  Reads stop where the regex's search stops (16 characters after the run).
"""
from __future__ import annotations

import numpy as np
from numba import njit

# Shape bits (the `shapes` argument): which shapes the chosen kinds use.
PLUS, INTL, ID, CARD, LAND, NANP, MOBILE, IPV4 = (1 << i for i in range(8))
BITS = {"plus": PLUS, "intl": INTL, "id": ID, "card": CARD, "land": LAND, "nanp": NANP, "mobile": MOBILE,
        "ipv4": IPV4}
_LPAREN, _RPAREN = 0xFF08, 0xFF09
# Fixed stretches for _fits: d a digit, b [1-9], e [1-8], t [2-9], s ' ' or '-', anything else itself.
_ID_SPACED, _CARD_HEAD, _D4, _D6, _NANP_GROUP = (np.frombuffer(p.encode(), np.uint8) for p in (
    "bddddd dddddddd ddd", "eddds", "dddd", "dddddd", "tdd"))


@njit(cache=True, inline="always")
def _dig(c):
    return 48 <= c <= 57


@njit(cache=True, inline="always")
def _alpha(c):
    return 65 <= c <= 90 or 97 <= c <= 122


@njit(cache=True, inline="always")
def _at(t, i, n):
    """The code point at i, or 0 past the end the regex sees."""
    return t[i] if i < n else 0


@njit(cache=True, inline="always")
def _digits(t, i, n):
    j = i
    while j < n and _dig(t[j]):
        j += 1
    return j - i


@njit(cache=True)
def _right(t, e, n):
    """pii_kinds._RIGHT at e: no digit, letter, _ or @ next, nor a . or - joining more."""
    if e >= n:
        return True
    c = t[e]
    if _dig(c) or _alpha(c) or c == 95 or c == 64:
        return False
    return not ((c == 46 or c == 45) and e + 1 < n and (_dig(t[e + 1]) or _alpha(t[e + 1])))


@njit(cache=True)
def _left(t, p):
    """pii_kinds._LEFT at p (the lookbehinds read before the search's start, as `re` does)."""
    if p == 0:
        return True
    c = t[p - 1]
    if _dig(c) or _alpha(c) or c == 95 or c == 64 or c == 43:
        return False
    return not (p >= 2 and (((c == 46 or c == 45) and _dig(t[p - 2])) or (c == 45 and _alpha(t[p - 2]))))


@njit(cache=True)
def _fits(t, p, n, pattern):
    """True where t[p:p+len(pattern)] fits `pattern` (one of the stretches above)."""
    if p + len(pattern) > n:
        return False
    for k in range(len(pattern)):
        c, want = t[p + k], pattern[k]
        if not (_dig(c) if want == 100 else 49 <= c <= 57 if want == 98 else 49 <= c <= 56 if want == 101
                else 50 <= c <= 57 if want == 116 else (c == 32 or c == 45) if want == 115 else c == want):
            return False
    return True


@njit(cache=True)
def _octets(t, p, n):
    """SHAPES['ipv4'] at p ends at a _RIGHT: four octets (each the whole digit group before its '.')."""
    q = p
    for k in range(4):
        size = _digits(t, q, n)
        if size == 0 or size > 3 or (size > 1 and t[q] == 48):
            return False
        if size == 3 and (t[q] - 48) * 100 + (t[q + 1] - 48) * 10 + t[q + 2] - 48 > 255:
            return False
        q += size
        if k < 3:
            if _at(t, q, n) != 46:
                return False
            q += 1
    return _right(t, q, n)


@njit(cache=True)
def _mobile(t, q, n):
    """SHAPES['mobile'] after its optional 86: 1[3-9]x then 8 digits, or groups of 4 after a ' ' or '-'."""
    if not (_at(t, q, n) == 49 and 51 <= _at(t, q + 1, n) <= 57 and _dig(_at(t, q + 2, n))):
        return False
    c = _at(t, q + 3, n)
    if c == 32 or c == 45:
        return True
    size = _digits(t, q, n)
    return size == 11 or (size == 7 and (_at(t, q + 7, n) == 32 or _at(t, q + 7, n) == 45))


@njit(cache=True)
def _may_start(t, p, n, shapes):
    """False only where no chosen shape of the number pattern matches at p (sound, not exact)."""
    c = t[p]
    if c == 43:  # '+': the plus shape, with its own look-behind
        if not shapes & PLUS or p + 1 >= n or not 49 <= t[p + 1] <= 57:
            return False
        b = t[p - 1] if p else 0
        return not (_dig(b) or _alpha(b) or b in (95, 64, 43, 61, 42, 47, 94))
    if not _left(t, p):
        return False
    if c == 40 or c == _LPAREN:  # (0755) …, (415) …
        d = _at(t, p + 1, n)
        return bool((shapes & LAND and d == 48 and 49 <= _at(t, p + 2, n) <= 57)
                    or (shapes & NANP and 50 <= d <= 57 and _dig(_at(t, p + 2, n)) and _dig(_at(t, p + 3, n))))
    size = _digits(t, p, n)
    if shapes & INTL and c == 48 and _at(t, p + 1, n) == 48 and 49 <= _at(t, p + 2, n) <= 57:
        return True
    if shapes & ID and ((size == 18 or (size == 17 and _at(t, p + 17, n) in (88, 120))) and c != 48
                        or _fits(t, p, n, _ID_SPACED) and _right(t, p + 20, n)):
        return True
    if shapes & CARD and 49 <= c <= 56 and (12 <= size <= 19 or _fits(t, p, n, _CARD_HEAD) and (
            _fits(t, p + 5, n, _D4) and _at(t, p + 9, n) == t[p + 4] and _fits(t, p + 10, n, _D4)
            and _at(t, p + 14, n) == t[p + 4] and _dig(_at(t, p + 15, n))
            or _fits(t, p + 5, n, _D6) and _at(t, p + 11, n) == t[p + 4] and _fits(t, p + 12, n, _D4))):
        return True
    if shapes & LAND and c == 48 and 1 <= size - 2 <= 3 and 49 <= _at(t, p + 1, n) <= 57 \
            and _at(t, p + size, n) in (32, 45):
        return True
    if shapes & NANP:
        for q in (p, p + 2):
            if q == p + 2 and not (c == 49 and _at(t, p + 1, n) in (32, 45, 46)):
                break
            d = _at(t, q, n)
            if ((d == 40 or d == _LPAREN) and 50 <= _at(t, q + 1, n) <= 57) or (
                    _fits(t, q, n, _NANP_GROUP) and _at(t, q + 3, n) in (32, 45, 46) and _fits(t, q + 4, n, _NANP_GROUP)
                    and _at(t, q + 7, n) == t[q + 3]):
                return True
        if size == 10 and 50 <= c <= 57 and 50 <= t[p + 3] <= 57:
            return True
    if shapes & MOBILE and (_mobile(t, p, n) or (c == 56 and _at(t, p + 1, n) == 54 and (
            _mobile(t, p + 2, n) or (_at(t, p + 2, n) in (32, 45) and _mobile(t, p + 3, n))))):
        return True
    return bool(shapes & IPV4) and _octets(t, p, n)


@njit(cache=True, inline="always")
def _run_char(c):
    return _dig(c) or c in (32, 40, 41, 43, 46, 45, _LPAREN, _RPAREN)


@njit(cache=True)
def _gate(t, q, j, shapes, fewest):
    """pii_kinds._open on a run's rest t[q:j]: long enough, or a '+', '00' or three dots for the
    plus, intl and ipv4 shapes."""
    if j - q >= fewest:
        return True
    dots = 0
    for k in range(q, j):
        c = t[k]
        if (shapes & PLUS and c == 43) or (shapes & INTL and c == 48 and k + 1 < j and t[k + 1] == 48):
            return True
        dots += c == 46
    return bool(shapes & IPV4) and dots >= 3


@njit(cache=True)
def first_candidates(t, shapes, fewest, out):
    """Writes (run start, run end, first position where a match may start) into `out` for each
    _HINT run that passes the gate and holds a candidate; returns how many (out: 3 * (len // 7 + 1)).
    A run is 7 or more characters, so it holds one of every 7th position: only those are read until
    one is a run character (a character-by-character scan mispredicts a branch at every space)."""
    n_all = t.shape[0]
    rows, i = 0, 6
    while i < n_all:
        if not _run_char(t[i]):
            i += 7
            continue
        q, j = i, i + 1
        while q > 0 and _run_char(t[q - 1]):
            q -= 1
        while j < n_all and _run_char(t[j]):
            j += 1
        while q < j and not (_dig(t[q]) or t[q] in (43, 40, _LPAREN)):
            q += 1
        if j - q >= 7 and _gate(t, q, j, shapes, fewest):
            n = min(n_all, j + 16)
            for p in range(q, j):
                c = t[p]
                if (_dig(c) or c in (43, 40, _LPAREN)) and _may_start(t, p, n, shapes):
                    out[rows], out[rows + 1], out[rows + 2] = q, j, p
                    rows += 3
                    break
        i = j + 7
    return rows // 3


def code_points(text: str) -> np.ndarray:
    """The text's code points, one byte each when it is ASCII (the cheaper encode)."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), np.uint8)
    return np.frombuffer(text.encode("utf-32-le"), np.uint32)
