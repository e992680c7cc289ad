"""The dedup stage's URL and line/span steps (Beam), run before and after its document-level step.

UrlDedup     of the documents with one normalised URL the first in keep order is kept, the others
             rejected `duplicate_url`; documents without a URL pass untouched.
LineDedup    every unit (line, or three-sentence span) belongs to the first document containing it
             in keep order; later ones lose it, and one left under `min_doc_chars` is rejected
             `duplicate_lines`.  Unit keys shuffle; documents meet their drop lists by document key.

Keep order, not reading order: the same result on every runner and any number of workers.
"""
from __future__ import annotations

from typing import Any

import apache_beam as beam

from dsdata.beam.dedup.composite import node_key
from dsdata.beam.park import FlattenParked, parked_sibling
from dsdata.beam.spill import SpilledGroupByKey
from dsdata.beam.transforms import KEPT, REJECTED
from dsdata.dedup.minhash import exact_hash
from dsdata.dedup.spans import normalise_url, remove_units, unit_keys
from dsdata.document import Document, Rejected, pack_document, unpack_document
from dsdata.stages.dedup import DedupConfig

LINES_REMOVED = "dup_lines_removed"


def _order_key(doc: Document, score_field: str | None) -> str:
    return node_key(doc, exact_hash(doc.text), score_field)


def record_url(doc: Document, field: str) -> Any:
    """The record's URL: metadata[field], else annotations[field]."""
    value = doc.metadata.get(field)
    return value if value is not None else doc.annotations.get(field)


# These DoFns route without the stage's counters: the document-level step counts the stage's
# documents in and out (progress display), and a document passes through several steps here.
def _routed(result: Document | Rejected):
    return beam.pvalue.TaggedOutput(REJECTED, result) if isinstance(result, Rejected) else result


class _PickUrl(beam.DoFn):
    def __init__(self, stage_name: str):
        self.stage_name = stage_name

    def process(self, item):
        url, members = item
        ranked = sorted((key, unpack_document(fields)) for key, fields in members)
        first = ranked[0][1]
        for i, (_, doc) in enumerate(ranked):
            if i == 0:
                yield doc
            else:
                yield _routed(Rejected(doc, self.stage_name, "duplicate_url",
                                           f"same URL as {first.id}: {url}"))


class ConfiguredStep(beam.PTransform):
    """A dedup step built from the stage's transform_config() (a DedupConfig)."""

    def __init__(self, cfg: DedupConfig):
        super().__init__()
        self.cfg = cfg


class UrlDedup(ConfiguredStep):
    """PCollection[Document] → {"kept", "rejected"}: one document per normalised URL."""

    def expand(self, docs):
        field, score, name = self.cfg.url_field, self.cfg.score_field, self.cfg.stage_name

        def by_url(doc: Document, _n):
            return 0 if normalise_url(record_url(doc, field)) is not None else 1

        with_url, without = docs | "SplitByUrl" >> beam.Partition(by_url, 2)
        out = (
            with_url
            | "KeyByUrl" >> beam.Map(lambda d: (normalise_url(record_url(d, field)),
                                                (_order_key(d, score), pack_document(d))))
            | "UrlGroups" >> beam.GroupByKey()
            | "PickUrl" >> beam.ParDo(_PickUrl(name)).with_outputs(REJECTED, main=KEPT)
        )
        parked = self.cfg.spill_dir and parked_sibling(self.cfg.spill_dir, "url")
        kept = (out[KEPT], without) | "UrlKept" >> FlattenParked(parked)
        return {KEPT: kept, REJECTED: out[REJECTED]}


def _unit_owners(item):
    """(unit key, [document keys]) → (document key, unit key) for every document but the first."""
    unit, doc_keys = item
    first = min(doc_keys)
    for key in set(doc_keys):
        if key != first:
            yield key, unit


class _ApplyDrops(beam.DoFn):
    def __init__(self, cfg: DedupConfig):
        self.cfg = cfg

    def process(self, item):
        _, joined = item
        drops = set(joined["drop"])
        for fields in joined["doc"]:
            yield _routed(self._apply(unpack_document(fields), drops))

    def _apply(self, doc: Document, drops: set[bytes]) -> Document | Rejected:
        c = self.cfg
        text, removed = remove_units(doc.text, c.lines_unit, c.lines_min_chars, drops) if drops else (doc.text, 0)
        doc.annotations[LINES_REMOVED] = removed
        if not removed:
            return doc
        left = len(text.strip())
        if left < c.lines_min_doc_chars:
            what = "lines" if c.lines_unit == "line" else "sentences"
            return Rejected(doc, c.stage_name, "duplicate_lines",
                            f"{removed} {what} seen in earlier documents removed; {left} characters left "
                            f"< lines_min_doc_chars {c.lines_min_doc_chars}")
        doc.text = text
        return doc


class LineDedup(ConfiguredStep):
    """PCollection[Document] → {"kept", "rejected"}: corpus-wide line (or three-sentence span) dedup."""

    def expand(self, docs):
        c = self.cfg
        keyed = docs | "DocKeys" >> beam.Map(lambda d: (_order_key(d, c.score_field), pack_document(d)))
        drops = (
            keyed
            | "UnitKeys" >> beam.FlatMap(lambda kd: {(unit, kd[0]) for unit, _ in unit_keys(
                unpack_document(kd[1]).text, c.lines_unit, c.lines_min_chars)})
            | "UnitGroups" >> (SpilledGroupByKey(c.spill_dir) if c.spill_dir else beam.GroupByKey())
            | "UnitOwners" >> beam.FlatMap(_unit_owners)
        )
        out = (
            {"doc": keyed, "drop": drops}
            | "JoinDrops" >> beam.CoGroupByKey()
            | "ApplyDrops" >> beam.ParDo(_ApplyDrops(c)).with_outputs(REJECTED, main=KEPT)
        )
        return {KEPT: out[KEPT], REJECTED: out[REJECTED]}
