"""HTML pages (.html, .htm, .xhtml, .shtml): one document per file, decoded by BOM, <meta charset>
or sniffing (decode_html)."""
from __future__ import annotations

import re
from typing import IO, Any, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.encodings import bom_encoding, decode, decode_with_replacement, encoding_for_label, meta_encoding
from dsdata.io.readers.common import (READ_STAGE, _BINARY_SNIFF, _file_rejection, _looks_binary,
                                      _one_record_file)

HTML_SUFFIXES = (".html", ".htm", ".xhtml", ".shtml")


# The page's head as the tree builder meets it: where a <meta> can still set the encoding (browsers
# switch when the parser reaches one later in <head>, e.g. after a long inline script).
_HEAD_SCAN = 16 << 10
_BODY_START = re.compile(rb"<body[\s>/]", re.I)
_COMMENT = re.compile(rb"<!--.*?(?:-->|\Z)", re.S)
_META_TAG = re.compile(rb"<meta(?=[\s/])([^>]*)>?", re.I)
_ATTRIBUTE = re.compile(rb"""([^\s=/>"']+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+)))?""")
_CHARSET_IN_CONTENT = re.compile(rb"""charset\s*=\s*["']?\s*([A-Za-z0-9_.:\-]+)""", re.I)
_XML_DECLARATION = re.compile(rb"""\s*<\?xml\s[^>]*?encoding\s*=\s*["']([A-Za-z0-9_.:\-]+)""", re.I)
# A declared encoding whose strict decode fails still gives the page when only this many of its
# bytes are invalid (at least _TOLERATED_MIN): a crawl cut inside the last character, a stray byte.
# A page in another encoding than the one tried fails on most of its non-ASCII characters.
_TOLERATED_SHARE = 0.001
_TOLERATED_MIN = 4


def meta_charset(data: bytes) -> str | None:
    """The charset label a page's <meta> declares: `<meta charset=…>`, or `<meta http-equiv=
    "Content-Type" content="…; charset=…">` (a `content` with "charset=" on any other meta, such
    as a description, declares nothing); in <head>, comments skipped."""
    head = data[:_HEAD_SCAN]
    body = _BODY_START.search(head)
    if body is not None:
        head = head[:body.start()]
    head = _COMMENT.sub(b"", head)
    for tag in _META_TAG.finditer(head):
        attrs: dict[bytes, bytes] = {}
        for m in _ATTRIBUTE.finditer(tag.group(1)):
            value = m.group(2) if m.group(2) is not None else m.group(3) if m.group(3) is not None else m.group(4)
            attrs.setdefault(m.group(1).lower(), (value or b"").strip())
        label = attrs.get(b"charset")
        if not label and attrs.get(b"http-equiv", b"").lower() == b"content-type":
            found = _CHARSET_IN_CONTENT.search(attrs.get(b"content", b""))
            label = found.group(1) if found else None
        if label:
            name = meta_encoding(label.strip(b"\"' ").decode("ascii", "replace"))
            if name:
                return name
    return None


def decode_html(data: bytes, declared: str | None = None) -> str | None:
    """Bytes of an HTML page → str, as browsers decode it (the WHATWG Encoding Standard): a byte-order
    mark, else the first of the declared (HTTP) charset, <meta charset>, an XML declaration's
    encoding and UTF-8 that decodes the page strictly; when none does, the first under which at most
    0.1 % of the bytes are invalid (made U+FFFD).  None if no candidate gives the page."""
    bom = bom_encoding(data)
    if bom is not None:
        name, length = bom
        candidates = [name]
        data = data[length:]
    else:
        xml = _XML_DECLARATION.match(data[:1024])
        labels = (encoding_for_label(declared), meta_charset(data),
                  meta_encoding(xml.group(1).decode("ascii")) if xml else None, "UTF-8")
        candidates = list(dict.fromkeys(name for name in labels if name))
        for name in candidates:
            try:
                return decode(data, name)
            except UnicodeDecodeError:
                continue
    tolerated = max(_TOLERATED_MIN, int(_TOLERATED_SHARE * len(data)))
    for name in candidates:
        text, invalid = decode_with_replacement(data, name)
        if invalid <= tolerated:
            return text
    return None


def _page_text(data: bytes, declared: str | None = None) -> tuple[str | None, str | None]:
    """An HTML file's or WARC payload's text (decode_html), and what makes it binary (None if
    nothing); UTF-16 (half NUL bytes) is sniffed for control characters once decoded."""
    marked = bom_encoding(data) is not None or (encoding_for_label(declared) or "").startswith("UTF-16")
    if not marked and _looks_binary(data[:_BINARY_SNIFF]):
        return None, "over 10 % control bytes in the first 8 KiB"
    text = decode_html(data, declared)
    if marked and text is not None and _looks_binary(text[:_BINARY_SNIFF].encode("utf-8", "replace")):
        return None, "over 10 % control characters in the first 8 KiB of its decoded text"
    return text, None


def read_html(path: str, raw: IO[bytes], **_: Any) -> Iterator[Document | Rejected]:
    """One HTML file → one document whose id is the file's path."""
    data = _one_record_file(path, raw)
    if isinstance(data, Rejected):
        yield data
        return
    text, binary = _page_text(data)
    if binary:
        yield _file_rejection(path, "binary_file", f"{binary}; not an HTML file")
        return
    meta = {"source": path, "content_type": "text/html"}
    if text is None:
        yield Rejected(Document(path, data.decode("utf-8", "replace"), meta), READ_STAGE, "invalid_utf8",
                       "no declared charset decodes the page and it is not UTF-8")
        return
    if not text.strip():
        yield Rejected(Document(path, text, meta), READ_STAGE, "empty_text")
        return
    if text.strip() == "\ufffd" and len(data) > 3:
        yield Rejected(Document(path, text, meta), READ_STAGE, "unreadable_encoding",
                       "the page decodes to one U+FFFD: its charset is one the Encoding Standard maps to "
                       "'replacement' (ISO-2022-KR, HZ-GB-2312, ...), whose text cannot be read")
        return
    yield Document(id=path, text=text, metadata=meta)
