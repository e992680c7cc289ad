"""The `pii` stage's digit kinds, compiled: one numba pass over the normalised text's code points
that does what pii_kinds.PiiFinder._numbers does with regexes wherever it can do it exactly
(first_candidates and _found: what it settles, and where it hands a run back to Python's regex).
tests/test_pii_kernels.py: _may_start against the regex, the same spans as the pure-Python path.
"""
from __future__ import annotations

import numpy as np

from dsdata.compiled import export, njit

# Shape bits (the `shapes` argument): which shapes the chosen kinds use.
PLUS, INTL, ID, CARD, LAND, NANP, MOBILE, IPV4 = (1 << i for i in range(8))
BITS = {"plus": PLUS, "intl": INTL, "id": ID, "card": CARD, "land": LAND, "nanp": NANP, "mobile": MOBILE,
        "ipv4": IPV4}
_LPAREN, _RPAREN = 0xFF08, 0xFF09
# Fixed stretches for _fits: d a digit, b [1-9], e [1-8], t [2-9], o [01], h [0-3], s ' ' or '-'.
_ID_SPACED, _CARD_HEAD, _D4, _D6, _NANP_GROUP, _ID_SOLID = (np.frombuffer(p.encode(), np.uint8) for p in (
    "bddddd dddddddd ddd", "eddds", "dddd", "dddddd", "tdd", "bdddddddddodhdddd"))


def _packed(words):
    """Words as one array of code points and the offsets where each starts (and the last ends)."""
    return (np.array([ord(c) for w in words for c in w], np.int64),
            np.cumsum([0] + [len(w) for w in words]).astype(np.int64))


# pii_kinds' _LABEL_WORDS and the codes of _MONEY_BEFORE, its identity-number check (_ID_WEIGHTS,
# _ID_CHECK, _MONTH_DAYS); tests/test_pii_kernels.py checks they are the same.
LABEL_WORDS = ("isbn", "issn", "doi", "order", "invoice", "tracking", "serial", "sku", "订单", "单号", "运单", "快递单",
               "发票", "序列号")
MONEY_CODES = ("rmb", "cny", "usd", "hkd", "eur")
_LABEL_CHARS, _LABEL_SIZES = _packed(LABEL_WORDS)
_CODE_CHARS, _CODE_SIZES = _packed(MONEY_CODES)
_ID_WEIGHTS = np.array((7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2), np.int64)
_ID_CHECK = np.frombuffer(b"10X98765432", np.uint8).astype(np.int64)
_MONTH_DAYS = np.array((31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31), np.int64)
NUMBERING_LAST = "nedrvlhtcagxpm本版§第见見阅閱节節章条條"  # pii_kinds._NUMBERING_LAST
SECTION_SIGNS = "节節章条條款项項"  # pii_kinds._SECTION_AFTER's
_NUMBERING_LAST = np.array([ord(c) for c in NUMBERING_LAST], np.int64)


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
                else 50 <= c <= 57 if want == 116 else 48 <= c <= 49 if want == 111 else 48 <= c <= 51 if want == 104
                else (c == 32 or c == 45) if want == 115 else c == want):
            return False
    return True


@njit(cache=True)
def _octets(t, p, n):
    """Where SHAPES['ipv4'] at p ends (at a _RIGHT: four octets, each the whole digit group before its
    '.'), or 0."""
    q = p
    for k in range(4):
        size = _digits(t, q, n)
        if size == 0 or size > 3 or (size > 1 and t[q] == 48):
            return 0
        if size == 3 and (t[q] - 48) * 100 + (t[q + 1] - 48) * 10 + t[q + 2] - 48 > 255:
            return 0
        q += size
        if k < 3:
            if _at(t, q, n) != 46:
                return 0
            q += 1
    return q if _right(t, q, n) else 0


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
        d, size = _at(t, p + 1, n), _digits(t, p + 1, n)
        return bool(_at(t, p + 1 + size, n) in (41, _RPAREN) and (
            (shapes & LAND and d == 48 and 49 <= _at(t, p + 2, n) <= 57 and 3 <= size <= 5)
            or (shapes & NANP and 50 <= d <= 57 and size == 3)))
    size = _digits(t, p, n)
    if shapes & INTL and c == 48 and _at(t, p + 1, n) == 48 and 49 <= _at(t, p + 2, n) <= 57:
        return True
    if shapes & ID and ((size == 18 or (size == 17 and _at(t, p + 17, n) in (88, 120))) and c != 48
                        or _fits(t, p, n, _ID_SPACED) and _right(t, p + 20, n)):
        return True
    if shapes & CARD and 49 <= c <= 56 and (12 <= size <= 19 or _card_end(t, p, n)):
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
    return bool(shapes & IPV4) and _octets(t, p, n) > 0


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
def _space(c):
    """str.isspace (what `\\s` reads)."""
    return 9 <= c <= 13 or 28 <= c <= 32 or c in (0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000) \
        or 0x2000 <= c <= 0x200A


