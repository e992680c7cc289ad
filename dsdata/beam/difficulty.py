"""The difficulty stage as a two-pass composite: score → per-language quantiles → grade.

  docs ─► full_batches ─► score (perplexity) ─┬─► (lang, perplexity) ─► log histogram per language
                                               │                               │ side input (AsDict)
                                               └─► parked in spill files ─► grade ─► kept / rejected
  kept + rejected ─► counts per (lang, grade) ─► summary (cut-offs, counts, sampling weights): the
                                                 stage's stats and OUT/difficulty.json (the builder writes it)

No document can be graded before all quantiles are known: with a spill directory (`spill: true`,
the default) the scored documents wait in spill files under RUN_DIR/.spill/difficulty, not in the
runner (an unspillable one waits in the runner); grading reads one file at a time.
"""
from __future__ import annotations

import bisect
import math
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from dsdata.beam.spill import make_private_dir, spill_directory
from dsdata.beam.park import bundle_spill, park, parked_entries, read_entry
from dsdata.beam.errors import retry_one_at_a_time, passes_through
from dsdata.beam.transforms import ANY_OUTPUT, KEPT, REJECTED, StageStepDoFn, full_batches
from dsdata.document import Document, Rejected, pack_document, unpack_document
from dsdata.stages.difficulty import GRADES, SUMMARY_FILE, DifficultyConfig, DifficultyStage

# Width of one histogram bin in natural-log units: a bin spans a factor e ** 1e-4, so a percentile
# read from the histogram is within 0.01 % of the value numpy.percentile gives on the same values.
BIN_WIDTH = 1e-4
# The tag of _ScoreDoFn's (grouping key, perplexity) of every scored document; its main output is
# the entries (dsdata/beam/park.py) of the scored documents waiting to be graded.
_PERPLEXITY = "perplexity"
_WAITING = "waiting"


class LogHistogram(beam.CombineFn):
    """Perplexities → [{bin: count}, smallest, largest], bins of BIN_WIDTH in log(value).

    Integer counts per fixed bin and the exact extremes merge to the same result in any order and
    grouping (Beam's ApproximateQuantiles do not); one entry per occupied bin, whatever the corpus."""

    def create_accumulator(self):
        return [{}, math.inf, -math.inf]

    def add_input(self, acc, value):
        value = float(value)
        counts = acc[0]
        # Perplexities are finite and >= 1 (non-finite ones are annotated null and never get here);
        # anything else is clamped into the lowest bin rather than raising inside a combine.
        b = math.floor(math.log(value) / BIN_WIDTH) if value > 0 and math.isfinite(value) else -10 ** 9
        counts[b] = counts.get(b, 0) + 1
        acc[1] = min(acc[1], value)
        acc[2] = max(acc[2], value)
        return acc

    def merge_accumulators(self, accumulators):
        merged = self.create_accumulator()
        counts = merged[0]
        for acc in accumulators:
            for b, n in acc[0].items():
                counts[b] = counts.get(b, 0) + n
            merged[1] = min(merged[1], acc[1])
            merged[2] = max(merged[2], acc[2])
        return merged

    def extract_output(self, acc):
        return acc


def percentiles_from_histogram(histogram, percentiles) -> list[float]:
    """numpy.percentile's linear interpolation, each order statistic read from its bin (geometrically
    by rank, clamped to the exact extremes): within 0.01 % of the exact value."""
    counts, smallest, largest = histogram
    bins = sorted(counts.items())
    total = sum(n for _, n in bins)
    starts, running = [], 0
    for _, n in bins:
        starts.append(running)
        running += n

    def order_statistic(rank: int) -> float:
        if rank <= 0:
            return smallest
        if rank >= total - 1:
            return largest
        i = bisect.bisect_right(starts, rank) - 1
        b, n = bins[i]
        value = math.exp((b + (rank - starts[i] + 0.5) / n) * BIN_WIDTH)
        return min(max(value, smallest), largest)

    out = []
    for p in percentiles:
        pos = p / 100.0 * (total - 1)
        low = math.floor(pos)
        a = order_statistic(low)
        out.append(a + (order_statistic(low + 1) - a) * (pos - low) if pos > low else a)
    return out


