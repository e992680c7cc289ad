"""Recipe → Beam pipeline: read, run the stages in order, write kept/rejected Parquet and the ledger.

Output layout (other stages and the trainer build on it):
  DIR/kept/part-*.parquet       id, text, metadata (JSON), one typed column per annotation
  DIR/rejected/part-*.parquet   id, text, text_length, metadata, stage, reason, detail, annotations
  DIR/stats.json                {"input", "kept", "augmented", "rejected": {stage: {reason: n}},
                                 "stages": {stage: {"rejected": n, "kept_after": n}}, "ledger_ok",
                                 "tallies": {annotation: {key: n}} (the stages' Stage.tallies, when any),
                                 "errors": {"count", "by_stage", "budget", "over_budget"},
                                 "stage_time": {stage: {"cpu_s", "docs", "docs_per_s"}},
                                 "resume": {"resumed", "units", "records"} (--resume runs only)}
  DIR/resume/                   a running (or killed) run's committed units (dsdata/beam/resume.py)
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import time
import uuid
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.transforms.window import GlobalWindows
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from dsdata.beam.errors import ErrorBudget, StorageUnreachable, find_environment_error
from dsdata.beam.kinds import ApplyBatchChain, ApplyStage, ApplyStageChain, StageContext, batchable, fusable
from dsdata.beam.resume import CommitPlan, CommitUnitsDoFn, plan_commits
from dsdata.beam.transforms import (ANY_OUTPUT, BATCH_DOCS, CPU_COUNTER, KEPT, REJECTED, UNIT_LEDGER, ReadDocuments,
                                    Unbatch)
from dsdata.document import REJECTED_SCHEMA, Document, Rejected, kept_columns, kept_schema, rejected_columns
from dsdata.beam import location
from dsdata.beam.engines import lean_worker
from dsdata.io.inputs import resolve_recipe_inputs
from dsdata.io.readers import READ_STAGE
from dsdata.io.outfiles import remove_entry, write_file_in_out
from dsdata.io.resume import remove_resume_folder
from dsdata.beam.spill import remove_spill, spill_directory
from dsdata.beam.park import FlattenParked
from dsdata.report.progress import watch as watch_progress
from dsdata.core.names import is_remote
from dsdata.recipe import Recipe, recipe_output
from dsdata.runners import IN_PROCESS_RUNNER, find_runner, is_in_process, resolve_runner
from dsdata.beam.run_files import run_info
from dsdata.report.page import remove_report, write_report_safely
from dsdata.stages import SideOutput, Stage, registered_side_outputs

log = logging.getLogger("dsdata")

# The in-process FnApiRunner by its own name: Beam's DirectRunner first tries to download Prism
# (offline a failed request; online a run on Prism that ignores the --direct_* flags).
DEFAULT_RUNNER = IN_PROCESS_RUNNER
# Under RUN_DIR/.spill: the rejected records of every stage, parked until the writer reads them.
PARKED_REJECTIONS = "rejected"


class LedgerError(RuntimeError):
    """input + augmented != kept + Σ rejected: a stage lost or invented documents."""


def pipeline_options(beam_args: list[str]) -> PipelineOptions:
    args = list(beam_args)
    for i, arg in enumerate(args):
        flag, _, name = arg.partition("=")
        if flag == "--runner" and resolve_runner(name) != name:
            # A runner dsdata replaces (dsdata/runners.py); importing its module registers its
            # options (--dask_*) before Beam parses them.
            importlib.import_module(find_runner(name).class_path.rpartition(".")[0])
            args[i] = f"--runner={resolve_runner(name)}"
    if "--runner" not in [a.split("=", 1)[0] for a in args]:
        args.append(f"--runner={DEFAULT_RUNNER}")
    return PipelineOptions(args + runner_defaults(args))


def in_process_runner(options: PipelineOptions):
    """For the default runner the FnApiRunner with the run's options in its provision info (where
    multi_processing workers read them), as Beam's DirectRunner makes it; None for any other."""
    if options.view_as(StandardOptions).runner != DEFAULT_RUNNER:
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return lean_worker.in_process_runner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


