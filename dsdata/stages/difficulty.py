"""difficulty: perplexity under a reference language model, and an easy / medium / hard grade.

Each document is scored by the model of its language and annotated `perplexity` (CCNet's) and
`difficulty`; grading by cutoffs or per-language percentiles (a whole-corpus stage:
dsdata/beam/difficulty.py), unscorable documents and outliers: docs/difficulty.md.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from dsdata.document import Document, Rejected
from dsdata.stages.base import Chart, CorpusStage, Param, SideOutput, StageConfigError
from dsdata.core.params import (Allowed, BadValue, Boolean, Choice, Integer, ListOf, MappingOf, Number, ParamType, Path,
                                  Text)

GRADES = ("easy", "medium", "hard")
SUMMARY_FILE = "difficulty.json"
BACKENDS = ("ngram", "causal_lm")
# The models shipped with the repository (trained by `dsdata lm train` on the dev prose).
SHIPPED_MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "pipelines", "models", "lm")


def base_language(code: str) -> str:
    return code.replace("_", "-").split("-")[0].lower()


class Cutoffs(ParamType):
    """[easy_below, hard_above] for every language, or {lang: [easy_below, hard_above]}; converted to
    {lang or "*": (easy_below, hard_above)}."""

    expect = ("[easy_below, hard_above] with 0 < easy_below <= hard_above, "
              "or {lang: [easy_below, hard_above]}")

    def _pair(self, v: Any) -> tuple[float, float]:
        pair = ListOf(Number(0, open_min=True), length=2)
        try:
            low, high = pair.check(v)
        except BadValue:
            raise BadValue(self.expect) from None
        if not low <= high:
            raise BadValue(self.expect)
        return low, high

    def check(self, value: Any) -> dict[str, tuple[float, float]]:
        if isinstance(value, dict):
            return {str(k): self._pair(v) for k, v in value.items()}
        return {"*": self._pair(value)}


class BucketWeights(MappingOf):
    """easy/medium/hard → non-negative weight, with a positive sum."""

    def __init__(self):
        super().__init__(Choice(GRADES), Number(0),
                         expect="a mapping of easy/medium/hard to non-negative numbers with a positive sum")

    def check(self, value: Any) -> dict[str, float]:
        weights = super().check(value)
        if sum(weights.values()) <= 0:
            raise BadValue(self.expect)
        return weights


@dataclass(frozen=True)
class DifficultyConfig:
    """The plain values the difficulty composite (dsdata/beam/difficulty.py) runs by and records in
    difficulty.json; scoring and grading are the stage's own methods, which its DoFns call."""

    stage_name: str
    batch_size: int
    environment_errors: tuple[type[BaseException], ...]
    backend: str
    model_dir: str | None
    percentiles: tuple[float, float]
    outlier_percentile: float | None
    max_perplexity: float | None
    unscored_grade: str | None


def model_languages(values: dict[str, Any]) -> Allowed | None:
    """`difficulty.lang`'s choices: the languages model_dir has a model for (None: one model for all,
    or no readable model folder, which setup() reports)."""
    from dsdata.lm.scorers import ModelLoadError, language_model_dirs

    try:
        found = language_model_dirs(values["model_dir"], values["backend"])
    except (ModelLoadError, OSError, TypeError):
        return None
    return None if "*" in found else Allowed(frozenset(found), f"the languages {values['model_dir']} has models for")


