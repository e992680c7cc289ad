"""The kinds of personal data the `pii` stage finds: their shapes, validators and context rules, and
the finder that runs them in one pass.  The rules (boundaries, not `\\b`; full-width forms; cost),
with examples kept and redacted: docs/pii.md.

Full-width forms, dashes and spaces are mapped to ASCII by a same-length table, so every offset in
the mapped text is an offset in the original.  The digit kinds are one alternation of bounded
shapes, run only where the compiled pass (pii_kernels, with numba) has not settled the run.
"""
from __future__ import annotations

import datetime
import functools
import ipaddress
import operator
import re

import numpy as np

from dsdata.compiled import import_compiled

PII_TYPES = ("email", "ip", "phone", "id", "card")
TOKENS = {"email": "<EMAIL>", "ip": "<IP>", "phone": "<PHONE>", "id": "<ID>", "card": "<CARD>"}

# --- 1. normalisation: one character for one character ------------------------------------------
_WIDE = {cp: cp - 0xFEE0 for cp in range(0xFF01, 0xFF5F)}  # ！..～ → ! .. ~ (digits, letters, ＠．：（）－＋)
_WIDE.update(dict.fromkeys((0x3000, 0x00A0, 0x2002, 0x2003, 0x2009, 0x202F, 0x205F), 0x20))
_WIDE.update(dict.fromkeys((0x2010, 0x2011, 0x2012, 0x2013, 0x2212, 0xFE63), 0x2D))
_WIDE[0xFE6B] = 0x40  # small commercial at
# What is mapped: runs that start with a full-width digit, letter or @+-. , another dash or a wide
# space (and go on through full-width colons and brackets: ２００１：ｄｂ８：：１).  Full-width
# punctuation elsewhere (most Chinese text) is left alone: the patterns below accept （ ） as written.
_SIGNIFICANT = "\uff10-\uff19\uff20-\uff3a\uff41-\uff5a\uff0b\uff0d\uff0e\u2010-\u2013\u2212\ufe63\ufe6b" \
               "\u3000\u00a0\u2002\u2003\u2009\u202f\u205f"
_MAPPED_RUN = re.compile(f"[{_SIGNIFICANT}][{_SIGNIFICANT}\uff1a\uff08\uff09]*")


def normalise(text: str) -> str:
    """`text` with full-width forms, dashes and spaces in ASCII; the same length, offset for offset."""
    return text if text.isascii() else _MAPPED_RUN.sub(lambda m: m.group().translate(_WIDE), text)


# --- 2. the digit kinds: one alternation of bounded shapes -----------------------------------------
# What may not be next to an item: a digit, a Latin letter, _ or @ (it would be part of a longer
# token: a hash, a UUID, an identifier, a mailbox), and a . or - joining it to more digits
# (1.2.3.4.5, 2024-03-15-…) or a - joining it to letters (ABC-13812345678, a UUID's last group).
_LEFT = r"(?<![0-9A-Za-z_@+])(?<![0-9][.\-])(?<![A-Za-z]-)"
_LEFT_PLUS = r"(?<![0-9A-Za-z_@+=*/^])"
_RIGHT = r"(?![0-9A-Za-z_@])(?![.\-][0-9A-Za-z])"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_EXT = r"(?: ?(?:x|ext\.?|#|转|轉) ?[0-9]{1,5})?"  # an extension: 415-555-0132x123, 010-12345678转8001
SHAPES = {  # kind family → the shapes it is written in (each bounded)
    "plus": r"\+[1-9][0-9]{0,3}(?:[ \-.]?(?:[(\uff08]0?[0-9]{1,4}[)\uff09]|[0-9]{1,8})){1,5}" + _EXT,   # +86 …, +1 (415) …, +44 20 …
    "intl": r"00[1-9][0-9]{0,3}(?:[ \-]?(?:[(\uff08][0-9]{1,4}[)\uff09]|[0-9]{1,8})){1,5}" + _EXT,        # 0086 138 …, 001-415-…
    "id": r"[1-9][0-9]{5}(?:18|19|20)[0-9]{2}[01][0-9][0-3][0-9][0-9]{3}[0-9Xx]"
          r"|[1-9][0-9]{5} (?:18|19|20)[0-9]{6} [0-9]{3}[0-9Xx]",
    "card": r"[1-8][0-9]{11,18}|[1-8][0-9]{3}(?P<cs>[ \-])[0-9]{4}(?P=cs)[0-9]{4}(?P=cs)[0-9]{1,4}(?:(?P=cs)[0-9]{1,3})?"
            r"|[1-8][0-9]{3}(?P<as>[ \-])[0-9]{6}(?P=as)[0-9]{4,5}",
    "land": r"(?:[(\uff08]0[1-9][0-9]{1,3}[)\uff09][ \-]?|0[1-9][0-9]{1,3}[ \-])[1-9][0-9]{2,3}[ \-]?[0-9]{4}(?:-[0-9]{1,5})?" + _EXT,
    "nanp": r"(?:(?:1[ \-.])?(?:[(\uff08][2-9][0-9]{2}[)\uff09] ?[2-9][0-9]{2}[ \-.]?|[2-9][0-9]{2}(?P<ns>[ \-.])[2-9][0-9]{2}(?P=ns))[0-9]{4}"
            r"|[2-9][0-9]{2}[2-9][0-9]{6})" + _EXT,
    "mobile": r"(?:86[ \-]?)?1[3-9][0-9](?:[0-9]{8}|(?P<ms>[ \-])[0-9]{4}(?P=ms)[0-9]{4}|[0-9]{4}[ \-][0-9]{4})",
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
}
_ORDER = ("id", "card", "intl", "land", "nanp", "mobile", "ipv4")  # the first that fits is the match's shape
_SHAPES_OF = {"ip": ("ipv4",), "id": ("id",), "card": ("card",), "phone": ("plus", "intl", "land", "nanp", "mobile")}


