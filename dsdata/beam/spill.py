"""Spill files: a whole-corpus stage parks its documents on disk while only small keys shuffle.

A spill file is a sequence of records, each `u32 length` + one value in a small tagged binary form of
the plain values a packed Document holds; decoding builds only those (no pickle).  Any other value
raises `Unspillable`: its document then travels through the shuffle instead.

Files are written through Beam's FileSystems and named by a random id, so a retried bundle writes
a new file and the old one is never read.
"""
from __future__ import annotations

import datetime as _dt
import os
import struct
import uuid
import zlib
from decimal import Decimal
from typing import Any, Iterator, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

SPILL_DIR = ".spill"
_LEN = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class Unspillable(TypeError):
    """A value the spill format does not carry exactly."""


class SpillFormatError(ValueError):
    """A spill file that does not decode (truncated or not written by this module)."""


def _put_bytes(out: bytearray, tag: bytes, data: bytes) -> None:
    out += tag
    out += _LEN.pack(len(data))
    out += data


def _encode(value: Any, out: bytearray, _pack_len=_LEN.pack) -> None:
    """`value` appended to `out`: the kinds a packed document holds most tested first, strings and
    bytes written inline (every parked or spilled record passes here once per step that writes it)."""
    kind = type(value)
    if kind is str:
        data = value.encode("utf-8", "surrogatepass")
        out += b"s"
        out += _pack_len(len(data))
        out += data
    elif kind is bytes:
        out += b"b"
        out += _pack_len(len(value))
        out += value
    elif kind is tuple or kind is list:
        out += b"t" if kind is tuple else b"l"
        out += _pack_len(len(value))
        for item in value:
            _encode(item, out)
    elif kind is dict:
        out += b"d"
        out += _pack_len(len(value))
        for key, item in value.items():
            _encode(key, out)
            _encode(item, out)
    elif value is None:
        out += b"N"
    elif kind is bool:
        out += b"T" if value else b"F"
    elif kind is int:
        if _I64_MIN <= value <= _I64_MAX:
            out += b"i"
            out += _I64.pack(value)
        else:
            _put_bytes(out, b"I", str(value).encode("ascii"))
    elif kind is float:
        out += b"f"
        out += _F64.pack(value)
    elif kind in (_dt.datetime, _dt.time) and (value.tzinfo is None or type(value.tzinfo) is _dt.timezone):
        # isoformat round-trips naive and fixed-offset values exactly (microseconds, fold aside).
        if value.fold:
            raise Unspillable(f"{kind.__name__} with fold=1")
        _put_bytes(out, b"D" if kind is _dt.datetime else b"H", value.isoformat().encode("ascii"))
    elif kind is _dt.date:
        _put_bytes(out, b"Y", value.isoformat().encode("ascii"))
    elif kind is Decimal:
        _put_bytes(out, b"M", str(value).encode("ascii"))
    else:
        raise Unspillable(f"a value of type {kind.__module__}.{kind.__qualname__}")


def encode(value: Any) -> bytes:
    out = bytearray()
    _encode(value, out)
    return bytes(out)


_U32 = _LEN.unpack_from
_FIXED = {ord("i"): _I64.unpack_from, ord("f"): _F64.unpack_from}
_CONSTANTS = {ord("N"): None, ord("T"): True, ord("F"): False}
_FROM_ASCII = {ord("I"): int, ord("D"): _dt.datetime.fromisoformat, ord("H"): _dt.time.fromisoformat,
               ord("Y"): _dt.date.fromisoformat, ord("M"): Decimal}


def _sized(data: bytes, pos: int) -> tuple[bytes, int]:
    """The u32-length-prefixed bytes at `pos`, and the position after them."""
    start = pos + 4
    end = start + _U32(data, pos)[0]
    if end > len(data):
        raise SpillFormatError("record ends early")
    return data[start:end], end


def _value(data: bytes, pos: int, _u32=_U32) -> tuple[Any, int]:
    """The value at `pos` and the position after it: one flat dispatch on the tag byte, strings and
    bytes read inline (~4× a method call per field)."""
    tag = data[pos]
    if tag == 115 or tag == 98:  # s, b
        start = pos + 5
        end = start + _u32(data, pos + 1)[0]
        if end > len(data):
            raise SpillFormatError("record ends early")
        return (data[start:end].decode("utf-8", "surrogatepass") if tag == 115 else data[start:end]), end
    pos += 1
    if tag == 108 or tag == 116:  # l, t
        items = []
        count, pos = _u32(data, pos)[0], pos + 4
        for _ in range(count):
            item, pos = _value(data, pos)
            items.append(item)
        return (items if tag == 108 else tuple(items)), pos
    if tag == 100:  # d
        out = {}
        count, pos = _u32(data, pos)[0], pos + 4
        for _ in range(count):
            key, pos = _value(data, pos)
            out[key], pos = _value(data, pos)
        return out, pos
    if tag in _CONSTANTS:
        return _CONSTANTS[tag], pos
    if tag in _FIXED:
        return _FIXED[tag](data, pos)[0], pos + 8
    if tag not in _FROM_ASCII:
        raise SpillFormatError(f"unknown tag {bytes([tag])!r}")
    raw, pos = _sized(data, pos)
    return _FROM_ASCII[tag](raw.decode("ascii")), pos


