"""The augment stage's Beam graph.

back_translation, per document chosen by `is_selected`:
  plan (split into sentences) ─► RunInference pass 1 (source → pivot)
                              ─► RunInference pass 2 (pivot → source)
                              ─► CoGroupByKey with the plan ─► reassemble ─► chrF window
synonym / entity: one DoFn each.  Originals always pass through unchanged.

Copies outside the window (and empty translations) are never emitted, only counted (Metrics and
RUN_DIR/augment.json), so the ledger counts only copies that exist.
"""
from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from time import thread_time
from typing import Any, Iterable, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, PredictionResult, RunInference

from dsdata.augment.language import document_language
from dsdata.augment.records import STAGE_NAME, augmented_copy, is_selected, stable_hash
from dsdata.augment.replace import EntityReplacer, SynonymReplacer
from dsdata.augment.sentences import Layout, split_sentences
from dsdata.augment.similarity import chrf
from dsdata.augment.translate import load_translator
from dsdata.beam.errors import (ERROR, environment_failure, error_rejection, first_line,
                                retry_one_at_a_time, passes_through)
from dsdata.beam.spill import spill_directory
from dsdata.beam.park import FlattenParked
from dsdata.beam.transforms import CPU_COUNTER, REJECTED, StageCounters
from dsdata.document import Document, Rejected
from dsdata.stages.augment import REPORT_NAME, AugmentConfig, BackTranslationConfig, ReplacementConfig

METRICS_NAMESPACE = "dsdata.augment"
PIVOT = {"en": "zh", "zh": "en"}
_OUTCOME = "outcome"


def _count(method: str, outcome: str, n: int = 1):
    Metrics.counter(METRICS_NAMESPACE, f"{method}.{outcome}").inc(n)
    return beam.pvalue.TaggedOutput(_OUTCOME, (method, outcome, n))


@dataclass(frozen=True)
class TranslationFailed:
    """The translation of a sentence whose model call raised."""

    detail: str


class _Errors(StageCounters):
    """The augment DoFns' CPU time and their one way to fail: the copy they were making is rejected
    (reason `error`); the original document always passes through the stage unchanged."""

    def setup(self):
        self._init_counters(STAGE_NAME)

    def _failed_copy(self, doc: Document, method: str, detail: str):
        copy = augmented_copy(doc, method, doc.text, None)
        return self._route(self._failed(Rejected(copy, STAGE_NAME, ERROR, f"{method}: {detail}")))

    def _guarded(self, doc: Document, method: str, make, *on_error: str) -> list:
        """make()'s outputs, its CPU time counted; when it raises (not a stop), the `on_error`
        outcomes and the failed copy of `doc` instead."""
        start = self._clock_start()
        try:
            outputs = make()
        except BaseException as exc:  # noqa: BLE001 - no copy of this document; the run goes on
            if passes_through(exc):  # a stop, not the record's fault; a native panic is
                raise
            outputs = [*(_count(method, outcome) for outcome in on_error),
                       self._failed_copy(doc, method, error_rejection(doc, STAGE_NAME, exc).detail)]
        self._clock_stop(start)
        return outputs


class LoadedTranslators(dict):
    """direction → Seq2SeqTranslator; a dict subclass: Beam's Shared needs a weak reference to it."""


