"""Generic Beam wrappers around the stage contract: one DoFn runs any per-document stage, another any
batched stage, each with two tagged outputs (kept, rejected) and Beam Metrics counters per stage and
reason; and the reader.  Which wrapper runs which stage: dsdata/beam/kinds.py."""
from __future__ import annotations

import logging
from typing import Any

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from dsdata.document import Document, Rejected
from dsdata.io.readers import READ_STAGE, read_file
from dsdata.beam.progress import stage_counter
from dsdata.stages.base import BatchStage, DocumentStage

log = logging.getLogger("dsdata")

KEPT = "kept"
REJECTED = "rejected"


class StageCounters:
    """Per-stage Metrics: documents in, kept, and rejected per reason (created lazily)."""

    def _init_counters(self, stage_name: str) -> None:
        self._ns = f"dsdata.{stage_name}"
        self._in = stage_counter(self._ns, "in")
        self._kept = stage_counter(self._ns, "kept")
        self._reasons: dict[str, Any] = {}

    def _route(self, result: Document | Rejected):
        if isinstance(result, Rejected):
            counter = self._reasons.get(result.reason)
            if counter is None:
                counter = self._reasons[result.reason] = stage_counter(self._ns, f"rejected.{result.reason}")
            counter.inc()
            return beam.pvalue.TaggedOutput(REJECTED, result)
        self._kept.inc()
        return result


class StageDoFn(StageCounters, beam.DoFn):
    """Runs a per-document stage (`process(doc)`): kept docs on the main output, rejections tagged."""

    def __init__(self, stage: DocumentStage):
        self.stage = stage

    def setup(self):
        self._init_counters(self.stage.name)
        self.stage.setup()

    def process(self, doc: Document):
        self._in.inc()
        yield self._route(self.stage.process(doc))


class BatchStageDoFn(StageCounters, beam.DoFn):
    """Runs a model stage (`process_batch(docs)`) over batches made by BatchElements."""

    def __init__(self, stage: BatchStage):
        self.stage = stage

    def setup(self):
        self._init_counters(self.stage.name)
        self.stage.setup()

    def process(self, batch: list[Document]):
        self._in.inc(len(batch))
        results = self.stage.process_batch(list(batch))
        if len(results) != len(batch):
            raise RuntimeError(
                f"stage '{self.stage.name}' returned {len(results)} results for a batch of {len(batch)}: "
                "process_batch must return exactly one Document or Rejected per input"
            )
        for result in results:
            yield self._route(result)


class ReadFileDoFn(StageCounters, beam.DoFn):
    """Reads one matched file into Documents; unreadable parts become rejections (never skipped)."""

    def __init__(self, fmt: str = "auto", text_field: str = "text", id_field: str = "id"):
        self.fmt, self.text_field, self.id_field = fmt, text_field, id_field

    def setup(self):
        self._init_counters(READ_STAGE)

    def process(self, metadata: fileio.FileMetadata):
        path = metadata.path
        try:
            fh = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
        except Exception as exc:  # noqa: BLE001 - any filesystem error means this file is unreadable
            yield self._route(Rejected(Document(path, "", {"source": path}), READ_STAGE, "unreadable_file", str(exc)))
            return
        n = bad = 0
        with fh:
            for result in read_file(path, fh, self.fmt, self.text_field, self.id_field):
                self._in.inc()
                n += 1
                bad += isinstance(result, Rejected)
                yield self._route(result)
        # Progress for long runs: one line per input file (the `dsdata` logger is INFO under the CLI).
        log.info("read %s: %d records (%d rejected by the reader)", path, n, bad)


class ReadDocuments(beam.PTransform):
    """File patterns (local, gs://, s3://, …) → {"kept": docs, "rejected": unreadable records}."""

    def __init__(self, patterns: list[str], fmt: str = "auto", text_field: str = "text", id_field: str = "id"):
        super().__init__()
        self.patterns, self.fmt, self.text_field, self.id_field = patterns, fmt, text_field, id_field

    def expand(self, pbegin):
        files = (
            pbegin
            | "Patterns" >> beam.Create(self.patterns)
            | "Match" >> fileio.MatchAll()
            # One pattern can match thousands of files: spread reading across workers.
            | "Spread" >> beam.Reshuffle()
        )
        out = files | "Read" >> beam.ParDo(ReadFileDoFn(self.fmt, self.text_field, self.id_field)).with_outputs(
            REJECTED, main=KEPT
        )
        return {KEPT: out[KEPT], REJECTED: out[REJECTED]}
