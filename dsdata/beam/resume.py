"""Runs that resume where they died: the recipe's leading per-document stages are committed per unit
(docs/resume.md).

Each unit (an input file, or a range of one) is read and run through the committed stages by ONE
DoFn call (CommitUnitsDoFn), whose results go to OUT/resume/units and are committed once the unit is
done.  `--resume` checks OUT/resume/fingerprint.json against its own, then reads committed units back
instead of their inputs; the whole-corpus stages then run over everything, so every output is what
an uninterrupted run writes.  A unit reader's UNIT_LEDGER output carries ("count", ("input",), n) and
("resume", "reused" | "processed", (1, records)) per unit.
"""
from __future__ import annotations

import contextlib
import glob
import itertools
import json
import logging
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.utils import shared

from dsdata import __version__
from dsdata.beam.errors import StageEnvironmentError
from dsdata.beam.kinds import batch_run, committable
from dsdata.beam.location import ObjectSizes
from dsdata.beam.transforms import (UNIT_LEDGER, Batch, FileRange, ReadFileDoFn, all_cuttable, matched_files,
                                    run_batch_chain)
from dsdata.io.inputs import shown_path
from dsdata.io.local_paths import path_stat
from dsdata.io.readers import READ_STAGE
from dsdata.io.resume import (FINGERPRINT_FORMAT, CommitGroup, CommittedUnit, CommittedUnitDamaged, CommittedWork,
                              committed_index, continue_committed, input_digest, path_fingerprint, read_fingerprint,
                              read_unit, remove_resume_folder, start_fresh, unfinished_units, unit_key, unit_problem)
from dsdata.stages import Stage

log = logging.getLogger("dsdata")


@dataclass
class CommitPlan:
    """How a run commits: `stages` leading stages per unit into `work` (None: the run commits
    nothing, `why_not` says why).  `resume`: the run was asked to resume (stats.json says what it reused)."""

    stages: int
    work: CommittedWork | None
    resume: bool
    why_not: str | None = None

    def stats(self, counts: dict[str, list[int]]) -> dict[str, Any] | None:
        """stats.json's "resume" (only on --resume runs): units and input records reused and processed."""
        if not self.resume:
            return None
        if self.work is None:
            return {"resumed": False, "why_not": self.why_not}
        out: dict[str, Any] = {"resumed": self.work.resumed}
        for what, index in (("units", 0), ("records", 1)):
            out[what] = {kind: counts.get(kind, [0, 0])[index] for kind in ("reused", "processed")}
        return out


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def input_listing(patterns: list[str]) -> dict[str, list | None]:
    """The files the patterns name now: path → [size in bytes, modification time] (None: nothing
    matches it now).  A local named file is stat-ed (ns), any other pattern listed by Beam (seconds)."""
    listing: dict[str, list | None] = {}
    objects = ObjectSizes()
    for pattern in patterns:
        if "://" not in pattern and not glob.has_magic(pattern):
            try:
                info = path_stat(pattern)  # a path of any length, as the readers open it
                listing[shown_path(pattern)] = [info.st_size, info.st_mtime_ns]
            except OSError:
                listing[shown_path(pattern)] = None
            continue
        try:
            found = matched_files(pattern, objects)
        except Exception:  # noqa: BLE001 - unmatchable: its reading fails, and so does its fingerprint
            found = []
        if not found:
            listing[shown_path(pattern)] = None
        for meta in found:
            listing[shown_path(meta.path)] = [meta.size_in_bytes, meta.last_updated_in_seconds]
    return listing


def run_fingerprint(recipe, stages: list[Stage], n_committed: int) -> dict[str, Any]:
    """What a resumed run must share with the run that committed: the recipe after --set, dsdata's
    version, the files the committed stages' path parameters name, and the input files."""
    stage_files = {}
    for stage in stages[:n_committed]:
        for key, spec in type(stage).params.items():
            value = getattr(stage, key)
            if not spec.is_path or value is None:
                continue
            paths = value if isinstance(value, list) else [value]
            for i, path in enumerate(paths):
                name = f"{stage.name}.{key}" + (f"[{i}]" if isinstance(value, list) else "")
                stage_files[name] = path_fingerprint(str(path))
    return {
        "format": FINGERPRINT_FORMAT,
        "dsdata_version": __version__,
        "recipe": _jsonable({
            "name": recipe.name, "input_format": recipe.input_format, "text_field": recipe.text_field,
            "id_field": recipe.id_field, "committed_stages": n_committed,
            "stages": [{"name": s.name, "params": s.parameter_values()} for s in stages],
        }),
        "stage_files": stage_files,
        "inputs": input_listing(list(recipe.inputs)),
    }