def _count_keys(kind: str):
    def keys(item: Document | Rejected):
        if isinstance(item, Rejected):
            yield ("rejected", item.stage, item.reason)
            doc = item.doc
        else:
            yield ("kept",) if kind == KEPT else ("input",)
            doc = item
        # A derived document counts as augmented wherever it ends: kept, or rejected by a later stage.
        if kind in (KEPT, REJECTED) and doc.derived_from is not None:
            yield ("augmented", doc.annotations.get("derived_by") or "augment")

    return keys


@ANY_OUTPUT
class _TallyKeys(beam.DoFn):
    """The ledger's keys of each record (_count_keys) summed per bundle, emitted as (key, n) when it
    ends; `part` ("docs", "rejected"): elements are Batches, that list's records count; `tallied`:
    the stages' Stage.tallies annotations, summed as ("tally", annotation, key)."""

    def __init__(self, kind: str, part: str | None = None, tallied: tuple[str, ...] = ()):
        self.kind, self.part = kind, part
        self.tallied = tallied if kind in (KEPT, REJECTED) else ()

    def setup(self):
        self._keys = _count_keys(self.kind)
        self._plain_key = ("kept",) if self.kind == KEPT else ("input",)

    def start_bundle(self):
        self._tally: dict[tuple, int] = {}
        self._plain = 0  # records whose only key is _plain_key (a document not derived from another)

    def process(self, element):
        items = (element,) if self.part is None else getattr(element, self.part)
        plain_kind = self.kind != REJECTED
        tally = self._tally
        for item in items:
            if self.tallied:
                self._tally_annotations(item)
            if plain_kind and type(item) is Document and item.derived_from is None:
                self._plain += 1
                continue
            for key in self._keys(item):
                tally[key] = tally.get(key, 0) + 1

    def _tally_annotations(self, item: Document | Rejected) -> None:
        annotations = (item.doc if isinstance(item, Rejected) else item).annotations
        for name in self.tallied:
            counts = annotations.get(name)
            if counts:
                for key, n in counts.items():
                    if n:
                        tally_key = ("tally", name, key)
                        self._tally[tally_key] = self._tally.get(tally_key, 0) + n

    def finish_bundle(self):
        if self._plain:
            self._tally[self._plain_key] = self._tally.get(self._plain_key, 0) + self._plain
        for key, n in self._tally.items():
            yield GlobalWindows.windowed_value((LEDGER_KEY, ("count", key, n)))
        self._tally, self._plain = {}, 0


def stats_from_counts(counts: dict[tuple, int], stage_order: list[str]) -> dict[str, Any]:
    """Fold (key → count) pairs into stats.json's structure and check the ledger law."""
    rejected: dict[str, dict[str, int]] = {}
    tallies: dict[str, dict[str, int]] = {}
    augmented_by: dict[str, int] = {}
    n_input = n_kept = 0
    for key, n in counts.items():
        if key[0] == "input":
            n_input += n
        elif key[0] == "kept":
            n_kept += n
        elif key[0] == "rejected":
            by_reason = rejected.setdefault(key[1], {})
            by_reason[key[2]] = by_reason.get(key[2], 0) + n
        elif key[0] == "augmented":
            augmented_by[key[1]] = augmented_by.get(key[1], 0) + n
        elif key[0] == "tally":
            by_key = tallies.setdefault(key[1], {})
            by_key[key[2]] = by_key.get(key[2], 0) + n
    n_rejected = sum(sum(r.values()) for r in rejected.values())
    n_aug = sum(augmented_by.values())
    # Reader rejections were records: part of the input.
    n_input += sum(rejected.get(READ_STAGE, {}).values())
    stages: dict[str, dict[str, int]] = {}
    running = n_input
    for name in [READ_STAGE, *stage_order]:
        r = sum(rejected.get(name, {}).values())
        running += augmented_by.get(name, 0) - r
        stages[name] = {"rejected": r, "kept_after": running}
    out = {
        "input": n_input,
        "kept": n_kept,
        "augmented": n_aug,
        "rejected": {s: dict(sorted(r.items())) for s, r in sorted(rejected.items())},
        "rejected_total": n_rejected,
        "stages": stages,
        "ledger_ok": n_input + n_aug == n_kept + n_rejected,
    }
    if tallies:
        out["tallies"] = {name: dict(sorted(t.items())) for name, t in sorted(tallies.items())}
    return out


