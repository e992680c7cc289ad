"""OUT/resume/: the committed work of a run, which `dsdata run --resume` reuses (docs/resume.md
has the layout: fingerprint.json, and per group units/G.arrow, one Arrow IPC stream per unit, and
its commit marker units/G.json).  No Beam here: the Beam side is dsdata/beam/resume.py.

OUT is untrusted: files here are opened with O_NOFOLLOW, markers and the fingerprint are read as
bounded JSON, the Arrow data is fully validated, and every metadata/annotation value is bounded JSON.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.io import local_paths
from dsdata.io.outfiles import create_exclusive, ensure_dir, fresh_dir, remove_entry, sync_dir, write_file_in_out
from dsdata.io.untrusted_files import UntrustedFileError, loads_bounded

RESUME_DIR = "resume"
UNITS_DIR = "units"
FINGERPRINT_NAME = "fingerprint.json"
FINGERPRINT_FORMAT = "dsdata-resume-1"
MARKER_FORMAT = "dsdata-units-1"
# `dsdata run --resume` refused (the committed work is another recipe's or other inputs'): its own
# status, so that a script can tell "start again without --resume" from a run that failed.
RESUME_REFUSED_EXIT = 3
# Metadata nests as deep as the readers let JSON nest (100 levels) plus the record around it.
_VALUE_DEPTH = 128
_MARKER_BYTES = 16 << 20  # a group's marker: GROUP_UNITS entries of a few hundred bytes
_FINGERPRINT_BYTES = 256 << 20
_TEMP_PREFIX = ".tmp-"

UNIT_SCHEMA = pa.schema([
    pa.field("kept", pa.bool_(), nullable=False),  # a kept document, or a rejection
    pa.field("id", pa.string(), nullable=False),
    pa.field("text", pa.large_string(), nullable=False),
    pa.field("metadata", pa.large_string(), nullable=False),  # exact JSON (see _exact_json)
    pa.field("annotations", pa.large_string(), nullable=False),
    pa.field("derived_from", pa.string()),
    pa.field("stage", pa.string()),  # rejections only
    pa.field("reason", pa.string()),
    pa.field("detail", pa.large_string()),
])


class ResumeRefused(ValueError):
    """`--resume` into an OUT whose committed work another recipe or other inputs made; one line."""


class CommittedUnitDamaged(ValueError):
    """A committed unit whose data matched its marker's sha256 but is not what dsdata writes; one line."""


class NotCommittable(ValueError):
    """A unit's records cannot be written so that reading them back gives the same records (a value
    JSON cannot hold exactly, a text Arrow cannot encode): the unit is not committed."""


