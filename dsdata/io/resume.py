"""OUT/resume/: the committed work of a run, which `dsdata run --resume` reuses after the run was
killed or failed.  No Beam here: the Beam side (which steps are committed, the DoFn that commits
and reuses units) is dsdata/beam/resume.py.

    OUT/resume/fingerprint.json     the recipe as run, the files its committed stages read, the inputs
    OUT/resume/units/KEY.arrow      one unit's records after the committed stages (Arrow IPC stream)
    OUT/resume/units/KEY.json       the unit's commit marker: what the unit is, the data's size and sha256

A *unit* is what one worker reads at once: an input file, or a byte range of a JSON Lines file / a
run of row groups of a Parquet file when the runner spreads ranges (dsdata/io/readers/ranges.py).
KEY is a digest of the unit's description.  A unit's data is written as the unit is read, then made
durable (fsync), renamed into place and the directory synced; only then is its marker written the
same way.  Data without a marker (the run died inside the unit), a temporary file, a marker without
data, and anything in the folder that is not a regular file dsdata made are removed before a resumed
run starts; a marker whose data does not have the size and sha256 it names is not reused.

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
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.io.outfiles import create_exclusive, ensure_dir, fresh_dir, remove_entry, sync_dir, write_file_in_out
from dsdata.io.untrusted_files import UntrustedFileError, loads_bounded

RESUME_DIR = "resume"
UNITS_DIR = "units"
FINGERPRINT_NAME = "fingerprint.json"
FINGERPRINT_FORMAT = "dsdata-resume-1"
MARKER_FORMAT = "dsdata-unit-1"
# `dsdata run --resume` refused (the committed work is another recipe's or other inputs'): its own
# status, so that a script can tell "start again without --resume" from a run that failed.
RESUME_REFUSED_EXIT = 3
# Metadata nests as deep as the readers let JSON nest (100 levels) plus the record around it.
_VALUE_DEPTH = 128
_MARKER_BYTES = 1 << 16
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


# --- writing a unit -------------------------------------------------------------------------------

class _HashingFile(io.RawIOBase):
    """A file descriptor written whole, every byte hashed (the marker names the data's sha256)."""

    def __init__(self, fd: int):
        self.fd, self.sha256, self.size = fd, hashlib.sha256(), 0

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


class UnitWriter:
    """One unit's records written as they come (`add`), then committed (`commit`): data fsynced,
    renamed to KEY.arrow, the folder synced, then the marker KEY.json written the same way.  A unit
    whose records cannot be stored exactly is `spoiled`: nothing more is written and it is not
    committed (the run goes on; a resumed run processes that unit again)."""

    def __init__(self, units_dir: str, description: list):
        self.units_dir, self.description = units_dir, description
        self.key = unit_key(description)
        self.temp = os.path.join(units_dir, f"{_TEMP_PREFIX}{uuid.uuid4().hex}.arrow")
        self.spoiled: str | None = None
        self.records = self.batches = 0
        self._fd: int | None = None
        self._file: _HashingFile | None = None
        self._writer = None

    def add(self, docs: list[Document], rejected: list[Rejected]) -> None:
        if self.spoiled is not None:
            return
        try:
            batch = unit_record_batch(docs, rejected)
        except NotCommittable as exc:
            self.spoiled = str(exc)
            self.abandon()
            return
        if self._writer is None:
            self._open()
        self._writer.write_batch(batch)
        self.records += batch.num_rows
        self.batches += 1

    def _open(self) -> None:
        self._fd = create_exclusive(self.temp)
        self._file = _HashingFile(self._fd)
        self._writer = pa.ipc.new_stream(self._file, UNIT_SCHEMA)

    def commit(self) -> bool:
        """Make the unit durable and mark it committed; False when it was spoiled."""
        if self.spoiled is not None:
            return False
        if self._writer is None:  # a unit with no record (an empty file) is committed all the same
            self._open()
        self._writer.close()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        data_name = f"{self.key}.arrow"
        os.replace(self.temp, os.path.join(self.units_dir, data_name))
        sync_dir(self.units_dir)
        marker = {"format": MARKER_FORMAT, "unit": self.description, "data": data_name, "bytes": self._file.size,
                  "sha256": self._file.sha256.hexdigest(), "records": self.records, "batches": self.batches}
        write_file_in_out(self.units_dir, f"{self.key}.json", json.dumps(marker, ensure_ascii=True) + "\n",
                          durable=True)
        return True

    def abandon(self) -> None:
        """Drop what was written (a spoiled unit, or one whose reading failed)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        self._writer = None
        with contextlib.suppress(OSError):
            os.unlink(self.temp)


# --- reading a committed unit ---------------------------------------------------------------------

def _open_regular(path: str) -> int:
    """A file dsdata made in OUT, opened without following a link; OSError/UntrustedFileError else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UntrustedFileError(f"{path} is not a regular file")
    return fd


def read_marker(units_dir: str, key: str) -> dict:
    """KEY.json, checked: UntrustedFileError (one line) when it is not a marker dsdata writes."""
    path = os.path.join(units_dir, f"{key}.json")
    fd = _open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_MARKER_BYTES + 1)
    if len(data) > _MARKER_BYTES:
        raise UntrustedFileError(f"commit marker {path} is over {_MARKER_BYTES} bytes")
    marker = loads_bounded(data, f"commit marker {path}")
    if (not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT
            or marker.get("data") != f"{key}.arrow" or not isinstance(marker.get("unit"), list)
            or not all(type(marker.get(k)) is int and marker[k] >= 0 for k in ("bytes", "records", "batches"))
            or not isinstance(marker.get("sha256"), str)):
        raise UntrustedFileError(f"commit marker {path} is not one dsdata writes")
    return marker