# The ledger's counts, the composites' stats and the part files reach _WriteStats as
# ("ledger", (kind, key, value)) pairs through one GroupByKey.
LEDGER_KEY = "ledger"


class _WriteStats(beam.DoFn):
    """The run's last step: commits the Parquet part files (ParquetParts) and writes stats.json, so
    that a stats.json on disk means a finished run."""

    def __init__(self, path: str, stage_order: list[str], extra: dict[str, Any], parts: tuple = (),
                 commits: CommitPlan | None = None):
        self.path, self.stage_order, self.extra, self.parts = path, stage_order, extra, parts
        self.commits = commits

    def process(self, grouped: tuple[str, Any]):
        counts: dict[tuple, int] = {}
        stage_stats: dict[str, Any] = {}
        files: dict[str, list[str]] = {parts.sub: [] for parts in self.parts}
        units: dict[str, list[int]] = {}  # "reused" / "processed" → [units, records]
        for kind, key, value in grouped[1]:
            if kind == "count":
                counts[key] = counts.get(key, 0) + value
            elif kind == "file":
                files[key].append(value)
            elif kind == "resume":
                total = units.setdefault(key, [0, 0])
                total[0] += value[0]
                total[1] += value[1]
            else:
                stage_stats[key] = value
        for parts in self.parts:
            parts.commit(files[parts.sub])
        stats = stats_from_counts(counts, self.stage_order)
        stats.update(self.extra)
        resumed = self.commits.stats(units) if self.commits is not None else None
        if resumed is not None:
            stats["resume"] = resumed
        if stage_stats:
            stats["stage_stats"] = dict(sorted(stage_stats.items()))
        location.write_bytes(self.path, json.dumps(stats, indent=2, ensure_ascii=False).encode("utf-8"))
        yield stats


INCOMPLETE_NAME = "INCOMPLETE"


RESUME_HINT = "continue the run with the same command and --resume, or run it again without --resume to replace them"


def mark_incomplete(output: str, why: str, discard: bool = False, resumable: bool = False) -> None:
    """A stopped run's OUT: stats.json, report.html and run.json removed, OUT/INCOMPLETE says why and
    what to do (`resumable`: work kept for --resume); discard: every output goes too (a full disk)."""
    if "://" in output:
        return
    if discard:
        _prepare_output(output)
    for name in ("stats.json", "report.html", "run.json"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(output, name))
    remove_spill(output)
    with contextlib.suppress(OSError):  # a read-only OUT: its lack of stats.json says as much
        write_file_in_out(output, INCOMPLETE_NAME,
                          f"{why} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; the files in this "
                          f"directory are partial: {RESUME_HINT if resumable and not discard else 'run again to replace them'}\n")


def _prepare_output(output: str) -> None:
    """Remove the outputs of an earlier run in DIR, local or remote (only the files this tool writes:
    kept/, rejected/, stats.json, every stage's declared side outputs, .spill/)."""
    # The side outputs' names import every stage module: asked only where there is something to clear.
    remote = is_remote(output)
    fresh = not remote and not (os.path.isdir(output) and any(n[:1] != "." for n in os.listdir(output)))
    sides = [] if fresh else registered_side_outputs()
    folders = ["kept", "rejected", *(s.name for s in sides if s.directory)]
    files = ["stats.json", INCOMPLETE_NAME, *(s.name for s in sides if not s.directory)]
    remove_spill(output)
    if remote:
        location.make_dirs(output)
        for sub in folders:
            location.remove_tree(location.join(output, sub))
        for name in files:
            location.remove_file(location.join(output, name))
        return
    os.makedirs(output, exist_ok=True)
    # OUT is untrusted (dsdata/io/outfiles.py): an entry planted as a link is removed, never followed.
    for name in [*folders, *files, "report.html", "run.json"]:
        remove_entry(os.path.join(output, name))
    for sub in ("kept", "rejected"):
        os.mkdir(os.path.join(output, sub))


class _WriteSideOutput(beam.DoFn):
    """Writes the one dict a composite returned for a declared side output as OUT/NAME (JSON)."""

    def __init__(self, path: str, side: SideOutput):
        self.path, self.side = path, side

    def process(self, content: dict[str, Any]):
        text = json.dumps(content, indent=2, sort_keys=self.side.sort_keys, ensure_ascii=self.side.ensure_ascii)
        location.write_bytes(self.path, text.encode("utf-8"))


