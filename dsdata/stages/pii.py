"""`pii`: find personal data — e-mail addresses, public IP addresses, phone numbers, PRC resident
identity numbers, bank card numbers — and redact, tag or reject.

  mode: redact   each match is replaced by its token (<EMAIL>, <IP>, <PHONE>, <ID>, <CARD>)
  mode: tag      the text is unchanged; `pii_spans` lists every match (type, start, end), as dolma's
                 taggers do, to redact or filter later
  mode: reject   a document with any match is rejected `pii` (the detail counts each type)

Every kept document gets `pii_counts` (matches per type); the counts over the whole run are the
`pii_counts` tally in stats.json and the report.

Precision over recall: every candidate passes a validator, not only a pattern.
  email   RFC-shaped local@domain with a letter TLD that is not a file extension (icon@2x.png)
  ip      IPv4 dotted quads without leading zeros, not part of a longer dotted number (1.2.3.4.5,
          OIDs) and not after "version"/"v"; IPv6 that parses; both only when globally routable
          (no private, loopback, link-local, documentation, or unassigned IPv6 outside 2000::/3)
  phone   mainland mobiles 1[3-9]x xxxx xxxx (optionally +86 / 86), not inside a longer digit or
          alphanumeric run, not money (¥…, …元); international "+CC …" forms of 8-15 digits
  id      18-character resident identity numbers: a province code, a real birth date (1900 on, not
          in the future) and the ISO 7064 MOD 11-2 check character
  card    13-19 digits, plain or in groups of 4 (Amex 4-6-5), passing Luhn, with an issuer prefix
          (2-6), not one digit repeated
A span claimed by an earlier type is not matched again (an identity number is not also a card).
"""
from __future__ import annotations

import datetime
import ipaddress
import re

import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.stages.base import DocumentStage, Param
from dsdata.stages.params import Choice, ListOf

PII_TYPES = ("email", "ip", "phone", "id", "card")
TOKENS = {"email": "<EMAIL>", "ip": "<IP>", "phone": "<PHONE>", "id": "<ID>", "card": "<CARD>"}
COUNTS = "pii_counts"

# --- e-mail ---------------------------------------------------------------------------------------
_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9](?:[A-Za-z0-9._%+-]{0,62}[A-Za-z0-9_-])?"
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z]{2,24})(?![\w-]|\.[A-Za-z0-9])")
# A "TLD" that is a file extension: retina image names (logo@2x.png), asset paths.
_FILE_EXTENSIONS = frozenset("png jpg jpeg gif svg webp bmp ico tif tiff js mjs css scss json html htm xml "
                             "txt md pdf zip gz tar py rb go rs java kt ts tsx jsx vue php sh yml yaml lock "
                             # systemd unit instances: getty@tty1.service, modprobe@drm.service
                             "service socket target mount automount timer path slice scope device swap".split())

# --- IP -----------------------------------------------------------------------------------------
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]\d|\d)"
_IPV4 = re.compile(rf"(?<![\w.])(?<!\d\.){_OCTET}(?:\.{_OCTET}){{3}}(?![\w]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}:|:(?=:))(?:[0-9A-Fa-f]{0,4}:){1,7}[0-9A-Fa-f]{0,4}"
                   r"(?:(?<=:)\d{1,3}(?:\.\d{1,3}){3})?(?![\w:.])")
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
# Dotted quads of small numbers are mostly section numbers (Section 9.2.1.4, 第 6.3.1.1 节) and
# versions (LibreOffice 7.4.1.2, 2.6.38.6): one with fewer than two octets of 10 or more is an IP
# address only with an IP word within 40 characters (8.8.8.8 作为域名服务器, "IP 1.1.1.1").
_IP_CONTEXT = re.compile(r"(?<![A-Za-z])(?:IP|IPv4|address|addr|DNS|nameserver|server|host|ping|gateway|router|"
                         r"resolver|地址|服务器|伺服器|域名|网关|主机|位址)(?![a-z])", re.IGNORECASE)
_SECTION_BEFORE = re.compile(r"(?:section|chapter|sec\.|ch\.|§|第|節|节|见|見|参见|參見)\s*$", re.IGNORECASE)
_SECTION_AFTER = re.compile(r"^(?:\s*[节節章]|\.\s)")
_VERSION_BEFORE = re.compile(r"(?<![A-Za-z])(?:version|release|build|ver|v|版本|版)\s*[:=]?\s*$", re.IGNORECASE)

# --- phones -------------------------------------------------------------------------------------
_MOBILE_CN = re.compile(r"(?<![\w+.\-/])(?:(?:\+86|0086|86)[\s-]?)?(1[3-9]\d(?:[\s-]?\d{4}){2})(?![\w]|[.\-/]\d)")
# "+CC" then groups; without any separator only 11-15 digits (E.164 written solid): "+33554432",
# "+2147483647" are numbers, not phones.
_PHONE_INTL = re.compile(r"(?<![\w+=*/^])\+(?:[1-9]\d{0,2})(?:[\s.-]?\(\d{1,4}\))?(?:[\s.-]?\d{1,4}){2,5}(?![\w]|[.-]\d)")
_MONEY_BEFORE = re.compile(r"[$¥￥€£]\s*$|(?:RMB|CNY|USD)\s*$", re.IGNORECASE)
_MONEY_AFTER = re.compile(r"^\s*(?:元|块|万|亿|美元|人民币|円|%)")

