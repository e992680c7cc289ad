"""Stage kind → PTransform: the one place that decides how Beam runs a stage.

  DocumentStage  → ParDo(StageDoFn)                        kept on the main output, rejections tagged
  BatchStage     → BatchElements → ParDo(BatchStageDoFn)   unless a composite is registered below
  CorpusStage    → its composite from COMPOSITES           (dedup, difficulty, augment, shards)

Every transform returns {"kept", "rejected"}; a composite may add "stats" (one JSON-able dict,
written into stats.json[stage name]) and one dict per side output the stage declares (written by
the builder under the run directory).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import apache_beam as beam

from dsdata.beam.transforms import KEPT, REJECTED, BatchStageDoFn, StageDoFn
from dsdata.stages.base import BatchStage, CorpusStage, DocumentStage, Stage

# Stage name → module whose `composite(stage, context)` builds the stage's transform.  Whole-corpus
# stages must have one; a batched stage may (relevance runs through RunInference).  Imported on
# use, so a recipe only pays for the composites it runs.
COMPOSITES: dict[str, str] = {
    "dedup": "dsdata.beam.dedup",
    "difficulty": "dsdata.beam.difficulty",
    "augment": "dsdata.beam.augment",
    "shards": "dsdata.beam.shards",
    "relevance": "dsdata.beam.relevance",
}


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
        if stage.name in COMPOSITES:
            composite = importlib.import_module(COMPOSITES[stage.name]).composite
            return dict(docs | composite(stage, self.context))
        if isinstance(stage, CorpusStage):
            raise TypeError(f"whole-corpus stage '{stage.name}' has no composite in dsdata/beam/kinds.py COMPOSITES")
        if isinstance(stage, BatchStage):
            batched = docs | "Batch" >> beam.BatchElements(
                min_batch_size=stage.batch_min, max_batch_size=stage.batch_max
            )
            out = batched | "Run" >> beam.ParDo(BatchStageDoFn(stage)).with_outputs(REJECTED, main=KEPT)
        elif isinstance(stage, DocumentStage):
            out = docs | "Run" >> beam.ParDo(StageDoFn(stage)).with_outputs(REJECTED, main=KEPT)
        else:
            raise TypeError(f"stage '{stage.name}' is none of DocumentStage, BatchStage, CorpusStage")
        return {KEPT: out[KEPT], REJECTED: out[REJECTED]}