def _apply_stages(docs, stages: list[Stage], output: str, start: int = 0):
    """Run stages[start:] in order: (kept docs, [rejected PCollections], [stats entries]), writing each
    stage's declared side-output files; consecutive fusable stages run as one step."""
    rejected, stage_stats = [], []
    i = start
    while i < len(stages):
        stage = stages[i]
        j = i
        while j < len(stages) and fusable(stages[j]):
            j += 1
        if j - i > 1:
            chain = stages[i:j]
            out = docs | f"{i:02d}_{'+'.join(s.name for s in chain)}" >> ApplyStageChain(chain)
            docs = out[KEPT]
            rejected.append(out[REJECTED])
            i = j
            continue
        out = docs | f"{i:02d}_{stage.name}" >> ApplyStage(stage, StageContext(output, tuple(stages[:i])))
        docs = out[KEPT]
        rejected.append(out[REJECTED])
        if "stats" in out:
            stage_stats.append(out["stats"] | f"{i:02d}_{stage.name}_Stats" >> beam.Map(
                lambda s, n=stage.name: (LEDGER_KEY, ("stats", n, s))))
        for side in stage.side_outputs:
            if not side.directory:
                (out[side.name]
                 | f"{i:02d}_{stage.name}_Write_{side.name}" >> beam.ParDo(
                     _WriteSideOutput(FileSystems.join(output, side.name), side)))
        i += 1
    return docs, rejected, stage_stats


# Rows go to Parquet as Arrow record batches of this many records, and a table (one row group) per
# this many bytes of them or per bundle: what a writer holds while Parquet encodes it, and what the
# report reads at once (docs/memory.md, "The Parquet writers").
ARROW_BATCH_ROWS = 1000
ARROW_TABLE_BYTES = 4 << 20


class _ArrowTables(beam.DoFn):
    """Records → pyarrow Tables of `schema` (`columns(records)`: one list per column), a table per
    ARROW_TABLE_BYTES and at the bundle's end.  `part`: elements are Batches, that list is written."""

    def __init__(self, schema, columns, part: str | None = None):
        self.schema, self.columns, self.part = schema, columns, part

    def start_bundle(self):
        self._records: list = []
        self._batches: list = []
        self._bytes = 0

    def process(self, element):
        records = self._records
        if self.part is None:
            records.append(element)
        else:
            records.extend(getattr(element, self.part))
        # Empty tuples, not None: Beam warns about a `process` whose source says "return None".
        if len(records) < ARROW_BATCH_ROWS:
            return ()
        self._flush()
        return (self._table(),) if self._bytes >= ARROW_TABLE_BYTES else ()

    def finish_bundle(self):
        if self._records:
            self._flush()
        if self._batches:
            yield GlobalWindows.windowed_value(self._table())

    def _flush(self):
        arrays = [pa.array(values, type=typ) for values, typ in zip(self.columns(self._records), self.schema.types)]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._records = []
        self._batches.append(batch)
        self._bytes += batch.nbytes

    def _table(self):
        table = pa.Table.from_batches(self._batches, schema=self.schema)
        self._batches, self._bytes = [], 0
        return table


