"""Generic Beam wrappers around the stage contract (kept/rejected outputs, counters per stage and
reason, CPU time, the `error` rule of dsdata/beam/errors.py), and the reader."""
from __future__ import annotations

import glob
import logging
import os
import pickle
import re
from dataclasses import dataclass
from time import perf_counter, thread_time
from typing import Any, Iterator

import apache_beam as beam
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dsdata.beam.engines import speedups
from dsdata.beam.errors import (StageResultError, annotation_checks, checked_result, copy_document, environment_failure,
                                error_rejection, is_environment_error, passes_through,
                                retry_one_at_a_time)
from dsdata.document import Document, Rejected
from dsdata.io import local_paths
from dsdata.core.names import shown_path
from dsdata.io.readers import READ_STAGE, READERS, InputFormatError, cuttable_format, range_bytes_for, read_file
from dsdata.beam.counters import StageCounter
from dsdata.stages.base import BatchStage, DocumentStage, Stage

log = logging.getLogger("dsdata")
speedups.install()  # here: every launcher and worker that runs dsdata's DoFns imports this module

KEPT = "kept"
REJECTED = "rejected"
# The ledger entries a unit reader (ReadDocuments' unit_reader) emits per unit: ("count", key, n)
# and ("resume", "reused" | "processed", (units, records)).
UNIT_LEDGER = "ledger"


# Per-stage CPU time: thread-local CPU seconds (a library's own threads are not seen), added to this
# counter in microseconds once per bundle.
CPU_COUNTER = "cpu_us"
# thread_time() is a system call: elements costing more than _EXACT_ABOVE_S on average are all
# timed, cheaper ones one in _SAMPLE_STRIDE (each timed one stands for the untimed ones before it).
_EXACT_ABOVE_S = 100e-6
_SAMPLE_STRIDE = 16
# An untimed element whose wall time passes this counts by that wall time (a regex stuck for
# minutes between two samples must not vanish from the stage's CPU seconds).
_OUTLIER_S = 10e-3
# Declares a DoFn's main output type Any, sparing Beam's bytecode inference at graph build.  Not for
# DoFns feeding a GroupByKey with tuples, whose inferred Tuple gives the key its coder.
ANY_OUTPUT = beam.typehints.with_output_types(Any)
# Without batch_docs the reader reads this many records at a time, then hands them on one by one.
_READ_CHUNK = 256
# Errors logged (with the document id) per DoFn instance; the rejected rows hold them all.
_LOGGED_ERRORS = 5


