"""Readers: turn one input file into Documents, and every unreadable part of it into a Rejected.

Each reader takes the file's name and a binary file object (local or from any Beam filesystem) and
yields `Document` or `Rejected(stage="read")`.  Nothing is skipped silently: a malformed line,
invalid UTF-8, a record without text, a binary file or a truncated compressed stream each become
one rejected row, so the ledger (input == kept + Σ rejected) counts them.  Blank lines in JSONL are
not records and are not counted.

Compressed input is decoded member by member (dsdata/io/decompress.py): every complete record before
damage is kept, and reading resumes at the next gzip member / zstd frame after it.  Every text that
leaves a reader is valid Unicode (lone surrogate escapes in JSON become U+FFFD).

Reason codes (stage `read`): bad_json, not_an_object, invalid_utf8, missing_text, empty_text,
binary_file, unknown_format, line_too_long, too_large, truncated_compression, corrupt_compression, bad_parquet, bad_warc,
truncated_record, undecodable_payload, unreadable_file.
"""
from __future__ import annotations

import codecs
import collections
import io
import itertools
import json
import os
import re
import tempfile
import uuid
from typing import IO, Any, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.decompress import MEMBER_END, Damage, compression_of, decoded_chunks
from dsdata.io.encodings import bom_encoding, decode, decode_with_replacement, encoding_for_label, meta_encoding

READ_STAGE = "read"
FORMATS = ("jsonl", "parquet", "html", "warc", "text", "csv")

_HTML_EXT = (".html", ".htm", ".xhtml", ".shtml")
_BINARY_SNIFF = 8192
_MAX_LINE = 256 * 1024 * 1024


class InputFormatError(ValueError):
    """The format of an input path cannot be determined."""


def detect_format(path: str) -> str:
    """Input format from the file name: .jsonl/.json/.ndjson (optionally .gz/.zst), .parquet,
    .html/.htm, .warc/.warc.gz, .txt/.md (text: one document per file), .csv/.tsv (csv)."""
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
    if name.endswith(_TEXT_EXT):
        return "text"
    if name.endswith((".csv", ".tsv", ".tab")):
        return "csv"
    raise InputFormatError(
        f"cannot tell the format of '{path}' from its name; set input.format in the recipe "
        f"or pass --format ({', '.join(FORMATS)})"
    )


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
    # Every field but id and text, in the record's order: a copy and two pops at C speed (a dict
    # comprehension costs ~1 µs per record, benchmarks/langid.py's reading).
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


# Rejections held back while a JSONL file has produced no JSON value yet: a binary file (an image
# named .jsonl) becomes one `binary_file` row instead of thousands of garbage "lines", but only if no
# line of it parses; a text file with one bad line keeps all its other lines.
_HOLD_ROWS = 10_000
_HOLD_BYTES = 16 << 20

# Damage inside a gzip member / zstd frame: deflate and zstd cannot resynchronise, and the decoder
# may emit garbage up to the member's end before its check (CRC-32, checksum) fails.  Garbage can
# parse: a back-reference can copy a whole earlier line, so the visible sign of damage (the first
# line that does not parse) may come a few lines after it begins (up to 12.7 KiB in 257 random
# damages of a deflate stream).  So each row of a compressed member waits until _LOOKBEHIND bytes
# (deflate's 32 KiB window) follow it, and from the first line that does not parse the rows, with
# those still waiting, are held back until the member's fate is known: a clean end (MEMBER_END) or a truncation releases
# them as they are (what decoded before a cut is sound); a decode or check error makes them part of
# the one damage row.  A run of _RESUMED_BYTES in at least _RESUMED_LINES consecutive lines that
# parse (twice deflate's 32 KiB window; the garbage after damage breaks the JSON far more often)
# ends the doubt early, so a healthy file's bad line delays only that much.  Held rows beyond
# _SUSPECT_MEMORY go to an anonymous temporary file, so memory stays bounded on huge members.
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