def unit_key(description: list) -> str:
    """The file name stem of a unit: a digest of its description (["file", path] or ["range", …])."""
    text = json.dumps(description, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


# A unit's input is hashed whole up to this size; a bigger one by its length and _SAMPLES blocks
# spread evenly over it, the first and the last included.
_DIGEST_WHOLE_BYTES = 64 << 20
_SAMPLE_BYTES = 1 << 20
_SAMPLES = 64


def input_digest(path: str, start: int = 0, end: int | None = None) -> str:
    """A digest of a local unit's input bytes [start, end) (end None: to the end of the file); "" for
    a remote object (the fingerprint's modification time sees its rewrite)."""
    if "://" in path:
        return ""
    digest = hashlib.sha256()
    with local_paths.open_binary(path) as fh:
        fh.seek(0, os.SEEK_END)
        stop = fh.tell() if end is None else min(end, fh.tell())
        length = max(0, stop - start)
        if length <= _DIGEST_WHOLE_BYTES:
            spans = [(start, length)]
        else:
            step = (length - _SAMPLE_BYTES) // (_SAMPLES - 1)
            spans = [(start + i * step, _SAMPLE_BYTES) for i in range(_SAMPLES)]
            digest.update(f"sampled {length}".encode("ascii"))
        for offset, size in spans:
            fh.seek(offset)
            while size > 0 and (block := fh.read(min(size, 8 << 20))):
                digest.update(block)
                size -= len(block)
    return digest.hexdigest()


# --- records <-> Arrow ----------------------------------------------------------------------------

def _exact(value: Any, depth: int = 0) -> bool:
    """Whether json.loads(json.dumps(value)) gives `value` back with the same types: tuples, int
    keys, numpy scalars and subclasses would come back as something else."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return True
    if depth >= _VALUE_DEPTH:
        return False
    if kind is dict:
        return all(type(k) is str and _exact(v, depth + 1) for k, v in value.items())
    if kind is list:
        return all(_exact(v, depth + 1) for v in value)
    return False


def _exact_json(value: dict) -> str:
    if not value:
        return "{}"
    if not _exact(value):
        raise NotCommittable("a metadata or annotation value JSON cannot hold exactly")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def unit_record_batch(docs: list[Document], rejected: list[Rejected]) -> pa.RecordBatch:
    """One Batch (its kept documents, then its rejections) as a record batch of UNIT_SCHEMA."""
    rows = [*docs, *(r.doc for r in rejected)]
    n_docs = len(docs)
    columns = [
        [True] * n_docs + [False] * len(rejected),
        [d.id for d in rows],
        [d.text for d in rows],
        [_exact_json(d.metadata) for d in rows],
        [_exact_json(d.annotations) for d in rows],
        [d.derived_from for d in rows],
        [None] * n_docs + [r.stage for r in rejected],
        [None] * n_docs + [r.reason for r in rejected],
        [None] * n_docs + [r.detail for r in rejected],
    ]
    try:
        arrays = [pa.array(column, type=field.type) for column, field in zip(columns, UNIT_SCHEMA)]
    except (pa.ArrowException, UnicodeError, TypeError, ValueError) as exc:
        raise NotCommittable(f"a record cannot be stored: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
    return pa.RecordBatch.from_arrays(arrays, schema=UNIT_SCHEMA)


def _json_dict(text: str, what: str) -> dict:
    if text == "{}":
        return {}
    value = loads_bounded(text, what, max_depth=_VALUE_DEPTH)
    if type(value) is not dict:
        raise UntrustedFileError(f"{what}: not a JSON object")
    return value


def _records(batch: pa.RecordBatch, what: str) -> tuple[list[Document], list[Rejected]]:
    kept, ids, texts, metadata, annotations, derived, stages, reasons, details = (
        column.to_pylist() for column in batch.columns)
    docs: list[Document] = []
    rejected: list[Rejected] = []
    for i, is_kept in enumerate(kept):
        if ids[i] is None or texts[i] is None or is_kept is None:
            raise UntrustedFileError(f"{what}: row {i} has no id, text or kind")
        doc = Document(ids[i], texts[i], _json_dict(metadata[i], what), _json_dict(annotations[i], what), derived[i])
        if is_kept:
            docs.append(doc)
        elif stages[i] is None or reasons[i] is None or details[i] is None:
            raise UntrustedFileError(f"{what}: rejected row {i} has no stage, reason or detail")
        else:
            rejected.append(Rejected(doc, stages[i], reasons[i], details[i]))
    return docs, rejected


# --- writing committed units ---------------------------------------------------------------------

class _SegmentFile(io.RawIOBase):
    """The group's data file, written at its end; the unit being written is hashed as it goes."""

    def __init__(self, fd: int, offset: int):
        self.fd, self.offset, self.size, self.sha256 = fd, offset, 0, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        done = 0
        while done < len(view):
            done += os.write(self.fd, view[done:])
        self.size += len(view)
        return len(view)


# A group is committed once its units hold this much data, this many units, or this much time went
# into them: four fsyncs per group rather than per unit, while a kill loses about a second of work.
GROUP_BYTES = 64 << 20
GROUP_UNITS = 1000
GROUP_SECONDS = 1.0


class CommitGroup:
    """Units committed together: one Arrow IPC stream per unit (`begin`, `add`, `end`), then `commit`:
    the data fsynced and renamed to G.arrow, the folder synced, then the marker G.json.  A unit whose
    records cannot be stored exactly (`add` spoils it) or whose reading failed (`drop`) is left out."""

    def __init__(self, units_dir: str):
        self.units_dir = units_dir
        self.name = uuid.uuid4().hex
        self.temp = os.path.join(units_dir, f"{_TEMP_PREFIX}{self.name}.arrow")
        self.entries: list[dict] = []
        self.started = time.monotonic()
        self.spoiled: str | None = None  # why the current unit is not committed
        self._fd: int | None = None
        self._size = 0
        self._unit: list | None = None
        self._file: _SegmentFile | None = None
        self._writer = None
        self._records = self._batches = 0

    def begin(self, description: list, content: str) -> None:
        """Start writing a unit; `content`: its input's digest (input_digest), taken before reading."""
        if self._fd is None:
            self._fd = create_exclusive(self.temp)
        self._unit, self._content, self.spoiled = description, content, None
        self._file = _SegmentFile(self._fd, self._size)
        self._writer = pa.ipc.new_stream(self._file, UNIT_SCHEMA)
        self._records = self._batches = 0

    def add(self, docs: list[Document], rejected: list[Rejected]) -> None:
        if self.spoiled is not None:
            return
        try:
            batch = unit_record_batch(docs, rejected)
        except NotCommittable as exc:
            self.spoiled = str(exc)
            return
        self._writer.write_batch(batch)
        self._records += batch.num_rows
        self._batches += 1

    def end(self) -> bool:
        """The current unit is done: True when it will be committed with the group."""
        self._writer.close()
        self._size += self._file.size
        if self.spoiled is None:
            self.entries.append({"unit": self._unit, "key": unit_key(self._unit), "offset": self._file.offset,
                                 "bytes": self._file.size, "sha256": self._file.sha256.hexdigest(),
                                 "records": self._records, "batches": self._batches, "content": self._content})
        self._unit = self._writer = self._file = None
        return self.spoiled is None

    def drop(self) -> None:
        """The current unit failed part-way: it is not committed (the units before it may be)."""
        if self._file is not None:
            self._size += self._file.size
        self._unit = self._writer = self._file = None

    def due(self) -> bool:
        return (self._size >= GROUP_BYTES or len(self.entries) >= GROUP_UNITS
                or time.monotonic() - self.started >= GROUP_SECONDS)

    def commit(self) -> int:
        """Make the finished units durable and mark them committed; how many were."""
        if not self.entries:
            self.abandon()
            return 0
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        data_name = f"{self.name}.arrow"
        os.replace(self.temp, os.path.join(self.units_dir, data_name))
        sync_dir(self.units_dir)
        marker = {"format": MARKER_FORMAT, "data": data_name, "units": self.entries}
        write_file_in_out(self.units_dir, f"{self.name}.json", json.dumps(marker, ensure_ascii=True) + "\n",
                          durable=True)
        return len(self.entries)

    def abandon(self) -> None:
        """Drop the group's data: nothing of it is committed."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        with contextlib.suppress(OSError):
            os.unlink(self.temp)


# --- reading committed units ----------------------------------------------------------------------

def _open_regular(path: str) -> int:
    """A file dsdata made in OUT, opened without following a link; OSError/UntrustedFileError else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UntrustedFileError(f"{path} is not a regular file")
    return fd


def _read_json(path: str, max_bytes: int, what: str) -> Any:
    """A regular JSON file in OUT of at most `max_bytes`; else OSError or UntrustedFileError."""
    with os.fdopen(_open_regular(path), "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UntrustedFileError(f"{what} is over {max_bytes} bytes")
    return loads_bounded(data, what)


def _entry_ok(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("unit"), list) and isinstance(entry.get("key"), str)
            and entry["key"] == unit_key(entry["unit"]) and isinstance(entry.get("sha256"), str)
            and isinstance(entry.get("content"), str)
            and all(type(entry.get(k)) is int and entry[k] >= 0 for k in ("offset", "bytes", "records", "batches")))


def read_marker(units_dir: str, name: str) -> dict:
    """G.json, checked: UntrustedFileError (one line) when it is not a marker dsdata writes."""
    path = os.path.join(units_dir, f"{name}.json")
    marker = _read_json(path, _MARKER_BYTES, f"commit marker {path}")
    if (not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT
            or marker.get("data") != f"{name}.arrow" or not isinstance(marker.get("units"), list)
            or not all(_entry_ok(entry) for entry in marker["units"])):
        raise UntrustedFileError(f"commit marker {path} is not one dsdata writes")
    return marker


@dataclass(frozen=True)
class CommittedUnit:
    """Where a committed unit's records are: the group's data file and the unit's marker entry."""

    data: str
    entry: dict


def committed_index(units_dir: str) -> dict[str, CommittedUnit]:
    """Every committed unit in the (tidied) units folder by its key."""
    index: dict[str, CommittedUnit] = {}
    with os.scandir(units_dir) as entries:
        names = sorted(e.name[:-5] for e in entries if e.name.endswith(".json"))
    for name in names:
        try:
            marker = read_marker(units_dir, name)
        except (OSError, UntrustedFileError):
            continue
        for entry in marker["units"]:
            index[entry["key"]] = CommittedUnit(os.path.join(units_dir, marker["data"]), entry)
    return index


class _Segment(io.RawIOBase):
    """A unit's bytes in its group's data file, read with pread (nothing outside them)."""

    def __init__(self, fd: int, offset: int, size: int):
        self.fd, self.pos, self.end = fd, offset, offset + size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.end - self.pos)
        if n <= 0:
            return 0
        data = os.pread(self.fd, n, self.pos)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def unit_problem(unit: CommittedUnit, description: list, content: str) -> str | None:
    """Why the committed unit cannot be reused for `description`, whose input now has the digest
    `content`; None when it can."""
    if unit.entry["unit"] != description:
        return f"its marker describes another unit ({unit.entry['unit']!r})"
    if unit.entry["content"] != content:
        return "its input's bytes changed since it was read (same size and modification time, other content)"
    try:
        fd = _open_regular(unit.data)
    except (OSError, UntrustedFileError) as exc:
        return f"{unit.data}: {exc}"
    digest, size = hashlib.sha256(), 0
    try:
        segment = _Segment(fd, unit.entry["offset"], unit.entry["bytes"])
        while chunk := segment.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size != unit.entry["bytes"] or digest.hexdigest() != unit.entry["sha256"]:
        return f"{unit.data} does not hold the data its marker names (size or sha256 differ)"
    return None


