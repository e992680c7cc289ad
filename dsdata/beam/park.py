"""Flattens that do not hold the documents in the runner: each input parks its records in spill files.

Beam's in-process runner materialises a Flatten whose inputs come from different runner stages:
over documents, the corpus in memory.  `FlattenParked` parks each input's records in spill files (a
step fused into the producer) and flattens only entries: `(True, file name)` per complete file, or
`(False, record)` for an unspillable record; one step after it reads each file once.  Without a
spill directory it is a plain Flatten.
"""
from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from dsdata.beam import location
from dsdata.beam.spill import RollingSpill, Unspillable, encode, make_private_dir, read_spill
from dsdata.beam.transforms import ANY_OUTPUT
from dsdata.document import Document, Rejected, pack_document, unpack_document

# A bundle's parked records roll over to a new spill file past this many bytes: the reading step
# holds one record at a time, the runner one name per file.
PARK_FILE_BYTES = 32 << 20


def parked_sibling(spill_dir: str, name: str) -> str:
    """A spill directory beside `spill_dir` (RUN_DIR/.spill/dedup → RUN_DIR/.spill/dedup-NAME), for
    a stage's records parked between its steps; local or remote alike."""
    return f"{spill_dir.rstrip('/')}-{name}"


def pack_record(item: Document | Rejected) -> list:
    """A Document or a Rejected as a list of plain values (spill.encode may still refuse what its
    metadata or annotations hold: Unspillable)."""
    if type(item) is Document:
        return ["d", pack_document(item)]
    if type(item) is Rejected:
        return ["r", pack_document(item.doc), item.stage, item.reason, item.detail]
    raise Unspillable(f"a record of type {type(item).__qualname__}")


def unpack_record(fields: list) -> Document | Rejected:
    if fields[0] == "d":
        return unpack_document(fields[1])
    _, doc, stage, reason, detail = fields
    return Rejected(unpack_document(doc), stage, reason, detail)


def bundle_spill(spill_dir: str) -> RollingSpill:
    """Where a bundle parks its records: files of PARK_FILE_BYTES under `spill_dir`."""
    return RollingSpill(spill_dir, PARK_FILE_BYTES)


def park(spill: RollingSpill, item, pack=pack_record) -> tuple[bool, Any] | None:
    """None once `item` is in the bundle's spill files; else the entry that carries it (unspillable)."""
    try:
        record = encode(pack(item))
    except Unspillable:
        return False, item
    spill.write_encoded(record)
    return None


def parked_entries(spill: RollingSpill) -> list[tuple[bool, str]]:
    """The bundle's last file closed; an entry for each of its complete files."""
    return [(True, name) for name in spill.close()]


@ANY_OUTPUT
class ParkRecords(beam.DoFn):
    """Records → entries: (True, name) per complete spill file of this bundle, emitted when the
    bundle finishes; (False, record) for a record the spill format cannot carry."""

    def __init__(self, spill_dir: str):
        self.spill_dir = spill_dir

    def setup(self):
        make_private_dir(self.spill_dir)

    def start_bundle(self):
        self._spill = bundle_spill(self.spill_dir)

    def process(self, item):
        entry = park(self._spill, item)
        if entry is not None:
            yield entry

    def finish_bundle(self):
        for entry in parked_entries(self._spill):
            yield GlobalWindows.windowed_value(entry)


def read_entry(spill_dir: str, entry: tuple[bool, Any], unpack=unpack_record):
    """The records an entry stands for: its spill file's, one at a time, or the one it carries."""
    parked, value = entry
    if not parked:
        yield value
        return
    for fields in read_spill(location.join(spill_dir, value)):
        yield unpack(fields)


@ANY_OUTPUT
class _Unpark(beam.DoFn):
    def __init__(self, spill_dir: str):
        self.spill_dir = spill_dir

    def process(self, entry):
        yield from read_entry(self.spill_dir, entry)


class FlattenParked(beam.PTransform):
    """Flatten whose records wait in spill files under `spill_dir`; a plain one when it is None."""

    def __init__(self, spill_dir: str | None):
        super().__init__()
        self.spill_dir = spill_dir

    def expand(self, pcolls):
        pcolls = tuple(pcolls)
        if not self.spill_dir or len(pcolls) < 2:  # a one-input Flatten is fused: nothing waits
            return pcolls | "Flatten" >> beam.Flatten()
        entries = tuple(p | f"Park{i}" >> beam.ParDo(ParkRecords(self.spill_dir)) for i, p in enumerate(pcolls))
        return entries | "Entries" >> beam.Flatten() | "Unpark" >> beam.ParDo(_Unpark(self.spill_dir))
