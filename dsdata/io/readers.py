"""Readers: turn one input file into Documents, and every unreadable part of it into a Rejected.

Each reader takes the file's name and a binary file object (local or from any Beam filesystem) and
yields `Document` or `Rejected(stage="read")`.  Nothing is skipped silently: a malformed line,
invalid UTF-8, a record without text, a binary file or a truncated compressed stream each become
one rejected row, so the ledger (input == kept + Σ rejected) counts them.  Blank lines in JSONL are
not records and are not counted.

Reason codes (stage `read`): bad_json, not_an_object, invalid_utf8, missing_text, empty_text,
binary_file, truncated_compression, bad_parquet, bad_warc, undecodable_payload, unreadable_file.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from typing import IO, Any, Iterator

from dsdata.document import Document, Rejected

READ_STAGE = "read"
FORMATS = ("jsonl", "parquet", "html", "warc")

_HTML_EXT = (".html", ".htm", ".xhtml", ".shtml")
_BINARY_SNIFF = 8192
_MAX_LINE = 256 * 1024 * 1024


class InputFormatError(ValueError):
    """The format of an input path cannot be determined."""


def detect_format(path: str) -> str:
    """Input format from the file name: .jsonl/.json/.ndjson (optionally .gz/.zst), .parquet,
    .html/.htm, .warc/.warc.gz."""
    name = path.lower()
    for suffix in (".gz", ".zst", ".zstd"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(_HTML_EXT):
        return "html"
    if name.endswith((".warc", ".arc")):
        return "warc"
    raise InputFormatError(
        f"cannot tell the format of '{path}' from its name; set input.format in the recipe "
        f"or pass --format ({', '.join(FORMATS)})"
    )


def _compression(path: str) -> str | None:
    name = path.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith((".zst", ".zstd")):
        return "zstd"
    return None


def _decompressed(path: str, raw: IO[bytes]) -> IO[bytes]:
    kind = _compression(path)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def _read_errors():
    errors: list[type[BaseException]] = [EOFError, zlib.error, gzip.BadGzipFile, OSError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstandard is a core dependency
        pass
    return tuple(errors)


def _file_rejection(path: str, reason: str, detail: str, text: str = "") -> Rejected:
    return Rejected(
        doc=Document(id=path, text=text, metadata={"source": path}), stage=READ_STAGE, reason=reason, detail=detail
    )


_CONTROL = bytes(range(0, 9)) + bytes(range(14, 27)) + bytes(range(28, 32))


def _looks_binary(chunk: bytes) -> bool:
    """A file is binary (one rejected row, not one per garbage "line") when over 10 % of its first
    8 KiB are control bytes that text never holds; a stray NUL in a text line is rejected per line."""
    if not chunk:
        return False
    return sum(chunk.count(b) for b in _CONTROL) > 0.1 * len(chunk)


def _stringify_id(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def record_to_document(
    record: Any, default_id: str, text_field: str = "text", id_field: str = "id", raw: str = ""
) -> Document | Rejected:
    """A JSON-like record → Document, or a Rejected naming what is wrong with it."""
    if not isinstance(record, dict):
        return Rejected(
            Document(id=default_id, text=raw, metadata={}), READ_STAGE, "not_an_object", type(record).__name__
        )
    rec_id = record.get(id_field)
    doc_id = default_id if rec_id is None else _stringify_id(rec_id)
    metadata = {k: v for k, v in record.items() if k not in (text_field, id_field)}
    text = record.get(text_field)
    if not isinstance(text, str):
        detail = f"field '{text_field}' is missing" if text is None else f"field '{text_field}' is {type(text).__name__}"
        return Rejected(Document(id=doc_id, text=raw, metadata=metadata), READ_STAGE, "missing_text", detail)
    if not text.strip():
        return Rejected(Document(id=doc_id, text=text, metadata=metadata), READ_STAGE, "empty_text")
    return Document(id=doc_id, text=text, metadata=metadata)


_CHUNK = 1 << 16


def _iter_lines(stream: IO[bytes], pending: bytes = b"") -> Iterator[bytes]:
    """Lines of a (decompressing) stream, read in 64 KiB chunks so that a truncated compressed
    file still yields every complete line before the damage; the caller sees the read error."""
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            yield from (line for line in pending.split(b"\n") if line)
            return
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield line
        if len(pending) > _MAX_LINE:
            raise ValueError(f"a line longer than {_MAX_LINE} bytes")


def read_jsonl(path: str, raw: IO[bytes], text_field: str = "text", id_field: str = "id") -> Iterator[Document | Rejected]:
    """JSON Lines, plain or .gz/.zst. Ids default to `PATH:LINE` (1-based)."""
    errors = _read_errors() + (ValueError,)
    lineno = 0
    try:
        stream = _decompressed(path, raw)
        head = stream.read(_BINARY_SNIFF)
        if _looks_binary(head):
            yield _file_rejection(path, "binary_file", "over 10 % control bytes in the first 8 KiB; not a text JSONL file")
            return
        for line in _iter_lines(stream, head):
            lineno += 1
            result = _jsonl_record(line, f"{path}:{lineno}", text_field, id_field)
            if result is not None:
                yield result
    except errors as exc:
        yield _file_rejection(
            f"{path}:{lineno + 1}", "truncated_compression",
            f"{type(exc).__name__} after line {lineno}: {exc}; the rest of the file is unreadable",
        )


def _jsonl_record(line: bytes, default_id: str, text_field: str, id_field: str) -> Document | Rejected | None:
    if not line.strip():
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Rejected(Document(id=default_id, text=line.decode("utf-8", "replace"), metadata={}),
                        READ_STAGE, "invalid_utf8", str(exc))
    try:
        record = json.loads(text)
    except ValueError as exc:
        return Rejected(Document(id=default_id, text=text.rstrip("\r\n"), metadata={}), READ_STAGE, "bad_json", str(exc))
    return record_to_document(record, default_id, text_field, id_field, raw=text.rstrip("\r\n"))


def read_parquet(path: str, raw: IO[bytes], text_field: str = "text", id_field: str = "id") -> Iterator[Document | Rejected]:
    """Parquet, row group by row group. Ids default to `PATH:ROW` (0-based)."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(raw)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a non-Parquet file
        yield _file_rejection(path, "bad_parquet", f"{type(exc).__name__}: {exc}")
        return
    row = 0
    for group in range(pf.num_row_groups):
        try:
            table = pf.read_row_group(group)
        except Exception as exc:  # noqa: BLE001
            yield _file_rejection(
                f"{path}:group{group}", "bad_parquet",
                f"row group {group} of {pf.num_row_groups} unreadable ({type(exc).__name__}: {exc})",
            )
            row += pf.metadata.row_group(group).num_rows
            continue
        for record in table.to_pylist():
            yield record_to_document(record, f"{path}:{row}", text_field, id_field)
            row += 1


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_\-]+)""", re.I)


def decode_html(data: bytes, declared: str | None = None) -> str | None:
    """Bytes of an HTML page → str: declared charset, then <meta charset>, then UTF-8; None if none fit."""
    candidates = []
    if declared:
        candidates.append(declared)
    m = _META_CHARSET.search(data[:4096])
    if m:
        candidates.append(m.group(1).decode("ascii"))
    candidates.append("utf-8")
    for enc in candidates:
        try:
            return data.decode(enc)
        except (UnicodeDecodeError, LookupError):
            continue
    return None


def read_html(path: str, raw: IO[bytes], **_: Any) -> Iterator[Document | Rejected]:
    """One HTML file → one document whose id is the file's path."""
    errors = _read_errors()
    try:
        data = _decompressed(path, raw).read()
    except errors as exc:
        yield _file_rejection(path, "truncated_compression", f"{type(exc).__name__}: {exc}")
        return
    if _looks_binary(data[:_BINARY_SNIFF]):
        yield _file_rejection(path, "binary_file", "over 10 % control bytes in the first 8 KiB; not an HTML file")
        return
    text = decode_html(data)
    meta = {"source": path, "content_type": "text/html"}
    if text is None:
        yield Rejected(Document(path, data.decode("utf-8", "replace"), meta), READ_STAGE, "invalid_utf8",
                       "no declared charset decodes the page and it is not UTF-8")
        return
    if not text.strip():
        yield Rejected(Document(path, text, meta), READ_STAGE, "empty_text")
        return
    yield Document(id=path, text=text, metadata=meta)


