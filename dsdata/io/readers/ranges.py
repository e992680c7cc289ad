"""Byte ranges: how big a part of a cuttable file one worker reads (range_bytes_for), and a file
object that stops at the end of its range (RangeReader).  Each format's `ranges` function cuts a file."""
from __future__ import annotations

import io
from typing import IO


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