# --- resident identity numbers --------------------------------------------------------------------
_ID_CN = re.compile(r"(?<![\w])([1-9]\d{5})((?:19|20)\d{2})(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])(\d{3})([\dXx])(?![\w])")
_PROVINCES = frozenset({11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46,
                        50, 51, 52, 53, 54, 61, 62, 63, 64, 65, 71, 81, 82})
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"

# --- bank cards ---------------------------------------------------------------------------------
_CARD = re.compile(r"(?<![\w.\-/+])(?:\d{4}(?:[ -]\d{4}){2}[ -]\d{1,7}|\d{4}[ -]\d{6}[ -]\d{4,5}|\d{13,19})"
                   r"(?![\w]|[.\-/]\d)")


def id_check_char(first17: str) -> str:
    """ISO 7064 MOD 11-2 check character of an identity number's first 17 digits."""
    return _ID_CHECK[sum(int(d) * w for d, w in zip(first17, _ID_WEIGHTS)) % 11]


def valid_resident_id(number: str) -> bool:
    """An 18-character PRC resident identity number with a province code, a real past birth date
    and a correct check character."""
    m = _ID_CN.fullmatch(number)
    if not m or int(number[:2]) not in _PROVINCES:
        return False
    try:
        born = datetime.date(int(m.group(2)), int(m.group(3)), int(m.group(4)))
    except ValueError:
        return False
    if born > datetime.date.today():
        return False
    return id_check_char(number[:17]) == number[17].upper()


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def valid_card(candidate: str) -> bool:
    digits = candidate.replace(" ", "").replace("-", "")
    return (13 <= len(digits) <= 19 and digits[0] in "23456" and len(set(digits)) > 2 and luhn_ok(digits))


def public_ip(candidate: str) -> bool:
    try:
        addr = ipaddress.ip_address(candidate)
    except ValueError:
        return False
    if addr.version == 6 and addr not in _GLOBAL_UNICAST:
        return False
    return addr.is_global and not addr.is_multicast


def _phone_digits_ok(digits: str) -> bool:
    # 13000000000, 13333333333, +1 555 0000000: placeholders and round numbers.
    return len(set(digits[-8:])) > 2


# Where a digit-based kind can be: a run of 4 digits, a dotted quad's start, or "+digit".  One scan
# of this (its first character a class, so the engine skips other characters fast) finds the few
# places the validating patterns then run around, instead of five full scans of every text.
_CANDIDATE = re.compile(r"[\d+](?:(?<=\+)\d|(?<=\d)(?:\d{3}|\d{0,2}\.\d{1,3}\.\d{1,3}\.\d))")
_BEFORE, _AFTER = 32, 48  # a window's reach around a candidate: longer than any kind's text (≤ 30 chars)
_TRAILING = frozenset(".-/_%+")


def candidate_windows(text: str) -> list[tuple[int, int]]:
    """Merged (start, end) windows around the candidates; an end is pushed past letters, digits and
    . - / so that no match is cut short where the text goes on (a pattern's look-ahead ends there)."""
    return _merged(((m.start() - _BEFORE, m.end() + _AFTER) for m in _CANDIDATE.finditer(text)), text)


