"""Decompress gzip and zstd input member by member (frame by frame), surviving damage: Python's
readers lose a `read()`'s output on damage and cannot go on.  `decoded_chunks` yields one `Damage`
at a damaged place and goes on at the next member header that really decodes; with member_ends a
`MEMBER_END` after each member that passed its check, the only point where its output is known sound.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import IO, Any, Iterator

GZIP_MAGIC = b"\x1f\x8b\x08"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FEED = 1 << 16
# How far back a resynchronisation search may look into a damaged member.
_RESYNC_WINDOW = 8 << 20
# A candidate member header counts as real when this much of what follows decodes without error.
_PROBE = 1 << 14
# Decompression bombs: zstd's decoder has no output limit per call (an RLE block is 32768:1), so zstd
# is fed _ZSTD_FEED bytes at a time, and a member whose output passes BOMB_MIN_OUTPUT at over
# BOMB_RATIO (deflate's own ceiling) times the compressed bytes fed is one `too_large` row.
_ZSTD_FEED = 1 << 10
BOMB_RATIO = 1032
BOMB_MIN_OUTPUT = 16 << 20


class _MemberEnd:
    def __repr__(self) -> str:
        return "MEMBER_END"


MEMBER_END = _MemberEnd()  # a member ended cleanly (only yielded with member_ends=True)


@dataclass
class Damage:
    """A damaged stretch of a compressed file: `reason` is truncated_compression (the file ends
    inside a member) or corrupt_compression (undecodable bytes, skipped to the next member)."""

    reason: str
    detail: str
    offset: int


def compression_of(path: str) -> str | None:
    name = path.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith((".zst", ".zstd")):
        return "zstd"
    return None


def _decoder(kind: str, dictionary: Any = None):
    if kind == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    import zstandard

    return zstandard.ZstdDecompressor(dict_data=dictionary).decompressobj()


def _decode_errors(kind: str) -> tuple[type[BaseException], ...]:
    if kind == "gzip":
        return (zlib.error,)
    import zstandard

    return (zstandard.ZstdError,)


def _decodes(kind: str, data: bytes, dictionary: Any = None) -> bool:
    try:
        _decoder(kind, dictionary).decompress(data[:_PROBE])
    except _decode_errors(kind):
        return False
    return True


def decoded_chunks(path: str, raw: IO[bytes], member_ends: bool = False) -> Iterator[bytes | Damage | _MemberEnd]:
    """The decompressed content of `raw` (compression from the file name) as byte chunks, with a
    `Damage` at each place where bytes were lost, and with `member_ends` a `MEMBER_END` after each
    member that passed its check.  Uncompressed files pass through."""
    kind = compression_of(path)
    if kind is None:
        while chunk := raw.read(_FEED):
            yield chunk
        return
    yield from _MemberReader(raw, kind, member_ends).chunks()


def _sound_part(decoder, piece: bytes, errors) -> Iterator[bytes]:
    """What `decoder` (a zlib snapshot from before `piece`) emits from `piece` before the error, fed
    in small steps, then byte by byte (zstd's decoder has no copy(): there the feed's output goes)."""
    step = 256
    at = 0
    while at < len(piece):
        probe = decoder.copy()
        try:
            out = probe.decompress(piece[at:at + step])
        except errors:
            if step == 1:
                return
            step = 1
            continue
        decoder = probe
        at += step
        if out:
            yield out
        if decoder.eof:
            return


_MAX_DICTIONARY = 64 << 20


def _zstd_dictionary(payload: bytes) -> tuple[Any, str | None]:
    """The dictionary a WARC-zstd file's first skippable frame holds (raw, or itself a zstd frame),
    and what is wrong with it (None when it loads)."""
    import zstandard

    if len(payload) > _MAX_DICTIONARY:
        return None, f"is over {_MAX_DICTIONARY >> 20} MiB"
    try:
        if payload.startswith(ZSTD_MAGIC):
            payload = zstandard.ZstdDecompressor().decompress(payload, max_output_size=_MAX_DICTIONARY)
        dictionary = zstandard.ZstdCompressionDict(payload)
        zstandard.ZstdDecompressor(dict_data=dictionary)  # loads the dictionary: raises if it is none
    except zstandard.ZstdError as exc:
        return None, f"holds no zstd dictionary ({str(exc).splitlines()[0] if str(exc) else 'ZstdError'})"
    return dictionary, None


def _without_checksum(frame: bytes, skip: int, dictionary: Any) -> tuple[bytes, int] | None:
    """(the output of a zstd frame past its first `skip` bytes, the frame's length) decoded with its
    checksum flag cleared, or None when it does not decode so either."""
    if len(frame) < 5 or not frame[4] & 0x04:
        return None
    patched = bytearray(frame)
    patched[4] &= ~0x04  # Frame_Header_Descriptor: Content_Checksum_flag
    decoder = _decoder("zstd", dictionary)
    out = bytearray()
    fed = 0
    try:
        while fed < len(patched) and not decoder.eof:
            piece = bytes(patched[fed:fed + _ZSTD_FEED])
            out += decoder.decompress(piece)
            fed += len(piece)
            if len(out) > BOMB_MIN_OUTPUT and len(out) > BOMB_RATIO * fed:
                return None
    except _decode_errors("zstd"):
        return None
    if not decoder.eof:
        return None
    used = fed - len(decoder.unused_data)
    return bytes(out[skip:]), used + 4  # the 4 checksum bytes the patched header no longer announces


class _MemberReader:
    """One pass over a compressed file: `buf` holds the compressed bytes not yet fed to a decoder,
    `buf[0]` at file offset `pos`; `chunks` walks member by member."""

    def __init__(self, raw: IO[bytes], kind: str, member_ends: bool):
        self.raw, self.kind, self.member_ends = raw, kind, member_ends
        self.magic = GZIP_MAGIC if kind == "gzip" else ZSTD_MAGIC
        self.errors = _decode_errors(kind)
        self.buf = bytearray()
        self.pos = 0
        self.exhausted = False
        self.dictionary = None  # a zstd dictionary the file carries (IIPC's WARC-zstd: a skippable frame first)

    def fill(self, n: int) -> None:
        while len(self.buf) < n and not self.exhausted:
            chunk = self.raw.read(max(_FEED, n - len(self.buf)))
            if chunk:
                self.buf.extend(chunk)
            else:
                self.exhausted = True

    def drop(self, n: int) -> None:
        del self.buf[:n]
        self.pos += n

    def chunks(self) -> Iterator[bytes | Damage | _MemberEnd]:
        magic, buf = self.magic, self.buf
        while True:
            self.fill(len(magic))
            if self.kind == "gzip":
                self._skip_zero_padding()
            if not buf and self.exhausted:
                return
            if self.kind == "zstd":
                self.fill(8)
                # A skippable frame's header: magic 0x184D2A50 to 0x184D2A5F, little-endian, then its size.
                if len(buf) >= 8 and buf[1:4] == b"\x2a\x4d\x18" and 0x50 <= buf[0] <= 0x5F:
                    if (yield from self._skippable_frame()):
                        return
                    continue
            if not buf.startswith(magic):
                if self.exhausted and len(buf) < len(magic) and magic.startswith(bytes(buf)):
                    yield Damage("truncated_compression",
                                 f"the file ends {len(buf)} bytes into a {self.kind} header at offset {self.pos}",
                                 self.pos)
                    return
                begin = self.pos
                yield from self.skip_to_member(1, begin, f"bytes at offset {begin} are not a {self.kind} member")
                continue
            if not (yield from self._member()):
                return

    def _skip_zero_padding(self) -> None:
        """gzip allows zero padding after a member (tape blocks); Python's gzip skips it too."""
        while self.buf[:1] == b"\x00":
            self.drop(len(self.buf) - len(self.buf.lstrip(b"\x00")))
            self.fill(len(self.magic))

    def _skippable_frame(self) -> Iterator[Damage]:
        """Pass a zstd skippable frame (metadata, as `zstd -d` does); the first one of a WARC-zstd file
        holds its dictionary.  Returns True when the file ends in it."""
        buf = self.buf
        frame_start = self.pos
        keep = frame_start == 0 and buf[0] == 0x5D  # the dictionary frame of a WARC-zstd file
        size = 8 + int.from_bytes(buf[4:8], "little")
        payload = bytearray()
        while size:
            self.fill(min(size, _FEED))
            if not buf:
                break
            step = min(size, len(buf))
            if keep and len(payload) <= _MAX_DICTIONARY:
                payload.extend(buf[:step])
            self.drop(step)
            size -= step
        if size:
            yield Damage("truncated_compression",
                         f"the file ends inside the zstd skippable frame that starts at offset {frame_start}",
                         frame_start)
            return True
        if keep:
            self.dictionary, problem = _zstd_dictionary(bytes(payload[8:]))
            if problem:
                yield Damage("corrupt_compression", f"the zstd dictionary frame at offset 0 {problem}; "
                             "the frames compressed with it cannot be read", 0)
        return False

    def _member(self) -> Iterator[bytes | Damage | _MemberEnd]:
        """Decode the member at the reading position; after damage, find the next one.  Returns
        False when the file ends inside it (its Damage said), True to go on."""
        kind, buf = self.kind, self.buf
        member_start = self.pos
        decoder = _decoder(kind, self.dictionary)
        history = bytearray()  # the member's bytes already fed (the last _RESYNC_WINDOW of them)
        history_start = self.pos
        feed = _FEED if kind == "gzip" else _ZSTD_FEED
        fed = produced = 0  # this member's compressed bytes fed and decoded bytes out
        while True:
            if not buf:
                self.fill(1)
                if not buf:
                    yield Damage("truncated_compression",
                                 f"the file ends inside the {kind} member that starts at offset {member_start} "
                                 f"({self.pos - member_start} compressed bytes of it present); its undecoded rest "
                                 "is lost", member_start)
                    return False
            piece = bytes(buf[:feed])
            before = decoder.copy() if kind == "gzip" else None
            try:
                out = decoder.decompress(piece)
            except self.errors as failure:
                if before is not None:
                    yield from _sound_part(before, piece, self.errors)
                return (yield from self._after_failure(failure, member_start, history, history_start, produced))
            fed += len(piece)
            produced += len(out)
            if produced > BOMB_MIN_OUTPUT and produced > BOMB_RATIO * fed:
                yield Damage("too_large", f"the {kind} member at offset {member_start} decodes to over {produced} "
                             f"bytes from {fed} compressed bytes (over {BOMB_RATIO}:1, a decompression bomb); "
                             "the rest of it is not decoded", member_start)
                self.drop(len(piece))
                self._seek_member(0)  # no corrupt_compression row for the rest of the bomb
                return True
            if out:
                yield out
            if decoder.eof:
                self.drop(len(piece) - len(decoder.unused_data))
                if self.member_ends:
                    yield MEMBER_END
                return True
            self.drop(len(piece))
            history.extend(piece)
            if len(history) > 2 * _RESYNC_WINDOW:  # trim in big steps: amortised O(1) per byte
                cut = len(history) - _RESYNC_WINDOW
                del history[:cut]
                history_start += cut

    def _after_failure(self, failure: BaseException, member_start: int, history: bytearray, history_start: int,
                       produced: int) -> Iterator[bytes | Damage]:
        """The member at `member_start` failed to decode: keep what a zstd frame with only a bad
        checksum decoded, or search for the next member.  Returns True (reading goes on)."""
        kind, buf = self.kind, self.buf
        if kind == "zstd" and "checksum" in str(failure) and history_start == member_start:
            recovered = _without_checksum(bytes(history) + bytes(buf), produced, self.dictionary)
            if recovered is not None:
                # Only the checksum differs: as on gzip's CRC failure, what it decoded is kept.
                tail, frame_bytes = recovered
                if tail:
                    yield tail
                self.drop(frame_bytes - len(history))
                yield Damage("corrupt_compression", f"the zstd frame at offset {member_start} decoded whole but "
                             "fails its checksum: its lines are kept as decoded", member_start)
                return True
        # Search for the next member from just after this member's header, through the bytes of
        # this member already fed (the decoder may notice damage well after it) and onwards.
        buf[:0] = history
        self.pos = history_start
        start = max(1, member_start + 1 - history_start)
        first_line = str(failure).splitlines()[0] if str(failure) else type(failure).__name__
        yield from self.skip_to_member(start, member_start,
                                       f"corrupt {kind} data in the member at offset {member_start} ({first_line})")
        return True

    def _seek_member(self, search_from: int) -> bool:
        """Drop bytes up to the next header (at or after `search_from`) that really decodes: True;
        False when none is left (every byte dropped)."""
        buf, magic = self.buf, self.magic
        while True:
            self.fill(search_from + _PROBE + len(magic))
            found = buf.find(magic, search_from)
            if found < 0:
                if self.exhausted:
                    self.drop(len(buf))
                    return False
                # Keep only a possible partial header at the end; everything before it is lost.
                self.drop(max(search_from, len(buf) - len(magic) + 1))
                search_from = 0
                continue
            self.fill(found + _PROBE)
            if _decodes(self.kind, bytes(buf[found:found + _PROBE]), self.dictionary):
                self.drop(found)
                return True
            search_from = found + 1

    def skip_to_member(self, search_from: int, begin: int, why: str) -> Iterator[Damage]:
        """Drop bytes up to the next header that really decodes; one Damage for the gap."""
        kind = self.kind
        if self._seek_member(search_from):
            yield Damage("corrupt_compression",
                         f"{why}; {self.pos - begin} compressed bytes from offset {begin} skipped, "
                         f"reading resumed at the next {kind} member (offset {self.pos})", begin)
        else:
            yield Damage("corrupt_compression",
                         f"{why}; the {self.pos - begin} compressed bytes from offset {begin} to the end hold no "
                         f"further {kind} member: what did not decode from them is lost", begin)
