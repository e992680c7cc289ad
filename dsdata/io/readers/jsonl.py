"""JSON Lines (.jsonl, .json, .ndjson; plain, .gz or .zst): one record per line, ids `PATH:LINE`.

A plain file is cut into line-aligned byte ranges (jsonl_ranges) for several workers to read apart."""
from __future__ import annotations

import codecs
import collections
import itertools
import json
import tempfile
from typing import IO, Any, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.decompress import MEMBER_END, Damage, compression_of, decoded_chunks
from dsdata.io.readers.common import (MAX_JSON_DEPTH, READ_STAGE, _BINARY_SNIFF, _COMPRESSION_DAMAGE, _MAX_LINE,
                                      _SURROGATE_ESCAPE, _UNPARSED, _depth_exceeds, _file_rejection, _looks_binary,
                                      record_to_document, scrub_surrogates)
from dsdata.io.readers.ranges import _SCAN_BLOCK, RangeReader


_BOM = b"\xef\xbb\xbf"


class _LineTooLong:
    def __init__(self, size: int):
        self.size = size


def _iter_lines(chunks: Iterator[bytes | Damage]) -> Iterator[bytes | Damage | _LineTooLong]:
    """Lines of a decoded stream; a `Damage` (and `MEMBER_END`) passes through in its place, and the partial line
    before a `Damage` (a fragment of a record the damage cut) is counted in it.  A line over _MAX_LINE
    bytes is one `_LineTooLong`; reading resumes after its newline."""
    parts: list[bytes] = []
    size = 0
    overlong = 0  # > 0 while skipping the rest of an over-long line
    for chunk in chunks:
        if chunk is MEMBER_END:  # passes through; a line may go on in the next member
            yield chunk
            continue
        if isinstance(chunk, Damage):
            if parts or overlong:
                chunk.detail += f"; the {size + overlong}-byte partial line before it is part of the loss"
            parts, size, overlong = [], 0, 0
            yield chunk
            continue
        pieces = chunk.split(b"\n")
        last = pieces.pop()
        if pieces:
            head = pieces[0]
            if overlong:
                yield _LineTooLong(overlong + len(head))
            elif size + len(head) > _MAX_LINE:
                yield _LineTooLong(size + len(head))
            else:
                yield b"".join(parts) + head if parts else head
            overlong = 0
            parts, size = [], 0
            for line in pieces[1:]:
                yield line if len(line) <= _MAX_LINE else _LineTooLong(len(line))
        if overlong:
            overlong += len(last)
        elif size + len(last) > _MAX_LINE:
            overlong = size + len(last)
            parts, size = [], 0
        elif last:
            parts.append(last)
            size += len(last)
    if overlong:
        yield _LineTooLong(overlong)
    elif parts:
        yield b"".join(parts)


# Rejections held back while a JSONL file has produced no JSON value yet: a binary file becomes one
# `binary_file` row instead of thousands of garbage "lines", but only if no line of it parses.
_HOLD_ROWS = 10_000
_HOLD_BYTES = 16 << 20

# Damage inside a gzip member / zstd frame: the decoder may emit garbage (which can parse: a
# back-reference copies an earlier line) up to the member's end before its check fails.  So each row
# of a compressed member waits until _LOOKBEHIND bytes (deflate's window) follow it, and from the
# first line that does not parse the rows are held until the member's fate is known: a clean end or
# a truncation releases them, a decode or check error makes them part of the one damage row.  A run
# of _RESUMED_BYTES in _RESUMED_LINES lines that parse ends the doubt early; held rows beyond
# _SUSPECT_MEMORY go to an anonymous temporary file.
_LOOKBEHIND = 32 << 10
_RESUMED_BYTES = 64 << 10
_RESUMED_LINES = 8
_SUSPECT_MEMORY = 16 << 20


def _held_line(result: Document | Rejected) -> bytes:
    """A held row as one JSON line (a JSONL reader's rows hold only JSON values; no pickle)."""
    doc = result.doc if isinstance(result, Rejected) else result
    fields = [doc.id, doc.text, doc.metadata, doc.annotations, doc.derived_from]
    if isinstance(result, Rejected):
        fields += [result.stage, result.reason, result.detail]
    return json.dumps(fields).encode("ascii") + b"\n"