class TranslationHandler(ModelHandler):
    """RunInference handler for (direction, text, seed) examples; both directions' models (Beam's
    Hugging Face handlers import TensorFlow)."""

    def __init__(self, config: BackTranslationConfig):
        super().__init__(min_batch_size=config.batch_size, max_batch_size=config.batch_size)
        self.config = config

    def load_model(self):
        if self.config.threads > 0:
            import torch

            torch.set_num_threads(self.config.threads)
        try:
            return LoadedTranslators(
                (direction, load_translator(
                    model_dir, f"model_{direction}", self.config.device,
                    self.config.target_tokens.get(direction.split("_")[1], ""),
                ))
                for direction, model_dir in self.config.model_dirs.items()
            )
        except Exception as exc:  # noqa: BLE001 - a model that cannot be loaded is no record's fault
            raise environment_failure(STAGE_NAME, exc, " cannot start") from exc

    def run_inference(self, batch: Sequence[tuple[str, Any, int]], model, inference_args=None) -> Iterable[PredictionResult]:
        start = thread_time()
        translations: list[Any] = [""] * len(batch)
        rows_by_direction: dict[str, list[int]] = defaultdict(list)
        for row, (direction, text, _seed) in enumerate(batch):
            if isinstance(text, TranslationFailed):  # pass 1 failed: nothing to translate back
                translations[row] = text
            elif text.strip():  # an empty pivot stays empty instead of becoming model noise
                rows_by_direction[direction].append(row)
        for direction, rows in rows_by_direction.items():
            for row, text in zip(rows, self._translate(model[direction], [batch[r] for r in rows])):
                translations[row] = text
        Metrics.counter(METRICS_NAMESPACE, "back_translation.sentences_translated").inc(len(batch))
        # Counted per batch (one counter lookup for many sentences), like the DoFns' per-bundle flush.
        Metrics.counter(METRICS_NAMESPACE, CPU_COUNTER).inc(round((thread_time() - start) * 1e6))
        return [PredictionResult(example, translation) for example, translation in zip(batch, translations)]

    def _translate(self, translator, examples: list[tuple[str, str, int]]) -> list[Any]:
        """Translations of `examples`; when the batch raises, each sentence alone, and a sentence that
        raises alone becomes a TranslationFailed (its document's copy is rejected, reason `error`)."""
        config = self.config

        def translate(some: Sequence[tuple[str, str, int]]) -> list[Any]:
            return translator.translate([e[1] for e in some], [e[2] for e in some], config.settings,
                                        config.batch_size if len(some) > 1 else 1)

        return retry_one_at_a_time(STAGE_NAME, examples, translate,
                                   lambda _example, exc: TranslationFailed(first_line(exc)), config.environment_errors)

    def get_num_bytes(self, batch: Sequence[tuple[str, Any, int]]) -> int:
        return sum(len(text.encode("utf-8")) for _direction, text, _seed in batch if isinstance(text, str))

    def get_metrics_namespace(self) -> str:
        return METRICS_NAMESPACE


@dataclass
class RoundTripPlan:
    doc: Document
    source_lang: str
    layout: Layout


class PlanRoundTrips(_Errors, beam.DoFn):
    """Chosen zh/en documents → a plan (main output) and one pass-1 example per sentence."""

    SENTENCES = "sentences"

    def __init__(self, config: BackTranslationConfig):
        self.config = config

    def process(self, doc: Document):
        yield from self._guarded(doc, "back_translation", lambda: self._plan(doc), "selected", "dropped_error")

    def _plan(self, doc: Document) -> list:
        config = self.config
        lang = document_language(doc)
        if lang not in config.languages or not is_selected(config.seed, "back_translation", doc.id, config.fraction):
            return []
        layout = split_sentences(doc.text, config.max_sentence_chars)
        if not layout.sentences:
            return [_count("back_translation", "selected"), _count("back_translation", "skipped_no_text")]
        # Duplicate ids with different texts must not share sentences: key by id and text.
        doc_key = f"{doc.id}\x1f{stable_hash(doc.text)}"
        direction = f"{lang}_{PIVOT[lang]}"
        out = [_count("back_translation", "selected"), (doc_key, RoundTripPlan(doc, lang, layout))]
        for index, sentence in enumerate(layout.sentences):
            seed = stable_hash(config.seed, "pass1", doc.id, index)
            out.append(beam.pvalue.TaggedOutput(self.SENTENCES, ((doc_key, index), (direction, sentence, seed))))
        return out


