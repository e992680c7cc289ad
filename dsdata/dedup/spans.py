"""URL and line/span deduplication keys (pure functions; the Beam steps are in dsdata/beam/dedup/spans.py).

What a URL's key drops and what a line or span unit is: docs/dedup.md; a unit's key is a 64-bit
BLAKE2b of its normalised form (NFKC, case-folded, whitespace collapsed).
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

LINE_UNITS = ("line", "sentences")
_TRACKING = re.compile(r"^(?:utm_\w+|fbclid|gclid|dclid|msclkid|mc_cid|mc_eid|yclid|_ga|igshid|spm)$", re.IGNORECASE)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SPACE = re.compile(r"\s+")
# A sentence ends at a run of . ! ? followed by a space or the end, or at a CJK full stop / mark
# (with closing quotes or brackets that follow it).
_SENTENCE = re.compile(r"[^\n]*?(?:[.!?]+[\"'”’」』)]*(?=\s|$)|[。！？]+[”’」』）]*|\n|$)")


def normalise_url(url: object) -> str | None:
    """The dedup key of a URL, or None when `url` is not a usable http(s)/other absolute URL."""
    if not isinstance(url, str) or not url.strip():
        return None
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not parts.netloc:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().rstrip(".")
    if host.startswith("www."):
        host = host[4:]
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    if scheme in _DEFAULT_PORTS:
        scheme = "http"  # the same page over http and https
    path = parts.path or "/"
    if len(path) > 1:
        path = path.rstrip("/")
    query = sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not _TRACKING.match(k))
    return urlunsplit((scheme, netloc, path, urlencode(query), ""))


def _normal(text: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()


def _key(normal: str) -> bytes:
    return hashlib.blake2b(normal.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def pieces(text: str, unit: str) -> list[tuple[int, int]]:
    """The removable pieces of `text`: its lines, or its sentences (each with its trailing space)."""
    if unit == "line":
        out, start = [], 0
        for line in text.split("\n"):
            out.append((start, start + len(line)))
            start += len(line) + 1
        return out
    out = []
    for m in _SENTENCE.finditer(text):
        if m.end() > m.start() and text[m.start():m.end()].strip():
            out.append((m.start(), m.end()))
    return out


def unit_keys(text: str, unit: str, min_chars: int) -> list[tuple[bytes, tuple[int, ...]]]:
    """(key, indices of the pieces it covers) for every unit of `text` long enough to count."""
    spans = pieces(text, unit)
    normals = [_normal(text[s:e]) for s, e in spans]
    if unit == "line":
        return [(_key(n), (i,)) for i, n in enumerate(normals) if len(n) >= min_chars]
    out = []
    for i in range(len(spans) - 2):
        joined = " ".join(normals[i:i + 3])
        if len(joined) >= min_chars:
            out.append((_key(joined), (i, i + 1, i + 2)))
    return out


def remove_units(text: str, unit: str, min_chars: int, drop: set[bytes]) -> tuple[str, int]:
    """`text` without the pieces of the units whose key is in `drop`, and how many pieces went."""
    gone: set[int] = set()
    for key, covered in unit_keys(text, unit, min_chars):
        if key in drop:
            gone.update(covered)
    if not gone:
        return text, 0
    spans = pieces(text, unit)
    if unit == "line":
        kept = [text[s:e] for i, (s, e) in enumerate(spans) if i not in gone]
        return "\n".join(kept), len(gone)
    out, pos = [], 0
    for i, (s, e) in enumerate(spans):
        if i in gone:
            out.append(text[pos:s])
            pos = e
    out.append(text[pos:])
    return re.sub(r"[ \t]{2,}", " ", "".join(out)).strip(), len(gone)