class _Suspect:
    """The rows of a compressed member from its first line that does not parse on."""

    def __init__(self, after_line: int, first_bad: int):
        self.after_line = after_line  # the last line before the held ones
        self.first_bad = first_bad  # the first line that does not parse
        self.rows: list[Document | Rejected] = []
        self.memory = 0
        self.spill = None
        self.bytes = 0
        self.clean_bytes = 0
        self.clean_lines = 0

    def add(self, result: Document | Rejected, size: int) -> bool:
        """Hold `result` (from a line of `size` bytes); True once the doubt is over."""
        self.bytes += size
        if isinstance(result, Document) or result.reason not in _UNPARSED:
            self.clean_bytes += size
            self.clean_lines += 1
        else:
            self.clean_bytes = self.clean_lines = 0
        if self.spill is None and self.memory + size <= _SUSPECT_MEMORY:
            self.rows.append(result)
            self.memory += size
        else:
            if self.spill is None:
                self.spill = tempfile.TemporaryFile(prefix="dsdata-held-")
            self.spill.write(_held_line(result))
        return self.clean_bytes >= _RESUMED_BYTES and self.clean_lines >= _RESUMED_LINES

    def release(self) -> Iterator[Document | Rejected]:
        rows, self.rows = self.rows, []
        yield from rows
        spill, self.spill = self.spill, None
        if spill is not None:
            with spill:
                spill.seek(0)
                for line in spill:
                    fields = json.loads(line)
                    doc = Document(*fields[:5])
                    yield Rejected(doc, *fields[5:]) if len(fields) > 5 else doc

    def discard(self) -> None:
        self.rows = []
        if self.spill is not None:
            self.spill.close()
            self.spill = None


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _head(chunks, size: int):
    """(the items taken to see a stream's first `size` bytes, those bytes, the rest of the stream);
    a Damage or MEMBER_END stops the look."""
    chunks = iter(chunks)
    pending, head = [], b""
    for item in chunks:
        pending.append(item)
        if not isinstance(item, bytes):
            break
        head += item
        if len(head) >= size:
            break
    return pending, head, chunks


def _as_utf8(chunks):
    """A JSONL stream as UTF-8: one that starts with a UTF-16 byte-order mark is re-encoded as it
    goes (a lone surrogate or an odd last byte stays invalid UTF-8, to be rejected); others pass."""
    pending, first, chunks = _head(chunks, 2)
    if not first.startswith(_UTF16_BOMS):
        yield from pending
        yield from chunks
        return
    decoder = codecs.getincrementaldecoder("utf-16")(errors="surrogatepass")  # the BOM picks the byte order
    for item in itertools.chain(pending, chunks):
        yield decoder.decode(item).encode("utf-8", "surrogatepass") if isinstance(item, bytes) else item
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        yield b"\xff"  # half a UTF-16 unit at the end: not UTF-8, so that last line is rejected


_CR_SNIFF = 64 << 10


def _cr_lines(chunks):
    """A stream whose first _CR_SNIFF bytes hold a CR and no LF has every CR made LF (lone-CR line
    ends; a raw CR inside a JSON string is invalid JSON anyway).  Other streams pass unchanged."""
    pending, head, chunks = _head(chunks, _CR_SNIFF)
    if b"\n" in head or b"\r" not in head:
        yield from pending
        yield from chunks
        return
    for item in itertools.chain(pending, chunks):
        yield item.replace(b"\r", b"\n") if isinstance(item, bytes) else item


def read_jsonl(path: str, raw: IO[bytes], text_field: str = "text", id_field: str = "id",
               first_line: int | None = None) -> Iterator[Document | Rejected]:
    """JSON Lines, plain or .gz/.zst. Ids default to `PATH:LINE` (1-based).

    first_line: `raw` is one of `jsonl_ranges`' ranges of a plain file, starting after that many
    lines; ids count from there, and nothing is held back for the binary-file rule (the ranges
    are only made for a file whose head is text, where that rule never applies)."""
    head = bytearray()

    def sniffed(chunks):
        for chunk in chunks:
            if isinstance(chunk, bytes) and len(head) < _BINARY_SNIFF:
                head.extend(chunk[: _BINARY_SNIFF - len(head)])
            yield chunk

    held: list[Rejected] | None = [] if first_line is None else None  # None: rows pass straight through
    held_bytes = 0
    watch = compression_of(path) is not None
    chunks = decoded_chunks(path, raw, member_ends=watch)
    if first_line is None:
        chunks = _cr_lines(_as_utf8(chunks))
    for result in _jsonl_rows(path, sniffed(chunks), text_field, id_field, first_line or 0, watch):
        if held is None:
            yield result
            continue
        if isinstance(result, Document) or result.reason not in _UNPARSED:
            yield from held
            held = None
            yield result
            continue
        held.append(result)
        held_bytes += len(result.doc.text)
        if len(held) > _HOLD_ROWS or held_bytes > _HOLD_BYTES:
            yield from held
            held = None
    if held:
        if _looks_binary(bytes(head)):
            # A damaged archive stays its own row (where the readable bytes end), binary or not.
            damage = [r for r in held if r.reason in _COMPRESSION_DAMAGE]
            if len(held) > len(damage):
                yield _file_rejection(path, "binary_file", f"no line of {len(held) - len(damage)} is JSON and over "
                                      "10 % of the first 8 KiB are control bytes; not a text JSONL file")
            yield from damage
        else:
            yield from held