def _second_pass(keyed: tuple[tuple[str, int], PredictionResult], seed: int):
    (doc_key, index), result = keyed
    direction, _text, _seed = result.example
    source, pivot = direction.split("_")
    return (doc_key, index), (f"{pivot}_{source}", result.inference, stable_hash(seed, "pass2", doc_key, index))


def _by_document(keyed: tuple[tuple[str, int], PredictionResult]):
    (doc_key, index), result = keyed
    return doc_key, (index, result.inference)


class AssembleRoundTrips(_Errors, beam.DoFn):
    """Plan + translated sentences → the augmented copy, if its chrF lies in the window."""

    def __init__(self, config: BackTranslationConfig):
        self.config = config

    def process(self, grouped: tuple[str, dict[str, list[Any]]]):
        _doc_key, parts = grouped
        translated = dict(parts["back"])
        for plan in parts["plan"]:
            missing = [i for i in range(len(plan.layout.sentences)) if i not in translated]
            if missing:
                raise RuntimeError(f"augment: document {plan.doc.id!r} lost translations of sentences {missing[:5]}")
            sentences = range(len(plan.layout.sentences))
            yield from self._guarded(plan.doc, "back_translation",
                                     lambda: self._assemble(plan, [translated[i] for i in sentences]), "dropped_error")

    def _assemble(self, plan: RoundTripPlan, sentences: list[Any]) -> list:
        failed = [s for s in sentences if isinstance(s, TranslationFailed)]
        if failed:
            return [_count("back_translation", "dropped_error"),
                    self._failed_copy(plan.doc, "back_translation", failed[0].detail)]
        text = plan.layout.join(sentences)
        out = [_count("back_translation", "made")]
        if not text.strip():
            return out + [_count("back_translation", "dropped_empty")]
        similarity = chrf(text, plan.doc.text)
        if not self.config.min_sim <= similarity <= self.config.max_sim:
            return out + [_count("back_translation", "dropped_out_of_window")]
        return out + [_count("back_translation", "kept"),
                      augmented_copy(plan.doc, "back_translation", text, round(similarity, 6))]


class BackTranslate(beam.PTransform):
    """PCollection[Document] → {"docs": augmented copies, "outcomes": (method, outcome, n),
    "rejected": the copies whose making raised}."""

    def __init__(self, config: BackTranslationConfig):
        super().__init__()
        self.config = config

    def expand(self, docs):
        handler = KeyedModelHandler(TranslationHandler(self.config))
        planned = docs | "Plan" >> beam.ParDo(PlanRoundTrips(self.config)).with_outputs(
            PlanRoundTrips.SENTENCES, _OUTCOME, REJECTED, main="plans"
        )
        back = (
            planned[PlanRoundTrips.SENTENCES]
            | "ToPivot" >> RunInference(handler)
            | "Reverse" >> beam.Map(_second_pass, self.config.seed)
            | "FromPivot" >> RunInference(handler)
            | "ByDocument" >> beam.Map(_by_document)
        )
        assembled = (
            {"plan": planned["plans"], "back": back}
            | "Join" >> beam.CoGroupByKey()
            | "Assemble" >> beam.ParDo(AssembleRoundTrips(self.config)).with_outputs(_OUTCOME, REJECTED, main="docs")
        )
        outcomes = (planned[_OUTCOME], assembled[_OUTCOME]) | "Outcomes" >> beam.Flatten()
        rejected = (planned[REJECTED], assembled[REJECTED]) | "Failed" >> beam.Flatten()
        return {"docs": assembled["docs"], "outcomes": outcomes, REJECTED: rejected}