@functools.lru_cache(maxsize=None)
def _number_pattern(kinds: frozenset) -> re.Pattern:
    """One alternation of the shapes of the chosen digit kinds, each a named group."""
    shapes = {shape for kind in kinds for shape in _SHAPES_OF[kind]}
    rest = "|".join(f"(?P<{k}>{SHAPES[k]})" for k in _ORDER if k in shapes)
    plus = rf"{_LEFT_PLUS}(?P<plus>{SHAPES['plus']}){_RIGHT}" if "plus" in shapes else ""
    return re.compile("|".join(p for p in (plus, rf"{_LEFT}(?:{rest}){_RIGHT}" if rest else "") if p))
_HINT = re.compile("[0-9+(\uff08][0-9 ()+.\\-\uff08\uff09]{6,}+")

# What a shape needs in the part of a _HINT run where it starts (its characters are digits and
# separators, and a shape that starts in it ends in it, but for an extension): a '+' (plus), '00'
# (intl), three dots (ipv4), or at least this many digits (the rest).
_FEWEST_DIGITS = {"id": 17, "card": 12, "land": 10, "nanp": 10, "mobile": 11}


def _gate(shapes: frozenset) -> tuple[int, bool, bool, bool]:
    """What a run's rest, text[pos:end], must have for one of `shapes` to start in it: (this many
    characters, or a '+', or '00', or three dots; False where that shape is not chosen).  A rest as
    long as the fewest digits is searched without counting them: the count costs as much."""
    fewest = min((_FEWEST_DIGITS[k] for k in shapes if k in _FEWEST_DIGITS), default=1 << 30)
    return fewest, "plus" in shapes, "intl" in shapes, "ipv4" in shapes


def _open(text: str, pos: int, end: int, gate: tuple[int, bool, bool, bool]) -> bool:
    """Whether a shape may start in text[pos:end], the rest of a run (gate: _gate's answer)."""
    fewest, plus, intl, dots = gate
    return end - pos >= fewest or (plus and text.find("+", pos, end) != -1) or (
        intl and text.find("00", pos, end) != -1) or (dots and text.count(".", pos, end) >= 3)


_VOUCHED = (None, "id", "card", "phone", "ip")  # pii_kernels.first_candidates' codes

@functools.lru_cache(maxsize=1)
def _kernel_tables() -> np.ndarray:
    """What pii_kernels reads of the validators: today (yyyymmdd), the province codes (at 1 + code),
    the issuer of each 4-digit prefix (at 101 + prefix: 0 none, 1 Maestro, 2 another), the IPv4
    ranges that are not global (their count at 10101, then (network >> shift, shift) pairs)."""
    return np.array([_TODAY[0] * 10000 + _TODAY[1] * 100 + _TODAY[2], *(n in _PROVINCES for n in range(100)),
                     *(0 if x is None else 1 if x == "maestro" else 2 for x in _ISSUER_OF),
                     len(_V4_RANGES), *(v for r in _V4_RANGES for v in r)], np.int64)
_FULL = {k: re.compile(f"(?:{v})") for k, v in SHAPES.items()}