@njit(cache=True)
def _lower(c):
    return c + 32 if 65 <= c <= 90 else c


@njit(cache=True)
def _ends_with(t, k, word, low):
    """t[k-len(word):k], lower-cased, is `word` (and starts at or after low)."""
    if k - len(word) < low:
        return False
    for m in range(len(word)):
        if _lower(t[k - len(word) + m]) != word[m]:
            return False
    return True


@njit(cache=True)
def _plain_context(t, start, end, n_all):
    """True where pii_kinds._classify would neither find a label (_LABEL_WORDS) in the 20 characters
    before `start` nor money around the item (_MONEY_BEFORE, _MONEY_AFTER).  Characters that
    lower-case or case-fold to ASCII letters (İ ı ſ K) leave the answer to Python."""
    low = max(0, start - 20)
    for k in range(low, min(n_all, end + 4)):
        if t[k] in (0x130, 0x131, 0x17F, 0x212A):
            return False
    for k in range(low + 1, start + 1):
        for w in range(_LABEL_SIZES.shape[0] - 1):
            if _ends_with(t, k, _LABEL_CHARS[_LABEL_SIZES[w]:_LABEL_SIZES[w + 1]], low):
                return False
    k, five = start, max(0, start - 5)
    while k > five and _space(t[k - 1]):
        k -= 1
    if k > five and t[k - 1] in (36, 0xA5, 0xFFE5, 0x20AC, 0xA3):
        return False
    for w in range(_CODE_SIZES.shape[0] - 1):
        if _ends_with(t, k, _CODE_CHARS[_CODE_SIZES[w]:_CODE_SIZES[w + 1]], five):
            return False
    k, lim = end, min(n_all, end + 4)
    while k < lim and _space(t[k]):
        k += 1
    if k < lim and t[k] in (0x5143, 0x5757, 0x4E07, 0x4EBF, 0x5186, 37, 0x2030):
        return False
    return not ((k + 1 < lim and t[k] == 0x7F8E and t[k + 1] == 0x5143)
                or (k + 2 < lim and t[k] == 0x4EBA and t[k + 1] == 0x6C11 and t[k + 2] == 0x5E01))


@njit(cache=True)
def _gather(t, p, end, d):
    """The digits (and a final X or x) of t[p:end] into d; returns how many."""
    size = 0
    for k in range(p, end):
        if _dig(t[k]) or t[k] == 88 or t[k] == 120:
            d[size] = t[k]
            size += 1
    return size


@njit(cache=True)
def _valid_id(d, tables):
    """pii_kinds.valid_resident_id of the 17 digits and check character in d."""
    total = 0
    for k in range(17):
        total += (d[k] - 48) * _ID_WEIGHTS[k]
    year = (d[6] - 48) * 1000 + (d[7] - 48) * 100 + (d[8] - 48) * 10 + d[9] - 48
    month, day = (d[10] - 48) * 10 + d[11] - 48, (d[12] - 48) * 10 + d[13] - 48
    if not tables[1 + (d[0] - 48) * 10 + d[1] - 48] or not 1900 <= year <= 2099 or not 1 <= month <= 12 \
            or not 1 <= day <= _MONTH_DAYS[month - 1] or year * 10000 + month * 100 + day > tables[0] \
            or (month == 2 and day == 29 and not (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0))):
        return False
    return _ID_CHECK[total % 11] == (88 if d[17] == 120 else d[17])


