"""The decontaminate stage with its document-frequency cap: match → count per n-gram → decide.

  docs ─► Match ─┬─► no benchmark n-gram ─────────────────────────────────────────► kept
                 ├─► (document, its matches) ─► Decide (side input: the capped n-grams) ─► kept / rejected
                 └─► each matched n-gram once per document ─► Count.PerElement ─► > cap ─┘
                                                                         └─► summary ─► the stage's stats

Only a document holding a benchmark n-gram waits for the counts (in the runner: few); the others
are kept at once, and the two paths meet in spill files (dsdata/beam/park.py).
"""
from __future__ import annotations

import apache_beam as beam

from dsdata.beam.spill import spill_directory
from dsdata.beam.errors import passes_through
from dsdata.beam.park import FlattenParked
from dsdata.beam.transforms import ANY_OUTPUT, KEPT, REJECTED, StageStepDoFn
from dsdata.document import Document
from dsdata.stages.decontaminate import CAPPED_LISTED, CAPPED_NOTE, DecontaminateStage, Match, shown

_WAITING = "waiting"
_GRAMS = "grams"


@ANY_OUTPUT
class _MatchDoFn(StageStepDoFn):
    """A document without a benchmark n-gram is kept (main output); one with some waits (tag
    `waiting`, with its matches) and names each of its n-grams once (tag `grams`); a document whose
    matching raises is rejected (reason `error`)."""

    def process(self, doc: Document):
        start = self._clock_start()
        try:
            found = self.stage.matches(doc)
        except BaseException as exc:  # noqa: BLE001 - one record's exception rejects that record only
            if passes_through(exc):
                raise
            self._in.inc()
            self._clock_stop(start)
            yield self._route(self._error(doc, exc, self.stage.environment_errors))
            return
        self._clock_stop(start)
        if not found:
            self._in.inc()
            yield self._route(doc)
            return
        for m in found:
            yield beam.pvalue.TaggedOutput(_GRAMS, m.key)
        yield beam.pvalue.TaggedOutput(_WAITING, (doc, [(m.key, m.benchmark, m.n, m.at, m.item) for m in found]))


class _DecideDoFn(StageStepDoFn):
    """(document, matches) → rejected on its first n-gram under the cap (or as a copy of an item),
    else kept; a document whose decision raises is rejected (reason `error`)."""

    def process(self, item, capped: dict[str, int]):
        doc, found = item
        self._in.inc()
        start = self._clock_start()
        try:
            result = self.stage.decide(doc, [Match(*m) for m in found], capped)
        except BaseException as exc:  # noqa: BLE001 - one record's exception rejects that record only
            if passes_through(exc):
                raise
            result = self._error(doc, exc, self.stage.environment_errors)
        self._clock_stop(start)
        yield self._route(result)


def summarize(stage: DecontaminateStage, capped: dict[str, int]) -> dict:
    """The stage's stats: the cap, how many n-grams it set aside, and the most shared of them."""
    top = sorted(capped.items(), key=lambda kv: (-kv[1], kv[0]))[:CAPPED_LISTED]
    return {"max_doc_frequency": stage.max_doc_frequency, "capped_ngrams": len(capped),
            "notes": {CAPPED_NOTE: {shown(key.split(" ")): n for key, n in top}}}


class DecontaminateWithCap(beam.PTransform):
    """PCollection[Document] → {"kept", "rejected", "stats"}."""

    def __init__(self, stage: DecontaminateStage, spill_dir: str | None = None):
        super().__init__()
        self.stage, self.spill_dir = stage, spill_dir

    def expand(self, docs):
        stage, cap = self.stage, self.stage.max_doc_frequency
        matched = docs | "Match" >> beam.ParDo(_MatchDoFn(stage)).with_outputs(_WAITING, _GRAMS, REJECTED, main=KEPT)
        capped = (
            matched[_GRAMS]
            | "Count" >> beam.combiners.Count.PerElement()
            | "OverCap" >> beam.Filter(lambda kv: kv[1] > cap)
        )
        side = beam.pvalue.AsDict(capped)
        decided = matched[_WAITING] | "Decide" >> beam.ParDo(_DecideDoFn(stage), side).with_outputs(REJECTED, main=KEPT)
        # The two paths meet in Flattens that park their records in spill files: a plain Flatten of
        # them would hold every kept document in the in-process runner (dsdata/beam/park.py).
        kept = (matched[KEPT], decided[KEPT]) | "AllKept" >> FlattenParked(self.spill_dir)
        rejected = (matched[REJECTED], decided[REJECTED]) | "AllRejected" >> FlattenParked(self.spill_dir)
        summary = (
            docs.pipeline | "One" >> beam.Create([None])
            | "Summary" >> beam.Map(lambda _, found: summarize(stage, found), side)
        )
        return {KEPT: kept, REJECTED: rejected, "stats": summary}


def composite(stage: DecontaminateStage, context) -> DecontaminateWithCap:
    """The decontaminate stage's transform when it caps document frequency (dsdata/beam/kinds.py)."""
    return DecontaminateWithCap(stage, spill_directory(context.run_dir, stage.name))