@functools.lru_cache(maxsize=None)
def _alternation(shapes: tuple) -> re.Pattern:
    """The shapes in order, each a named group: a fullmatch's lastgroup is the first that reads all."""
    return re.compile("|".join(f"(?P<{k}>{SHAPES[k]})" for k in shapes))
_NON_DIGIT = re.compile(r"[^0-9]")
_SEPARATORS = dict.fromkeys(map(ord, " ()+.-\uff08\uff09"))  # what a shape writes between digits (deleted)
_EXTENSION = re.compile(r" ?(?:x|ext\.?|#|转|轉) ?[0-9]{1,5}$")
# Ten digits written solid (4155550132) are a phone number only after a word that says so.
_PHONE_WORD = re.compile(r"(?:phone|tel|call|mobile|cell|fax|dial|contact|电话|電話|手机|手機|致电|联系|聯繫|拨打|撥打|热线|熱線)"
                         r"[^0-9]{0,12}$", re.IGNORECASE)

# Labels that name a number which is not personal data, within 20 characters before it.
_NOT_PERSONAL = re.compile(r"(?<![A-Za-z])(?:ISBN|ISSN|DOI|order|invoice|tracking|serial|SKU|订单|单号|运单|快递单|发票|序列号)"
                           r"(?:\s*(?:no|nr|number|num|id|code)\.?)?[^0-9A-Za-z]{0,6}$", re.IGNORECASE)
_LABEL_WORDS = re.compile("isbn|issn|doi|order|invoice|tracking|serial|sku|订单|单号|运单|快递单|发票|序列号")  # a fast first look
_MONEY_CHARS = frozenset("$¥￥€£rmbcnyusdhkeRMBCNYUSDHKE元块万亿美人円%‰")
_MONEY_BEFORE = re.compile(r"(?:[$¥￥€£]|RMB|CNY|USD|HKD|EUR)\s*$", re.IGNORECASE)
_MONEY_AFTER = re.compile(r"\s*(?:元|块|万|亿|美元|人民币|円|%|‰)")
# A dotted quad that numbers a section or a version is not an address.
_SECTION_BEFORE = re.compile(r"(?:section|sect\.?|sec\.|chapter|ch\.|clause|article|art\.|para(?:graph)?|§|table|figure|"
                             r"fig\.|appendix|step|rule|item|第|见|見|参见|參見|参阅|參閱|节|節|章|条|條)\s*$", re.IGNORECASE)
_SECTION_AFTER = re.compile(r"\s*[节節章条條款项項]")
_VERSION_BEFORE = re.compile(r"(?<![A-Za-z])(?:version|release|build|ver|rev|revision|firmware|kernel|driver|update|patch|"
                             r"v|版本|版)\.?\s*[:=]?\s*$", re.IGNORECASE)
_NUMBERING_BEFORE = re.compile(f"(?:{_VERSION_BEFORE.pattern})|(?:{_SECTION_BEFORE.pattern})", re.IGNORECASE)  # either, one search
# The last character of each of those words but for a full stop, lower-cased (a cheap first look).
_NUMBERING_LAST = frozenset("nedrvlhtcagxpm本版§第见見阅閱节節章条條")


def _numbering_may_end(text: str, start: int) -> bool:
    """False where _NUMBERING_BEFORE cannot match before `start`: the last character of the 12 before
    it that is not a space, '.', ':' or '=' must end one of its words."""
    i, low = start, max(0, start - 12)
    while i > low and (text[i - 1] in ".:=" or text[i - 1].isspace()):
        i -= 1
    return i > low and text[i - 1].lower() in _NUMBERING_LAST


# A quad of small numbers (fewer than two ≥ 10: 9.2.1.4, 2.6.38.6) is an address only near an IP word.
_HEADING = re.compile(r"(?<![0-9.])[0-9]{1,3}(?:\.[0-9]{1,3}){1,3}\.(?=\s|[^\x00-\x7f])")
_IP_CONTEXT = re.compile(r"(?<![A-Za-z])(?:IP|IPv4|address|addr|DNS|nameserver|server|host|ping|gateway|router|"
                         r"resolver|地址|服务器|伺服器|域名|网关|主机|位址)(?![a-z])", re.IGNORECASE)

_PROVINCES = frozenset({11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46,
                        50, 51, 52, 53, 54, 61, 62, 63, 64, 65, 71, 81, 82})
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_TODAY = datetime.date.today().timetuple()[:3]  # birth dates after it are not real (read once per process)
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def id_check_char(first17: str) -> str:
    """ISO 7064 MOD 11-2 check character of an identity number's first 17 digits."""
    if first17.isascii() and first17.isdigit():
        # The weights are 2^17 … 2^1 mod 11, and 13 ≡ 2 (mod 11): the digits read in base 13 with a
        # zero appended are the weighted sum, mod 11, in one C call.
        return _ID_CHECK[int(first17 + "0", 13) % 11]
    return _ID_CHECK[sum(map(operator.mul, map(int, first17), _ID_WEIGHTS)) % 11]