@njit(cache=True)
def _valid_card(d, size, tables):
    """pii_kinds._card_digits_ok of the `size` digits in d."""
    issuer = tables[101 + (d[0] - 48) * 1000 + (d[1] - 48) * 100 + (d[2] - 48) * 10 + d[3] - 48]
    if issuer == 0 or (size == 12 and issuer != 1):
        return False
    same, total = True, 0
    for k in range(size):
        digit = d[size - 1 - k] - 48
        total += digit if k % 2 == 0 else (digit * 2 - 9 if digit > 4 else digit * 2)
        same = same and (k == 0 or d[size - 1 - k] == d[0])
    return not same and total % 10 == 0


@njit(cache=True)
def _card_end(t, p, n):
    """Where SHAPES['card'] ends at p when it is written in groups (alternatives 2 and 3, as the
    regex's greedy backtracking reads them: the fifth group of 1-3 digits taken when it fits), or 0
    where neither fits (the regex may still match another shape)."""
    sep = _at(t, p + 4, n)
    if _fits(t, p, n, _CARD_HEAD) and _fits(t, p + 5, n, _D4) and _at(t, p + 9, n) == sep \
            and _fits(t, p + 10, n, _D4) and _at(t, p + 14, n) == sep:
        size = _digits(t, p + 15, n)
        if not 1 <= size <= 4:
            return 0
        end = p + 15 + size
        more = _digits(t, end + 1, n) if _at(t, end, n) == sep else 0
        if 1 <= more <= 3 and _right(t, end + 1 + more, n):
            return end + 1 + more
        return end if _right(t, end, n) else 0
    if _fits(t, p, n, _CARD_HEAD) and _fits(t, p + 5, n, _D6) and _at(t, p + 11, n) == sep:
        size = _digits(t, p + 12, n)
        return p + 12 + size if 4 <= size <= 5 and _right(t, p + 12 + size, n) else 0
    return 0


@njit(cache=True)
def _ip4(t, start, end, n_all, tables):
    """pii_kinds._ip4_ok of the quad t[start:end] as far as it is decided without a regex: (end, -1)
    where it is not public or a section sign follows, (end, 4) where no numbering word can end before
    it and two octets or more have two digits or more; else (0, 0)."""
    value, octet, long = 0, 0, 0
    for k in range(start, end + 1):
        if k == end or t[k] == 46:
            value, long, octet = value * 256 + octet, long + (k - start > 1 and _dig(t[k - 2])), 0
        else:
            octet = octet * 10 + t[k] - 48
    for r in range(tables[10101]):
        if value >> tables[10103 + 2 * r] == tables[10102 + 2 * r]:
            return end, -1
    k, lim = end, min(n_all, end + 3)
    while k < lim and _space(t[k]):
        k += 1
    if k < lim and t[k] in (0x8282, 0x7BC0, 0x7AE0, 0x6761, 0x689D, 0x6B3E, 0x9879, 0x9805):
        return end, -1
    k, low = start, max(0, start - 12)
    while k > low and (t[k - 1] in (46, 58, 61) or _space(t[k - 1])):
        k -= 1
    if k > low:
        for c in _NUMBERING_LAST:
            if _lower(t[k - 1]) == c:
                return 0, 0
    return (end, 4) if long >= 2 else (0, 0)