@ANY_OUTPUT
class _ScoreDoFn(StageStepDoFn):
    """Batches → scored documents as park entries (dsdata/beam/park.py: spill files with `spill_dir`);
    a document that raises alone is rejected (reason `error`).  Each scored document's (group,
    perplexity) goes to tag `perplexity`."""

    def setup(self):
        super().setup()
        if self.spill_dir:
            make_private_dir(self.spill_dir)

    def start_bundle(self):
        self._spill = bundle_spill(self.spill_dir) if self.spill_dir else None

    def process(self, batch: list[Document]):
        docs = list(batch)
        start = self._clock_start()
        declared = self.stage.environment_errors
        results = retry_one_at_a_time(self.stage.name, docs, self.stage.score_batch,
                                      lambda doc, exc: self._error(doc, exc, declared), declared)
        out = []
        for result in results:
            if isinstance(result, Rejected):  # scored documents are counted when graded
                self._in.inc()
                out.append(self._route(result))
                continue
            perplexity = result.annotations.get("perplexity")
            if perplexity is not None:
                out.append(beam.pvalue.TaggedOutput(_PERPLEXITY, (self.stage.grouping_key(result), perplexity)))
            entry = park(self._spill, result, pack_document) if self._spill else (False, result)
            if entry is not None:
                out.append(entry)
        self._clock_stop(start)
        return out

    def finish_bundle(self):
        super().finish_bundle()
        for entry in parked_entries(self._spill) if self._spill else ():
            yield GlobalWindows.windowed_value(entry)


def _thresholds(stage: DifficultyStage):
    def build(item: tuple[str, list]):
        lang, histogram = item
        low, high = stage.percentiles
        outlier = stage.outlier_percentile
        shown = (0, 10, 50, 90, 100)
        wanted = (low, high, *shown, *(() if outlier is None else (outlier,)))
        at = dict(zip(wanted, percentiles_from_histogram(histogram, wanted)))
        return lang, {
            "percentile_cutoffs": [at[low], at[high]],
            "outlier_threshold": at[outlier] if outlier is not None else None,
            "perplexity_percentiles": {f"p{p}": round(at[p], 4) for p in shown},
        }

    return build


class _GradeDoFn(StageStepDoFn):
    """Entries of scored documents (a document, or a spill file of them read one record at a time)
    → each document graded against the quantiles."""

    def process(self, entry, thresholds: dict[str, dict[str, Any]]):
        for doc in read_entry(self.spill_dir, entry, unpack_document):
            yield self._graded(doc, thresholds)

    def _graded(self, doc: Document, thresholds: dict[str, dict[str, Any]]):
        self._in.inc()
        start = self._clock_start()
        try:
            group = self.stage.grouping_key(doc)
            found = thresholds.get(group) or {}
            cutoffs = self.stage.fixed_cutoffs(group) or found.get("percentile_cutoffs")
            result = self.stage.grade(doc, cutoffs, found.get("outlier_threshold"))
        except BaseException as exc:  # noqa: BLE001 - one record's exception rejects that record only
            if passes_through(exc):  # a stop, not the record's fault; a native panic is
                raise
            result = self._error(doc, exc, self.stage.environment_errors)
        self._clock_stop(start)
        return self._route(result)


def _count_key(stage: DifficultyStage):
    def key(item: Document | Rejected):
        if isinstance(item, Rejected):
            return stage.grouping_key(item.doc), "rejected", item.reason
        scored = "scored" if item.annotations.get("perplexity") is not None else "unscored"
        return stage.grouping_key(item), scored, item.annotations.get("difficulty")

    return key