def valid_resident_id(number: str) -> bool:
    """An 18-character PRC resident identity number with a province code, a real past birth date
    (1900 on) and a correct check character."""
    if len(number) == 18 and number.isascii() and number[:17].isdigit() and number[17] in "0123456789Xx":
        value = int(number[:17])  # one parse: province, birth date and check from its digits
        year, month, day = value // 10000000 % 10000, value // 100000 % 100, value // 1000 % 100
        if value // 1000000000000000 not in _PROVINCES or not 1900 <= year <= 2099 or not 1 <= month <= 12 \
                or not 1 <= day <= _MONTH_DAYS[month - 1] or (year, month, day) > _TODAY \
                or (month == 2 and day == 29 and not (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0))):
            return False
        return _ID_CHECK[int(number[:17] + "0", 13) % 11] == number[17].upper()
    if len(number) != 18 or not number[:17].isdigit() or number[17] not in "0123456789Xx" \
            or int(number[:2]) not in _PROVINCES or number[6:8] not in ("19", "20"):
        return False
    year, month, day = int(number[6:10]), int(number[10:12]), int(number[12:14])
    if not (1 <= month <= 12 and 1 <= day <= _MONTH_DAYS[month - 1]) or (year, month, day) > _TODAY \
            or (month == 2 and day == 29 and not (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0))):
        return False
    return id_check_char(number[:17]) == number[17].upper()


_DOUBLED_ASCII = str.maketrans("0123456789", "0246813579")  # a digit doubled, its digits summed


# Issuer identification ranges: (network, first digits from, to).  A card falls in one, has 13-19 digits
# (Maestro 12-19) and passes Luhn; the networks' own lengths are not required (issuers widen them).
_ISSUERS = (("visa", 4, 4), ("mastercard", 51, 55), ("mastercard", 2221, 2720), ("amex", 34, 34), ("amex", 37, 37),
            ("diners", 300, 305), ("diners", 36, 36), ("diners", 38, 39), ("discover", 6011, 6011),
            ("discover", 644, 649), ("discover", 65, 65), ("jcb", 35, 35), ("jcb", 2131, 2131), ("jcb", 1800, 1800),
            ("unionpay", 62, 62), ("unionpay", 81, 81), ("maestro", 50, 50), ("maestro", 56, 58), ("maestro", 6304, 6304),
            ("maestro", 6759, 6759), ("maestro", 6761, 6763))


def _issuer_table() -> list:
    """The network of every four-digit prefix 0000-9999 (the first range that holds it wins)."""
    table: list[str | None] = [None] * 10000
    for network, low, high in reversed(_ISSUERS):
        scale = 10 ** (4 - len(str(low)))
        table[low * scale:(high + 1) * scale] = [network] * ((high + 1 - low) * scale)
    return table


_ISSUER_OF = _issuer_table()


def _card_digits_ok(digits: str) -> bool:
    """12-19 ASCII digits in an issuer's range (13 on for all but Maestro), passing Luhn (the digit sums
    as byte sums), whose digits before the check digit are not all one digit (0000…, 4444…8 are
    placeholders)."""
    size = len(digits)
    if not 12 <= size <= 19 or not digits.isdigit():
        return False
    issuer = _ISSUER_OF[int(digits[:4])]
    if issuer is None or (size == 12 and issuer != "maestro") or digits.count(digits[0], 0, size - 1) == size - 1:
        return False
    backwards = digits[::-1]
    return (sum(backwards[::2].encode()) + sum(backwards[1::2].translate(_DOUBLED_ASCII).encode()) - 48 * size) % 10 == 0


# IPv4 ranges that are not globally routable (RFC 6890's special-purpose registry), multicast and reserved.
# Keyed by first octet: (network >> shift, shift) of each range that starts with it.
_NOT_GLOBAL_V4: dict[int, list[tuple[int, int]]] = {}
for _net in map(ipaddress.IPv4Network, (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24",
        "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24", "192.88.99.0/24", "192.168.0.0/16", "192.175.48.0/24",
        "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", *(f"{a}.0.0.0/8" for a in range(224, 256)))):
    _NOT_GLOBAL_V4.setdefault(int(_net.network_address) >> 24, []).append(
        (int(_net.network_address) >> (32 - _net.prefixlen), 32 - _net.prefixlen))


