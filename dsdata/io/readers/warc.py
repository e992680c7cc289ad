"""Web archives (.warc, .arc; plain, .gz or .zst): one document per HTML response record; damaged
framing is one bad_warc row and reading resumes at the next `WARC/1.x` line."""
from __future__ import annotations

import io
import re
import uuid
from typing import IO, Any, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.decompress import Damage, compression_of, decoded_chunks
from dsdata.io.readers.common import READ_STAGE, _MAX_LINE, _file_rejection
from dsdata.io.readers.html import _page_text


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (one undamaged stretch of a WARC)."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._rest = memoryview(b"")  # a view, so handing out a large chunk piecewise copies it once

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not len(self._rest):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._rest = memoryview(chunk)
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


def _stretches(path: str, raw: IO[bytes]) -> Iterator[tuple[Iterator[bytes], list[Damage]]]:
    """Split a decoded stream at its damages: (chunks of one undamaged stretch, [the damage that
    ends it, if any]).  Each stretch must be consumed before the next is asked for."""
    source = decoded_chunks(path, raw)
    done = False
    while not done:
        ended: list[Damage] = []

        def stretch():
            nonlocal done
            for chunk in source:
                if isinstance(chunk, Damage):
                    ended.append(chunk)
                    return
                yield chunk
            done = True

        gen = stretch()
        yield gen, ended
        for _ in gen:  # drain what the WARC parser left unread
            pass


def read_warc(path: str, raw: IO[bytes], **_: Any) -> Iterator[Document | Rejected]:
    """WARC (compressed or not) or ARC: one document per `response` record, id = WARC-Record-ID.
    Records are framed here (`_warc_frames`), not by warcio's iterator, which lets a header without
    a valid Content-Length swallow the rest of the file: a malformed record is one `bad_warc` row and
    reading resumes at the next `WARC/1.x` line (after a corrupt member, at the next member)."""
    count = 0
    first = True
    if compression_of(path) is None and isinstance(raw, (io.BufferedIOBase, io.BytesIO)):
        stretches: Any = [(None, [])]  # an uncompressed buffered file is read as it is: no copies
    else:
        stretches = _stretches(path, raw)
    try:
        for chunks, ended in stretches:
            src = _Source(raw if chunks is None else io.BufferedReader(_ChunkReader(chunks), 1 << 16))
            for item in _warc_frames(src, arc_allowed=first):
                if isinstance(item, Damage):
                    yield _file_rejection(f"{path}:after{count}", item.reason,
                                          f"after {count} response records: {item.detail}")
                elif item.rec_type == "response":
                    count += 1
                    yield _warc_response(path, item, count)
            first = False
            for damage in ended:
                yield _file_rejection(f"{path}:after{count}", damage.reason,
                                      f"after {count} response records: {damage.detail}")
    except OSError as exc:
        yield _file_rejection(f"{path}:after{count}", "unreadable_file", f"{type(exc).__name__}: {exc}")


class _Source:
    """A byte stream with its offset and a pushback front: bytes already read (a record's block,
    the line after it) can be put back to be framed again."""

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._front: list[io.BytesIO] = []
        self.offset = 0

    def tell(self) -> int:
        return self.offset

    def unread(self, data: bytes) -> None:
        """Put back `data`, the bytes read just before the current position."""
        if data:
            self._front.insert(0, io.BytesIO(data))
            self.offset -= len(data)

    def read(self, n: int | None = -1) -> bytes:
        return self._take(-1 if n is None else n, line=False)

    def readline(self, limit: int | None = -1) -> bytes:
        return self._take(-1 if limit is None else limit, line=True)

    def _take(self, limit: int, line: bool) -> bytes:
        """Up to `limit` bytes (all when negative), or with `line` up to and with the next newline:
        the put-back bytes first, then the stream's."""
        parts = []
        while limit and self._front:
            front = self._front[0]
            part = front.readline(limit) if line else front.read(limit)
            if not part:
                self._front.pop(0)
                continue
            parts.append(part)
            if line and part.endswith(b"\n"):
                limit = 0
                break
            if limit > 0:
                limit -= len(part)
        if limit:
            parts.append(self._raw.readline(limit) if line else self._raw.read(limit))
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.offset += len(data)
        return data