def _gzip_intact(raw: IO[bytes]) -> bool | None:
    """True if a multi-member gzip stream decompresses to its very end; None if it cannot be re-read.
    warcio stops silently at a member cut off inside its header, so truncation is checked here."""
    try:
        raw.seek(0)
    except (AttributeError, OSError, ValueError):
        return None
    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    in_member = False
    try:
        while True:
            chunk = raw.read(1 << 20)
            if not chunk:
                break
            while chunk:
                decomp.decompress(chunk)
                in_member = not decomp.eof
                if decomp.eof:
                    chunk = decomp.unused_data
                    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
                else:
                    chunk = b""
        ok = not in_member
    except zlib.error:
        ok = False
    raw.seek(0)
    return ok


def read_warc(path: str, raw: IO[bytes], **_: Any) -> Iterator[Document | Rejected]:
    """WARC (gzipped or not): one document per `response` record; other record types (request,
    metadata, warcinfo) describe the crawl and are not documents.  id = WARC-Record-ID."""
    from warcio.archiveiterator import ArchiveIterator

    intact = _gzip_intact(raw) if _compression(path) == "gzip" else None
    count = 0
    try:
        for record in ArchiveIterator(raw, arc2warc=True):
            if record.rec_type != "response":
                continue
            count += 1
            rec_id = record.rec_headers.get_header("WARC-Record-ID") or f"{path}:{count}"
            meta = {
                "url": record.rec_headers.get_header("WARC-Target-URI"),
                "warc_date": record.rec_headers.get_header("WARC-Date"),
                "source": path,
            }
            ctype = record.http_headers.get_header("Content-Type") if record.http_headers else None
            meta["content_type"] = (ctype or "").split(";")[0].strip().lower() or "application/octet-stream"
            payload = record.content_stream().read()
            if getattr(record.raw_stream, "limit", 0):
                yield Rejected(Document(rec_id, payload.decode("utf-8", "replace"), meta), READ_STAGE,
                               "truncated_record", f"{record.raw_stream.limit} bytes of the record are missing")
                continue
            charset = None
            if ctype and "charset=" in ctype.lower():
                charset = ctype.lower().split("charset=")[-1].split(";")[0].strip(" \"'")
            if _looks_binary(payload[:_BINARY_SNIFF]) or not meta["content_type"].startswith(("text/", "application/xhtml")):
                yield Rejected(Document(rec_id, "", meta), READ_STAGE, "binary_file",
                               f"payload is {meta['content_type']}, not text")
                continue
            text = decode_html(payload, charset)
            if text is None:
                yield Rejected(Document(rec_id, payload.decode("utf-8", "replace"), meta), READ_STAGE,
                               "undecodable_payload", f"charset {charset!r} and UTF-8 both fail")
                continue
            if not text.strip():
                yield Rejected(Document(rec_id, text, meta), READ_STAGE, "empty_text")
                continue
            yield Document(id=rec_id, text=text, metadata=meta)
    except Exception as exc:  # noqa: BLE001 - warcio raises assorted errors on damaged input
        yield _file_rejection(
            f"{path}:after{count}", "bad_warc",
            f"{type(exc).__name__} after {count} response records: {exc}; the rest of the file is unreadable",
        )
        return
    if intact is False:
        yield _file_rejection(
            f"{path}:after{count}", "truncated_compression",
            f"the gzip stream ends mid-member after {count} response records; the rest of the file is lost",
        )


READERS = {"jsonl": read_jsonl, "parquet": read_parquet, "html": read_html, "warc": read_warc}


def read_file(path: str, raw: IO[bytes], fmt: str = "auto", text_field: str = "text", id_field: str = "id"):
    """Dispatch to the reader for `fmt` ('auto' = from the file name)."""
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in READERS:
        raise InputFormatError(f"unknown input format '{fmt}' (known: {', '.join(FORMATS)})")
    return READERS[fmt](path, raw, text_field=text_field, id_field=id_field)


def read_local(path: str, fmt: str = "auto", **kwargs: Any) -> list[Document | Rejected]:
    """Read a local file fully (for tests and small tools)."""
    with open(path, "rb") as fh:
        return list(read_file(os.fspath(path), fh, fmt, **kwargs))