class ParquetParts:
    """One output folder of Parquet part files (kept/, rejected/).  Each bundle writes
    FOLDER/.temp-RUN/UUID.parquet and sends its name through the ledger; _WriteStats commits them as
    part-SSSSS-of-NNNNN.parquet (one empty file when none) and removes the temporary folder."""

    def __init__(self, output: str, sub: str, schema: pa.Schema, run_id: str):
        self.sub, self.schema = sub, schema
        self.folder = FileSystems.join(output, sub)
        self.temp = FileSystems.join(self.folder, f".temp-{run_id}")

    def open(self, path: str):
        from apache_beam.io.filesystem import CompressionTypes

        fh = FileSystems.create(path, "application/x-parquet", CompressionTypes.UNCOMPRESSED)
        writer = pq.ParquetWriter(fh, self.schema, compression="none", use_deprecated_int96_timestamps=False,
                                  use_compliant_nested_type=False)
        return fh, writer

    def commit(self, temp_names: list[str]) -> None:
        """temp_names: the names (not paths) of the bundles' files in the temporary folder."""
        if not temp_names:
            fh, writer = self.open(FileSystems.join(self.folder, "part-00000-of-00001.parquet"))
            writer.close()
            fh.close()
        n = len(temp_names)
        for i, name in enumerate(sorted(temp_names)):
            src = FileSystems.join(self.temp, name)
            dst = FileSystems.join(self.folder, f"part-{i:05d}-of-{n:05d}.parquet")
            if FileSystems.exists(src):
                FileSystems.rename([src], [dst])
            elif not FileSystems.exists(dst):  # a retried commit finds its renames done
                raise OSError(f"{self.sub}: the part file {src} written by the run is gone")
        # What failed or retried bundles left (on object stores a "folder" is only its files' prefix).
        if not location.is_remote(self.temp):
            remove_entry(self.temp)  # not Beam's delete, which takes a local path for a glob (OUT may be `out-*`)
            return
        left = [m.path for m in FileSystems.match([FileSystems.join(self.temp, "*")])[0].metadata_list]
        if left:
            FileSystems.delete(left)
        if FileSystems.exists(self.temp):
            FileSystems.delete([self.temp])


@ANY_OUTPUT
class _ParquetPartFiles(_ArrowTables):
    """_ArrowTables' tables written to one temporary Parquet file per bundle; its name goes to the
    ledger as ("file", sub, name) when the bundle ends."""

    def __init__(self, parts: ParquetParts, columns, part: str | None = None):
        super().__init__(parts.schema, columns, part)
        self.parts = parts

    def start_bundle(self):
        super().start_bundle()
        self._file = None

    def process(self, element):
        for table in super().process(element):
            self._write(table)
        return ()

    def finish_bundle(self):
        for table in super().finish_bundle():
            self._write(table.value)
        if self._file is not None:
            name, fh, writer = self._file
            self._file = None
            writer.close()
            fh.close()
            # The name only: OUT's path may not be UTF-8, and what crosses Beam's coders as str must be.
            yield GlobalWindows.windowed_value((LEDGER_KEY, ("file", self.parts.sub, name)))

    def _write(self, table) -> None:
        if self._file is None:
            try:
                FileSystems.mkdirs(self.parts.temp)
            except OSError:  # made by another bundle (or a file system without folders)
                pass
            name = f"{uuid.uuid4().hex}.parquet"
            self._file = (name, *self.parts.open(FileSystems.join(self.parts.temp, name)))
        self._file[2].write_table(table)


def _write_rows(docs, all_rejected, stages: list[Stage], output: str, batched: bool = False) -> tuple:
    """kept/ and rejected/ Parquet writers (`batched`: both inputs are one PCollection of Batches).
    Returns the ParquetParts to commit and their part files' ledger entries."""
    annotation_types: dict[str, Any] = {}
    for stage in stages:
        annotation_types.update(stage.annotations)
    names = list(annotation_types)
    run_id = uuid.uuid4().hex
    kept = ParquetParts(output, "kept", kept_schema(annotation_types), run_id)
    rejected = ParquetParts(output, "rejected", REJECTED_SCHEMA, run_id)
    kept_files = docs | "WriteKept" >> beam.ParDo(_ParquetPartFiles(
        kept, functools.partial(kept_columns, annotation_names=names), "docs" if batched else None))
    rejected_files = all_rejected | "WriteRejected" >> beam.ParDo(_ParquetPartFiles(
        rejected, rejected_columns, "rejected" if batched else None))
    return (kept, rejected), (kept_files, rejected_files)


def runs_on_several_workers(options: PipelineOptions) -> bool:
    """False only for the in-process runner with one worker (dsdata's default)."""
    direct = options.view_as(DirectOptions)
    return (not is_in_process(options.view_as(StandardOptions).runner)
            or direct.direct_running_mode == "multi_processing" and direct.direct_num_workers != 1)


def runs_on_one_worker(options: PipelineOptions) -> bool:
    """The in-process runner with --direct_num_workers=1 (any running mode): no Reshuffle of files."""
    return (is_in_process(options.view_as(StandardOptions).runner)
            and options.view_as(DirectOptions).direct_num_workers == 1)