def _jsonl_rows(path: str, chunks, text_field: str, id_field: str, lineno: int,
                watch: bool) -> Iterator[Document | Rejected]:
    """read_jsonl's rows in file order, before the binary-file rule; with `watch` (compressed input)
    held as the comment above _LOOKBEHIND says (`_HeldRows`)."""
    held = _HeldRows()
    try:
        for line in _iter_lines(chunks):
            if line is MEMBER_END:
                yield from held.flush()
                continue
            if isinstance(line, Damage):
                yield from held.damage(path, line, lineno)
                continue
            if isinstance(line, _LineTooLong):
                lineno += 1
                size = line.size
                result = Rejected(Document(f"{path}:{lineno}", "", {}), READ_STAGE, "line_too_long",
                                  f"{line.size} bytes without a newline (at most {_MAX_LINE})")
            else:
                if line.startswith(_BOM):
                    # A UTF-8 BOM is no content, on a later line too (`cat a.jsonl b.jsonl`).
                    line = line[len(_BOM):]
                lineno += 1
                size = len(line) + 1
                result = _jsonl_record(line, f"{path}:{lineno}", text_field, id_field)
                if result is None:
                    held.blank(size)
                    continue
            if watch:
                yield from held.add(result, size, lineno)
            else:
                yield result
    except OSError as exc:  # the file system failed mid-read (a network file system, a vanished file)
        yield from held.flush()
        yield _file_rejection(f"{path}:{lineno + 1}", "unreadable_file",
                              f"{type(exc).__name__} after line {lineno}: {exc}; the rest of the file is unreadable")
        return
    yield from held.flush()


class _HeldRows:
    """The rows of compressed input not yet handed out: `lag`, (line number, row, size) of the
    last _LOOKBEHIND decoded bytes, and from a member's first unparsable line on, `suspect`."""

    def __init__(self):
        self.suspect: _Suspect | None = None
        self.lag: collections.deque = collections.deque()
        self.lag_bytes = 0

    def flush(self) -> Iterator[Document | Rejected]:
        if self.suspect is not None:
            yield from self.suspect.release()
            self.suspect = None
        while self.lag:
            yield self.lag.popleft()[1]
        self.lag_bytes = 0

    def blank(self, size: int) -> None:
        """A blank line: no row, but its bytes count towards what follows the held rows."""
        if self.suspect is not None:
            self.suspect.bytes += size
        else:
            self.lag_bytes += size

    def add(self, result: Document | Rejected, size: int, lineno: int) -> Iterator[Document | Rejected]:
        """Hold the row of line `lineno`; hand out the rows that are now far enough behind."""
        suspect, lag = self.suspect, self.lag
        if suspect is not None:
            if suspect.add(result, size):
                yield from suspect.release()
                self.suspect = None
            return
        if type(result) is Rejected and result.reason in _UNPARSED:
            suspect = self.suspect = _Suspect(lag[0][0] - 1 if lag else lineno - 1, lineno)
            for _, row, row_size in lag:
                suspect.add(row, row_size)
            lag.clear()
            self.lag_bytes = 0
            suspect.add(result, size)
            return
        lag.append((lineno, result, size))
        self.lag_bytes += size
        while lag and self.lag_bytes - lag[0][2] >= _LOOKBEHIND:
            self.lag_bytes -= lag[0][2]
            yield lag.popleft()[1]
        if not lag:
            self.lag_bytes = 0

    def damage(self, path: str, line: Damage, lineno: int) -> Iterator[Document | Rejected]:
        """A damaged stretch after line `lineno`: with a suspect member, its held rows are part of
        the loss; otherwise (a cut, or an error with no sign of garbage before it) what decoded is kept."""
        suspect = self.suspect
        detail = f"after line {lineno}: {line.detail}"
        row_line = lineno + 1
        if suspect is not None and line.reason == "corrupt_compression":
            row_line = suspect.after_line + 1
            detail = (f"after line {suspect.after_line}: {line.detail}; the {lineno - suspect.after_line} "
                      f"lines ({suspect.bytes} bytes) this member decoded from line {row_line} on are part "
                      f"of the loss: line {suspect.first_bad} is the first that does not parse, and the "
                      f"decoder cannot resynchronise inside a member, so its output from shortly before "
                      f"that line on is not data (the {_LOOKBEHIND} bytes before it go too: a back-reference "
                      f"can copy a whole earlier line)")
            suspect.discard()
            self.suspect = None
        yield from self.flush()
        yield _file_rejection(f"{path}:{row_line}", line.reason, detail)