def read_unit(unit: CommittedUnit) -> Iterator[tuple[list[Document], list[Rejected]]]:
    """The committed unit's batches, (kept documents, rejections) each; CommittedUnitDamaged (one
    line) when the data, which matched its sha256, is not what dsdata writes."""
    entry = unit.entry
    what = f"committed unit {unit.data} (bytes {entry['offset']}+{entry['bytes']})"
    fd = _open_regular(unit.data)
    n_batches = n_records = 0
    try:
        reader = pa.ipc.open_stream(pa.PythonFile(_Segment(fd, entry["offset"], entry["bytes"]), mode="r"))
        if not reader.schema.equals(UNIT_SCHEMA, check_metadata=False):
            raise UntrustedFileError(f"{what}: unexpected columns")
        for batch in reader:
            batch.validate(full=True)
            n_batches += 1
            n_records += batch.num_rows
            yield _records(batch, what)
    except (pa.ArrowException, UntrustedFileError, UnicodeError, ValueError) as exc:
        raise CommittedUnitDamaged(f"{what} is damaged ({' '.join(str(exc).split())[:300]}); "
                                   "run again without --resume") from None
    finally:
        os.close(fd)
    if (n_batches, n_records) != (entry["batches"], entry["records"]):
        raise CommittedUnitDamaged(f"{what} holds {n_records} records in {n_batches} batches, its marker "
                                   f"{entry['records']} in {entry['batches']}; run again without --resume")