def build_pipeline(p: beam.Pipeline, recipe: Recipe, output: str, stages: list[Stage],
                   commits: CommitPlan | None = None) -> None:
    """Add the recipe's read → stages → write graph to pipeline `p`.  The leading batchable stages run
    on the reader's Batches in one ParDo; from the first composite on records go one per element.
    commits: the reader is resume.CommitUnitsDoFn, which runs the plan's leading stages per unit."""
    reading = dict(spread_documents=runs_on_several_workers(p.options), batch_docs=BATCH_DOCS,
                   spread_files=not runs_on_one_worker(p.options), limit=recipe.limit)
    tallied = tuple(name for s in stages for name in s.tallies)
    lead, reader = 0, None
    if commits is not None and commits.work is not None:
        lead = commits.stages
        reader = CommitUnitsDoFn(recipe.input_format, recipe.text_field, recipe.id_field, BATCH_DOCS, stages[:lead],
                                 commits.work.units_dir, commits.work.resumed)
    read = p | "Read" >> ReadDocuments(recipe.inputs, recipe.input_format, recipe.text_field, recipe.id_field,
                                       unit_reader=reader, **reading)
    batches = read[KEPT]
    if reader is not None:
        input_keys = read[UNIT_LEDGER] | "UnitKeys" >> beam.Map(lambda entry: (LEDGER_KEY, entry))
    else:
        input_keys = batches | "InputKeys" >> beam.ParDo(_TallyKeys("input", "docs"))
        while lead < len(stages) and batchable(stages[lead]):
            lead += 1
        if lead:
            batches = batches | f"00_{'+'.join(s.name for s in stages[:lead])}" >> ApplyBatchChain(stages[:lead])
    stage_stats = []
    if lead == len(stages):
        parts, part_files = _write_rows(batches, batches, stages, output, batched=True)
        keys = (input_keys,
                batches | "KeptKeys" >> beam.ParDo(_TallyKeys(KEPT, "docs", tallied)),
                batches | "RejectedKeys" >> beam.ParDo(_TallyKeys(REJECTED, "rejected", tallied)))
    else:
        split = batches | "Unbatch" >> beam.ParDo(Unbatch()).with_outputs(REJECTED, main=KEPT)
        docs, stage_rejected, stage_stats = _apply_stages(split[KEPT], stages, output, start=lead)
        # Every stage's rejections wait for the writer in spill files, not in the runner (park.py).
        all_rejected = (split[REJECTED], *stage_rejected) | "AllRejected" >> FlattenParked(
            spill_directory(output, PARKED_REJECTIONS))
        parts, part_files = _write_rows(docs, all_rejected, stages, output)
        keys = (input_keys,
                docs | "KeptKeys" >> beam.ParDo(_TallyKeys(KEPT, tallied=tallied)),
                all_rejected | "RejectedKeys" >> beam.ParDo(_TallyKeys(REJECTED, tallied=tallied)))
    # One zero count makes the group exist (and stats.json be written) when there is no record at all.
    nothing = p | "LedgerStart" >> beam.Create([(LEDGER_KEY, ("count", ("input",), 0))])
    extra = {"recipe": recipe.name, "stage_order": [READ_STAGE] + [s.name for s in stages]}
    if recipe.inputs_left_out:
        extra["inputs_left_out"] = recipe.inputs_left_out
    if recipe.limit is not None:
        extra["limit"] = recipe.limit
    (
        (nothing, *keys, *stage_stats, *part_files)
        | "AllKeys" >> beam.Flatten()
        | "Gather" >> beam.GroupByKey()
        | "WriteStats" >> beam.ParDo(_WriteStats(FileSystems.join(output, "stats.json"), [s.name for s in stages], extra,
                                                 parts, commits))
    )