_WARC_LINE = re.compile(rb"WARC/1\.[0-9]\r?\n")
_WARC_VERSION = re.compile(rb"WARC/(?:1\.[0-9]|0\.1[78])\r?\n\Z")  # the versions warcio reads
_ARC_LINE = re.compile(rb"\S+ \S+ [0-9]{14} \S* ?[0-9]+\r?\n\Z")  # URL IP date [mime] length
_CONTENT_LENGTH = re.compile(rb"[ \t]*[0-9]+[ \t]*\r?\n?\Z")
_LINE_CAP = 1 << 16  # lines are read in pieces of this size while searching
_MAX_HEADERS = 1 << 20  # a WARC header block over 1 MiB is not a header block


def _skip_to_record(src: _Source) -> tuple[int, bytes | None]:
    """Read up to the next `WARC/1.x` version line (ending a line, so also one right after garbage
    without a newline): (bytes skipped, that line, put back; None at the end of the stream)."""
    skipped = 0
    while True:
        line = src.readline(_LINE_CAP)
        if not line:
            return skipped, None
        m = _WARC_LINE.search(line)  # a match ends the line: the pattern ends in its newline
        if m is not None:
            src.unread(line[m.start():])
            return skipped + m.start(), line[m.start():]
        if not line.endswith(b"\n"):  # a piece of a long line: its tail may begin a version line
            w = line.rfind(b"W", max(0, len(line) - 10))
            if w > 0:
                src.unread(line[w:])
                line = line[:w]
        skipped += len(line)


def _header_problem(head: list[bytes]) -> str | None:
    """What makes a WARC header block unusable (None if nothing): a line that is not a field,
    no WARC-Type, a Content-Length missing or not a number."""
    fields: dict[bytes, bytes] = {}
    for n, line in enumerate(head[1:-1], 2):
        if line[:1] in (b" ", b"\t"):
            continue  # a continuation of the field above
        name, colon, value = line.partition(b":")
        if not colon or not name.strip():
            return f"header line {n} is not a 'Name: value' field: {line[:60].rstrip()!r}"
        fields.setdefault(name.strip().lower(), value)
    if not fields.get(b"warc-type", b"").strip():
        return "no WARC-Type header"
    length = fields.get(b"content-length")
    if length is None:
        return "no Content-Length header"
    if not _CONTENT_LENGTH.match(length):
        return f"Content-Length {length.strip()[:40]!r} is not a byte count"
    return None


def _warc_frames(src: _Source, arc_allowed: bool = False) -> Iterator[Any]:
    """warcio records (and a Damage for each unusable stretch) of a decoded WARC stream.  Each
    record's header block is checked and its block read before it is handed out: a bad header, or a
    block not followed by a record boundary, is one `bad_warc` Damage and framing resumes at the
    next `WARC/1.x` line.  A stream that starts like an ARC file is left to warcio."""
    loader = _record_loader()
    while True:
        line = src.readline(_LINE_CAP)
        while line and not line.strip():
            line = src.readline(_LINE_CAP)
        if not line:
            return
        start = src.offset - len(line)
        if not _WARC_VERSION.match(line):
            src.unread(line)
            if arc_allowed and _ARC_LINE.match(line):
                yield from _arc_records(src, loader)
                return
            skipped, found = _skip_to_record(src)
            what = f"{skipped} bytes at offset {start} are not a WARC record (they begin {line[:40]!r})"
            yield Damage("bad_warc", what + (f"; reading resumed at the next record (offset {src.offset})"
                                             if found else "; no further record in the file"), start)
            arc_allowed = False
            continue
        arc_allowed = False
        head = yield from _header_block(src, line, start)
        if head is None:
            return
        if head:
            yield from _framed_record(src, loader, head, start)


def _header_block(src: _Source, line: bytes, start: int) -> Iterator[Damage]:
    """The header lines of the record whose version `line` starts at `start`, through the blank
    line; [] when they are unusable (one bad_warc Damage, and the stream moved to the next record),
    None when the stream ends inside them (one truncated_record Damage)."""
    head = [line]
    size = len(line)
    while True:
        h = src.readline(_LINE_CAP)
        if not h:
            yield Damage("truncated_record", f"the file ends inside a record at offset {start} "
                         f"({size} bytes of it present)", start)
            return None
        head.append(h)
        size += len(h)
        if not h.strip() or size > _MAX_HEADERS:
            break
    problem = "headers over 1 MiB" if size > _MAX_HEADERS else _header_problem(head)
    if problem is None:
        return head
    src.unread(b"".join(head[1:]))
    skipped, found = _skip_to_record(src)
    yield Damage("bad_warc", f"malformed WARC record at offset {start}: {problem}; "
                 + (f"{skipped + len(line)} bytes skipped, reading resumed at the next record "
                    f"(offset {src.offset})" if found else
                    f"the {skipped + len(line)} bytes to the end of the file hold no further record"),
                 start)
    return []


