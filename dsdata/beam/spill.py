"""Spill files: a whole-corpus stage parks its documents on disk while only small keys shuffle.

A spill file is a sequence of records, each `u32 length` + one MessagePack value of the plain kinds
a packed Document holds; decoding builds only those (no pickle, no code).  Any other value raises
`Unspillable`: its document then travels through the shuffle instead.

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
import msgpack
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

SPILL_DIR = ".spill"
_LEN = struct.Struct("<I")
_CHUNK = 1 << 20  # bytes a spill file is written and read at a time


class Unspillable(TypeError):
    """A value the spill format does not carry exactly."""


class SpillFormatError(ValueError):
    """A spill file that does not decode (truncated or not written by this module)."""


# Values are MessagePack (the msgpack C codec: ~4x faster to decode than a Python one, which every
# parked document passed through up to six times in a run).  strict_types: a type is carried only as
# exactly itself; tuples, integers past 64 bits, datetimes, times, dates and Decimals are extension
# types of their own below; anything else is Unspillable.
_TUPLE, _BIG_INT, _DATETIME, _TIME, _DATE, _DECIMAL = range(1, 7)
_FROM_ASCII = {_BIG_INT: int, _DATETIME: _dt.datetime.fromisoformat, _TIME: _dt.time.fromisoformat,
               _DATE: _dt.date.fromisoformat, _DECIMAL: Decimal}


def _extension(value: Any) -> msgpack.ExtType:
    kind = type(value)
    if kind is tuple:
        return msgpack.ExtType(_TUPLE, encode(list(value)))
    if kind is int:  # past 64 bits
        return msgpack.ExtType(_BIG_INT, str(value).encode("ascii"))
    if kind in (_dt.datetime, _dt.time) and (value.tzinfo is None or type(value.tzinfo) is _dt.timezone):
        # isoformat round-trips naive and fixed-offset values exactly (microseconds, fold aside).
        if value.fold:
            raise Unspillable(f"{kind.__name__} with fold=1")
        return msgpack.ExtType(_DATETIME if kind is _dt.datetime else _TIME, value.isoformat().encode("ascii"))
    if kind is _dt.date:
        return msgpack.ExtType(_DATE, value.isoformat().encode("ascii"))
    if kind is Decimal:
        return msgpack.ExtType(_DECIMAL, str(value).encode("ascii"))
    raise Unspillable(f"a value of type {kind.__module__}.{kind.__qualname__}")


def _from_extension(code: int, data: bytes) -> Any:
    if code == _TUPLE:
        return tuple(_unpack(data))
    if code not in _FROM_ASCII:
        raise SpillFormatError(f"unknown extension type {code}")
    return _FROM_ASCII[code](data.decode("ascii"))


def encode(value: Any) -> bytes:
    try:
        return msgpack.packb(value, default=_extension, use_bin_type=True, strict_types=True,
                             unicode_errors="surrogatepass")
    except (ValueError, RecursionError) as exc:  # nested past msgpack's (or Python's) depth limit
        raise Unspillable(f"a value nested too deep ({exc})") from None


def _unpack(data) -> Any:
    return msgpack.unpackb(data, ext_hook=_from_extension, raw=False, strict_map_key=False,
                           unicode_errors="surrogatepass", timestamp=3)  # msgpack's own ext -1: a datetime


def decode(data) -> Any:
    """The value of one record's bytes; SpillFormatError when they are not exactly one value."""
    try:
        return _unpack(data)
    except SpillFormatError:
        raise
    except (ValueError, TypeError, UnicodeDecodeError, msgpack.UnpackException) as exc:
        raise SpillFormatError(f"a record does not decode ({type(exc).__name__})") from None


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
        self._buffer = bytearray()  # records go to the file _CHUNK at a time
        self.records = 0

    def write(self, value: Any) -> None:
        self.write_encoded(encode(value))

    def write_encoded(self, data: bytes) -> None:
        self._buffer += _LEN.pack(len(data))
        self._buffer += data
        self.records += 1
        if len(self._buffer) >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        try:
            self._fh.write(self._buffer)
        except OSError as exc:
            raise _named(exc, self.path)
        self._buffer = bytearray()

    def close(self) -> None:
        self._flush()
        try:
            self._fh.close()
        except OSError as exc:
            raise _named(exc, self.path)