def plan_commits(recipe, stages: list[Stage], output: str, several_workers: bool, resume: bool) -> CommitPlan:
    """Decide how this run commits, set up OUT/resume, and (resume) check that OUT's committed work
    is this run's: ResumeRefused (one line, nothing touched) when it is not.  Called under OUT's lock
    before the run's old outputs are removed."""
    n = len(list(itertools.takewhile(committable, stages)))  # the leading stages committed per unit
    local = "://" not in output
    if resume and local:
        recorded = read_fingerprint(output)
        if recorded is not None:
            # Same recipe, so n > 0.  Resuming commits even where several workers cannot cut a big
            # file: the committed work is worth more than the spread.
            work = continue_committed(output, run_fingerprint(recipe, stages, n), recorded)
            log.info("resuming %s: %d unit(s) committed by the earlier run", output, work.committed)
            return CommitPlan(n, work, resume=True)
        log.warning("--resume: %s holds no committed work to resume; starting a fresh run", output)
    if not local:
        why_not = "the output is remote (object stores have no atomic rename to commit with)"
    elif recipe.limit is not None:
        why_not = "a --limit run commits nothing"
    elif n == 0:
        why_not = "the recipe has no per-document stage before its first whole-corpus stage"
    elif several_workers and not all_cuttable(list(recipe.inputs), recipe.input_format):
        why_not = ("several workers read the inputs and a big one cannot be cut into ranges, so its documents "
                   "are spread after reading")
    else:
        why_not = None
    if local:
        units = unfinished_units(output)
        if units and not resume:
            log.info("%s holds the committed work of an unfinished run (%d unit(s)); this run replaces it "
                     "(dsdata run --resume continues such a run)", output, units)
        if why_not is not None:
            remove_resume_folder(output)
    if why_not is not None:
        if resume:
            log.warning("--resume: this run commits nothing: %s", why_not)
        return CommitPlan(0, None, resume, why_not)
    return CommitPlan(n, start_fresh(output, run_fingerprint(recipe, stages, n)), resume)


def unit_description(element: fileio.FileMetadata | FileRange) -> list:
    """A unit as plain data: ["file", path] or ["range", path, format, start, end, first line]."""
    if isinstance(element, FileRange):
        return ["range", element.path, element.fmt, element.start, element.end, element.first_line]
    return ["file", element.path]


def unit_content(element: fileio.FileMetadata | FileRange) -> str:
    """The digest of a unit's input bytes: a JSON Lines range's, a whole file's otherwise (a Parquet
    range's row groups lie anywhere in it); "" when the file cannot be opened."""
    jsonl = isinstance(element, FileRange) and element.fmt == "jsonl"
    try:
        return input_digest(element.path, element.start if jsonl else 0, element.end if jsonl else None)
    except OSError:
        return ""


class CommitUnitsDoFn(ReadFileDoFn):
    """Reads a unit, runs the committed stages on each batch and writes the results to OUT/resume/units;
    finished units are committed in groups (CommitGroup), the last when the bundle ends or a unit
    fails.  With `resumed`, a committed unit is read back instead.  Main output: the batches after
    the committed stages; UNIT_LEDGER: each unit's entries."""

    def __init__(self, fmt: str, text_field: str, id_field: str, batch_docs: int, stages: list[Stage],
                 units_dir: str, resumed: bool):
        super().__init__(fmt, text_field, id_field, batch_docs)
        self.stages, self.units_dir, self.resumed = list(stages), units_dir, resumed
        self._shared = [shared.Shared() for _ in self.stages]  # made here: one handle per stage for every worker

    def setup(self):
        super().setup()
        self._runs = [batch_run(stage, handle) for stage, handle in zip(self.stages, self._shared)]
        self._committed = committed_index(self.units_dir) if self.resumed else {}
        self._group: CommitGroup | None = None

    def process(self, element: fileio.FileMetadata | FileRange):
        description = unit_description(element)
        unit = self._committed.get(unit_key(description))
        content = unit_content(element)  # before reading: a change while it is read is seen on resume
        if unit is not None:
            why = unit_problem(unit, description, content)
            if why is None:
                yield from self._reuse(unit)
                return
            log.warning("committed unit %s is not reused: %s; reading it again", shown_path(element.path), why)
        yield from self._process(element, description, content)

    def _process(self, element, description: list, content: str):
        if self._group is None:
            self._group = CommitGroup(self.units_dir)
        group = self._group
        group.begin(description, content)
        n_input = records = 0
        try:
            for chunk in self._chunks(element, self.batch_docs):
                records += len(chunk)
                batch = self._batch(chunk)
                n_input += len(batch.docs)
                batch = run_batch_chain(self._runs, batch)
                if batch is None:
                    continue
                group.add(batch.docs, batch.rejected)  # before any later stage can change the documents
                yield batch
        except BaseException:
            group.drop()
            with contextlib.suppress(OSError):  # what stopped the unit is the error to report
                self._commit_group()  # the units finished before this one
            raise
        if not group.end():
            log.info("%s is not committed (%s); a resumed run reads it again", shown_path(element.path), group.spoiled)
        if group.due():
            self._commit_group()
        yield beam.pvalue.TaggedOutput(UNIT_LEDGER, ("count", ("input",), n_input))
        yield beam.pvalue.TaggedOutput(UNIT_LEDGER, ("resume", "processed", (1, records)))

    def _commit_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.commit()

    def _reuse(self, unit: CommittedUnit):
        """The committed unit's batches, timed and counted as the read stage's work."""
        n_input = records = 0
        batches = iter(read_unit(unit))
        while True:
            start = self._clock_start()
            try:
                part = next(batches, None)
            except CommittedUnitDamaged as exc:  # a crafted file whose marker matches: the run stops
                raise StageEnvironmentError(str(exc)) from None
            self._clock_stop(start)
            if part is None:
                break
            docs, rejected = part
            records += len(docs) + len(rejected)
            # A committed stage's rejections were input documents; the reader's own were not read.
            n_input += len(docs) + sum(r.stage != READ_STAGE for r in rejected)
            self._in.inc(len(docs) + len(rejected))
            yield Batch(docs, rejected)
        yield beam.pvalue.TaggedOutput(UNIT_LEDGER, ("count", ("input",), n_input))
        yield beam.pvalue.TaggedOutput(UNIT_LEDGER, ("resume", "reused", (1, records)))

    def finish_bundle(self):
        self._commit_group()
        super().finish_bundle()
        for run in self._runs:
            run.finish_bundle()

    def teardown(self):
        if self._group is not None:  # a bundle that failed: nothing of its open group is committed
            self._group.abandon()