def _from_held_line(line: bytes) -> Document | Rejected:
    fields = json.loads(line)
    doc = Document(*fields[:5])
    return Rejected(doc, *fields[5:]) if len(fields) > 5 else doc


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
                    yield _from_held_line(line)

    def discard(self) -> None:
        self.rows = []
        if self.spill is not None:
            self.spill.close()
            self.spill = None


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _as_utf8(chunks):
    """A JSONL stream as UTF-8: one that starts with a UTF-16 byte-order mark (JSON's older RFCs
    allowed UTF-16; Windows tools still write it) is decoded and re-encoded as it goes.  A lone
    surrogate stays one (surrogatepass both ways), so its line is rejected as invalid UTF-8 like any
    other, and so is an odd byte at the end; damage markers pass through.  Other streams pass
    unchanged."""
    chunks = iter(chunks)
    pending, first = [], b""  # what was taken to see the first two bytes
    for item in chunks:
        pending.append(item)
        if not isinstance(item, bytes):
            break
        first += item
        if len(first) >= 2:
            break
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
    """A stream whose lines end with a lone CR (classic Mac OS, some exports): when its first
    _CR_SNIFF bytes hold a CR and no LF, every CR becomes LF, so its records are lines and not one
    bad line.  (A raw CR inside a JSON string is invalid JSON anyway.)  Other streams pass unchanged."""
    chunks = iter(chunks)
    pending, head = [], b""
    for item in chunks:
        pending.append(item)
        if not isinstance(item, bytes):
            break
        head += item
        if len(head) >= _CR_SNIFF:
            break
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
    """read_jsonl's rows in file order, before the binary-file rule.  With `watch` (compressed
    input) each row waits until _LOOKBEHIND decoded bytes follow it, and from a member's first line
    that does not parse the rows (with those still waiting) are held (a `_Suspect`) until the
    member's end says whether they are data."""
    suspect: _Suspect | None = None
    lag: collections.deque = collections.deque()  # (line number, row, size) of the rows still waiting
    lag_bytes = 0

    def flush() -> Iterator[Document | Rejected]:
        nonlocal suspect, lag_bytes
        if suspect is not None:
            yield from suspect.release()
            suspect = None
        while lag:
            yield lag.popleft()[1]
        lag_bytes = 0

    try:
        for line in _iter_lines(chunks):
            if line is MEMBER_END:
                yield from flush()
                continue
            if isinstance(line, Damage):
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
                    suspect = None
                # else a cut, or an error with no sign of garbage before it: what decoded is kept
                yield from flush()
                yield _file_rejection(f"{path}:{row_line}", line.reason, detail)
                continue
            if isinstance(line, _LineTooLong):
                lineno += 1
                size = line.size
                result = Rejected(Document(f"{path}:{lineno}", "", {}), READ_STAGE, "line_too_long",
                                  f"{line.size} bytes without a newline (at most {_MAX_LINE})")
            else:
                if line.startswith(_BOM):
                    # A UTF-8 BOM marks the encoding; it is not content.  One that starts a later line
                    # is the start of another file (`cat a.jsonl b.jsonl`, `cat a.gz b.gz`): no JSON
                    # value starts with U+FEFF, so nothing is lost by dropping it there too.
                    line = line[len(_BOM):]
                lineno += 1
                size = len(line) + 1
                result = _jsonl_record(line, f"{path}:{lineno}", text_field, id_field)
                if result is None:
                    if suspect is not None:
                        suspect.bytes += size
                    else:
                        lag_bytes += size
                    continue
            if not watch:
                yield result
                continue
            if suspect is not None:
                if suspect.add(result, size):
                    yield from suspect.release()
                    suspect = None
                continue
            if type(result) is Rejected and result.reason in _UNPARSED:
                suspect = _Suspect(lag[0][0] - 1 if lag else lineno - 1, lineno)
                for _, row, row_size in lag:
                    suspect.add(row, row_size)
                lag.clear()
                lag_bytes = 0
                suspect.add(result, size)
                continue
            lag.append((lineno, result, size))
            lag_bytes += size
            while lag and lag_bytes - lag[0][2] >= _LOOKBEHIND:
                lag_bytes -= lag[0][2]
                yield lag.popleft()[1]
            if not lag:
                lag_bytes = 0
    except OSError as exc:  # the file system failed mid-read (a network file system, a vanished file)
        yield from flush()
        yield _file_rejection(f"{path}:{lineno + 1}", "unreadable_file",
                              f"{type(exc).__name__} after line {lineno}: {exc}; the rest of the file is unreadable")
        return
    yield from flush()


