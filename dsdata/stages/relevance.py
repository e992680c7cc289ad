"""Relevance filter: a learned classifier (BERT-family sequence classifier or supervised fastText)
scores every document; `relevance_score` is annotated and documents below `threshold` are rejected
with reason `low_relevance`.  In a pipeline it runs through Beam RunInference (see
dsdata/beam/relevance.py); `process_batch` scores the same way without Beam."""
from __future__ import annotations

import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.relevance.scorer import BACKENDS, SCORES, detect_backend, load_scorer
from dsdata.stages.base import Chart, Param, ScoringStage, StageConfigError
from dsdata.core.params import AnyOf, Choice, Integer, ListOf, Number, Path, Text


class RelevanceStage(ScoringStage):
    name = "relevance"
    charts = (Chart("histogram", "relevance_score", "hist-relevance", "Relevance score", "Relevance score",
                    label="relevance_score", threshold="threshold"),)
    description = "learned relevance filter (BERT via RunInference, or fastText); rejects low_relevance"
    params = {
        "model": Param(None, "trained model: a save_pretrained BERT-family classifier directory or a fastText "
                             "directory/.ftz (from 'dsdata classifier train')",
                       Path(must_exist="any", missing="does not exist; train one with "
                            "'dsdata classifier train --backend fasttext|bert --data F --out DIR'"), nullable=True),
        "backend": Param("auto", "auto (from the model's files) | bert | fasttext", Choice(BACKENDS)),
        "threshold": Param(0.5, "documents with relevance_score below this are rejected (low_relevance); between "
                                "0 and 1 for probabilities, any number with score: raw (FineWeb-Edu: 3)", Number()),
        "positive_label": Param(None, "the label meaning relevant (fastText: __label__hq or hq; bert: a label2id "
                                      "name), or a list whose probabilities are summed; null: __label__1 / the "
                                      "model's positive label",
                                AnyOf(Text(nonempty=True), ListOf(Text(nonempty=True), nonempty=True),
                                      expect="a label or a non-empty list of labels"), nullable=True),
        "score": Param("probability", "probability (of positive_label) | raw (a one-output head's value as it is, "
                                      "e.g. FineWeb-Edu's 0-5 educational score)", Choice(SCORES)),
        "device": Param("auto", "bert: auto (GPU when present, with autocast) | cpu | cuda[:N]", Text(nonempty=True)),
        "batch_size": Param(32, "bert: windows per forward pass (sorted by length to limit padding)", Integer(min=1)),
        "max_length": Param(0, "bert: window in tokens incl. [CLS]/[SEP]; 0 = the model's training setting",
                            Integer(min=0, where=lambda n: n == 0 or n >= 8, expect="0 (model default) or at least 8")),
        "long_documents": Param("head_tail", "bert: texts longer than one window: head_tail (average of the "
                                             "first and last window) | head", Choice(("head_tail", "head"))),
    }
    annotations = {"relevance_score": pa.float64()}
    batch_min = 8
    batch_max = 256
    _scorer = None  # loaded by setup()

    def validate(self) -> None:
        if self.model is None:
            raise StageConfigError("stage 'relevance' needs model=PATH (a directory from 'dsdata classifier train'; "
                                   "the shipped default is pipelines/models/relevance-fasttext)")
        try:
            found = detect_backend(self.model)
        except ValueError as exc:
            raise StageConfigError(f"relevance.model: {exc}") from None
        if self.backend != "auto" and self.backend != found:
            raise StageConfigError(f"relevance.model '{self.model}' is a {found} model but backend={self.backend}; "
                                   f"set relevance.backend={found} or auto")
        if self.score == "probability" and not 0 <= self.threshold <= 1:
            raise StageConfigError(f"relevance.threshold {self.threshold:g} is not a probability (0 to 1); "
                                   "with a regression head's raw score set relevance.score=raw")
        if self.score == "raw" and found == "fasttext":
            raise StageConfigError("relevance.score=raw is for a one-output BERT-family head; a fastText "
                                   "model's scores are probabilities")

    def preflight(self) -> str | None:
        """The fastText scorer needs fasttext-numpy2's full module (a predict-only one cannot load it)."""
        if detect_backend(self.model) != "fasttext":
            return None
        from dsdata.stages.fasttext_install import fasttext_problem

        return fasttext_problem(need_training=True)

    def load_options(self) -> dict:
        """Keyword arguments of `load_scorer` (also used by the RunInference model handler)."""
        return dict(backend=self.backend, device=self.device, batch_size=self.batch_size,
                    max_length=self.max_length or None, long_documents=self.long_documents,
                    positive_label=self.positive_label, score=self.score)

    def setup(self) -> None:
        try:
            self._scorer = load_scorer(self.model, **self.load_options())
        except ValueError as exc:
            raise StageConfigError(f"relevance.model: {exc}") from None

    def judge(self, doc: Document, score: float) -> Document | Rejected:
        """Annotate the score; keep at or above the threshold, else reject (NaN is rejected too)."""
        doc.annotations["relevance_score"] = float(score)
        if not score >= self.threshold:
            return self.reject(doc, "low_relevance", f"relevance_score {score:.4f} < threshold {self.threshold}")
        return doc

    def process_batch(self, docs: list[Document]) -> list[Document | Rejected]:
        if self._scorer is None:
            self.setup()
        return [self.judge(doc, score) for doc, score in zip(docs, self._scorer.score([d.text for d in docs]))]