class StageCounters:
    """Per-stage Metrics (documents in, kept, rejected per reason), the stage's CPU time, and the
    per-record error rule of dsdata/beam/errors.py for the DoFns that run a stage."""

    def _init_counters(self, stage_name: str) -> None:
        self._stage_name = stage_name
        self._ns = f"dsdata.{stage_name}"
        self._in = StageCounter(self._ns, "in")
        self._kept = StageCounter(self._ns, "kept")
        self._reasons: dict[str, Any] = {}
        self._cpu_counter = Metrics.counter(self._ns, CPU_COUNTER)
        self._cpu = 0.0
        self._untimed = 0  # elements since the last timed one, that one included
        self._wall_start = 0.0
        self._stride = 1
        self._timed_n = 0
        self._timed_s = 0.0
        self._errors_logged = 0

    def _clock_start(self) -> float | None:
        """thread_time() when this element is to be timed, else None."""
        self._untimed += 1
        self._wall_start = perf_counter()
        return thread_time() if self._untimed >= self._stride else None

    def _clock_stop(self, start: float | None) -> None:
        if start is None:
            wall = perf_counter() - self._wall_start
            if wall > _OUTLIER_S:
                self._cpu += wall
                self._untimed -= 1  # counted itself, not through the next sample
            return
        seconds = thread_time() - start
        self._cpu += seconds * self._untimed
        self._untimed = 0
        self._timed_n += 1
        self._timed_s += seconds
        self._stride = 1 if self._timed_s > _EXACT_ABOVE_S * self._timed_n else _SAMPLE_STRIDE

    def _route(self, result: Document | Rejected):
        if self._counted_rejected(result):
            return beam.pvalue.TaggedOutput(REJECTED, result)
        return result

    def _counted_rejected(self, result: Document | Rejected) -> bool:
        """Count `result` as kept or rejected (per reason); True when it is a rejection."""
        if isinstance(result, Rejected):
            self._count_rejection(result)
            return True
        self._kept.inc()
        return False

    def _collect(self, results, rejected: list[Rejected]) -> list[Document]:
        """The kept ones of `results`, counted; each rejection counted and appended to `rejected`."""
        kept: list[Document] = []
        for result in results:
            if isinstance(result, Rejected):
                self._count_rejection(result)
                rejected.append(result)
            else:
                kept.append(result)
        if kept:
            self._kept.inc(len(kept))
        return kept

    def _count_rejection(self, result: Rejected) -> None:
        counter = self._reasons.get(result.reason)
        if counter is None:
            counter = self._reasons[result.reason] = StageCounter(self._ns, f"rejected.{result.reason}")
        counter.inc()

    def _error(self, doc: Document, exc: BaseException, declared: tuple[type[BaseException], ...] = ()) -> Rejected:
        """`doc` rejected with reason `error` (or StageEnvironmentError raised for an environment error)."""
        return self._failed(error_rejection(doc, self._stage_name, exc, declared))

    def _failed(self, rejected: Rejected) -> Rejected:
        if self._errors_logged < _LOGGED_ERRORS:
            self._errors_logged += 1
            log.info("stage %r: document %r rejected (%s)", self._stage_name, rejected.doc.id, rejected.detail)
        return rejected

    def _setup_stage(self, stage: Stage) -> None:
        try:
            stage.setup()
        except BaseException as exc:  # noqa: BLE001 - whatever setup() raises (sys.exit() too), no record can be blamed
            if passes_through(exc):
                raise
            raise environment_failure(stage.name, exc, " cannot start") from exc

    def finish_bundle(self):
        if self._untimed and self._timed_n:  # the elements after the last timed one, at the mean cost
            self._cpu += self._untimed * self._timed_s / self._timed_n
        self._untimed = 0
        if self._cpu:
            self._cpu_counter.inc(round(self._cpu * 1e6))
            self._cpu = 0.0


class StageStepDoFn(StageCounters, beam.DoFn):
    """A DoFn of one stage's composite: the stage set up on the worker, with its counters and clock."""

    def __init__(self, stage: Stage, spill_dir: str | None = None):
        self.stage, self.spill_dir = stage, spill_dir

    def setup(self):
        self._init_counters(self.stage.name)
        self._setup_stage(self.stage)


class _StageRun(StageCounters):
    """One stage inside a DoFn, set up: its own counters, CPU clock and error rule."""

    def __init__(self, stage: Stage):
        self.stage = stage
        self._declared = stage.environment_errors
        self._checks = annotation_checks(stage.annotations)
        self._init_counters(stage.name)
        self._setup_stage(stage)


class _DocumentStageRun(_StageRun):
    """One per-document stage inside a StageDoFn."""

    def run(self, doc: Document) -> Document | Rejected:
        """The stage's result for `doc`, counted and timed."""
        self._in.inc()
        start = self._clock_start()
        result = self._result(doc)
        self._clock_stop(start)
        return result

    def _result(self, doc: Document) -> Document | Rejected:
        """The stage's result for `doc`; what it raises rejects `doc` (reason `error`)."""
        try:
            return checked_result(self._stage_name, self.stage.process(doc), self._checks)
        except BaseException as exc:  # noqa: BLE001 - one record's exception rejects that record only
            if passes_through(exc):  # a stop, not the record's fault; a native panic is
                raise
            return self._error(doc, exc, self._declared)