class ReplaceTerms(_Errors, beam.DoFn):
    """Chosen documents → a copy with dictionary terms replaced (none if nothing matched)."""

    def __init__(self, config: ReplacementConfig):
        self.config = config

    def setup(self):
        super().setup()
        replacer = SynonymReplacer if self.config.method == "synonym" else EntityReplacer
        param = "synonyms" if self.config.method == "synonym" else "entities"
        try:
            self.replacer = replacer(self.config.path, param)
        except Exception as exc:  # noqa: BLE001 - a dictionary that cannot be loaded is no record's fault
            raise environment_failure(STAGE_NAME, exc, " cannot start") from exc

    def process(self, doc: Document):
        config = self.config
        if not is_selected(config.seed, config.method, doc.id, config.fraction):
            return
        yield _count(config.method, "selected")
        yield from self._guarded(doc, config.method, lambda: self._replace(doc), "dropped_error")

    def _replace(self, doc: Document) -> list:
        config = self.config
        rng = random.Random(stable_hash(config.seed, config.method, "rng", doc.id))
        result = self.replacer.apply(doc.text, rng, config.replace_prob)
        if result.replaced == 0:
            return [_count(config.method, "skipped_no_match")]
        return [_count(config.method, "made"), _count(config.method, "kept"),
                augmented_copy(doc, config.method, result.text, round(chrf(result.text, doc.text), 6))]


def report_from_counts(counts: Iterable[tuple[tuple[str, str], int]], methods: Sequence[str]) -> dict[str, Any]:
    """augment.json: per method selected/made/kept and dropped per reason, plus totals."""
    def empty() -> dict[str, Any]:
        return {"selected": 0, "made": 0, "kept": 0, "dropped": {}, "skipped": {}}

    report: dict[str, Any] = {method: empty() for method in methods}
    for (method, outcome), n in counts:
        entry = report.setdefault(method, empty())
        kind, _, reason = outcome.partition("_")
        if kind in ("dropped", "skipped") and reason:
            entry[kind][reason] = entry[kind].get(reason, 0) + n
        else:
            entry[outcome] = entry.get(outcome, 0) + n
    entries = [report[m] for m in report]
    report["total"] = {
        "made": sum(e["made"] for e in entries),
        "kept": sum(e["kept"] for e in entries),
        "dropped": sum(sum(e["dropped"].values()) for e in entries),
    }
    return report


class Augment(beam.PTransform):
    """The whole stage: originals plus every method's copies as "kept", the copies whose making raised
    as "rejected", and the outcome counts as the report (augment.json)."""

    def __init__(self, config: AugmentConfig, spill_dir: str | None = None):
        super().__init__()
        self.config, self.spill_dir = config, spill_dir

    def expand(self, docs):
        kept = [docs]
        outcomes, failed = [], []
        if self.config.back_translation is not None:
            out = docs | "BackTranslation" >> BackTranslate(self.config.back_translation)
            kept.append(out["docs"])
            outcomes.append(out["outcomes"])
            failed.append(out[REJECTED])
        for config in self.config.replacements:
            out = docs | f"Replace_{config.method}" >> beam.ParDo(ReplaceTerms(config)).with_outputs(
                _OUTCOME, REJECTED, main="docs")
            kept.append(out["docs"])
            outcomes.append(out[_OUTCOME])
            failed.append(out[REJECTED])
        report = (
            outcomes
            | "AllOutcomes" >> beam.Flatten(pipeline=docs.pipeline)
            | "OutcomeKeys" >> beam.Map(lambda item: ((item[0], item[1]), item[2]))
            | "SumOutcomes" >> beam.CombinePerKey(sum)
            | "GatherOutcomes" >> beam.combiners.ToList()
            | "Report" >> beam.Map(report_from_counts, self.config.methods)
        )
        # Originals are never rejected; a copy whose making raised is (reason `error`), and counts as
        # augmented in the ledger like every derived document.
        rejected = failed | "AllFailed" >> beam.Flatten(pipeline=docs.pipeline)
        # Originals and copies wait for the next stage in spill files under `spill_dir`, not in the
        # runner (dsdata/beam/park.py).
        return {"kept": tuple(kept) | "AllKept" >> FlattenParked(self.spill_dir), "rejected": rejected, REPORT_NAME: report}


def composite(stage, context) -> Augment:
    """The augment stage's transform; its documents are parked under the run directory."""
    return Augment(stage.transform_config(), spill_directory(context.run_dir, stage.name))
