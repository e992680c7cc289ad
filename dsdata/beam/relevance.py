"""Beam side of the relevance stage: a small RunInference ModelHandler (no TensorFlow) and the
composite; RunInference shares the model among a worker process's threads."""
from __future__ import annotations

from dataclasses import dataclass
from time import thread_time
from typing import Any, Iterable, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference

from dsdata.beam.errors import ERROR, environment_failure, first_line, retry_one_at_a_time, passes_through
from dsdata.beam.transforms import CPU_COUNTER, KEPT, REJECTED, StageCounters
from dsdata.document import Document, Rejected
from dsdata.relevance.scorer import Scorer, load_scorer
from dsdata.stages.base import ScoringStage


@dataclass(frozen=True)
class ScoringFailed:
    """The inference of a document whose scoring raised: _RouteByScore rejects it (reason `error`)."""

    detail: str


class RelevanceModelHandler(ModelHandler[Document, PredictionResult, Scorer]):
    """Loads the relevance model once per worker process and scores whole batches; a document that
    raises alone gets a ScoringFailed inference (rejected, reason `error`)."""

    def __init__(self, model: str, backend: str = "auto", device: str = "auto", batch_size: int = 32,
                 max_length: int | None = None, long_documents: str = "head_tail",
                 min_batch_size: int = 8, max_batch_size: int = 256,
                 positive_label: str | list[str] | None = None, score: str = "probability",
                 stage_name: str = "relevance", environment_errors: tuple[type[BaseException], ...] = ()):
        super().__init__()
        self.model = model
        self.stage_name, self.environment_errors = stage_name, environment_errors
        self.load_options = dict(backend=backend, device=device, batch_size=batch_size,
                                 max_length=max_length, long_documents=long_documents,
                                 positive_label=positive_label, score=score)
        self.min_batch_size, self.max_batch_size = min_batch_size, max_batch_size

    def load_model(self) -> Scorer:
        try:
            return load_scorer(self.model, **self.load_options)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be loaded is no record's fault
            raise environment_failure("relevance", exc, " cannot start") from exc

    def run_inference(self, batch: Sequence[Document], model: Scorer,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        start = thread_time()
        scores = retry_one_at_a_time(self.stage_name, batch, lambda docs: model.score([doc.text for doc in docs]),
                                     lambda _doc, exc: ScoringFailed(first_line(exc)), self.environment_errors)
        # Counted per batch (one counter lookup for many documents), like the DoFns' per-bundle flush.
        Metrics.counter("dsdata.relevance", CPU_COUNTER).inc(round((thread_time() - start) * 1e6))
        return [PredictionResult(doc, score, self.model) for doc, score in zip(batch, scores)]

    def get_num_bytes(self, batch: Sequence[Document]) -> int:
        return sum(len(doc.text.encode("utf-8")) for doc in batch)

    def get_metrics_namespace(self) -> str:
        return "dsdata.relevance.inference"

    def batch_elements_kwargs(self) -> dict[str, Any]:
        # Large RunInference batches let the scorer sort by length across more documents, so padding
        # stays small; the scorer itself cuts them into forward passes of `batch_size` windows.
        return {"min_batch_size": self.min_batch_size, "max_batch_size": self.max_batch_size}


class _RouteByScore(StageCounters, beam.DoFn):
    """Hands each (document, score) to the stage's `judge`: kept on the main output, rejections tagged."""

    def __init__(self, stage):
        self.stage = stage

    def setup(self):
        self._init_counters(self.stage.name)

    def process(self, result: PredictionResult):
        self._in.inc()
        yield self._route(_judged(self, result))


def _judged(run: StageCounters, result: PredictionResult) -> Document | Rejected:
    """The stage's `judge` of one scored document (timed on `run`'s clock); a document whose scoring
    or judging raised is rejected (reason `error`)."""
    start = run._clock_start()
    doc = result.example
    if isinstance(result.inference, ScoringFailed):
        out = run._failed(Rejected(doc, run.stage.name, ERROR, result.inference.detail))
    else:
        try:
            out = run.stage.judge(doc, float(result.inference))
        except BaseException as exc:  # noqa: BLE001 - one record's exception rejects that record only
            if passes_through(exc):  # a stop, not the record's fault; a native panic is
                raise
            out = run._error(doc, exc)
    run._clock_stop(start)
    return out


def _model_handler(stage: ScoringStage) -> RelevanceModelHandler:
    return RelevanceModelHandler(stage.model, min_batch_size=stage.batch_min, max_batch_size=stage.batch_max,
                                 stage_name=stage.name, environment_errors=stage.environment_errors,
                                 **stage.load_options())


def composite(stage: ScoringStage, context) -> "RelevanceFilter":
    """The relevance stage's transform (registered in dsdata/beam/kinds.py)."""
    return RelevanceFilter(_model_handler(stage), stage)


class _LoadedScorer:
    """The scorer held in a process's Beam `Shared` map (which needs an object it can weakly refer to)."""

    def __init__(self, scorer: Scorer):
        self.scorer = scorer


class ScoringBatchRun(StageCounters):
    """The stage scored inside another DoFn over batches (a run's committed steps) with the same model
    handler (loaded once per process through `shared`), then `judge`, in chunks of batch_max."""

    def __init__(self, stage: ScoringStage, shared):
        self.stage = stage
        self._handler = _model_handler(stage)
        self._init_counters(stage.name)
        self._scorer = shared.acquire(lambda: _LoadedScorer(self._handler.load_model())).scorer

    def run_batch(self, docs: list[Document], rejected: list[Rejected]) -> list[Document]:
        """The kept ones of `docs`; rejections appended to `rejected`."""
        self._in.inc(len(docs))
        size = max(1, int(self.stage.batch_max))
        results = (_judged(self, result) for i in range(0, len(docs), size)
                   for result in self._handler.run_inference(docs[i:i + size], self._scorer))
        return self._collect(results, rejected)


def batch_run(stage: ScoringStage, shared) -> ScoringBatchRun:
    """The stage's run on batches inside another DoFn (kinds.batch_run); `shared`: a Beam Shared handle."""
    return ScoringBatchRun(stage, shared)


class RelevanceFilter(beam.PTransform):
    """PCollection[Document] → {"kept", "rejected"} scored by RunInference; the ScoringStage's
    `judge(doc, score)` decides each document."""

    def __init__(self, handler: RelevanceModelHandler, stage):
        super().__init__()
        self.handler, self.stage = handler, stage

    def expand(self, docs):
        out = (
            docs
            | "RunInference" >> RunInference(self.handler)
            | "Route" >> beam.ParDo(_RouteByScore(self.stage)).with_outputs(REJECTED, main=KEPT)
        )
        return {KEPT: out[KEPT], REJECTED: out[REJECTED]}