_V4_RANGES = [r for ranges in _NOT_GLOBAL_V4.values() for r in ranges]


def _public_v4_int(value: int) -> bool:
    ranges = _NOT_GLOBAL_V4.get(value >> 24)
    return not ranges or not any(value >> shift == net for net, shift in ranges)


def _ip4_ok(text: str, start: int, end: int) -> bool:
    octets = text[start:end].split(".")
    a, b, c, d = map(int, octets)
    if not _public_v4_int(a << 24 | b << 16 | c << 8 | d) or _SECTION_AFTER.match(text, end, end + 3) \
            or _numbering_may_end(text, start) and _NUMBERING_BEFORE.search(text, max(0, start - 12), start):
        return False
    if (len(octets[0]) > 1) + (len(octets[1]) > 1) + (len(octets[2]) > 1) + (len(octets[3]) > 1) >= 2:
        return True
    if text.startswith(".", end) and (_HEADING.search(text, max(0, start - 40), start)
                                      or _HEADING.search(text, end + 1, end + 40)):
        return False  # "6.2.4. 邮件传输代理 6.2.4.1. exim4 的配置 6.2.4.2. 带有…": a table of contents
    return _IP_CONTEXT.search(text, max(0, start - 40), end + 40) is not None


def _phone_ok(shape: str, c: str, digits: str) -> bool:
    if len(set(digits[-8:])) <= 2:  # 13000000000, +1 555 5555555: placeholders and round numbers
        return False
    if shape in ("plus", "intl"):
        body = digits[2:] if shape == "intl" else digits
        solid = len(c) == len(digits) + (1 if shape == "plus" else 0)
        if body.startswith("86"):
            national = body[2:]
            if len(national) == 11 and national[0] == "1":
                return national[1] in "3456789"  # a mobile
            return 9 <= len(national) <= 11 and national[0] != "0" and not solid  # area code + subscriber
        if body[0] == "1":
            return len(body) == 11 and body[1] in "23456789" and body[4] in "23456789"
        return (11 if solid else 8) <= len(body) <= 15 and not (shape == "intl" and solid)
    if shape == "mobile":
        return digits[-11] == "1"
    return True  # land, nanp: the shape is the rule (area code 0…, or NANP [2-9]xx [2-9]xx xxxx)


