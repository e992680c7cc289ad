"""What every reader shares: the read stage's name, the file-level rejection, the binary-file
rule, records → Documents (ids, surrogate scrubbing, JSON depth), and reading a whole file under a cap."""
from __future__ import annotations

import json
import re
from typing import IO, Any

from dsdata.document import Document, Rejected
from dsdata.io.decompress import Damage, decoded_chunks

READ_STAGE = "read"
_BINARY_SNIFF = 8192
# A compressed file's name ends in one of these after its format's own suffix (data.jsonl.gz).
COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")
_MAX_LINE = 256 * 1024 * 1024


class InputFormatError(ValueError):
    """The format of an input path cannot be determined."""


def _file_rejection(path: str, reason: str, detail: str, text: str = "") -> Rejected:
    return Rejected(
        doc=Document(id=path, text=text, metadata={"source": path}), stage=READ_STAGE, reason=reason, detail=detail
    )


_CONTROL = bytes(range(0, 9)) + bytes(range(14, 27)) + bytes(range(28, 32))


def _looks_binary(chunk: bytes) -> bool:
    """Over 10 % of the first 8 KiB are control bytes that text never holds."""
    if not chunk:
        return False
    return sum(chunk.count(b) for b in _CONTROL) > 0.1 * len(chunk)


# The types json.dumps writes itself; any other id (a Parquet timestamp, date, decimal, binary or
# a struct holding one) is made a string by _scalar_id.
_JSON_TYPES = (int, float, bool, type(None), list, tuple, dict)


def _scalar_id(value: Any) -> str:
    """A non-JSON id value as a string: bytes as their UTF-8 text (else hex), anything else str()."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data.hex()
    return str(value)


def _stringify_id(value: Any) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, _JSON_TYPES):
        return _scalar_id(value)
    return json.dumps(value, ensure_ascii=False, default=_scalar_id)


def record_to_document(
    record: Any, default_id: str, text_field: str = "text", id_field: str = "id", raw: str = ""
) -> Document | Rejected:
    """A JSON-like record → Document, or a Rejected naming what is wrong with it."""
    if not isinstance(record, dict):
        return Rejected(
            Document(id=default_id, text=raw, metadata={}), READ_STAGE, "not_an_object", type(record).__name__
        )
    rec_id = record.get(id_field)
    doc_id = default_id if rec_id is None else rec_id if isinstance(rec_id, str) else _stringify_id(rec_id)
    # Every field but id and text, in the record's order: a copy and two pops at C speed.
    metadata = record.copy()
    metadata.pop(text_field, None)
    metadata.pop(id_field, None)
    text = record.get(text_field)
    if not isinstance(text, str):
        detail = f"field '{text_field}' is missing" if text is None else f"field '{text_field}' is {type(text).__name__}"
        return Rejected(Document(id=doc_id, text=raw, metadata=metadata), READ_STAGE, "missing_text", detail)
    if not text or text.isspace():  # = not text.strip(), without copying the text
        return Rejected(Document(id=doc_id, text=text, metadata=metadata), READ_STAGE, "empty_text")
    return Document(id=doc_id, text=text, metadata=metadata)


# Reasons of lines that did not parse as JSON at all (the held-back kind, see _HOLD_ROWS).
_UNPARSED = frozenset({"bad_json", "invalid_utf8", "line_too_long", "truncated_compression", "corrupt_compression"})
_COMPRESSION_DAMAGE = frozenset({"truncated_compression", "corrupt_compression"})
# Records nested deeper than this are refused: the JSON decoder recurses (RecursionError near 1000
# levels) and so would every later json.dumps of the metadata, at a depth no data set needs.
MAX_JSON_DEPTH = 100
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def scrub_surrogates(value: Any) -> Any:
    """Replace unpaired UTF-16 surrogates (valid JSON escapes, not Unicode scalar values: no UTF-8
    encoder accepts them) by U+FFFD, as browsers do; the JSON decoder already joined valid pairs."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    return value


class _TooLarge(Exception):
    pass


def _whole(path: str, raw: IO[bytes]) -> tuple[bytes, Damage | None]:
    """The decoded content of a one-record file, and the first damage in it (None if intact).
    _TooLarge past _MAX_LINE bytes: a page that size is a decompression bomb, not a page."""
    parts = []
    size = 0
    for chunk in decoded_chunks(path, raw):
        if isinstance(chunk, Damage):
            return b"".join(parts), chunk
        parts.append(chunk)
        size += len(chunk)
        if size > _MAX_LINE:
            raise _TooLarge(size)
    return b"".join(parts), None


def _one_record_file(path: str, raw: IO[bytes]) -> bytes | Rejected:
    """The decoded bytes of a file that is one record (an HTML page, a text file), or its rejection:
    unreadable, too large, or damaged (a page cut by damage is rejected whole, not served half)."""
    try:
        data, damage = _whole(path, raw)
    except OSError as exc:
        return _file_rejection(path, "unreadable_file", f"{type(exc).__name__}: {exc}")
    except _TooLarge:
        return _file_rejection(path, "too_large", f"over {_MAX_LINE} bytes decoded; not read further")
    if damage is not None:
        return _file_rejection(path, damage.reason, damage.detail)
    return data


def base_name(path: str) -> str:
    """The lower-case file name without its compression suffix: what names the format."""
    name = path.lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
