"""The dedup stage's index steps (Beam): `against: DIR` drops documents that near-duplicate a
previous run's index; `index: DIR` writes this run's kept documents' MinHash signatures there
(format: dsdata/dedup/index.py)."""
from __future__ import annotations

import os
import dataclasses
import uuid

import apache_beam as beam

from dsdata.beam.dedup.spans import ConfiguredStep
from dsdata.beam.errors import environment_failure
from dsdata.beam.transforms import KEPT, REJECTED, full_batches
from dsdata.dedup.index import shared_index, best_match, write_manifest, write_part
from dsdata.dedup.lsh import band_keys
from dsdata.dedup.minhash import MinHasher
from dsdata.document import Rejected
from dsdata.stages.dedup import DedupConfig


def _hasher(c: DedupConfig) -> MinHasher:
    return MinHasher(c.num_perm, c.ngram, c.char_ngram, c.seed)


class _Against(beam.DoFn):
    def __init__(self, cfg: DedupConfig):
        self.cfg = cfg

    def setup(self):
        c = self.cfg
        self.hasher = _hasher(c)
        try:
            self.index = shared_index(c.against, dataclasses.asdict(c), c.bands, c.rows)
        except (OSError, ValueError) as exc:
            raise environment_failure(c.stage_name, exc, " cannot start") from exc

    def process(self, batch):
        c = self.cfg
        docs = list(batch)
        sigs, has = self.hasher.signatures([d.text for d in docs])
        keys = band_keys(sigs, c.bands, c.rows)
        for i, doc in enumerate(docs):
            match = best_match(self.index, keys[i], sigs[i], c.threshold) if has[i] and len(self.index.ids) else None
            if match is None:
                yield doc
            else:
                row, similarity = match
                yield beam.pvalue.TaggedOutput(REJECTED, Rejected(
                    doc, c.stage_name, "indexed_duplicate",
                    f"near-duplicate of {self.index.ids[row]} in the index {c.against} "
                    f"(estimated Jaccard {similarity:.3f} >= {c.threshold})"))


class AgainstIndex(ConfiguredStep):
    """PCollection[Document] → {"kept", "rejected"}: documents duplicating an indexed one rejected."""

    def expand(self, docs):
        out = (docs
               | "Batch" >> full_batches(self.cfg.batch_size)
               | "Lookup" >> beam.ParDo(_Against(self.cfg)).with_outputs(REJECTED, main=KEPT))
        return {KEPT: out[KEPT], REJECTED: out[REJECTED]}


class _WritePart(beam.DoFn):
    def __init__(self, cfg: DedupConfig):
        self.cfg = cfg

    def setup(self):
        self.hasher = _hasher(self.cfg)

    def process(self, batch):
        docs = list(batch)
        sigs, has = self.hasher.signatures([d.text for d in docs])
        ids = [d.id for i, d in enumerate(docs) if has[i]]
        if ids:
            name = uuid.uuid4().hex
            write_part(self.cfg.index, name, ids, sigs[has])
            yield name, len(ids)


def _finish(parts, cfg: DedupConfig):
    write_manifest(cfg.index, dataclasses.asdict(cfg), [name for name, _ in parts], sum(n for _, n in parts))
    return len(parts)


class WriteIndex(ConfiguredStep):
    """PCollection[Document] (the kept ones) → the index in cfg.index; the manifest is written
    once every part is."""

    def expand(self, docs):
        os.makedirs(self.cfg.index, exist_ok=True)
        return (docs
                | "Batch" >> full_batches(self.cfg.batch_size)
                | "WriteParts" >> beam.ParDo(_WritePart(self.cfg))
                | "AllParts" >> beam.combiners.ToList()
                | "Manifest" >> beam.Map(_finish, self.cfg))