# When a run has several workers, a plain JSON Lines or Parquet file is read in ranges (of lines,
# of row groups: jsonl_ranges, parquet_ranges) of about this size: at least RANGE_MIN_BYTES, at most
# RANGE_MAX_BYTES, and a file cut into at most RANGES_PER_FILE of them.
RANGE_MIN_BYTES = 512 << 10
RANGE_MAX_BYTES = 64 << 20
RANGES_PER_FILE = 64
_SCAN_BLOCK = 1 << 20


def range_bytes_for(size: int) -> int:
    """The range size `jsonl_ranges` and `parquet_ranges` aim at for a file of `size` bytes."""
    return min(RANGE_MAX_BYTES, max(RANGE_MIN_BYTES, -(-size // RANGES_PER_FILE)))


def cuttable_format(path: str, fmt: str = "auto") -> str | None:
    """"jsonl" or "parquet" when `path` is read in a format that can be cut into ranges read apart
    (uncompressed JSON Lines: `jsonl_ranges`; Parquet: `parquet_ranges`), else None."""
    if fmt == "auto":
        try:
            fmt = detect_format(path)
        except InputFormatError:
            return None
    return fmt if fmt in ("jsonl", "parquet") and compression_of(path) is None else None


def parquet_ranges(raw: IO[bytes], range_bytes: int) -> list[tuple[int, int | None, int]] | None:
    """Runs of consecutive row groups of a Parquet file of about `range_bytes` (uncompressed) each:
    (first group, end group, rows before first), end None for the last (to the last group).  None
    when the footer cannot be read (the reader then reports the file whole) or there would be one
    range."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(raw).metadata
    except Exception:  # noqa: BLE001 - not readable as Parquet: read whole, which rejects it once
        return None
    ranges: list[tuple[int, int | None, int]] = []
    first = row = first_row = size = 0
    for group in range(meta.num_row_groups):
        info = meta.row_group(group)
        size += info.total_byte_size
        row += info.num_rows
        if size >= range_bytes and group + 1 < meta.num_row_groups:
            ranges.append((first, group + 1, first_row))
            first, first_row, size = group + 1, row, 0
    if not ranges:
        return None
    ranges.append((first, None, first_row))
    return ranges


def jsonl_ranges(raw: IO[bytes], range_bytes: int) -> list[tuple[int, int | None, int]] | None:
    """Line-aligned byte ranges covering a plain JSON Lines file, for several workers to read
    apart: (start, end, lines before start) each, end None for the last (to the end of the file,
    as reading it whole would).  Each range after the first starts just after a newline, so
    `read_jsonl(..., first_line=lines)` on each gives the ids and rows reading the file whole
    gives.  None when the file must be read whole: its head looks binary (the binary-file rule
    judges the file as one), or it has no line break past `range_bytes` (one range)."""
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


class RangeReader(io.RawIOBase):
    """At most `length` bytes of `raw` from where it stands (all of it when length is None)."""

    def __init__(self, raw: IO[bytes], length: int | None):
        self._raw, self._left = raw, length

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._left is None:
            return self._raw.read(n)
        if n is None or n < 0 or n > self._left:
            n = self._left
        data = self._raw.read(n) if n else b""
        self._left -= len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self._raw.tell()


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
        if isinstance(item, dict):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item)
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


_SCAN_JSON = json.JSONDecoder().scan_once  # json.loads' own C scanner (its decoder has no hooks either)


def _parse_json(text: str) -> Any:
    """json.loads(text), the common line (a value with no whitespace around it) straight from the C
    scanner: json.loads adds three Python calls and two whitespace regex matches (~1 µs a record).
    Anything else, whitespace, a BOM, no value or extra data after it, goes to json.loads itself,
    so the value and every error are json.loads'; an error inside the value is the same scanner's."""
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


def read_parquet(path: str, raw: IO[bytes], text_field: str = "text", id_field: str = "id",
                 groups: tuple[int, int | None, int] | None = None) -> Iterator[Document | Rejected]:
    """Parquet, row group by row group. Ids default to `PATH:ROW` (0-based).

    groups: (first, end, rows before first) — one of `parquet_ranges`' ranges: only row groups
    first..end-1 (end None: to the last) are read, their rows numbered as reading the whole file
    numbers them."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(raw)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a non-Parquet file
        where = path if groups is None else f"{path}:groups{groups[0]}-{groups[1]}"
        yield _file_rejection(where, "bad_parquet", f"{type(exc).__name__}: {exc}")
        return
    first, end, row = (0, None, 0) if groups is None else groups
    end = pf.num_row_groups if end is None else min(end, pf.num_row_groups)
    for group in range(first, end):
        rows = pf.metadata.row_group(group).num_rows
        try:
            records = _parquet_records(_text_as_string(pf.read_row_group(group), text_field))
        except Exception as exc:  # noqa: BLE001 - a damaged row group: its rows are lost, each one counted
            detail = f"row group {group} of {pf.num_row_groups} unreadable ({type(exc).__name__}: {exc})"
            if rows > _LOST_ROWS_LISTED:  # the footer's count; not millions of rows of nothing
                yield _file_rejection(f"{path}:group{group}", "bad_parquet",
                                      f"{detail}; its {rows} rows are lost (one row here, over {_LOST_ROWS_LISTED})")
            else:
                for lost in range(row, row + rows):
                    yield _file_rejection(f"{path}:{lost}", "bad_parquet", detail)
            row += rows
            continue
        for record in records:
            doc_id = f"{path}:{row}"
            row += 1
            if isinstance(record, _BadValue):
                yield Rejected(Document(doc_id, "", {}), READ_STAGE, "bad_value", record.detail)
                continue
            raw_text = record.get(text_field)
            if isinstance(raw_text, bytes):  # a binary text column that is not all UTF-8 (_text_as_string)
                try:
                    record[text_field] = raw_text.decode("utf-8")
                except UnicodeDecodeError as exc:
                    yield Rejected(Document(doc_id, raw_text.decode("utf-8", "replace"), {}), READ_STAGE,
                                   "invalid_utf8", f"field '{text_field}' is binary and this value is not UTF-8: {exc}")
                    continue
            try:
                result = record_to_document(record, doc_id, text_field, id_field)
            except Exception as exc:  # noqa: BLE001 - one record's failure rejects that record only
                result = Rejected(Document(doc_id, "", {}), READ_STAGE, "bad_value", f"{type(exc).__name__}: {exc}")
            yield result


# A damaged row group up to this many rows (the footer says how many) gets one rejected row per row,
# with the id a readable row there would have had; a larger one is one row saying how many are lost.
_LOST_ROWS_LISTED = 1_000_000


def _text_as_string(table, text_field: str):
    """A binary text column (what writers that do not mark strings as UTF-8 make: older Spark and
    Hive) as strings when all of it is UTF-8; otherwise as it is, and each value is decoded on its
    own in read_parquet (one that is not UTF-8 is rejected as invalid_utf8)."""
    import pyarrow as pa

    if text_field not in table.column_names:
        return table
    index = table.column_names.index(text_field)
    column = table.column(index)
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        return table
    try:
        return table.set_column(index, text_field, column.cast(pa.large_string()))
    except pa.ArrowInvalid:
        return table


class _BadValue:
    """A Parquet row one of whose values has neither a Python form nor an Arrow string form."""

    def __init__(self, detail: str):
        self.detail = detail


def _parquet_records(table) -> list[dict[str, Any] | _BadValue]:
    """The row group's rows as dicts; where pyarrow cannot convert the whole table, column by
    column, and a row holding a value it cannot convert is a _BadValue naming the column."""
    try:
        return table.to_pylist()
    except Exception:  # noqa: BLE001 - pyarrow raises ValueError, OverflowError, ArrowException...
        pass
    import pyarrow as pa
    import pyarrow.compute as pc

    names = table.column_names
    columns: list[list[Any]] = []
    bad: dict[int, str] = {}
    for name, column in zip(names, table.columns):
        try:
            columns.append(column.to_pylist())
            continue
        except Exception:  # noqa: BLE001
            pass
        values = []
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
                continue
            except Exception as exc:  # noqa: BLE001
                problem = f"column '{name}': {type(exc).__name__}: {exc}"
            try:
                # No Python form (a timestamp[ns] off whole microseconds without pandas, a date past
                # year 9999): Arrow's own exact text of the value, so the row is not lost for it.
                values.append(pc.cast(column.slice(i, 1), pa.string())[0].as_py())
            except Exception:  # noqa: BLE001
                values.append(None)
                bad.setdefault(i, problem)
        columns.append(values)
    return [_BadValue(bad[i]) if i in bad else dict(zip(names, values))
            for i, values in enumerate(zip(*columns))]


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
    """Bytes of an HTML page → str, as browsers decode it (the WHATWG Encoding Standard): a UTF-8 or
    UTF-16 byte-order mark first, then the declared (HTTP) charset, then <meta charset> (comments
    skipped, anywhere in <head>), then an XML declaration's encoding (XHTML), then UTF-8, each label
    mapped to the standard's encoding (gb2312 → GBK, shift_jis → windows-31j, iso-8859-1 →
    windows-1252, …).  The first candidate that decodes the page strictly wins; when none does, the
    first one under which at most 0.1 % of the bytes are invalid (those become U+FFFD, as in a
    browser; bytes the standard defines and Python's codec lacks are decoded as the standard says).
    None if no candidate gives the page."""
    bom = bom_encoding(data)
    if bom is not None:
        name, length = bom
        candidates = [name]
        data = data[length:]
    else:
        candidates = []
        for name in (encoding_for_label(declared), meta_charset(data)):
            if name:
                candidates.append(name)
        xml = _XML_DECLARATION.match(data[:1024])
        if xml:
            name = meta_encoding(xml.group(1).decode("ascii"))
            if name:
                candidates.append(name)
        candidates.append("UTF-8")
        candidates = list(dict.fromkeys(candidates))
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
    nothing).  Bytes are sniffed for control bytes before decoding, except where a byte-order mark
    or a UTF-16 charset says what they are: UTF-16 is half NUL bytes, so its text is checked once
    decoded."""
    marked = bom_encoding(data) is not None or (encoding_for_label(declared) or "").startswith("UTF-16")
    if not marked and _looks_binary(data[:_BINARY_SNIFF]):
        return None, "over 10 % control bytes in the first 8 KiB"
    text = decode_html(data, declared)
    if marked and text is not None and _looks_binary(text[:_BINARY_SNIFF].encode("utf-8", "replace")):
        return None, "over 10 % control characters in the first 8 KiB of its decoded text"
    return text, None


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
    """WARC (gzipped or not) or ARC: one document per `response` record; other record types
    (request, metadata, warcinfo) describe the crawl and are not documents.  id = WARC-Record-ID.

    Records are framed here (`_warc_frames`), not by warcio's iterator, which lets a header
    without a valid Content-Length swallow the rest of the file: a malformed record, or bytes
    that are no record, are one `bad_warc` row and reading resumes at the next `WARC/1.x` line.
    A gzipped WARC is read on its decoded stream: after a corrupt member, reading resumes at the
    next one (the damage is one rejected row; a record it cut is one more)."""
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
    record's header block is checked and its Content-Length bytes read before it is handed out,
    so a broken record is one row: a header that is not one, or a block not followed by a record
    boundary, is one `bad_warc` Damage and framing resumes at the next `WARC/1.x` line (inside
    what the bad record claimed, when it claimed too much).  A block cut by the end of the
    stream is handed out (the caller reports it `truncated_record`) and the records it
    swallowed are read again.  A stream that starts like an ARC file is left to warcio."""
    loader = _record_loader()
    while True:
        line = src.readline(_LINE_CAP)
        while line and not line.strip():
            line = src.readline(_LINE_CAP)
        if not line:
            return
        start = src.offset - len(line)
        if not _WARC_VERSION.match(line):
            if arc_allowed and _ARC_LINE.match(line):
                src.unread(line)
                yield from _arc_records(src, loader)
                return
            src.unread(line)
            skipped, found = _skip_to_record(src)
            what = f"{skipped} bytes at offset {start} are not a WARC record (they begin {line[:40]!r})"
            yield Damage("bad_warc", what + (f"; reading resumed at the next record (offset {src.offset})"
                                             if found else "; no further record in the file"), start)
            arc_allowed = False
            continue
        arc_allowed = False
        head = [line]
        size = len(line)
        while True:
            h = src.readline(_LINE_CAP)
            if not h:
                yield Damage("truncated_record", f"the file ends inside a record at offset {start} "
                             f"({size} bytes of it present)", start)
                return
            head.append(h)
            size += len(h)
            if not h.strip() or size > _MAX_HEADERS:
                break
        problem = "headers over 1 MiB" if size > _MAX_HEADERS else _header_problem(head)
        if problem is not None:
            src.unread(b"".join(head[1:]))
            skipped, found = _skip_to_record(src)
            yield Damage("bad_warc", f"malformed WARC record at offset {start}: {problem}; "
                         + (f"{skipped + len(line)} bytes skipped, reading resumed at the next record "
                            f"(offset {src.offset})" if found else
                            f"the {skipped + len(line)} bytes to the end of the file hold no further record"),
                         start)
            continue
        length = int(_header_value(head, b"content-length"))
        header = b"".join(head)
        if length > _MAX_LINE:  # too large to hold: streamed to the caller (a too_large row)
            src.unread(header)
            record = _parse_record(loader, src, start)
            yield record
            if not isinstance(record, Damage):
                while record.raw_stream.read(1 << 20):
                    pass
            continue
        block = src.read(length)
        record_src = _Source(io.BytesIO(block))
        record_src.unread(header)
        if len(block) < length:
            # The stream ends inside this record: it is handed out (truncated_record), then the
            # records its length swallowed are framed again.
            yield _parse_record(loader, record_src, start)
            src.unread(block)
            _skip_to_record(src)
            continue
        trail = [src.readline(_LINE_CAP)]  # the lines after the block, to its first non-blank one
        while trail[-1] and not trail[-1].strip():
            trail.append(src.readline(_LINE_CAP))
        after = trail[-1]
        if not after or _WARC_VERSION.match(after):  # the end, or the next record's version line
            src.unread(after)
            yield _parse_record(loader, record_src, start)
            continue
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
            continue
        # The block is not followed by a record boundary: the Content-Length is wrong.
        src.unread(following)
        end = src.offset
        rec_id = (_header_value(head, b"warc-record-id") or b"").strip()[:80].decode("utf-8", "replace")
        if cut is not None:
            # Too long: the next record starts inside the block.  The record is read as ending
            # there (one bad_warc row says so), and the rest of the block is framed again.
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
                         f"into the next record (offset {start + len(header) + cut}); read as ending there",
                         start)
            continue
        # Too short: what follows the block is the rest of this record; the record is one row.
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


# --- plain text and Markdown: one document per file -------------------------------------------------

_TEXT_EXT = (".txt", ".text", ".md", ".markdown")


def read_text(path: str, raw: IO[bytes], **_: Any) -> Iterator[Document | Rejected]:
    """One .txt / .md file → one document whose id is the file's path; UTF-8 (a BOM is dropped)."""
    data = _one_record_file(path, raw)
    if isinstance(data, Rejected):
        yield data
        return
    if _looks_binary(data[:_BINARY_SNIFF]):
        yield _file_rejection(path, "binary_file", "over 10 % of the first 8 KiB are control bytes; not a text file")
        return
    name = path.lower()
    for suffix in (".gz", ".zst", ".zstd"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    meta = {"source": path, "content_type": "text/markdown" if name.endswith((".md", ".markdown")) else "text/plain"}
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        yield Rejected(Document(path, data.decode("utf-8", "replace"), meta), READ_STAGE, "invalid_utf8",
                       f"byte {exc.start}: not UTF-8")
        return
    if not text.strip():
        yield Rejected(Document(path, text, meta), READ_STAGE, "empty_text")
        return
    yield Document(path, text, meta)


# --- CSV / TSV: a header row, then one record per row --------------------------------------------------

def _csv_lines(path: str, raw: IO[bytes], bad: set[int], problems: list):
    """Decoded text lines (newline kept) for csv.reader; numbers of lines that were not UTF-8 go to
    `bad`, the first damage or over-long line to `problems` (reading stops there)."""
    lineno = 0
    for line in _iter_lines(_cr_lines(_as_utf8(decoded_chunks(path, raw)))):
        if line is MEMBER_END:
            continue
        if isinstance(line, (Damage, _LineTooLong)):
            problems.append(line)
            return
        lineno += 1
        if lineno == 1 and line.startswith(_BOM):
            line = line[len(_BOM):]
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            bad.add(lineno)
            text = line.decode("utf-8", "replace")
        yield text + "\n"


def read_csv(path: str, raw: IO[bytes], text_field: str = "text", id_field: str = "id",
             delimiter: str | None = None) -> Iterator[Document | Rejected]:
    """CSV (comma) or TSV (tab, from a .tsv name) with a header row: `text_field` and `id_field` name
    columns; the other columns go to metadata.  Ids default to `PATH:ROW` (1-based data rows).  A row
    with another number of fields than the header is rejected `bad_row`; a file without the text
    column is one `missing_text_column` row."""
    import csv

    # A document is one cell: allow cells as long as a JSONL line may be (the default is 128 KiB).
    if csv.field_size_limit() < _MAX_LINE:
        csv.field_size_limit(_MAX_LINE)
    if delimiter is None:
        name = path.lower()
        for suffix in (".gz", ".zst", ".zstd"):
            name = name[: -len(suffix)] if name.endswith(suffix) else name
        delimiter = "\t" if name.endswith((".tsv", ".tab")) else ","
    bad: set[int] = set()
    problems: list = []
    try:
        reader = csv.reader(_csv_lines(path, raw, bad, problems), delimiter=delimiter, strict=True)
        header = None
        row_no = 0
        last_line = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                row_no += 1
                yield Rejected(Document(f"{path}:{row_no}", "", {"source": path}), READ_STAGE, "bad_row",
                               f"line {reader.line_num}: {exc}")
                last_line = reader.line_num
                continue
            lines = set(range(last_line + 1, reader.line_num + 1))
            last_line = reader.line_num
            if header is None:
                header = row
                if text_field not in header:
                    yield _file_rejection(path, "missing_text_column",
                                          f"the header has no column '{text_field}' (columns: {', '.join(header)[:500]})")
                    return
                continue
            if not row:
                continue  # a blank line
            row_no += 1
            default_id = f"{path}:{row_no}"
            raw_row = delimiter.join(row)
            if len(row) != len(header):
                yield Rejected(Document(default_id, raw_row, {"source": path}), READ_STAGE, "bad_row",
                               f"line {reader.line_num}: {len(row)} fields, the header has {len(header)}")
                continue
            if lines & bad:
                yield Rejected(Document(default_id, raw_row, {"source": path}), READ_STAGE, "invalid_utf8",
                               f"line {min(lines & bad)} is not UTF-8")
                continue
            yield record_to_document(dict(zip(header, row)), default_id, text_field, id_field, raw_row)
    except OSError as exc:
        yield _file_rejection(path, "unreadable_file", f"{type(exc).__name__}: {exc}")
        return
    for problem in problems:
        if isinstance(problem, Damage):
            yield _file_rejection(path, problem.reason, problem.detail)
        else:
            yield _file_rejection(path, "line_too_long", f"a line of {problem.size} bytes; the rest of the file is not read")


READERS = {"jsonl": read_jsonl, "parquet": read_parquet, "html": read_html, "warc": read_warc,
           "text": read_text, "csv": read_csv}


def read_file(path: str, raw: IO[bytes], fmt: str = "auto", text_field: str = "text", id_field: str = "id"):
    """Dispatch to the reader for `fmt` ('auto' = from the file name)."""
    if fmt == "auto":
        try:
            fmt = detect_format(path)
        except InputFormatError as exc:
            # One file a glob matched by accident (a README among the data) is a row, not a crash.
            return iter([_file_rejection(path, "unknown_format", str(exc))])
    if fmt not in READERS:
        raise InputFormatError(f"unknown input format '{fmt}' (known: {', '.join(FORMATS)})")
    return READERS[fmt](path, raw, text_field=text_field, id_field=id_field)


def read_local(path: str, fmt: str = "auto", **kwargs: Any) -> list[Document | Rejected]:
    """Read a local file fully (for tests and small tools)."""
    with open(path, "rb") as fh:
        return list(read_file(os.fspath(path), fh, fmt, **kwargs))