def summarize(stage: DifficultyStage, config: DifficultyConfig, counts: list[tuple[tuple[str, str, str], int]],
              thresholds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """difficulty.json: per-language cut-offs and bucket counts, and curriculum sampling weights."""
    languages: dict[str, dict[str, Any]] = {}
    for (lang, kind, value), n in sorted(counts):
        entry = languages.setdefault(lang, {"documents": 0, "scored": 0, "unscored": 0,
                                            "counts": {g: 0 for g in GRADES}, "rejected": {}})
        entry["documents"] += n
        if kind == "rejected":
            entry["rejected"][value] = entry["rejected"].get(value, 0) + n
            continue
        entry[kind] += n
        entry["counts"][value] = entry["counts"].get(value, 0) + n
    totals = {g: 0 for g in GRADES}
    for lang, entry in languages.items():
        found = thresholds.get(lang) or {}
        fixed = stage.fixed_cutoffs(lang)
        entry["cutoff_source"] = "fixed" if fixed else ("percentiles" if found else "none")
        cut = fixed or found.get("percentile_cutoffs")
        entry["cutoffs"] = {"easy_below": round(cut[0], 4), "hard_above": round(cut[1], 4)} if cut else None
        entry["outlier_threshold"] = (round(found["outlier_threshold"], 4)
                                      if found.get("outlier_threshold") is not None else None)
        entry["perplexity_percentiles"] = found.get("perplexity_percentiles")
        entry["sampling_weights"] = stage.sampling_probabilities(entry["counts"])
        for g in GRADES:
            totals[g] += entry["counts"].get(g, 0)
    return {
        "backend": config.backend,
        "model_dir": config.model_dir,
        "percentiles": config.percentiles,
        "outlier_percentile": config.outlier_percentile,
        "max_perplexity": config.max_perplexity,
        "unscored_grade": config.unscored_grade,
        "counts": totals,
        # Probability of drawing the next training document from each bucket (the curriculum default;
        # the trainer may anneal from these towards the natural proportions in `counts`).
        "sampling_weights": stage.sampling_probabilities(totals),
        # A spec for dsdata.train.curriculum.schedule_from_spec: start at `sampling_weights`, move
        # linearly to the corpus' own mix over the first 30 % of training.
        "curriculum": {"schedule": "linear", "warmup_fraction": 0.3,
                       "start": stage.sampling_probabilities(totals),
                       "end": {g: round(n / sum(totals.values()), 6) if sum(totals.values()) else 0.0
                               for g, n in totals.items()}},
        "languages": dict(sorted(languages.items())),
    }


class GradeByPerplexity(beam.PTransform):
    """PCollection[Document] → {"kept", "rejected", "stats" and "difficulty.json": one summary dict}."""

    def __init__(self, stage: DifficultyStage, config: DifficultyConfig, spill_dir: str | None = None):
        super().__init__()
        self.stage, self.config, self.spill_dir = stage, config, spill_dir

    def expand(self, docs):
        stage, config = self.stage, self.config
        scored = (
            docs
            | "Batch" >> full_batches(config.batch_size)
            | "Score" >> beam.ParDo(_ScoreDoFn(stage, self.spill_dir)).with_outputs(
                _PERPLEXITY, REJECTED, main=_WAITING)
        )
        failed = scored[REJECTED]
        thresholds = (
            scored[_PERPLEXITY]
            | "Quantiles" >> beam.CombinePerKey(LogHistogram())
            | "Thresholds" >> beam.Map(_thresholds(stage))
        )
        side = beam.pvalue.AsDict(thresholds)
        graded = scored[_WAITING] | "Grade" >> beam.ParDo(_GradeDoFn(stage, self.spill_dir), side).with_outputs(
            REJECTED, main=KEPT)
        kept = graded[KEPT]
        rejected = (graded[REJECTED], failed) | "AllRejected" >> beam.Flatten()
        # Counted where each is produced: a Flatten of the documents themselves would hold every
        # graded document in the in-process runner until the last of them is graded (park.py).
        summary = (
            (kept | "CountKeptKeys" >> beam.Map(_count_key(stage)),
             rejected | "CountRejectedKeys" >> beam.Map(_count_key(stage)))
            | "AllCountKeys" >> beam.Flatten()
            | "Count" >> beam.combiners.Count.PerElement()
            | "Gather" >> beam.combiners.ToList()
            | "Summary" >> beam.Map(lambda counts, found: summarize(stage, config, counts, found), side)
        )
        return {KEPT: kept, REJECTED: rejected, "stats": summary, SUMMARY_FILE: summary}


def composite(stage: DifficultyStage, context) -> GradeByPerplexity:
    """The difficulty stage's transform; spilled under the run directory unless `spill: false`."""
    spill_dir = spill_directory(context.run_dir, stage.name) if stage.spill else None
    return GradeByPerplexity(stage, stage.transform_config(), spill_dir)
