"""Stage kind → PTransform: the one place that decides how Beam runs a stage.

  DocumentStage  → ParDo(StageDoFn)                        kept on the main output, rejections tagged;
                                                           consecutive ones share one StageDoFn (ApplyStageChain)
  BatchStage     → full_batches → ParDo(BatchStageDoFn)    unless a composite is registered below
  CorpusStage    → its composite from COMPOSITES           (dedup, difficulty, augment, shards)
  a per-document stage with a corpus-wide part → its composite while `uses_composite()` (decontaminate's
                                                           document-frequency cap)

The recipe's leading `batchable` stages run instead on the reader's Batches (BatchChainDoFn).
Every transform returns {"kept", "rejected"}; a composite may add "stats" (one JSON-able dict) and
one dict per side output the stage declares.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import apache_beam as beam

from dsdata.beam.transforms import (KEPT, REJECTED, Batch, BatchChainDoFn, BatchStageDoFn, StageDoFn, batchable_run,
                                    full_batches)
from dsdata.stages.base import BatchStage, CorpusStage, DocumentStage, Stage

# Stage name → module whose `composite(stage, context)` builds the stage's transform.  Whole-corpus
# stages must have one; a batched stage may (relevance runs through RunInference).  A module may also
# offer `batch_run(stage, shared)`: that stage run inside another DoFn on Batches, as BatchChainDoFn
# runs the batchable stages — what a run that commits its per-document steps per unit needs
# (dsdata/beam/resume.py; `shared` is a Beam Shared handle).  Imported on use, so a recipe only pays
# for the composites it runs.
COMPOSITES: dict[str, str] = {
    "dedup": "dsdata.beam.dedup.steps",
    "difficulty": "dsdata.beam.difficulty",
    "augment": "dsdata.beam.augment",
    "shards": "dsdata.beam.shards",
    "relevance": "dsdata.beam.relevance",
    "decontaminate": "dsdata.beam.decontaminate",
}


def has_composite(stage: Stage) -> bool:
    """A stage that runs through its registered composite (one whose parameters turn the corpus-wide
    part off runs as its kind says)."""
    return stage.name in COMPOSITES and stage.uses_composite()


def _composite_batch_run(stage: Stage):
    """The `batch_run` its composite module offers, or None."""
    if stage.name not in COMPOSITES:
        return None
    return getattr(importlib.import_module(COMPOSITES[stage.name]), "batch_run", None)


@dataclass(frozen=True)
class StageContext:
    """What the builder hands a composite: the run directory and the recipe's stages before it."""

    run_dir: str
    upstream: tuple[Stage, ...] = ()


class ApplyStage(beam.PTransform):
    """PCollection[Document] → {"kept": PCollection[Document], "rejected": PCollection[Rejected], …}."""

    def __init__(self, stage: Stage, context: StageContext):
        super().__init__(label=f"stage:{stage.name}")
        self.stage, self.context = stage, context

    def expand(self, docs):
        stage = self.stage
        if has_composite(stage):
            composite = importlib.import_module(COMPOSITES[stage.name]).composite
            return dict(docs | composite(stage, self.context))
        if isinstance(stage, CorpusStage):
            raise TypeError(f"whole-corpus stage '{stage.name}' has no composite in dsdata/beam/kinds.py COMPOSITES")
        if isinstance(stage, BatchStage):
            batched = docs | "Batch" >> full_batches(stage.batch_max)
            out = batched | "Run" >> beam.ParDo(BatchStageDoFn(stage)).with_outputs(REJECTED, main=KEPT)
        elif isinstance(stage, DocumentStage):
            out = docs | "Run" >> beam.ParDo(StageDoFn(stage)).with_outputs(REJECTED, main=KEPT)
        else:
            raise TypeError(f"stage '{stage.name}' is none of DocumentStage, BatchStage, CorpusStage")
        return {KEPT: out[KEPT], REJECTED: out[REJECTED]}


def fusable(stage: Stage) -> bool:
    """A per-document stage with no composite and no side outputs: it can share a StageDoFn."""
    return isinstance(stage, DocumentStage) and not has_composite(stage) and not stage.side_outputs


class ApplyStageChain(beam.PTransform):
    """Consecutive per-document stages as ONE ParDo (StageDoFn): {"kept", "rejected"}."""

    def __init__(self, stages: list[DocumentStage]):
        super().__init__(label="stages:" + "+".join(s.name for s in stages))
        if not stages or not all(fusable(s) for s in stages):
            raise TypeError("ApplyStageChain runs only per-document stages without a composite or side outputs")
        self.stages = list(stages)

    def expand(self, docs):
        out = docs | "Run" >> beam.ParDo(StageDoFn(self.stages)).with_outputs(REJECTED, main=KEPT)
        return {KEPT: out[KEPT], REJECTED: out[REJECTED]}


def batchable(stage: Stage) -> bool:
    """A per-document or batched stage with no composite and no side outputs: BatchChainDoFn runs it."""
    return (isinstance(stage, (DocumentStage, BatchStage)) and not has_composite(stage)
            and not stage.side_outputs)


class ApplyBatchChain(beam.PTransform):
    """Batches → Batches: consecutive batchable stages as ONE ParDo (BatchChainDoFn)."""

    def __init__(self, stages: list[Stage]):
        super().__init__(label="batch:" + "+".join(s.name for s in stages))
        if not stages or not all(batchable(s) for s in stages):
            raise TypeError("ApplyBatchChain runs only per-document and batched stages without a composite "
                            "or side outputs")
        self.stages = list(stages)

    def expand(self, batches):
        return batches | "Run" >> beam.ParDo(BatchChainDoFn(self.stages)).with_output_types(Batch)


def committable(stage: Stage) -> bool:
    """A per-document stage that can run inside one DoFn on Batches (batchable, or its composite module
    offers a `batch_run`): what a run commits per unit (dsdata/beam/resume.py)."""
    if batchable(stage):
        return True
    return isinstance(stage, BatchStage) and not stage.side_outputs and _composite_batch_run(stage) is not None


def batch_run(stage: Stage, shared):
    """The object that runs a committable stage on Batches inside another DoFn's setup (`run_batch`,
    `finish_bundle`); `shared`: a Beam Shared handle, for a model loaded once per process."""
    run = _composite_batch_run(stage)
    return run(stage, shared) if run is not None else batchable_run(stage)