# --- the folder -----------------------------------------------------------------------------------

@dataclass
class CommittedWork:
    """The units folder of this run, and whether it resumes an earlier run's committed units."""

    units_dir: str
    resumed: bool
    committed: int = 0  # how many units the earlier run committed


def resume_folder(output: str) -> str:
    return os.path.join(output, RESUME_DIR)


def tidy_units(units_dir: str) -> int:
    """Tidy the units folder of a killed or failed run; how many units it holds committed.  Removed:
    temporary files, data without a marker, markers without data or unreadable, and whatever is not
    a regular file named as dsdata names them (a planted link: removed, never followed)."""
    data: set[str] = set()
    markers: set[str] = set()
    with os.scandir(units_dir) as entries:
        for entry in entries:
            stem, dot, ext = entry.name.rpartition(".")
            if (not entry.is_file(follow_symlinks=False) or not dot or ext not in ("arrow", "json")
                    or len(stem) != 32 or any(c not in "0123456789abcdef" for c in stem)):
                remove_entry(entry.path)
            elif ext == "arrow":
                data.add(stem)
            else:
                markers.add(stem)
    for name in data - markers:
        remove_entry(os.path.join(units_dir, f"{name}.arrow"))
    committed = 0
    for name in markers:
        try:
            units = len(read_marker(units_dir, name)["units"]) if name in data else None
        except (OSError, UntrustedFileError):
            units = None
        if units is None:
            for ext in ("json", "arrow"):
                remove_entry(os.path.join(units_dir, f"{name}.{ext}"))
        else:
            committed += units
    return committed


