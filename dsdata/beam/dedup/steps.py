"""The dedup stage's steps around the document-level composite (composite.py): `against`, `url`,
`lines` (spans.py) and `index` (index.py); a stage with none of them gets the composite alone."""
from __future__ import annotations

import apache_beam as beam

from dsdata.beam.dedup.composite import DedupTransform
from dsdata.beam.dedup.composite import composite as document_composite
from dsdata.beam.dedup.index import AgainstIndex, WriteIndex
from dsdata.beam.dedup.spans import ConfiguredStep, LineDedup, UrlDedup
from dsdata.beam.park import FlattenParked, parked_sibling
from dsdata.beam.transforms import KEPT, REJECTED


class DedupSteps(ConfiguredStep):
    """The stage's steps in order (`against`, `url`, `exact`/`near`, `lines`), their rejections joined,
    the kept documents' signatures written to `index`."""

    def expand(self, docs):
        c, rejected = self.cfg, []
        steps = [("Against", AgainstIndex)] if c.against else []
        if c.url:
            steps.append(("Url", UrlDedup))
        if c.exact or c.near:
            steps.append(("Documents", DedupTransform))
        if c.lines:
            steps.append(("Lines", LineDedup))
        for label, step in steps:
            out = docs | label >> step(c)
            docs = out[KEPT]
            rejected.append(out[REJECTED])
        if c.index:
            _ = docs | "Index" >> WriteIndex(c)
        parked = c.spill_dir and parked_sibling(c.spill_dir, "steps")
        return {KEPT: docs, REJECTED: tuple(rejected) | "StepsRejected" >> FlattenParked(parked)}


def composite(stage, context) -> beam.PTransform:
    """The dedup stage's transform: the document-level composite, with the extra steps if any."""
    document_step = document_composite(stage, context)
    cfg = document_step.cfg
    if not any(getattr(cfg, k) for k in ("url", "lines", "index", "against")):
        return document_step  # the graph earlier runs had, step names unchanged
    return DedupSteps(cfg)