class DifficultyStage(CorpusStage):
    name = "difficulty"
    charts = (
        Chart("cutoffs", "perplexity", "hist-perplexity", "perplexity", "perplexity with difficulty cut-offs",
              group="lang", side_output="difficulty.json"),
        Chart("grades", "difficulty", "hist-difficulty", "Difficulty grades (all kept)", "difficulty grades",
              label="grade", side_output="difficulty.json"),
    )
    description = "perplexity under a per-language reference LM, graded easy/medium/hard by corpus percentiles"
    params = {
        "model_dir": Param(SHIPPED_MODELS, "directory with one model subdirectory per language (en/, zh/, …) or one "
                                           "model for all; default: the shipped pipelines/models/lm",
                           Path(must_exist="dir", missing="is not a directory; pass --set difficulty.model_dir=DIR "
                                                          "with one subdirectory per language")),
        "backend": Param("ngram", "ngram (SentencePiece + KenLM, from `dsdata lm train`) or causal_lm "
                                  "(a Hugging Face AutoModelForCausalLM directory with its tokenizer)", Choice(BACKENDS)),
        "lang": Param(None, "language to assume when a document has no lang annotation or metadata; one "
                            "model_dir has a model for", Text(nonempty=True), nullable=True, choices=model_languages),
        "percentiles": Param([30, 60], "per-language percentiles that separate easy|medium|hard",
                             ListOf(Number(0, 100, open_min=True, open_max=True), length=2)),
        "cutoffs": Param(None, "fixed perplexity cut-offs instead: [easy_below, hard_above] for every language, "
                               "or {lang: [easy_below, hard_above]}; languages not listed use percentiles",
                         Cutoffs(), nullable=True),
        "outlier_percentile": Param(None, "reject documents above this per-language percentile (e.g. 99.5) "
                                          "with reason perplexity_outlier; null: reject none",
                                    Number(0, 100, open_min=True, open_max=True), nullable=True),
        "max_perplexity": Param(None, "reject documents whose perplexity exceeds this value (perplexity_outlier)",
                                Number(0, open_min=True), nullable=True),
        "unscored_grade": Param("medium", "grade of documents with no model for their language or no tokens "
                                          "(perplexity null): easy, medium, hard, or reject", Choice((*GRADES, "reject"))),
        "sampling_weights": Param({"easy": 0.5, "medium": 0.3, "hard": 0.2},
                                  "curriculum default: probability of drawing the next document from each bucket "
                                  "(written to difficulty.json; renormalised over non-empty buckets)", BucketWeights()),
        "batch_size": Param(64, "documents scored per model call", Integer(min=1)),
        "spill": Param(True, "scored documents wait for the corpus quantiles in files under RUN_DIR/.spill "
                             "(bounded memory on the in-process runner); false: they wait in the runner",
                       Boolean()),
        "device": Param("auto", "causal_lm device: auto (cuda when present), cpu, cuda, cuda:1", Text(nonempty=True)),
        "max_length": Param(1024, "causal_lm window in tokens (longer documents are scored window by window)",
                            Integer(min=1)),
    }
    annotations = {"perplexity": pa.float64(), "difficulty": pa.string()}
    side_outputs = (SideOutput(SUMMARY_FILE, ensure_ascii=False),)

    def validate(self) -> None:
        low, high = self.percentiles
        if not low < high:
            raise StageConfigError(f"difficulty.percentiles must be two numbers 0 < low < high < 100 "
                                   f"(got {self.percentiles!r})")
        if self.outlier_percentile is not None and not high < self.outlier_percentile:
            raise StageConfigError("difficulty.outlier_percentile must be a number between the high percentile "
                                   f"and 100 (got {self.outlier_percentile!r})")

    def transform_config(self) -> DifficultyConfig:
        return DifficultyConfig(
            stage_name=self.name, batch_size=self.batch_size, environment_errors=self.environment_errors,
            backend=self.backend, model_dir=self.model_dir, percentiles=tuple(self.percentiles),
            outlier_percentile=self.outlier_percentile, max_perplexity=self.max_perplexity,
            unscored_grade=self.unscored_grade,
        )

    # ---- scoring -------------------------------------------------------------------------------
    def setup(self) -> None:
        from dsdata.lm.scorers import ModelLoadError, language_model_dirs

        try:
            self._model_dirs = language_model_dirs(self.model_dir, self.backend)
        except ModelLoadError as exc:
            raise StageConfigError(str(exc)) from None
        self._scorers: dict[str, Any] = {}

    def language_of(self, doc: Document) -> str | None:
        lang = doc.annotations.get("lang") or doc.metadata.get("lang") or self.lang
        return str(lang) if lang else None

    def model_key(self, lang: str | None) -> str | None:
        """The model directory key serving `lang` (exact code, then its base code, then a shared model)."""
        dirs = self._model_dirs
        if lang is not None:
            for key in (lang, base_language(lang)):
                if key in dirs:
                    return key
        return "*" if "*" in dirs else None

    def _scorer(self, key: str):
        scorer = self._scorers.get(key)
        if scorer is None:
            from dsdata.lm.scorers import ModelLoadError, make_scorer

            try:
                scorer = make_scorer(self.backend, self._model_dirs[key], self.device, self.max_length)
            except ModelLoadError as exc:
                raise StageConfigError(str(exc)) from None
            self._scorers[key] = scorer
        return scorer

    def score_batch(self, docs: list[Document]) -> list[Document]:
        """Annotate `perplexity` (None when unscorable) and the model language used (`_lm`)."""
        from dsdata.lm.scorers import perplexity

        by_model: dict[str, list[int]] = {}
        for i, doc in enumerate(docs):
            key = self.model_key(self.language_of(doc))
            doc.annotations["perplexity"] = None
            if key is not None:
                by_model.setdefault(key, []).append(i)
        for key, idx in by_model.items():
            results = self._scorer(key).score_documents([docs[i].text for i in idx])
            for i, (log10_sum, n_tokens) in zip(idx, results):
                ppl = perplexity(log10_sum, n_tokens)
                docs[i].annotations["perplexity"] = ppl if ppl is None or math.isfinite(ppl) else None
        return docs

    # ---- grading -------------------------------------------------------------------------------
    def grouping_key(self, doc: Document) -> str:
        """The language a document's percentiles are computed over."""
        lang = self.language_of(doc)
        return lang if lang is not None else "unknown"

    def grade(self, doc: Document, cutoffs: tuple[float, float] | None, outlier: float | None) -> Document | Rejected:
        """Set `difficulty` from the perplexity and the language's cut-offs, or reject the tail."""
        ppl = doc.annotations.get("perplexity")
        if ppl is None:
            if self.unscored_grade == "reject":
                reason = "no_language_model" if self.model_key(self.language_of(doc)) is None else "no_tokens"
                return self.reject(doc, reason, f"lang={self.language_of(doc)}")
            doc.annotations["difficulty"] = self.unscored_grade
            return doc
        limit = min(x for x in (outlier, self.max_perplexity) if x is not None) if (
            outlier is not None or self.max_perplexity is not None) else None
        if limit is not None and ppl > limit:
            doc.annotations["difficulty"] = "hard"
            return self.reject(doc, "perplexity_outlier", f"perplexity {ppl:.1f} > {limit:.1f}")
        if cutoffs is None:
            doc.annotations["difficulty"] = "medium"
        elif ppl < cutoffs[0]:
            doc.annotations["difficulty"] = "easy"
        elif ppl > cutoffs[1]:
            doc.annotations["difficulty"] = "hard"
        else:
            doc.annotations["difficulty"] = "medium"
        return doc

    def fixed_cutoffs(self, group: str) -> tuple[float, float] | None:
        if self.cutoffs is None:
            return None
        return self.cutoffs.get(group) or self.cutoffs.get(base_language(group)) or self.cutoffs.get("*")

    def sampling_probabilities(self, counts: dict[str, int]) -> dict[str, float]:
        """The configured bucket weights renormalised over buckets that hold documents."""
        weights = {g: float(self.sampling_weights.get(g, 0.0)) if counts.get(g, 0) else 0.0 for g in GRADES}
        total = sum(weights.values())
        return {g: round(w / total, 6) if total else 0.0 for g, w in weights.items()}