def jsonl_ranges(raw: IO[bytes], range_bytes: int) -> list[tuple[int, int | None, int]] | None:
    """Line-aligned byte ranges covering a plain JSON Lines file: (start, end, lines before start)
    each, end None for the last, so `read_jsonl(..., first_line=lines)` on each gives the rows of
    reading it whole.  None when the file must be read whole (a binary head, UTF-16, lone-CR lines,
    or no line break past `range_bytes`)."""
    head = raw.read(_BINARY_SNIFF)
    if _looks_binary(head) or head.startswith(_UTF16_BOMS):  # UTF-16 lines do not end at a newline byte
        return None
    if b"\n" not in head[:_CR_SNIFF] and b"\r" in head:
        return None  # lines ending in a lone CR: read whole, where they are made lines (_cr_lines)
    ranges: list[tuple[int, int | None, int]] = []
    start = start_line = 0
    target = range_bytes
    lines = 0  # newlines before block[offset]
    pos = 0  # file offset of block[0]
    block = head
    while block:
        offset = 0
        while target - pos < len(block):
            newline = block.find(b"\n", max(target - pos, offset))
            if newline < 0:
                break  # no line ends in the rest of this block: the cut moves on to the next line end
            lines += block.count(b"\n", offset, newline + 1)
            offset = newline + 1
            end = pos + offset
            ranges.append((start, end, start_line))
            start, start_line = end, lines
            target = end + range_bytes
        lines += block.count(b"\n", offset)
        pos += len(block)
        block = raw.read(_SCAN_BLOCK)
    if not ranges:
        return None
    if pos > start:
        ranges.append((start, None, start_line))
    else:  # the file ends with the last cut's newline
        last_start, _, last_line = ranges.pop()
        ranges.append((last_start, None, last_line))
    return ranges


_SCAN_JSON = json.JSONDecoder().scan_once  # json.loads' own C scanner (its decoder has no hooks either)


def _parse_json(text: str) -> Any:
    """json.loads(text), the common line (a value with no whitespace around it) straight from the C
    scanner; anything else goes to json.loads itself, so values and errors are json.loads'."""
    try:
        value, end = _SCAN_JSON(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def _jsonl_record(line: bytes, default_id: str, text_field: str, id_field: str) -> Document | Rejected | None:
    if not line or line.isspace():  # = not line.strip(), without copying the line
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Rejected(Document(id=default_id, text=line.decode("utf-8", "replace"), metadata={}),
                        READ_STAGE, "invalid_utf8", str(exc))
    raw = text.rstrip("\r\n")
    try:
        record = _parse_json(text)
    except RecursionError:
        return Rejected(Document(id=default_id, text=raw, metadata={}), READ_STAGE, "bad_json",
                        f"nested deeper than the JSON decoder can follow (at most {MAX_JSON_DEPTH} levels are read)")
    except ValueError as exc:  # also int() of over 4300 digits
        return Rejected(Document(id=default_id, text=raw, metadata={}), READ_STAGE, "bad_json", str(exc))
    if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH and _depth_exceeds(record, MAX_JSON_DEPTH):
        return Rejected(Document(id=default_id, text=raw, metadata={}), READ_STAGE, "bad_json",
                        f"nested deeper than {MAX_JSON_DEPTH} levels")
    if b"\\u" in line and _SURROGATE_ESCAPE.search(line):
        record = scrub_surrogates(record)
    return record_to_document(record, default_id, text_field, id_field, raw=raw)


def read_jsonl_range(path: str, raw: IO[bytes], start: int, end: int | None, first_line: int,
                     text_field: str = "text", id_field: str = "id") -> Iterator[Document | Rejected]:
    """One of `jsonl_ranges`' ranges of a plain file: bytes start..end (None: to the end), whose
    first line is line first_line + 1 of the file."""
    raw.seek(start)
    length = None if end is None else end - start
    return read_jsonl(path, RangeReader(raw, length), text_field, id_field, first_line=first_line)