def _framed_record(src: _Source, loader: Any, head: list[bytes], start: int) -> Iterator[Any]:
    """The record with these sound headers: its block read, and handed out when a record boundary
    (or the end) follows it; otherwise its Content-Length is wrong (`_misframed`)."""
    length = int(_header_value(head, b"content-length"))
    header = b"".join(head)
    if length > _MAX_LINE:  # too large to hold: streamed to the caller (a too_large row)
        src.unread(header)
        record = _parse_record(loader, src, start)
        yield record
        if not isinstance(record, Damage):
            while record.raw_stream.read(1 << 20):
                pass
        return
    block = src.read(length)
    record_src = _Source(io.BytesIO(block))
    record_src.unread(header)
    if len(block) < length:
        # The stream ends inside this record: it is handed out (truncated_record), then the
        # records its length swallowed are framed again.
        yield _parse_record(loader, record_src, start)
        src.unread(block)
        _skip_to_record(src)
        return
    trail = [src.readline(_LINE_CAP)]  # the lines after the block, to its first non-blank one
    while trail[-1] and not trail[-1].strip():
        trail.append(src.readline(_LINE_CAP))
    after = trail[-1]
    if not after or _WARC_VERSION.match(after):  # the end, or the next record's version line
        src.unread(after)
        yield _parse_record(loader, record_src, start)
        return
    following = b"".join(trail)
    inner = _WARC_LINE.search(block)
    cut = inner.start() if inner is not None else None
    if cut is None:  # a version line that the block's end cuts in two
        tail_start = block.rfind(b"\n") + 1
        m = _WARC_LINE.search(block[tail_start:] + following[:16])
        if m is not None and tail_start + m.start() < len(block):
            cut = tail_start + m.start()
    if len(trail) > 1 and cut is None:
        # Blank lines, then bytes that are framed on their own (garbage between records).
        src.unread(after)
        yield _parse_record(loader, record_src, start)
        return
    src.unread(following)
    yield from _misframed(src, loader, head, start, block, cut, following)


def _misframed(src: _Source, loader: Any, head: list[bytes], start: int, block: bytes, cut: int | None,
               following: bytes) -> Iterator[Any]:
    """A record whose block is not followed by a record boundary: its Content-Length is wrong.
    Too long (the next record starts at `cut` inside the block): read as ending there, and the rest
    of the block framed again.  Too short: what follows is the rest of this record, skipped."""
    end = src.offset
    length = len(block)
    rec_id = (_header_value(head, b"warc-record-id") or b"").strip()[:80].decode("utf-8", "replace")
    if cut is not None:
        body = block[:cut]
        for tail in (b"\r\n\r\n", b"\n\n"):
            if body.endswith(tail):
                body = body[: -len(tail)]
                break
        src.unread(block[cut:])
        fixed = [b"Content-Length: %d\r\n" % len(body) if _field_name(h) == b"content-length" else h
                 for h in head]
        record_src = _Source(io.BytesIO(body))
        record_src.unread(b"".join(fixed))
        yield _parse_record(loader, record_src, start)
        yield Damage("bad_warc", f"record {rec_id} at offset {start}: its Content-Length {length} runs "
                     f"into the next record (offset {start + len(b''.join(head)) + cut}); read as ending there",
                     start)
        return
    skipped, found = _skip_to_record(src)
    yield Damage("bad_warc", f"record {rec_id} at offset {start}: its Content-Length {length} ends inside "
                 f"the record (followed by {following[:30]!r} at offset {end}, not by the next record); "
                 + (f"{skipped} bytes skipped, reading resumed at the next record (offset {src.offset})"
                    if found else f"the {skipped} bytes after it hold no further record"), start)


def _record_loader() -> Any:
    """warcio's record loader, except that a response, request or revisit record without
    WARC-Target-URI (the standard requires one) is still read: warcio asks the URI's scheme whether
    the block starts with HTTP headers and fails on a missing one (AttributeError), which lost
    the whole record; its block is taken as HTTP, as in every web crawl, and its url is null."""
    from warcio.recordloader import ArcWarcRecordLoader

    class Loader(ArcWarcRecordLoader):
        def load_http_headers(self, rec_type, uri, stream, length):
            return super().load_http_headers(rec_type, "http:" if uri is None else uri, stream, length)

    return Loader(verify_http=False, arc2warc=True)