class PiiFinder:
    """Finds the PII of the chosen types in a text: sorted, non-overlapping (start, end, type) with
    offsets in the text as given."""

    def __init__(self, types: tuple[str, ...] = PII_TYPES):
        self.types = tuple(t for t in PII_TYPES if t in types)
        self._digit_kinds = frozenset({"ip", "phone", "id", "card"} & set(self.types))
        if self._digit_kinds:
            self._number = _number_pattern(self._digit_kinds)
            shapes = tuple(k for k in ("plus",) + _ORDER[:-1] if any(k in _SHAPES_OF[kind] for kind in self._digit_kinds))
            self._chosen = frozenset(s for kind in self._digit_kinds for s in _SHAPES_OF[kind])
            self._gate = _gate(self._chosen)
            self._kernels = None  # pii_kernels once _load_kernels has run (False: none)
            # The shapes to try, in order, for a match the scan found in `shape` (None: not known): that
            # shape first, then each other one (a shape tried twice gives the same answer twice).
            self._tries = {shape: ((shape,) if shape else ()) + tuple(k for k in shapes if k != shape)
                           for shape in (None, *_ORDER, "plus")}
            self._first_full = {(shape, i): _alternation(tries[i:]) for shape, tries in self._tries.items()
                                for i in range(len(tries))}

    def _load_kernels(self):
        """pii_kernels with its machine code loaded, or False without numba: at the first text, so that
        a process which only checks a recipe never imports numba (~0.35 CPU-s)."""
        kernels = import_compiled("dsdata.stages.pii_kernels")  # False without numba or with DSDATA_NO_NUMBA=1
        if kernels:
            kernels.warm()
            self._shape_bits = sum(kernels.BITS[s] for s in self._chosen)
            self._tables = _kernel_tables()
        self._kernels = kernels
        return kernels

    def find(self, text: str) -> list[tuple[int, int, str]]:
        norm = normalise(text)
        spans: list[tuple[int, int, str]] = []
        if "email" in self.types and "@" in norm:
            spans = self._emails(norm)
        if "ip" in self.types and ":" in norm and ("::" in norm or norm.count(":") >= 7):  # an IPv6 address has one or the other
            spans = _claim(spans, self._ipv6(norm, text))
        if self._digit_kinds:
            spans = _claim(spans, self._numbers(norm))
        return spans

    # -- digit kinds ---------------------------------------------------------------------------
    def _numbers(self, text: str) -> list[tuple[int, int, str]]:
        # Where a digit kind can be: a run of 7 or more of its characters whose rest could hold a shape
        # (_gate), found by the compiled pass (which also settles the items it can) or by _HINT.  The
        # full pattern runs only inside those runs (and 16 characters on: an extension, the look-ahead).
        found: list[tuple[int, int, str]] = []
        search, classify, gate = self._number.search, self._classify, self._gate
        if kernels := self._kernels if self._kernels is not None else self._load_kernels():
            out = np.empty(len(text) // 7 * 3 + 3, np.int64)
            rows = kernels.first_candidates(kernels.code_points(text), self._shape_bits, gate[0], self._tables, out)
            flat = out[:3 * rows].tolist()
            starts = zip(flat[::3], flat[1::3], flat[2::3])
        else:
            starts = [(0, run.end(), run.start()) for run in _HINT.finditer(text) if _open(text, *run.span(), gate)]
        for vouched, run_end, pos in starts:
            if vouched:  # (1, 2 or 3, start, end): an item the compiled pass read in full
                found.append((run_end, pos, _VOUCHED[vouched]))
                continue
            while m := search(text, pos, run_end + 16):
                start, end = m.span()
                if start >= run_end:
                    break
                kind = classify(text, start, end, m.lastgroup)
                if kind is None and " " in text[start:end]:
                    # A space-separated group after the item that belongs to other text ("+86 138 1234 5678
                    # 2024"): try without the last group, then the last two.
                    cut = end
                    for _ in range(2):
                        cut = text.rfind(" ", start, cut)
                        if cut == -1:
                            break
                        if kind := classify(text, start, cut):
                            end = cut
                            break
                if kind:
                    found.append((start, end, kind))
                    pos = end
                else:  # or one before it ("2024 4111 1111 1111 1111"): go on from the next group
                    space = text.find(" ", start, end)
                    pos = space + 1 if space != -1 else end
                if not (pos < run_end and _open(text, pos, run_end, gate)):
                    break
        return found

    def _classify(self, text: str, start: int, end: int, shape: str | None = None) -> str | None:
        """The kind of text[start:end] (written in `shape`, when the scan knows it), or None."""
        c = text[start:end]
        if shape == "ipv4" or (shape is None and _FULL["ipv4"].fullmatch(c)):
            return "ip" if "ip" in self._digit_kinds and _ip4_ok(text, start, end) else None
        before = text[max(0, start - 20):start].lower()
        if _LABEL_WORDS.search(before) and _NOT_PERSONAL.search(before):
            return None
        if c.isdigit():
            solid, ext, core, digits = True, None, c, c
        else:
            solid = False
            ext = _EXTENSION.search(c) if c[-1].isdigit() and ("x" in c or "#" in c or "转" in c or "轉" in c) else None
            core = c[:ext.start()] if ext else c
            digits = core.translate(_SEPARATORS)
            if not digits.isdigit():
                digits = _NON_DIGIT.sub("", core)
        money = None  # read when a kind other than an identity number is tried
        tries, i = self._tries[shape], 0
        while i < len(tries):
            candidate = tries[i]
            if candidate != shape:  # the first of the shapes left that reads all of c, in one call
                m = self._first_full[shape, i].fullmatch(c)
                if m is None:
                    return None
                candidate = m.lastgroup
                i = tries.index(candidate)
            i += 1
            if candidate == "id":  # (a shape is tried only when its kind is chosen)
                if valid_resident_id(digits + c[-1].upper() if c[-1] in "Xx" else digits):
                    return "id"
                continue
            if money is None:
                money = bool((not _MONEY_CHARS.isdisjoint(before[-5:]) and _MONEY_BEFORE.search(before[-5:])) or (
                    not _MONEY_CHARS.isdisjoint(text[end:end + 4]) and _MONEY_AFTER.match(text, end, end + 4)))
            if money:
                return None
            elif candidate == "card":
                if not ext and _card_digits_ok(digits):
                    return "card"
            elif _phone_ok(candidate, core, digits) and not (
                    candidate == "nanp" and solid and not _PHONE_WORD.search(text, max(0, start - 24), start)):
                return "phone"
        return None

    # -- e-mail ----------------------------------------------------------------------------------
    def _emails(self, text: str) -> list[tuple[int, int, str]]:
        """The '@'s in groups less than 322 characters apart; in each, addresses start at most 65
        characters before its first '@' and end at most 256 after its last (a local part ≤ 64, a domain
        ≤ 253).  A group of one or two '@'s (ordinary text) is read '@' by '@': the run of local-part
        characters before it, read backwards, then the address from that run's start; a larger group
        (a list of addresses, or hostile text) by one scan of its window.  Both find the same addresses."""
        ats, at = [], text.find("@")
        while at != -1:
            ats.append(at)
            at = text.find("@", at + 1)
        found: list[tuple[int, int, str]] = []
        i = 0
        while i < len(ats):
            j, hi = i + 1, ats[i] + 256
            while j < len(ats) and ats[j] - 65 <= hi:
                hi = ats[j] + 256
                j += 1
            if j - i > 2:
                matches = _EMAIL.finditer(text, max(0, ats[i] - 65), hi)
            else:
                matches, done = [], 0
                for at in ats[i:j]:
                    if at <= done or text[at - 1] not in _LOCAL_CHARS:
                        continue  # (an address never starts inside the one before it)
                    run = _LOCAL_RUN_REVERSED.match(text[max(0, at - 65):at][::-1]).end()
                    if run <= 64 and at - run >= done and (m := _EMAIL.match(text, at - run, hi)):
                        matches.append(m)
                        done = m.end()
            for m in matches:
                local = m.group(1)
                lead = len(local) - len(local.lstrip(".+-"))
                local = local[lead:]
                if local and not local.endswith(".") and ".." not in local and valid_mail_domain(m.group(2)):
                    found.append((m.start() + lead, m.end(), "email"))
            i = j
        return found

    # -- IPv6 ------------------------------------------------------------------------------------
    def _ipv6(self, text: str, original: str):
        """Around each ':' not already read: the run of hex digits, ':' and '.' that holds it (at most
        45 characters, else it is part of something longer), a zone id, then validation."""
        size = len(text)
        pair = _V6_PAIR.search(text)  # the run holds every ':' of a candidate here: one is no address
        while pair:
            colon = pair.start()
            left = _V6_RUN_REVERSED.match(text[max(0, colon - 46):colon][::-1]).end()
            end = _V6_RUN.match(text, colon).end()
            start, stop = colon - left, end
            while start < colon and text[start] == ".":
                start += 1
            while stop > colon and text[stop - 1] == ".":  # a sentence's full stop: "… ::1."
                stop -= 1
            if text.startswith(":", start) and not text.startswith("::", start):
                start += 1  # "地址：2606:…" (the full-width colon is a ':' once normalised)
            zone = _V6_ZONE.match(text, end) if end == stop else None
            after = zone.end() if zone else stop
            wide = original.rfind("\uff1a", start, stop)
            if wide != -1 and ":" in original[start:stop]:
                start = wide + 1  # "A：2a00:1450::200e": a full-width colon among ASCII ones is punctuation
            if left < 46 and stop - start <= 45 and (after == size or text[after] not in _GLUE):
                if not (start and text[start - 1] in _GLUE) and valid_ipv6(text[start:stop]):
                    yield start, after, "ip"
            pair = _V6_PAIR.search(text, end)


_GLUE = frozenset("ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ_")  # a letter that cannot be hex: std::vector
_V6_RUN = re.compile(r"[0-9A-Fa-f:.]*+")
_V6_PAIR = re.compile(r":[0-9A-Fa-f.]*+:")  # a ':' whose run holds another
_V6_RUN_REVERSED = re.compile(r"[0-9A-Fa-f:.]{0,46}+")
_V6_ZONE = re.compile(r"%[0-9A-Za-z_\-]{1,16}+")
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
# IPv6 ranges that are not globally routable (Python's is_private list for IPv6) and multicast.
_NOT_GLOBAL_V6 = tuple((int(n.network_address) >> (128 - n.prefixlen), 128 - n.prefixlen) for n in map(ipaddress.IPv6Network, (
    "::1/128", "::/128", "100::/64", "2001::/23", "2001:2::/48", "2001:db8::/32", "2001:10::/28", "fc00::/7", "fe80::/10",
    "ff00::/8")))


def valid_ipv6(candidate: str) -> bool:
    """Parses as IPv6 (RFC 5952 forms: '::', embedded IPv4), is public, and — outside 2000::/3, where
    every assigned global address is — writes at least three groups ('dead::beef' is code)."""
    if candidate.count(":") < 2:
        return False
    value = _v6_value(candidate)
    if value is None:
        return False
    if value >> 32 == 0xFFFF:  # IPv4-mapped
        return _public_v4_int(value & 0xFFFFFFFF)
    top = value >> 112
    if (top in (0, 0x100, 0x2001) or top >= 0xFC00) and any(value >> shift == net for net, shift in _NOT_GLOBAL_V6):
        return False  # (every range of _NOT_GLOBAL_V6 starts with one of those first groups)
    groups = candidate.split("%")[0].split(":")
    return value >> 125 == 1 or sum(1 + ("." in g) for g in groups if g) >= 3  # 1: in 2000::/3


_HEX_COLON = frozenset("0123456789abcdefABCDEF:")
_EIGHT_GROUPS = "%4s" * 8


def _v6_value(candidate: str) -> int | None:
    """The address as an int, or None: the rules of ipaddress.IPv6Address, read without building one
    for the common text (hex groups and '::'); an embedded IPv4 or a zone goes to ipaddress."""
    if "." in candidate or "%" in candidate or "/" in candidate:
        try:
            return int(ipaddress.IPv6Address(candidate))
        except ValueError:
            return None
    parts = candidate.split(":")
    n = len(parts)
    if n < 3 or n > 9 or not _HEX_COLON.issuperset(candidate):
        return None
    skip = candidate.find("::")
    if skip == -1:  # eight groups
        if n != 8 or not parts[0] or not parts[-1]:
            return None
        groups = parts
    else:  # one '::' (the empty part at `skip`) for the zero groups
        if candidate.find("::", skip + 1) != -1:
            return None
        skip = candidate.count(":", 0, skip) + 1
        hi, lo = skip, n - skip - 1
        if not parts[0]:
            hi -= 1
            if hi:
                return None
        if not parts[-1]:
            lo -= 1
            if lo:
                return None
        if hi + lo > 7:
            return None
        groups = parts[:hi] + ["0"] * (8 - hi - lo) + (parts[n - lo:] if lo else [])
    padded = _EIGHT_GROUPS % tuple(groups)
    return int(padded.replace(" ", "0"), 16) if len(padded) == 32 else None  # longer: a group of 5 or more


# --- e-mail ---------------------------------------------------------------------------------------
# A local part of ASCII letters, digits and . _ % + - (RFC 5321's dot-atom without the rare symbols);
# see docs/pii.md for why quoted and non-ASCII local parts are not taken.
_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+\-])([A-Za-z0-9._%+\-]{1,64}+)@((?:[A-Za-z0-9\-]{1,63}+\.)+[A-Za-z0-9\-]{1,63}+)")
_LOCAL_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
_LOCAL_RUN_REVERSED = re.compile(r"[A-Za-z0-9._%+\-]{0,65}+")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?")
_TLD = re.compile(r"[A-Za-z]{2,24}|xn--[A-Za-z0-9\-]{1,59}")
_RETINA = re.compile(r"[0-9]+x", re.IGNORECASE)  # icon@2x.png, logo@1.5x.jpg: a scale factor, not a host
# A "TLD" that is a file extension: image names (logo@2x.png), asset paths, systemd unit instances.
_FILE_EXTENSIONS = frozenset("png jpg jpeg gif svg webp bmp ico tif tiff avif heic js mjs cjs css scss less json html htm xml "
                             "txt md pdf zip gz tgz tar bz2 xz py rb go rs java kt ts tsx jsx vue php sh yml yaml toml lock "
                             "mp3 mp4 wav mov avi mkv woff woff2 ttf otf eot map wasm exe dll so dylib "
                             "service socket target mount automount timer path slice scope device swap".split())


@functools.lru_cache(maxsize=4096)  # the same few domains come back again and again
def valid_mail_domain(domain: str) -> bool:
    labels = domain.split(".")
    tld = labels[-1]
    return (len(domain) <= 253 and len(labels) >= 2 and _TLD.fullmatch(tld) is not None
            and tld.lower() not in _FILE_EXTENSIONS and all(_LABEL.fullmatch(lb) for lb in labels)
            and not any(_RETINA.fullmatch(lb) for lb in labels))


def _claim(spans: list, found) -> list:
    """`spans` (sorted, non-overlapping) with each of `found` (sorted) that overlaps none of them: the
    kinds claimed first win.  One merge, linear in both."""
    if not spans:
        return found if isinstance(found, list) else list(found)
    out, i, taken = [], 0, len(spans)
    for span in found:
        while i < taken and spans[i][1] <= span[0]:
            out.append(spans[i])
            i += 1
        if (i < taken and spans[i][0] < span[1]) or (out and out[-1][1] > span[0]):
            continue
        out.append(span)
    out.extend(spans[i:])
    return out