class StageDoFn(beam.DoFn):
    """Runs consecutive per-document stages (`process(doc)`) in one step until one rejects the
    document (tagged output); each stage keeps its own counters, CPU time and error rule."""

    def __init__(self, stages: DocumentStage | list[DocumentStage]):
        self.stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]

    def setup(self):
        self._runs = [_DocumentStageRun(stage) for stage in self.stages]

    def process(self, doc: Document):
        result = doc
        for run in self._runs:
            result = run.run(result)
            if run._counted_rejected(result):
                yield beam.pvalue.TaggedOutput(REJECTED, result)
                return
        yield result

    def finish_bundle(self):
        for run in self._runs:
            run.finish_bundle()


class _BatchStageRun(_StageRun):
    """One batched stage (`process_batch(docs)`); a batch that raises is run again one document at a time."""

    def _checked(self, docs: list[Document]) -> list[Document | Rejected]:
        """process_batch(docs); a result list of the wrong kind or length fails the batch, a malformed
        result for one document rejects that document."""
        results = self.stage.process_batch(docs)
        if not isinstance(results, (list, tuple)) or len(results) != len(docs):
            got = f"{len(results)} results" if isinstance(results, (list, tuple)) else type(results).__name__
            raise StageResultError(f"stage '{self.stage.name}' returned {got} for a batch of {len(docs)}: "
                                   "process_batch must return a list of one Document or Rejected per input")
        out = []
        for doc, result in zip(docs, results):
            try:
                out.append(checked_result(self.stage.name, result, self._checks))
            except StageResultError as exc:
                out.append(self._error(doc, exc))
        return out

    def run(self, docs: list[Document]) -> list[Document | Rejected]:
        self._in.inc(len(docs))
        start = self._clock_start()
        # fresh: a retry after a failed batch starts from the documents as they were before it
        # (process_batch may have changed them in place before it raised).
        results = retry_one_at_a_time(self.stage.name, docs, self._checked,
                                      lambda doc, exc: self._error(doc, exc, self._declared), self._declared,
                                      fresh=copy_document)
        self._clock_stop(start)
        return results

    def run_batch(self, docs: list[Document], rejected: list[Rejected]) -> list[Document]:
        """The kept ones of `docs` (in chunks of the stage's batch_max); rejections appended to `rejected`."""
        size = max(1, int(self.stage.batch_max))
        return self._collect((result for i in range(0, len(docs), size) for result in self.run(docs[i:i + size])),
                             rejected)


class BatchStageDoFn(beam.DoFn):
    """Runs a model stage (`process_batch(docs)`) over batches made by BatchElements (_BatchStageRun)."""

    def __init__(self, stage: BatchStage):
        self.stage = stage

    def setup(self):
        self._run = _BatchStageRun(self.stage)

    def process(self, batch: list[Document]):
        run = self._run
        for result in run.run(list(batch)):
            yield run._route(result)

    def finish_bundle(self):
        self._run.finish_bundle()


def full_batches(size: int) -> beam.BatchElements:
    """Batches of `size` elements (a bundle's last one smaller).  Not Beam's adaptive sizing between a
    minimum and a maximum: that fits a regression per batch (two np.polyfit calls, ~0.5 CPU-s over
    pretrain.yaml at 20k documents), and a batch run gains nothing from smaller batches."""
    return beam.BatchElements(min_batch_size=size, max_batch_size=size)


# Between the reader and the writers, documents travel as Batches of up to BATCH_DOCS records (or
# BATCH_CHARS characters of text) where the recipe allows: one runner element per batch.
BATCH_DOCS = 1000
BATCH_CHARS = 16 << 20


@dataclass
class Batch:
    """Documents read together and still kept, with their records' rejections so far: both are
    written from it, so the rejected rows need no Flatten."""

    docs: list[Document]
    rejected: list[Rejected]