def _named(exc: OSError, path: str) -> OSError:
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
    """The records of one spill file, in the order written (read _CHUNK at a time)."""
    with FileSystems.open(path) as fh:
        data, pos = b"", 0
        while True:
            end = pos + 4 + _LEN.unpack_from(data, pos)[0] if len(data) - pos >= 4 else len(data) + 1
            if end > len(data):  # the next record is not all here: read on
                more = fh.read(max(_CHUNK, end - len(data)))
                if not more:
                    if pos == len(data):
                        return
                    raise SpillFormatError(f"{path}: record {'cut short' if end > pos + 4 else 'header cut short'}")
                data, pos = data[pos:] + more, 0
                continue
            try:
                yield decode(memoryview(data)[pos + 4:end])
            except SpillFormatError as exc:
                raise SpillFormatError(f"{path}: {exc}") from None
            pos = end


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


class RunWriter:
    """A bundle's partition runs appended to one spill file of `kind`, opened at the first run; `close()`
    returns (partition, (file name, offset, length, *tail)) for each run written."""

    def __init__(self, spill_dir: str, kind: str):
        self.spill_dir, self.kind = spill_dir, kind
        self._fh, self._entries = None, []

    def write(self, partition: int, data, *tail) -> None:
        if self._fh is None:
            self._name = spill_name(uuid.uuid4().hex, self.kind)
            self._path = FileSystems.join(self.spill_dir, self._name)
            self._fh, self._offset = FileSystems.create(self._path), 0
        try:
            self._fh.write(data)
        except OSError as exc:
            raise _named(exc, self._path)
        self._entries.append((partition, (self._name, self._offset, len(data), *tail)))
        self._offset += len(data)

    def close(self) -> list:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                raise _named(exc, self._path)
        entries, self._fh, self._entries = self._entries, None, []
        return entries


def read_runs(spill_dir: str, runs) -> Iterator[tuple]:
    """(data, file name, *tail) of each (file name, offset, length, *tail) in `runs`, in file and offset
    order: each file opened once."""
    fh = name = None
    try:
        for run_name, offset, length, *tail in sorted(runs):
            if run_name != name:
                if fh is not None:
                    fh.close()
                name, fh = run_name, FileSystems.open(FileSystems.join(spill_dir, run_name))
            fh.seek(offset)
            data = fh.read(length)
            if len(data) < length:
                raise SpillFormatError(f"{name}: a run cut short")
            yield data, name, *tail
    finally:
        if fh is not None:
            fh.close()


# Spilled grouping: a bundle's records go to its spill file in runs of one partition (crc32 of the
# key mod GROUP_PARTITIONS); only (partition, (file, offset, length, input)) entries cross the
# runner's GroupByKey, and a worker reads back and groups one partition at a time.
GROUP_PARTITIONS = 64
_PAIR = b"\x92"  # a MessagePack array of two: (key, value), the key encoded once
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
        self._bytes, self._writer = 0, RunWriter(self.spill_dir, "group")

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
        for partition, run in sorted(self._pending.items()):
            self._writer.write(partition, run, self.source)
        self._pending, self._bytes = {}, 0

    def finish_bundle(self):
        if self._pending:
            self._flush()
        for run in self._writer.close():
            yield GlobalWindows.windowed_value(run)


class _GroupRuns(beam.DoFn):
    """A partition's runs → (key, values), or (key, {tag: values}) with the CoGroupByKey's tags."""

    def __init__(self, spill_dir: str, tags: list | None):
        self.spill_dir, self.tags = spill_dir, tags

    def process(self, item):
        groups: dict[Any, list[list]] = {}
        sources = len(self.tags) if self.tags else 1
        for key, value, source in self._records(item[1]):
            lists = groups.get(key)
            if lists is None:
                lists = groups[key] = [[] for _ in range(sources)]
            lists[source].append(value)
        if self.tags is None:
            return [(key, lists[0]) for key, lists in groups.items()]
        return [(key, dict(zip(self.tags, lists))) for key, lists in groups.items()]

    def _records(self, runs):
        """(key, value, input) of each record in `runs`."""
        for data, name, source in read_runs(self.spill_dir, runs):
            view, pos, length = memoryview(data), 0, len(data)
            while pos < length:
                end = pos + 4 + (_LEN.unpack_from(data, pos)[0] if pos + 4 <= length else length)
                if end > length:
                    raise SpillFormatError(f"{name}: a record's length does not match its value")
                try:  # decoded where it lies in the run, not from a copy
                    key, value = decode(view[pos + 4:end])
                except (SpillFormatError, ValueError, TypeError):
                    raise SpillFormatError(f"{name}: a record does not decode") from None
                pos = end
                yield key, value, source


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
                | "Group" >> beam.ParDo(_GroupRuns(self.spill_dir, tags)))