def _parse_record(loader: Any, stream: Any, start: int) -> Any:
    """warcio's record from `stream` (its checked header block, then its block), or a bad_warc
    Damage when warcio cannot make one (a response without WARC-Target-URI, a bad HTTP head)."""
    try:
        return loader.parse_record_stream(stream, known_format="warc")
    except Exception as exc:  # noqa: BLE001 - warcio raises assorted errors on damaged input
        first = str(exc).splitlines()[0] if str(exc) else ""
        return Damage("bad_warc", f"malformed WARC record at offset {start}: {type(exc).__name__}: {first}; "
                      "reading resumed after it", start)


def _field_name(line: bytes) -> bytes | None:
    name, colon, _ = line.partition(b":")
    return name.strip().lower() if colon and line[:1] not in (b" ", b"\t") else None


def _header_value(head: list[bytes], name: bytes) -> bytes | None:
    """The first value of header field `name` (lower case) in a header block."""
    for line in head[1:]:
        if _field_name(line) == name:
            return line.partition(b":")[2].strip()
    return None


_ARC_ID_NAMESPACE = uuid.UUID("6f1c1a9e-3d0b-5e8a-9f57-2c4b8d0e7a13")  # dsdata's, for ARC record ids


def _arc_records(src: _Source, loader: Any) -> Iterator[Any]:
    """warcio records of an ARC stream (ARC records have no version line to resynchronise on:
    damage ends the file, as one bad_warc Damage naming the offset and the bytes left)."""
    from warcio.archiveiterator import ArchiveIterator

    iterator = ArchiveIterator(src, arc2warc=True)
    try:
        for n, record in enumerate(iterator):
            # warcio gives a converted ARC record a random WARC-Record-ID: the same file read twice
            # would give other ids.  Derived from the record's place in the file and what it says
            # (its offset is only known once its content is read), it is stable.
            headers = record.rec_headers
            ident = uuid.uuid5(_ARC_ID_NAMESPACE, f"{n} {headers.get_header('WARC-Target-URI')} "
                                                  f"{headers.get_header('WARC-Date')}")
            headers.replace_header("WARC-Record-ID", f"<urn:uuid:{ident}>")
            yield record
    except Exception as exc:  # noqa: BLE001 - warcio raises assorted errors on damaged input
        failed_at = iterator.offset
        first = str(exc).splitlines()[0] if str(exc) else ""
        rest = 0
        while chunk := src.read(1 << 20):
            rest += len(chunk)
        yield Damage("bad_warc", f"malformed ARC record at offset {failed_at}: {type(exc).__name__}: {first}; "
                     f"the rest of the file ({max(0, src.offset - failed_at)} bytes) is unreadable", failed_at)


def _warc_response(path: str, record: Any, count: int) -> Document | Rejected:
    rec_id = record.rec_headers.get_header("WARC-Record-ID") or f"{path}:{count}"
    meta = {
        "url": record.rec_headers.get_header("WARC-Target-URI"),
        "warc_date": record.rec_headers.get_header("WARC-Date"),
        "source": path,
    }
    ctype = record.http_headers.get_header("Content-Type") if record.http_headers else None
    meta["content_type"] = (ctype or "").split(";")[0].strip().lower() or "application/octet-stream"
    payload = record.content_stream().read(_MAX_LINE + 1)
    if len(payload) > _MAX_LINE:  # the iterator skips the rest of the record
        return Rejected(Document(rec_id, "", meta), READ_STAGE, "too_large", f"payload over {_MAX_LINE} bytes")
    if getattr(record.raw_stream, "limit", 0):
        return Rejected(Document(rec_id, payload.decode("utf-8", "replace"), meta), READ_STAGE,
                        "truncated_record", f"{record.raw_stream.limit} bytes of the record are missing")
    charset = None
    if ctype and "charset=" in ctype.lower():
        charset = ctype.lower().split("charset=")[-1].split(";")[0].strip(" \"'")
    if not meta["content_type"].startswith(("text/", "application/xhtml")):
        return Rejected(Document(rec_id, "", meta), READ_STAGE, "binary_file",
                        f"payload is {meta['content_type']}, not text")
    text, binary = _page_text(payload, charset)
    if binary:
        return Rejected(Document(rec_id, "", meta), READ_STAGE, "binary_file",
                        f"payload is {meta['content_type']} but has {binary}")
    if text is None:
        return Rejected(Document(rec_id, payload.decode("utf-8", "replace"), meta), READ_STAGE,
                        "undecodable_payload", f"charset {charset!r} and UTF-8 both fail")
    if not text.strip():
        return Rejected(Document(rec_id, text, meta), READ_STAGE, "empty_text")
    return Document(id=rec_id, text=text, metadata=meta)