class BatchCoder(beam.coders.Coder):
    """How a runner ships a Batch (pickle) and guesses its size from the texts' lengths (encoding
    whole batches for Beam's size counters is costly)."""

    def encode(self, batch: Batch) -> bytes:
        return pickle.dumps((batch.docs, batch.rejected), pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> Batch:
        docs, rejected = pickle.loads(encoded)  # a runner's own buffer, never a file
        return Batch(docs, rejected)

    def estimate_size(self, batch: Batch) -> int:
        return 64 + sum(len(d.text) + 32 for d in batch.docs) + sum(len(r.doc.text) + 64 for r in batch.rejected)

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return Batch


beam.coders.registry.register_coder(Batch, BatchCoder)


class _DocumentStageBatchRun(_DocumentStageRun):
    def run_batch(self, docs: list[Document], rejected: list[Rejected]) -> list[Document]:
        """The kept ones of `docs`, rejections appended to `rejected`; counters and clock once per batch."""
        self._in.inc(len(docs))
        start = thread_time()
        results = [self._result(doc) for doc in docs]
        self._cpu += thread_time() - start
        return self._collect(results, rejected)


class BatchChainDoFn(beam.DoFn):
    """Runs consecutive `batchable` stages (dsdata/beam/kinds.py) over Batches (run_batch_chain);
    counters, CPU time and the error rule are each stage's own."""

    def __init__(self, stages: list[Stage]):
        self.stages = list(stages)

    def setup(self):
        self._runs = [batchable_run(s) for s in self.stages]

    def process(self, batch: Batch):
        out = run_batch_chain(self._runs, batch)
        if out is not None:
            yield out

    def finish_bundle(self):
        for run in self._runs:
            run.finish_bundle()


def batchable_run(stage: Stage) -> "_BatchStageRun | _DocumentStageBatchRun":
    """A per-document or batched stage's run on Batches: `run_batch(docs, rejected)`, `finish_bundle()`."""
    return _BatchStageRun(stage) if isinstance(stage, BatchStage) else _DocumentStageBatchRun(stage)


def run_batch_chain(runs: list, batch: Batch) -> Batch | None:
    """`batch` through stage runs in turn (each `run_batch(docs, rejected)` takes the documents the
    ones before it kept and adds its rejections to the batch's); None when nothing is left."""
    docs, rejected = batch.docs, list(batch.rejected)
    for run in runs:
        if not docs:
            break
        docs = run.run_batch(docs, rejected)
    return Batch(docs, rejected) if docs or rejected else None


class Unbatch(beam.DoFn):
    """Batches → documents (main output) and their rejections (tagged), for composite stages."""

    def process(self, batch: Batch):
        yield from batch.docs
        for rejected in batch.rejected:
            yield beam.pvalue.TaggedOutput(REJECTED, rejected)


class ReadFileDoFn(StageCounters, beam.DoFn):
    """Reads one matched file into Documents; unreadable parts become rejections (never skipped).
    A reader raising part-way keeps its records; the rest of the file is one `error` row."""

    def __init__(self, fmt: str = "auto", text_field: str = "text", id_field: str = "id",
                 batch_docs: int | None = None):
        self.fmt, self.text_field, self.id_field = fmt, text_field, id_field
        self.batch_docs = batch_docs

    def setup(self):
        self._init_counters(READ_STAGE)

    def process(self, element: FileMetadata | FileRange):
        """Each record (kept on the main output, a rejection tagged), or with batch_docs Batches of up
        to batch_docs records / BATCH_CHARS characters (main output only)."""
        if not self.batch_docs:
            for chunk in self._chunks(element, _READ_CHUNK):
                for result in chunk:
                    yield self._route(result)
            return
        for chunk in self._chunks(element, self.batch_docs):
            yield self._batch(chunk)

    def _batch(self, results: list[Document | Rejected]) -> Batch:
        rejected: list[Rejected] = []
        return Batch(self._collect(results, rejected), rejected)

    def _chunks(self, element: FileMetadata | FileRange, size: int) -> Iterator[list[Document | Rejected]]:
        """The file's (or range's) records in lists of up to `size` records or BATCH_CHARS characters,
        counted as read.  Timed a list at a time: no yield while one fills (a yield runs the fused
        stages downstream)."""
        real = element.path
        # Ids, rows and logs name the file as shown_path writes it; it is opened by its real name.
        path = shown_path(real)
        part = element if isinstance(element, FileRange) else None
        try:
            fh = open_input(real)
            if part is not None:  # the format's own range reader (dsdata/io/readers REGISTRY)
                try:
                    records = iter(READERS[part.fmt].read_range(path, fh, part.start, part.end, part.first_line,
                                                                self.text_field, self.id_field))
                except BaseException:
                    fh.close()
                    raise
        except Exception as exc:  # noqa: BLE001 - any filesystem error means this file is unreadable
            if is_environment_error(exc):  # ... unless every file would fail alike (an endpoint gone)
                raise environment_failure(READ_STAGE, exc) from exc
            yield [Rejected(Document(path, "", {"source": path}), READ_STAGE, "unreadable_file",
                            unreadable_reason(exc))]
            return
        n = bad = 0
        size = max(1, int(size))
        with fh:
            if part is None:
                records = iter(read_file(path, fh, self.fmt, self.text_field, self.id_field))
            done = False
            while not done:
                chunk: list[Document | Rejected] = []
                chars = 0
                start = self._clock_start()
                try:
                    for result in records:
                        chunk.append(result)
                        if isinstance(result, Rejected):
                            bad += 1
                        else:
                            chars += len(result.text)
                        if len(chunk) >= size or chars >= BATCH_CHARS:
                            break
                    else:
                        done = True
                except InputFormatError:
                    raise  # the recipe names a format this file is not in: a user error, one line
                except BaseException as exc:  # noqa: BLE001 - the reader broke on this file's content
                    if passes_through(exc):  # a stop, not the record's fault; a native panic is
                        raise
                    bad += 1
                    chunk.append(self._error(_rest_of_file(path, n + len(chunk) + 1, fh, part), exc))
                    done = True
                self._clock_stop(start)
                if chunk:
                    n += len(chunk)
                    self._in.inc(len(chunk))
                    yield chunk
        # One line per input file; a file cut into ranges logs each at DEBUG, its last at INFO.
        if part is None:
            log.info("read %s: %d records (%d rejected by the reader)", path, n, bad)
        else:
            unit = "bytes" if part.fmt == "jsonl" else "row groups"
            last = part.end is None
            log.log(logging.INFO if last else logging.DEBUG,
                    "read %s, %srange (%s %d-%s): %d records (%d rejected by the reader)",
                    path, "last " if last else "", unit, part.start, "end" if last else part.end, n, bad)

    def _error(self, doc: Document, exc: BaseException, declared=()) -> Rejected:
        rejected = super()._error(doc, exc, declared)
        offset = doc.metadata.get("offset")
        where = f" at byte {offset}" if offset is not None else ""
        rejected.detail = f"{rejected.detail}; the rest of the file{where} is unread"
        return rejected


def _rest_of_file(path: str, n: int, fh, part: FileRange | None = None) -> Document:
    """The stand-in record for the part of a file (or of a range of it) a reader could not get through."""
    metadata: dict[str, Any] = {"source": path}
    try:
        metadata["offset"] = int(fh.tell())
    except Exception:  # noqa: BLE001 - not every stream knows its position
        pass
    where = "" if part is None else f"@{part.start}"  # a range's: after its n-th record
    return Document(f"{path}:after{n - 1}{where}", "", metadata)


@dataclass(frozen=True)
class FileRange:
    """A part of a file one worker reads, as its format's `ranges` cut it: for "jsonl" bytes start to
    end (None: the file's end) after first_line lines; for "parquet" row groups start to end - 1."""

    path: str
    start: int
    end: int | None
    first_line: int
    fmt: str = "jsonl"


class PlanRanges(beam.DoFn):
    """Matched files → what the workers read: a big plain JSON Lines or Parquet file as FileRanges,
    any other file (or one that cannot be cut) whole."""

    def __init__(self, fmt: str = "auto", range_bytes: int | None = None):
        self.fmt, self.range_bytes = fmt, range_bytes

    def process(self, metadata: FileMetadata):
        path, size = metadata.path, metadata.size_in_bytes
        range_bytes = self.range_bytes or range_bytes_for(size)
        kind = cuttable_format(path, self.fmt)
        ranges = None
        if size > range_bytes and kind is not None:
            try:
                with open_input(path) as fh:
                    ranges = READERS[kind].ranges(fh, range_bytes)
            except Exception as exc:  # noqa: BLE001 - the reader then meets the same problem and reports it
                log.info("read %s: not cut into ranges (%s: %s); read whole", path, type(exc).__name__, exc)
        if ranges is None:
            yield metadata
            return
        for start, end, first in ranges:
            yield FileRange(path, start, end, first, kind)


def all_cuttable(patterns: list[str], fmt: str = "auto", range_bytes: int | None = None) -> bool:
    """Whether every file the patterns match is small or cuttable by PlanRanges; False when they
    cannot be listed here (the launcher may not see a worker's file system)."""
    try:
        from dsdata.beam.location import ObjectSizes

        objects = ObjectSizes()
        matched = [matched_files(p, objects) for p in patterns]
    except Exception:  # noqa: BLE001 - unknown: take the way that works for every file
        return False
    for found in matched:
        for metadata in found:
            size = metadata.size_in_bytes
            if size > (range_bytes or range_bytes_for(size)) and cuttable_format(metadata.path, fmt) is None:
                return False
    return True


def open_input(path: str):
    """An input file opened for reading, raw bytes; local ones through dsdata/io/local_paths.py (Beam's
    local open takes no path over PATH_MAX)."""
    if "://" in path:
        if path.startswith("s3://"):  # on a worker: an endpoint gone mid-run fails fast, in one line
            from dsdata.beam.location import bound_s3_requests

            bound_s3_requests()
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return local_paths.open_binary(path)


def unreadable_reason(exc: Exception) -> str:
    """Why a file could not be opened, for its `unreadable_file` row: the system's reason without
    the path (the row's id names the file; str(OSError) quotes the name's repr)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}" if exc.errno else exc.strerror
    return " ".join(str(exc).encode("utf-8", "backslashreplace").decode("utf-8").split())


class MatchPatterns(beam.DoFn):
    """An input pattern (bytes) → the files it matches.  A named file that does not match (gone, or
    unstattable) still goes on, so that it becomes an `unreadable_file` row, never silently absent."""

    def setup(self):
        from dsdata.beam.location import ObjectSizes, bound_s3_requests

        bound_s3_requests()
        self._objects = ObjectSizes()

    def process(self, pattern: bytes):
        text = os.fsdecode(pattern)
        try:
            found = matched_files(text, self._objects)
        except Exception as exc:  # noqa: BLE001 - an unmatchable name: the reader's open says why
            if is_environment_error(exc):  # an endpoint gone: no pattern can be listed
                raise environment_failure(READ_STAGE, exc) from exc
            log.debug("match %s: %s", shown_path(text), exc)
            found = []
        name = named_file(text)
        if found or name is None:
            yield from found
            return
        size = 0
        if "://" not in name:
            try:
                size = local_paths.path_stat(name).st_size
            except OSError:
                pass
        yield FileMetadata(name, size)


def matched_files(pattern: str, objects) -> list[FileMetadata]:
    """The files an input pattern names: local through Beam's FileSystems; a remote named file from
    `objects` (location.ObjectSizes: one listing per folder); any other remote pattern listed anew."""
    if "://" not in pattern:
        return FileSystems.match([pattern])[0].metadata_list
    from dsdata.beam.location import list_objects

    name = named_file(pattern)
    if name is None:
        return list_objects(pattern)
    found = objects.metadata(name)
    return [found] if found is not None else []


def named_file(pattern: str) -> str | None:
    """The one file `pattern` names, or None for a pattern that may match several: a path without
    wildcards, or one glob.escape made of a listed file's name (its `[`, `*` and `?` bracketed)."""
    if not glob.has_magic(pattern):
        return pattern
    name = re.sub(r"\[([*?[])\]", r"\1", pattern)
    return name if glob.escape(name) == pattern else None


class ReadFirstDoFn(ReadFileDoFn):
    """Reads the first `limit` records of all matched files (one element: their list), in path order."""

    def __init__(self, limit: int, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit = limit

    def process(self, files):
        left = self.limit
        seen: set[str] = set()
        for meta in sorted(files, key=lambda m: m.path):
            if left <= 0:
                return
            if meta.path in seen:  # two patterns matching one file
                continue
            seen.add(meta.path)
            for chunk in self._chunks(meta, self.batch_docs or _READ_CHUNK):
                chunk = chunk[:left]
                left -= len(chunk)
                if self.batch_docs:
                    yield self._batch(chunk)
                else:
                    for result in chunk:
                        yield self._route(result)
                if left <= 0:
                    break


class ReadDocuments(beam.PTransform):
    """File patterns (local, gs://, s3://, …) → {"kept": docs, "rejected": unreadable records}.

    spread_documents (several workers): big files are cut into ranges (PlanRanges) when all_cuttable,
    otherwise the documents are reshuffled after reading.  batch_docs: "kept" holds Batches, the
    reader's rejections in them.  spread_files: the matched files are reshuffled across workers.
    unit_reader: a ReadFileDoFn that commits each file or range itself (resume.CommitUnitsDoFn); the
    result then has UNIT_LEDGER instead of REJECTED, and its documents are never reshuffled."""

    def __init__(self, patterns: list[str], fmt: str = "auto", text_field: str = "text", id_field: str = "id",
                 spread_documents: bool = False, range_bytes: int | None = None, batch_docs: int | None = None,
                 spread_files: bool = True, limit: int | None = None, unit_reader: ReadFileDoFn | None = None):
        super().__init__()
        self.patterns, self.fmt, self.text_field, self.id_field = patterns, fmt, text_field, id_field
        self.limit = limit
        self.spread_documents, self.range_bytes, self.batch_docs = spread_documents, range_bytes, batch_docs
        self.spread_files = spread_files or spread_documents
        self.unit_reader = unit_reader

    def expand(self, pbegin):
        files = (
            pbegin
            # As bytes: a file name that is not UTF-8 has no str form Beam's coder can write.
            | "Patterns" >> beam.Create([os.fsencode(p) for p in self.patterns])
            | "Match" >> beam.ParDo(MatchPatterns())
        )
        fields = (self.fmt, self.text_field, self.id_field, self.batch_docs)
        cut = False
        if self.limit is not None:
            # Every matched file in one element, read in path order by one worker that stops at
            # `limit`: the same records on every runner and worker count.
            read = self._read(ReadFirstDoFn(self.limit, *fields))
            out = files | "AllFiles" >> beam.combiners.ToList() | "ReadFirst" >> read
        else:
            if self.spread_files:
                files = files | "Spread" >> beam.Reshuffle()
            cut = self.spread_documents and all_cuttable(self.patterns, self.fmt, self.range_bytes)
            if cut:
                files = (files | "PlanRanges" >> beam.ParDo(PlanRanges(self.fmt, self.range_bytes))
                         | "SpreadRanges" >> beam.Reshuffle())
            if self.unit_reader is not None:
                read = beam.ParDo(self.unit_reader).with_output_types(Batch)
                out = files | "ReadUnits" >> read.with_outputs(UNIT_LEDGER, main=KEPT)
                return {KEPT: out[KEPT], UNIT_LEDGER: out[UNIT_LEDGER]}
            out = files | "Read" >> self._read(ReadFileDoFn(*fields))
        kept = out[KEPT]
        if self.spread_documents and not cut:
            kept = kept | "SpreadDocuments" >> beam.Reshuffle()
        return {KEPT: kept, REJECTED: out[REJECTED]}

    def _read(self, dofn: ReadFileDoFn):
        read = beam.ParDo(dofn)
        return (read.with_output_types(Batch) if self.batch_docs else read).with_outputs(REJECTED, main=KEPT)