def stage_times(result, stats: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """stats.json's "stage_time": each stage's CPU seconds, input documents and docs per CPU-second;
    None when the runner returned no such metrics."""
    try:
        counters = result.metrics().query(MetricsFilter().with_name(CPU_COUNTER))["counters"]
    except Exception:  # noqa: BLE001 - a runner without metrics support
        return None
    cpu_us: dict[str, int] = {}
    for item in counters:
        namespace = item.key.metric.namespace
        if not namespace.startswith("dsdata."):
            continue
        value = item.committed if item.committed is not None else item.attempted
        stage = namespace[len("dsdata."):]
        cpu_us[stage] = cpu_us.get(stage, 0) + int(value or 0)
    if not cpu_us:
        return None
    times: dict[str, dict[str, Any]] = {}
    docs_in = stats["input"]
    for name in stats["stage_order"]:
        cpu_s = cpu_us.get(name, 0) / 1e6
        times[name] = {"cpu_s": round(cpu_s, 6), "docs": docs_in,
                       "docs_per_s": round(docs_in / cpu_s, 1) if cpu_s > 0 else None}
        docs_in = stats["stages"][name]["kept_after"]
    return times


def run_recipe(recipe: Recipe, output: str | None = None, beam_args: list[str] | None = None,
               max_errors: str | ErrorBudget | None = None, progress: str = "off",
               resume: bool = False) -> dict[str, Any]:
    """Run a recipe and return its stats (also OUTPUT/stats.json), then write report.html and run.json.

    resume: reuse the units a stopped run committed (ResumeRefused when another recipe's or inputs').
    max_errors: `error` rejections allowed, "25" or "0.1%" (default); over it ErrorBudgetExceeded is
    raised after the outputs are written.  progress: "lines" / "bar" or "off"."""
    if output is None:  # the recipe's own output may not leave the working directory (recipe_output)
        output = recipe.output if is_remote(recipe.output) else recipe_output(recipe)
    if not recipe.inputs_checked:  # called from Python with a recipe nobody checked: the CLI's checks
        resolve_recipe_inputs(recipe, confined=recipe.inputs_from_file, output=output)
    budget = ErrorBudget.parse(max_errors)
    stages = recipe.build_stages()
    options = pipeline_options(list(recipe.beam_args) + list(beam_args or []))
    # Before the Pipeline exists: removing old remote outputs needs S3's endpoint and credentials.
    FileSystems.set_options(options)
    commits = plan_commits(recipe, stages, output, runs_on_several_workers(options), resume)
    _prepare_output(output)
    remove_report(output)
    start = time.time()
    ran = False
    try:
        with watch_progress(progress, [READ_STAGE] + [s.name for s in stages]) as watcher:
            with beam.Pipeline(runner=in_process_runner(options), options=options) as p:
                build_pipeline(p, recipe, output, stages, commits)
                watcher.attach(p)
        ran = True
    except Exception as exc:  # noqa: BLE001 - only an environment error is turned into one line
        fatal = find_environment_error(exc)
        if fatal is None:
            raise
        if isinstance(fatal, StorageUnreachable):  # as a stopped run's: OUT/INCOMPLETE says why
            mark_incomplete(output, str(fatal))
        raise fatal from None
    finally:
        # After a failure at best effort: the failure may be the storage's own and must not be hidden.
        with contextlib.nullcontext() if ran else contextlib.suppress(Exception):
            remove_spill(output)
    stats_path = FileSystems.join(output, "stats.json")
    with FileSystems.open(stats_path) as fh:
        stats = json.loads(fh.read().decode("utf-8"))
    times = stage_times(p.result, stats)
    if times is None:
        stats["stage_time_unavailable"] = f"the runner ({type(p.result).__name__}) returned no metrics"
    else:
        stats["stage_time"] = times
    stats["errors"] = budget.summary(stats)
    location.write_bytes(stats_path, json.dumps(stats, indent=2, ensure_ascii=False).encode("utf-8"))
    stats["seconds"] = round(time.time() - start, 3)
    write_report_safely(output, run_info(recipe, stages, options, stats["seconds"]))
    if not stats["ledger_ok"]:
        raise LedgerError(
            f"ledger broken in {output}/stats.json: input {stats['input']} + augmented {stats['augmented']} "
            f"!= kept {stats['kept']} + rejected {stats['rejected_total']}"
        )
    budget.check(stats, output)
    if commits.work is not None:  # a finished run needs no committed work (it is as big as kept + rejected)
        remove_resume_folder(output)
    return stats


def runner_defaults(args: list[str]) -> list[str]:
    """The Beam arguments the chosen runner's row adds by default (dsdata/runners.py `defaults`)."""
    from dsdata.beam.engines.options import last_option

    runner = find_runner(last_option(args, "runner") or "")
    if runner is None or not runner.defaults:
        return []
    module, _, function = runner.defaults.partition(":")
    return getattr(importlib.import_module(module), function)(args)