def _is_real_dir(path: str) -> bool:
    """A folder, not a link to one (OUT is untrusted: OUT/resume may be a planted link)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def read_fingerprint(output: str) -> dict | None:
    """OUT/resume/fingerprint.json, or None when there is none (or it is no fingerprint dsdata wrote)."""
    if not _is_real_dir(resume_folder(output)):
        return None
    path = os.path.join(resume_folder(output), FINGERPRINT_NAME)
    try:
        found = _read_json(path, _FINGERPRINT_BYTES, f"fingerprint {path}")
    except (OSError, UntrustedFileError):
        return None
    if not isinstance(found, dict) or found.get("format") != FINGERPRINT_FORMAT:
        return None
    return found


def start_fresh(output: str, fingerprint: dict) -> CommittedWork:
    """An empty OUT/resume/ holding this run's fingerprint (whatever was there is removed)."""
    os.makedirs(output, exist_ok=True)
    folder = fresh_dir(resume_folder(output))
    units = fresh_dir(os.path.join(folder, UNITS_DIR))
    write_file_in_out(folder, FINGERPRINT_NAME, json.dumps(fingerprint, ensure_ascii=True, sort_keys=True) + "\n",
                      durable=True)
    return CommittedWork(units, resumed=False)


def continue_committed(output: str, fingerprint: dict, recorded: dict) -> CommittedWork:
    """OUT's committed work, tidied; ResumeRefused when `recorded` is not this run's fingerprint."""
    difference = fingerprint_difference(recorded, fingerprint)
    if difference:
        raise ResumeRefused(f"cannot resume {output}: {difference}; its committed work is not this run's "
                            "(run without --resume to start again)")
    units = ensure_dir(os.path.join(ensure_dir(resume_folder(output)), UNITS_DIR))
    return CommittedWork(units, resumed=True, committed=tidy_units(units))