def unit_problem(units_dir: str, key: str, description: list) -> tuple[dict | None, str | None]:
    """(the marker, None) when unit `key` is committed for `description` and its data has the size
    and sha256 the marker names; (None, why) otherwise."""
    try:
        marker = read_marker(units_dir, key)
    except FileNotFoundError:
        return None, "no commit marker"
    except (OSError, UntrustedFileError) as exc:
        return None, str(exc)
    if marker["unit"] != description:
        return None, f"its marker describes another unit ({marker['unit']!r})"
    path = os.path.join(units_dir, marker["data"])
    try:
        fd = _open_regular(path)
    except (OSError, UntrustedFileError) as exc:
        return None, f"{path}: {exc}"
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    if size != marker["bytes"] or digest.hexdigest() != marker["sha256"]:
        return None, f"{path} is not the data its marker names (size or sha256 differ)"
    return marker, None


def read_unit(units_dir: str, marker: dict) -> Iterator[tuple[list[Document], list[Rejected]]]:
    """The committed unit's batches, (kept documents, rejections) each, as they were written.
    CommittedUnitDamaged (one line) when the data, which matched its sha256, is not what dsdata
    writes (a file crafted with a matching marker)."""
    path = os.path.join(units_dir, marker["data"])
    what = f"committed unit {path}"
    fd = _open_regular(path)
    n_batches = n_records = 0
    with os.fdopen(fd, "rb") as fh:
        try:
            reader = pa.ipc.open_stream(fh)
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
    if (n_batches, n_records) != (marker["batches"], marker["records"]):
        raise CommittedUnitDamaged(f"{what} holds {n_records} records in {n_batches} batches, its marker "
                                   f"{marker['records']} in {marker['batches']}; run again without --resume")


# --- the folder -----------------------------------------------------------------------------------

@dataclass
class CommittedWork:
    """What `open_resume_folder` found and set up: the units folder, the keys of the committed units
    (a resumed run reuses those its plan reads), whether a resume found work to continue."""

    units_dir: str
    committed: frozenset[str]
    resumed: bool


def resume_folder(output: str) -> str:
    return os.path.join(output, RESUME_DIR)


def committed_units(units_dir: str) -> frozenset[str]:
    """Tidy the units folder of a killed or failed run and return the keys of its committed units:
    temporary files, data without a marker, markers without data or unreadable, and whatever is
    not a regular file (a planted link: removed, never followed) are removed."""
    data: set[str] = set()
    markers: set[str] = set()
    with os.scandir(units_dir) as entries:
        for entry in entries:
            stem, dot, ext = entry.name.rpartition(".")
            if (not entry.is_file(follow_symlinks=False) or entry.name.startswith(_TEMP_PREFIX)
                    or not dot or ext not in ("arrow", "json") or len(stem) != 32
                    or any(c not in "0123456789abcdef" for c in stem)):
                remove_entry(entry.path)
            elif ext == "arrow":
                data.add(stem)
            else:
                markers.add(stem)
    for key in data - markers:
        remove_entry(os.path.join(units_dir, f"{key}.arrow"))
    committed = set()
    for key in markers:
        try:
            read_marker(units_dir, key)
            readable = True
        except (OSError, UntrustedFileError):
            readable = False
        if readable and key in data:
            committed.add(key)
        else:
            for ext in ("json", "arrow"):
                remove_entry(os.path.join(units_dir, f"{key}.{ext}"))
    return frozenset(committed)


def read_fingerprint(output: str) -> dict | None:
    """OUT/resume/fingerprint.json, or None when there is none (or it is no fingerprint dsdata wrote)."""
    path = os.path.join(resume_folder(output), FINGERPRINT_NAME)
    try:
        fd = _open_regular(path)
    except (OSError, UntrustedFileError):
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_FINGERPRINT_BYTES + 1)
    if len(data) > _FINGERPRINT_BYTES:
        return None
    try:
        found = loads_bounded(data, f"fingerprint {path}")
    except UntrustedFileError:
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
    return CommittedWork(units, frozenset(), resumed=False)


def continue_committed(output: str, fingerprint: dict, recorded: dict) -> CommittedWork:
    """The committed work of OUT for a resumed run: ResumeRefused when `recorded` (OUT's fingerprint)
    is not this run's; else the folder tidied (committed_units)."""
    difference = fingerprint_difference(recorded, fingerprint)
    if difference:
        raise ResumeRefused(f"cannot resume {output}: {difference}; its committed work is not this run's "
                            "(run without --resume to start again)")
    units = ensure_dir(os.path.join(ensure_dir(resume_folder(output)), UNITS_DIR))
    return CommittedWork(units, committed_units(units), resumed=True)


def remove_resume_folder(output: str) -> None:
    remove_entry(resume_folder(output))


def unfinished_units(output: str) -> int:
    """How many units an unfinished run left committed in OUT (0 when none, or no such folder)."""
    units = os.path.join(resume_folder(output), UNITS_DIR)
    try:
        if not stat.S_ISDIR(os.lstat(units).st_mode):
            return 0
        with os.scandir(units) as entries:
            return sum(1 for e in entries if e.name.endswith(".json") and e.is_file(follow_symlinks=False))
    except OSError:
        return 0


# --- fingerprints ---------------------------------------------------------------------------------

# A folder named by a stage parameter (a model directory) is summed over at most this many files.
_MAX_FILES_FINGERPRINTED = 100_000


def path_fingerprint(path: str) -> str:
    """What a stage's file or folder parameter names, as a digest of its files' relative names, sizes
    and modification times (ns); "missing" when it does not exist, the path itself when remote."""
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