def _merged(windows, text: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    size = len(text)
    for start, end in windows:
        start, end = max(0, start), min(size, end)
        while end < size and (text[end].isalnum() or text[end] in _TRAILING):
            end += 1
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return out


def at_windows(text: str) -> list[tuple[int, int]]:
    """Windows around each '@' wide enough for an address (local part ≤ 64, domain ≤ 253)."""
    ats, at = [], text.find("@")
    while at != -1:
        ats.append((at - 66, at + 256))
        at = text.find("@", at + 1)
    return _merged(ats, text)


def colon_windows(text: str) -> list[tuple[int, int]]:
    """Windows where an IPv6 address can be: around each '::', and around every ':' of a text with
    the seven an uncompressed address needs (an address is at most 45 characters)."""
    if text.count(":") >= 7:
        step, marker = 1, ":"
    elif "::" in text:
        step, marker = 2, "::"
    else:
        return []
    found, at = [], text.find(marker)
    while at != -1:
        found.append((at - 45, at + 47))
        at = text.find(marker, at + step)
    return _merged(found, text)


class PiiFinder:
    """Finds the PII of the chosen types in a text: sorted, non-overlapping (start, end, type)."""

    def __init__(self, types: tuple[str, ...] = PII_TYPES):
        self.types = tuple(t for t in PII_TYPES if t in types)  # a fixed order: the claim priority

    def find(self, text: str) -> list[tuple[int, int, str]]:
        spans: list[tuple[int, int, str]] = []
        windows = candidate_windows(text) if self.types != ("email",) else []
        for kind in self.types:
            if kind == "email":
                spans.extend((m.start(), m.end(), kind) for start, end in at_windows(text)
                             for m in _EMAIL.finditer(text, start, end) if m.group(1).lower() not in _FILE_EXTENSIONS)
                continue
            found = [span for start, end in windows for span in getattr(self, f"_{kind}")(text, start, end)]
            if kind == "ip":
                found.extend(span for start, end in colon_windows(text) for span in self._ipv6(text, start, end))
            for start, end in found:
                if not any(s < end and start < e for s, e, _ in spans):
                    spans.append((start, end, kind))
        spans.sort()
        return spans

    def _id(self, text: str, pos: int, endpos: int):
        for m in _ID_CN.finditer(text, pos, endpos):
            if valid_resident_id(m.group(0)):
                yield m.span()

    def _card(self, text: str, pos: int, endpos: int):
        for m in _CARD.finditer(text, pos, endpos):
            if valid_card(m.group(0)):
                yield m.span()

    def _phone(self, text: str, pos: int, endpos: int):
        for m in _MOBILE_CN.finditer(text, pos, endpos):
            digits = re.sub(r"\D", "", m.group(1))
            if (_phone_digits_ok(digits) and not _MONEY_BEFORE.search(text[max(0, m.start() - 6):m.start()])
                    and not _MONEY_AFTER.match(text[m.end():m.end() + 4])):
                yield m.span()
        for m in _PHONE_INTL.finditer(text, pos, endpos):
            digits = re.sub(r"\D", "", m.group(0))
            solid = len(digits) + 1 == len(m.group(0))
            if (11 if solid else 8) <= len(digits) <= 15 and _phone_digits_ok(digits):
                yield m.span()

    @staticmethod
    def _small_quad_is_ip(text: str, start: int, end: int) -> bool:
        """A dotted quad of small numbers: an address only in an IP context and not numbering a section."""
        return (not _SECTION_BEFORE.search(text[max(0, start - 12):start])
                and not _SECTION_AFTER.match(text[end:end + 3])
                and _IP_CONTEXT.search(text[max(0, start - 40):end + 40]) is not None)

    def _ip(self, text: str, pos: int, endpos: int):
        for m in _IPV4.finditer(text, pos, endpos):
            if (public_ip(m.group(0)) and not _VERSION_BEFORE.search(text[max(0, m.start() - 12):m.start()])
                    and (sum(int(o) >= 10 for o in m.group(0).split(".")) >= 2
                         or self._small_quad_is_ip(text, m.start(), m.end()))):
                yield m.span()

    def _ipv6(self, text: str, pos: int, endpos: int):
        for m in _IPV6.finditer(text, pos, endpos):
            if public_ip(m.group(0)):
                yield m.span()


def redact(text: str, spans: list[tuple[int, int, str]]) -> str:
    out, pos = [], 0
    for start, end, kind in spans:
        out.append(text[pos:start])
        out.append(TOKENS[kind])
        pos = end
    out.append(text[pos:])
    return "".join(out)


_SPAN_TYPE = pa.struct([("type", pa.string()), ("start", pa.int64()), ("end", pa.int64())])


class PiiStage(DocumentStage):
    name = "pii"
    description = ("personal data (e-mail, public IP, phone incl. mainland mobiles, PRC identity numbers, bank "
                   "cards): redact (<EMAIL>, <IP>, <PHONE>, <ID>, <CARD>) | tag | reject")
    params = {
        "mode": Param("redact", "redact (replace with <EMAIL>, <IP>, <PHONE>, <ID>, <CARD>) | tag (pii_spans, "
                                "text unchanged) | reject (reason pii)", Choice(("redact", "tag", "reject"))),
        "types": Param(list(PII_TYPES), "which kinds to find: email, ip, phone, id, card",
                       ListOf(Choice(PII_TYPES), nonempty=True, single=True)),
    }
    annotations = {
        COUNTS: pa.struct([(t, pa.int64()) for t in PII_TYPES]),
        "pii_spans": pa.list_(_SPAN_TYPE),
    }
    tallies = (COUNTS,)

    def validate(self) -> None:
        self._finder = PiiFinder(tuple(self.types))

    def process(self, doc: Document) -> Document | Rejected:
        spans = self._finder.find(doc.text)
        counts = dict.fromkeys(PII_TYPES, 0)
        for _, _, kind in spans:
            counts[kind] += 1
        doc.annotations[COUNTS] = counts
        if not spans:
            return doc
        if self.mode == "reject":
            return self.reject(doc, "pii", ", ".join(f"{k} {n}" for k, n in counts.items() if n))
        if self.mode == "tag":
            doc.annotations["pii_spans"] = [{"type": k, "start": s, "end": e} for s, e, k in spans]
        else:
            # Positions in tag mode refer to the text as it is; after redaction they would not.
            doc.text = redact(doc.text, spans)
        return doc