def decode(data: bytes) -> Any:
    try:
        value, pos = _value(data, 0)
    except (struct.error, IndexError):  # a length, a number or a tag past the end
        raise SpillFormatError("record ends early") from None
    if pos != len(data):
        raise SpillFormatError("trailing bytes after a record")
    return value


def spill_directory(run_dir: str, name: str) -> str:
    return FileSystems.join(run_dir, SPILL_DIR, name)


def make_private_dir(path: str) -> None:
    """Create `path` (local: mode 0700, the documents' text is in there)."""
    if "://" in path:
        return  # object stores have no directories; FileSystems.create makes what it needs
    from dsdata.io.outfiles import ensure_dir

    # OUT/.spill and its folders are made here, never through a link planted in OUT (a linked
    # .spill made the run chmod and fill a folder elsewhere).
    parent = os.path.dirname(path.rstrip(os.sep))
    os.makedirs(os.path.dirname(parent), exist_ok=True)  # the run's folder itself: the user's choice
    ensure_dir(parent, 0o700)
    os.chmod(parent, 0o700)  # a real folder now: ensure_dir replaced any link
    ensure_dir(path, 0o700)


def spill_name(bundle: str, kind: str) -> str:
    """The file name of a bundle's spill file of one kind (docs, verify, …)."""
    return f"{bundle}.{kind}.spill"


class SpillWriter:
    """Appends records to a new file `name` (default: a random one) under `directory`."""

    def __init__(self, directory: str, name: str | None = None):
        self.name = name or spill_name(uuid.uuid4().hex, "data")
        self.path = FileSystems.join(directory, self.name)
        self._fh = FileSystems.create(self.path)
        self.records = 0

    def write(self, value: Any) -> None:
        self.write_encoded(encode(value))

    def write_encoded(self, data: bytes) -> None:
        try:
            self._fh.write(_LEN.pack(len(data)) + data)
        except OSError as exc:
            raise named(exc, self.path)
        self.records += 1

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError as exc:
            raise named(exc, self.path)


def named(exc: OSError, path: str) -> OSError:
    """`exc` naming the spill file it failed on: a full disk under OUT/.spill is OUT's, and a write on
    an open file says no path (dsdata/api.py tells OUT's full disk from a stage's own by the path)."""
    if exc.filename is None:
        exc.filename = path
    return exc


class RollingSpill:
    """One bundle's records appended to spill files under `directory`, a new file past `file_bytes`;
    `close()` ends the open file and returns the names (not paths) of the files completed since."""

    def __init__(self, directory: str, file_bytes: int):
        self.directory, self.file_bytes = directory, file_bytes
        self._writer: SpillWriter | None = None
        self._bytes, self._done = 0, []

    def write(self, value: Any) -> None:
        self.write_encoded(encode(value))

    def write_encoded(self, data: bytes) -> None:
        if self._writer is None:
            self._writer = SpillWriter(self.directory)
        self._writer.write_encoded(data)
        self._bytes += len(data)
        if self._bytes >= self.file_bytes:
            self._roll()

    def _roll(self) -> None:
        self._writer.close()
        self._done.append(self._writer.name)
        self._writer, self._bytes = None, 0

    def close(self) -> list[str]:
        if self._writer is not None:
            self._roll()
        done, self._done = self._done, []
        return done


def read_spill(path: str) -> Iterator[Any]:
    """The records of one spill file, in the order written."""
    with FileSystems.open(path) as fh:
        while True:
            head = fh.read(4)
            if not head:
                return
            if len(head) < 4:
                raise SpillFormatError(f"{path}: record header cut short")
            (n,) = _LEN.unpack(head)
            data = fh.read(n)
            if len(data) < n:
                raise SpillFormatError(f"{path}: record cut short")
            yield decode(data)


def remove_spill(run_dir: str) -> None:
    """Delete RUN_DIR/.spill (every stage's files), if there."""
    path = FileSystems.join(run_dir, SPILL_DIR)
    if "://" not in path:
        from dsdata.io.outfiles import remove_entry

        try:
            remove_entry(path)  # a link planted as .spill is unlinked, not followed
        except OSError:
            pass  # best effort, as before: a file a worker still writes
        return
    matches = FileSystems.match([FileSystems.join(path, "**")])[0].metadata_list
    if matches:
        FileSystems.delete([m.path for m in matches])