def remove_resume_folder(output: str) -> None:
    remove_entry(resume_folder(output))


def unfinished_units(output: str) -> int:
    """How many units an unfinished run left committed in OUT (0 when none, or no such folder)."""
    units = os.path.join(resume_folder(output), UNITS_DIR)
    if not (_is_real_dir(resume_folder(output)) and _is_real_dir(units)):
        return 0
    try:
        return len(committed_index(units))
    except OSError:
        return 0


# --- fingerprints ---------------------------------------------------------------------------------

# A folder named by a stage parameter (a model directory) is summed over at most this many files.
_MAX_FILES_FINGERPRINTED = 100_000


def path_fingerprint(path: str) -> str:
    """A digest of the relative names, sizes and mtimes of what a stage's path parameter names;
    "missing" when it does not exist, the path itself when remote."""
    if "://" in path:
        return f"remote:{path}"
    try:
        info = os.stat(path)
    except OSError:
        return "missing"
    listing: list[tuple[str, int, int]] = []
    if stat.S_ISDIR(info.st_mode):
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(root, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                listing.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
                if len(listing) >= _MAX_FILES_FINGERPRINTED:
                    break
    else:
        listing.append(("", info.st_size, info.st_mtime_ns))
    digest = hashlib.sha256(json.dumps(listing, ensure_ascii=True).encode("ascii")).hexdigest()
    return f"{len(listing)} files sha256:{digest[:32]}"


def fingerprint_difference(recorded: dict, current: dict) -> str | None:
    """What differs between OUT's fingerprint and this run's, as a phrase; None when nothing does."""
    if recorded.get("dsdata_version") != current.get("dsdata_version"):
        return (f"it was written by dsdata {recorded.get('dsdata_version')}, this is "
                f"{current.get('dsdata_version')}")
    old, new = recorded.get("recipe") or {}, current.get("recipe") or {}
    old_stages, new_stages = old.get("stages") or [], new.get("stages") or []
    old_names = [s.get("name") for s in old_stages if isinstance(s, dict)]
    new_names = [s.get("name") for s in new_stages]
    if old_names != new_names:
        return f"the recipe's stages changed ({' → '.join(map(str, old_names))} then, {' → '.join(new_names)} now)"
    for before, now in zip(old_stages, new_stages):
        old_params, new_params = before.get("params") or {}, now.get("params") or {}
        for key in sorted(set(old_params) | set(new_params)):
            if old_params.get(key) != new_params.get(key):
                return (f"the recipe changed: {now['name']}.{key} was {_short(old_params.get(key))}, "
                        f"is {_short(new_params.get(key))}")
    for key in sorted(set(old) | set(new)):
        if key != "stages" and old.get(key) != new.get(key):
            return f"the recipe changed: {key} was {_short(old.get(key))}, is {_short(new.get(key))}"
    old_files, new_files = recorded.get("stage_files") or {}, current.get("stage_files") or {}
    for key in sorted(set(old_files) | set(new_files)):
        if old_files.get(key) != new_files.get(key):
            return f"the files {key} names changed since (their sizes or modification times)"
    old_inputs, new_inputs = recorded.get("inputs") or {}, current.get("inputs") or {}
    if old_inputs != new_inputs:
        gone = sorted(set(old_inputs) - set(new_inputs))
        added = sorted(set(new_inputs) - set(old_inputs))
        changed = sorted(p for p in set(old_inputs) & set(new_inputs) if old_inputs[p] != new_inputs[p])
        parts = [f"{len(items)} {what} ({', '.join(os.path.basename(p) for p in items[:3])}"
                 f"{', …' if len(items) > 3 else ''})"
                 for items, what in ((changed, "changed in size or modification time"), (added, "new"),
                                     (gone, "gone")) if items]
        return "the input files changed: " + "; ".join(parts)
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
