"""Relevance filter: a learned classifier (BERT-family sequence classifier or supervised fastText)
scores every document; `relevance_score` is annotated and documents below `threshold` are rejected
with reason `low_relevance`.  In a pipeline it runs through Beam RunInference (see
dsdata/relevance/inference.py); `process_batch` scores the same way without Beam."""
from __future__ import annotations

import os

import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.stages.base import Param, Stage, StageConfigError


class RelevanceStage(Stage):
    name = "relevance"
    description = "learned relevance filter (BERT via RunInference, or fastText); rejects low_relevance"
    params = {
        "model": Param(None, "trained model: a save_pretrained BERT-family classifier directory or a fastText "
                             "directory/.ftz (from 'dsdata classifier train')", kind="path"),
        "backend": Param("auto", "auto (from the model's files) | bert | fasttext"),
        "threshold": Param(0.5, "documents with relevance_score below this are rejected (low_relevance)"),
        "device": Param("auto", "bert: auto (GPU when present, with autocast) | cpu | cuda[:N]"),
        "batch_size": Param(32, "bert: windows per forward pass (sorted by length to limit padding)"),
        "max_length": Param(0, "bert: window in tokens incl. [CLS]/[SEP]; 0 = the model's training setting"),
        "long_documents": Param("head_tail", "bert: texts longer than one window: head_tail (average of the "
                                             "first and last window) | head"),
    }
    annotations = {"relevance_score": pa.float64()}
    batch_min = 8
    batch_max = 256

    def validate(self) -> None:
        from dsdata.relevance.scorer import BACKENDS, detect_backend

        if not self.model or not isinstance(self.model, str):
            raise StageConfigError("stage 'relevance' needs model=PATH (a directory from 'dsdata classifier train'; "
                                   "the shipped default is pipelines/models/relevance-fasttext)")
        if self.backend not in BACKENDS:
            raise StageConfigError(f"relevance.backend '{self.backend}' unknown (choose one of {', '.join(BACKENDS)})")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) \
                or not 0.0 <= float(self.threshold) <= 1.0:
            raise StageConfigError(f"relevance.threshold must be a number between 0 and 1, got {self.threshold!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise StageConfigError(f"relevance.batch_size must be a positive integer, got {self.batch_size!r}")
        if not isinstance(self.max_length, int) or self.max_length < 0 or 0 < self.max_length < 8:
            raise StageConfigError(f"relevance.max_length must be 0 (model default) or at least 8, got {self.max_length!r}")
        if self.long_documents not in ("head_tail", "head"):
            raise StageConfigError(f"relevance.long_documents must be head_tail or head, got {self.long_documents!r}")
        if "://" not in self.model and not os.path.exists(self.model):
            raise StageConfigError(f"relevance.model '{self.model}' does not exist; train one with "
                                   "'dsdata classifier train --backend fasttext|bert --data F --out DIR'")
        try:
            found = detect_backend(self.model)
        except ValueError as exc:
            raise StageConfigError(f"relevance.model: {exc}") from None
        if self.backend != "auto" and self.backend != found:
            raise StageConfigError(f"relevance.model '{self.model}' is a {found} model but backend={self.backend}; "
                                   f"set relevance.backend={found} or auto")
        self.threshold = float(self.threshold)

    def _load_options(self) -> dict:
        return dict(backend=self.backend, device=self.device, batch_size=self.batch_size,
                    max_length=self.max_length or None, long_documents=self.long_documents)

    def setup(self) -> None:
        from dsdata.relevance.scorer import load_scorer

        try:
            self._scorer = load_scorer(self.model, **self._load_options())
        except ValueError as exc:
            raise StageConfigError(f"relevance.model: {exc}") from None

    def judge(self, doc: Document, score: float) -> Document | Rejected:
        """Annotate the score; keep at or above the threshold, else reject (NaN is rejected too)."""
        doc.annotations["relevance_score"] = float(score)
        if not score >= self.threshold:
            return self.reject(doc, "low_relevance", f"relevance_score {score:.4f} < threshold {self.threshold}")
        return doc

    def process_batch(self, docs: list[Document]) -> list[Document | Rejected]:
        if getattr(self, "_scorer", None) is None:
            self.setup()
        return [self.judge(doc, score) for doc, score in zip(docs, self._scorer.score([d.text for d in docs]))]

    def beam_transform(self):
        from dsdata.relevance.inference import RelevanceFilter, RelevanceModelHandler

        handler = RelevanceModelHandler(self.model, min_batch_size=self.batch_min, max_batch_size=self.batch_max,
                                        **self._load_options())
        return RelevanceFilter(handler, self)