# Spilled grouping: a bundle's records go to its spill file in runs of one partition (crc32 of the
# key mod GROUP_PARTITIONS); only (partition, (file, offset, length, input)) entries cross the
# runner's GroupByKey, and a worker reads back and groups one partition at a time.
GROUP_PARTITIONS = 64
_PAIR = b"t" + _LEN.pack(2)
GROUP_PENDING_BYTES = 16 << 20


# Declared, not inferred: Beam would otherwise infer it from process()'s bytecode, recursing into
# encode() (over a CPU-second per grouping when the graph is built); the int key gets VarIntCoder.
@beam.typehints.with_output_types(Tuple[int, Tuple[str, int, int, int]])
class _SpillRuns(beam.DoFn):
    def __init__(self, spill_dir: str, source: int):
        self.spill_dir, self.source = spill_dir, source

    def setup(self):
        make_private_dir(self.spill_dir)

    def start_bundle(self):
        self._pending: dict[int, bytearray] = {}
        self._bytes, self._fh, self._runs = 0, None, []

    def process(self, item):
        key, value = item
        key_data = encode(key)
        record = _PAIR + key_data + encode(value)  # encode((key, value)), the key encoded once
        run = self._pending.get(partition := zlib.crc32(key_data) % GROUP_PARTITIONS)
        if run is None:
            run = self._pending[partition] = bytearray()
        run += _LEN.pack(len(record))
        run += record
        self._bytes += len(record) + 4
        if self._bytes >= GROUP_PENDING_BYTES:
            self._flush()
        return ()

    def _flush(self):
        if self._fh is None:
            self._name = spill_name(uuid.uuid4().hex, "group")
            self._path = FileSystems.join(self.spill_dir, self._name)
            self._fh, self._offset = FileSystems.create(self._path), 0
        try:
            for partition, run in sorted(self._pending.items()):
                self._fh.write(run)
                self._runs.append((partition, (self._name, self._offset, len(run), self.source)))
                self._offset += len(run)
        except OSError as exc:
            raise named(exc, self._path)
        self._pending, self._bytes = {}, 0

    def finish_bundle(self):
        if self._pending:
            self._flush()
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                raise named(exc, self._path)
        for run in self._runs:
            yield GlobalWindows.windowed_value(run)
        self._fh, self._runs = None, []


class _GroupRuns(beam.DoFn):
    def __init__(self, spill_dir: str, sources: int):
        self.spill_dir, self.sources = spill_dir, sources

    def process(self, item):
        groups: dict[Any, list[list]] = {}
        for key, value, source in self._records(sorted(item[1])):
            lists = groups.get(key)
            if lists is None:
                lists = groups[key] = [[] for _ in range(self.sources)]
            lists[source].append(value)
        yield from groups.items()

    def _records(self, runs):
        """(key, value, input) of each record in `runs`, sorted by file and offset: each file opened once."""
        fh = name = None
        try:
            for run_name, offset, length, source in runs:
                if run_name != name:
                    if fh is not None:
                        fh.close()
                    name, fh = run_name, FileSystems.open(FileSystems.join(self.spill_dir, run_name))
                fh.seek(offset)
                data, pos = fh.read(length), 0
                if len(data) < length:
                    raise SpillFormatError(f"{name}: a run cut short")
                while pos < length:
                    end = pos + 4 + _U32(data, pos)[0]
                    try:  # decoded where it lies in the run, not from a copy
                        (key, value), at = _value(data, pos + 4)
                    except (struct.error, IndexError, ValueError):
                        raise SpillFormatError(f"{name}: a record does not decode") from None
                    if at != end:
                        raise SpillFormatError(f"{name}: a record's length does not match its value")
                    pos = end
                    yield key, value, source
        finally:
            if fh is not None:
                fh.close()


class SpilledGroupByKey(beam.PTransform):
    """GroupByKey (one PCollection) or CoGroupByKey (a dict of them) whose records wait in spill files
    under `spill_dir`, not in the runner; keys and values must be spillable."""

    def __init__(self, spill_dir: str):
        super().__init__()
        self.spill_dir = spill_dir

    def expand(self, pcolls):
        tags = list(pcolls) if isinstance(pcolls, dict) else None
        inputs = [pcolls[t] for t in tags] if tags else [pcolls]
        runs = tuple(p | f"Spill{i}" >> beam.ParDo(_SpillRuns(self.spill_dir, i)) for i, p in enumerate(inputs))
        return (runs | "Runs" >> beam.Flatten() | "ByPartition" >> beam.GroupByKey()
                | "Group" >> beam.ParDo(_GroupRuns(self.spill_dir, len(inputs)))
                | "Values" >> beam.MapTuple(lambda key, lists: (key, dict(zip(tags, lists)) if tags else lists[0])))