@njit(cache=True)
def _found(t, p, n, n_all, shapes, tables):
    """(end, kind) where the regex's match at p (the first place one can start) is an identity or card
    number (solid or grouped), a solid mobile or a dotted quad — read as exactly as the regex reads
    them, the alternatives before them ruled out — and _classify's verdict needs no context regex:
    kind 1 id, 2 card, 3 phone, 4 ip, -1 refused (a card failing its check, a placeholder mobile, a
    quad not public or before a section sign).  (0, 0): Python's regex and _classify decide."""
    size, d = _digits(t, p, n), np.empty(24, np.int64)
    end, kind = 0, 0
    if shapes & ID and (size == 18 or (size == 17 and _at(t, p + 17, n) in (88, 120))):
        if not (_fits(t, p, n, _ID_SOLID) and t[p + 6] * 100 + t[p + 7] in (4956, 4957, 5048) and _right(t, p + 18, n)):
            return 0, 0
        end, kind = p + 18, 1
    elif shapes & ID and size == 6 and _fits(t, p, n, _ID_SPACED) and t[p + 7] * 100 + t[p + 8] in (4956, 4957, 5048) \
            and (_dig(_at(t, p + 19, n)) or _at(t, p + 19, n) in (88, 120)) and _right(t, p + 20, n):
        end, kind = p + 20, 1
    elif shapes & CARD and 49 <= t[p] <= 56 and 12 <= size <= 19 and size != 17 and size != 18:
        if not _right(t, p + size, n):
            return 0, 0
        if not _valid_card(t[p:p + size], size, tables):
            # _classify then tries the other shapes on the digits: only a mobile with 86 fits (8613812345678)
            mobile = size == 13 and t[p] == 56 and t[p + 1] == 54 and t[p + 2] == 49 and 51 <= t[p + 3] <= 57
            return (0, 0) if mobile else (p + size, -1)
        end, kind = p + size, 2
    elif shapes & CARD and size == 4:
        end = _card_end(t, p, n)
        kind = 2 if end else 0
    elif shapes & MOBILE and size == 11 and t[p] == 49 and 51 <= t[p + 1] <= 57 and _right(t, p + 11, n) \
            and _at(t, p + 11, n) not in (32, 35, 0x8F6C, 0x8F49):  # (no extension: 13812345678 转 8001)
        # SHAPES['mobile'] (no shape before it reads 11 solid digits from a 1); _phone_ok refuses
        # a number whose last 8 digits hold two different digits or fewer
        if not _plain_context(t, p, p + 11, n_all):
            return 0, 0
        first, second = t[p + 3], t[p + 3]
        for k in range(p + 4, p + 11):
            if t[k] != first and second == first:
                second = t[k]
            elif t[k] != first and t[k] != second:
                return p + 11, 3
        return p + 11, -1
    elif shapes & IPV4 and size <= 3:
        # SHAPES['ipv4'] (no shape before it reads a dotted quad); _ip4_ok's first rules
        end = _octets(t, p, n)
        return (0, 0) if end == 0 else _ip4(t, p, end, n_all, tables)
    if kind == 0:
        return 0, 0
    size = _gather(t, p, end, d)
    valid = size == 18 and _valid_id(d, tables) if kind == 1 else _valid_card(d, size, tables)
    return (end, kind) if valid and _plain_context(t, p, end, n_all) else (0, 0)


# Long on purpose: one compiled loop over the text, state (the run, where to read next) carried in
# locals; split into calls it would pass that state back and forth for every run.
@export(
        "int64(uint8[::1], int64, int64, int64[::1], int64[::1])",
        "int64(uint32[::1], int64, int64, int64[::1], int64[::1])",
        cache=True)
def first_candidates(t, shapes, fewest, tables, out):
    """For each _HINT run that passes the gate: the items the regex and _classify would find in it
    one after another while _found can settle them (rows (kind 1-4, start, end)), then where Python
    takes over (a row (0, run end, first position where a match may start)).  Returns the number of
    rows written to `out` (3 * (len // 7 + 1) long).  A run is 7 or more characters, so it holds one
    of every 7th position: only those are read until one is a run character (a character-by-
    character scan mispredicts a branch at every space)."""
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
        pos, n = q, min(n_all, j + 16)
        while j - q >= 7 and pos < j and _gate(t, pos, j, shapes, fewest):
            p = pos
            while p < j and not ((_dig(t[p]) or t[p] in (43, 40, _LPAREN)) and _may_start(t, p, n, shapes)):
                p += 1
            if p == j:
                break
            end, kind = _found(t, p, n, n_all, shapes, tables) if _dig(t[p]) else (0, 0)
            if kind >= 0:
                out[rows], out[rows + 1], out[rows + 2] = kind, p if kind else j, end if kind else p
                rows += 3
            if not kind:
                break
            pos = end
        i = j + 7
    return rows // 3


def warm() -> None:
    """Load (or compile) the machine code for both kinds of text (a byte or four per character) at
    once, rather than the second kind inside some later document."""
    for text in ("0", "\uff10"):
        first_candidates(code_points(text), 0, 1, np.zeros(10101, np.int64), np.empty(3, np.int64))


def code_points(text: str) -> np.ndarray:
    """The text's code points, one byte each when it is ASCII (the cheaper encode)."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), np.uint8)
    return np.frombuffer(text.encode("utf-32-le"), np.uint32)
