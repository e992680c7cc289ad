"""The shards stage's composite: token ids of kept documents → Arrow IPC shards + manifest.json.

  docs ─► records (bucket, id, token bytes) parked in spill files ─► tokens per bucket ─► sum ─┐
                                                                                side input │
       spill files ─► each read once: its records cut by shard (id hash mod n) ◄───────────┘
                      into one fragment file per shard ─► GroupByKey (fragment names only)
                      ─► write one shard from its fragments (one worker) ─► gather descriptors
                      ─► manifest.json (written last)

Every document passes through unchanged as kept; nothing is rejected.  How shards are cut and why:
dsdata/stages/shards.py; the file layout: dsdata/shards/format.py.

No document can be placed before the per-bucket totals are known: the token ids wait in spill files
under RUN_DIR/.spill/shards, and only file names and counts shuffle.
"""
from __future__ import annotations

import os
import tempfile
from time import thread_time
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from dsdata.beam.errors import passes_through
from dsdata.beam.transforms import ANY_OUTPUT, CPU_COUNTER, KEPT, REJECTED, StageCounters

from dsdata.beam import location
from dsdata.beam.spill import RollingSpill, SpillWriter, make_private_dir, read_spill, spill_directory
from dsdata.shards import format as shard_io
from dsdata.shards.tokenizer import bundle_tokenizer
from dsdata.stages.base import StageConfigError
from dsdata.stages.shards import EXPORT_DIR, SHARDS_DIR, id_hash, shard_key, shard_record
from dsdata.stages.tokenize import TokenizeStage

# A bundle's parked records roll over to a new spill file past this many bytes: the step that cuts
# a spill file per shard holds one file's records at a time.
SPILL_FILE_BYTES = 32 << 20


def check_vocabulary(doc_id: str, tokens: np.ndarray, vocab_size: int | None) -> None:
    if vocab_size is not None and len(tokens) and int(tokens.max()) >= vocab_size:
        raise ValueError(f"shards: document '{doc_id}' has token id {int(tokens.max())} >= the "
                         f"tokenizer's vocabulary size {vocab_size}; was it tokenized with another tokenizer?")


def write_shard_group(keyed, directory: str, dtype_name: str, spill_dir: str) -> dict[str, Any]:
    """Write one shard from its GroupByKey group of fragment files (their names in `spill_dir`) and
    return its manifest entry."""
    (bucket, index, count), fragments = keyed
    dtype = np.dtype(dtype_name)
    records = []
    for name in fragments:
        for doc_id, data in read_spill(location.join(spill_dir, name)):
            records.append((id_hash(doc_id), doc_id, data))
    # Sorting by (id hash, id) fixes the shard's bytes whatever order the runner delivered, and
    # spreads documents of one source across the shard.
    records.sort()
    name = shard_io.shard_name(bucket, index, count)
    arrays, ids = [np.frombuffer(r[2], dtype=dtype) for r in records], [r[1] for r in records]
    if not location.is_remote(directory):
        os.makedirs(directory, exist_ok=True)
        return shard_io.write_shard(directory, name, arrays, ids, [bucket] * len(records), dtype)
    # Object storage: built and hashed in a local temporary folder, then uploaded under its final
    # name, which appears only when the upload completes (dsdata/beam/location.py).
    with tempfile.TemporaryDirectory(prefix="dsdata-shard-") as tmp:
        entry = shard_io.write_shard(tmp, name, arrays, ids, [bucket] * len(records), dtype)
        location.upload(os.path.join(tmp, name), location.join(directory, name))
    return entry


def write_manifest_from(entries: list[dict[str, Any]], directory: str, dtype_name: str,
                        tokenizer: dict[str, Any] | None, extra: dict[str, Any]) -> str:
    """manifest.json, written last (after the shards and the bundled tokenizer files; remote: uploaded
    from a local temporary folder).  Returns the manifest's file name, not its path."""
    if not location.is_remote(directory):
        os.makedirs(directory, exist_ok=True)
        tokenizer = bundle_tokenizer(directory, tokenizer)  # the shard set carries its tokenizer (portable)
        manifest = shard_io.build_manifest(entries, np.dtype(dtype_name), tokenizer, extra)
        return os.path.basename(shard_io.write_manifest(directory, manifest))
    with tempfile.TemporaryDirectory(prefix="dsdata-tokenizer-") as tmp:
        tokenizer = bundle_tokenizer(tmp, tokenizer)
        for root, _, names in os.walk(tmp):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), tmp)
                location.upload(os.path.join(root, name), location.join(directory, *rel.split(os.sep)))
    manifest = shard_io.build_manifest(entries, np.dtype(dtype_name), tokenizer, extra)
    for shard in manifest["shards"]:
        path = location.join(directory, shard["file"])
        if not location.exists(path) or location.size(path) != shard["bytes"]:
            raise shard_io.ShardError(f"{path}: missing or not {shard['bytes']} bytes; not writing a manifest "
                                      "that names it")
    location.write_bytes(location.join(directory, shard_io.MANIFEST), shard_io.manifest_bytes(manifest))
    return shard_io.MANIFEST


def tokenizer_info(config: dict[str, Any], upstream) -> dict[str, Any]:
    """What the manifest records about the tokenizer: the `tokenizer` parameter's, else that of the
    nearest `tokenize` stage among `upstream` (the recipe's stages before shards, in order)."""
    if config["tokenizer"]:
        return TokenizeStage(tokenizer=config["tokenizer"]).describe_tokenizer()
    for stage in reversed(upstream):
        if isinstance(stage, TokenizeStage):
            return stage.describe_tokenizer()
    raise StageConfigError("shards: no 'tokenize' stage before 'shards' in this recipe; add one "
                           "(or set shards.tokenizer if documents already carry token ids)")


def export_written(manifest_name: str, directory: str, formats: list[str], export_dir: str) -> None:
    """The `export` option: the shard set just written in `directory` (once its manifest is) → export_dir/<format>."""
    from dsdata.shards.export import export_shards

    export_shards(directory, export_dir, formats)


_PARKED = "parked"
_TOTALS = "totals"


@ANY_OUTPUT
class _ParkRecords(StageCounters, beam.DoFn):
    """Each document stays kept; its shard record goes to this bundle's spill file (names: tag
    `parked`; tokens per bucket: tag `totals`).  A record that raises rejects its document (`error`);
    a token id outside the vocabulary stops the run."""

    def __init__(self, default_difficulty: str, spill_dir: str, dtype_name: str, vocab_size: int | None,
                 stage_name: str):
        self.default_difficulty, self.spill_dir, self.stage_name = default_difficulty, spill_dir, stage_name
        self.dtype_name, self.vocab_size = dtype_name, vocab_size

    def setup(self):
        self._init_counters(self.stage_name)
        self._dtype = np.dtype(self.dtype_name)
        make_private_dir(self.spill_dir)

    def start_bundle(self):
        self._spill = RollingSpill(self.spill_dir, SPILL_FILE_BYTES)
        self._totals: dict[str, int] = {}

    def process(self, doc):
        self._in.inc()
        start = self._clock_start()
        try:
            bucket, _, doc_id, tokens = shard_record(doc, self.default_difficulty)
        except BaseException as exc:  # noqa: BLE001 - one record's exception rejects that record only
            if passes_through(exc):  # a stop, not the record's fault; a native panic is
                raise
            rejected = self._error(doc, exc)
            self._clock_stop(start)
            yield self._route(rejected)
            return
        check_vocabulary(doc_id, tokens, self.vocab_size)
        data = tokens.astype(self._dtype, copy=False).tobytes()
        self._spill.write([bucket, doc_id, data])  # a list: a native MessagePack array
        self._totals[bucket] = self._totals.get(bucket, 0) + len(tokens)
        self._clock_stop(start)
        yield self._route(doc)

    def finish_bundle(self):
        start = thread_time()
        names = self._spill.close()
        self._cpu += thread_time() - start
        super().finish_bundle()
        for name in names:
            yield beam.pvalue.TaggedOutput(_PARKED, GlobalWindows.windowed_value(name))
        for bucket, n in self._totals.items():
            yield beam.pvalue.TaggedOutput(_TOTALS, GlobalWindows.windowed_value((bucket, n)))
        self._totals = {}


@ANY_OUTPUT
class _CutByShard(beam.DoFn):
    """One parked spill file → one fragment file per shard its records belong to (shard = id hash
    mod the bucket's shard count, from the totals), emitted as ((bucket, index, count), fragment)."""

    def __init__(self, spill_dir: str, shard_size: int, stage_name: str):
        self.spill_dir, self.shard_size, self.stage_name = spill_dir, shard_size, stage_name

    def setup(self):
        self._cpu_counter = Metrics.counter(f"dsdata.{self.stage_name}", CPU_COUNTER)

    def process(self, name: str, totals: dict[str, int]):
        start = thread_time()
        by_shard: dict[tuple[str, int, int], list] = {}
        for bucket, doc_id, data in read_spill(location.join(self.spill_dir, name)):
            by_shard.setdefault(shard_key(bucket, doc_id, totals, self.shard_size), []).append([doc_id, data])
        out = []
        for key in sorted(by_shard):
            writer = SpillWriter(self.spill_dir)
            for record in by_shard[key]:
                writer.write(record)
            writer.close()
            out.append((key, writer.name))
        self._cpu_counter.inc(round((thread_time() - start) * 1e6))
        return out


@ANY_OUTPUT
class _WriteShard(beam.DoFn):
    """One shard's fragment files → its file and manifest entry; a write error stops the run."""

    def __init__(self, directory: str, dtype_name: str, stage_name: str, spill_dir: str):
        self.directory, self.dtype_name, self.stage_name = directory, dtype_name, stage_name
        self.spill_dir = spill_dir

    def setup(self):
        self._cpu_counter = Metrics.counter(f"dsdata.{self.stage_name}", CPU_COUNTER)
        self._cpu = 0.0

    def process(self, keyed):
        start = thread_time()
        entry = write_shard_group(keyed, self.directory, self.dtype_name, self.spill_dir)
        self._cpu += thread_time() - start
        yield entry

    def finish_bundle(self):
        if self._cpu:
            self._cpu_counter.inc(round(self._cpu * 1e6))
            self._cpu = 0.0


class WriteShards(beam.PTransform):
    """PCollection[Document] → {"kept", "rejected"}; writes the shards to `directory`."""

    def __init__(self, config: dict[str, Any], directory: str, tokenizer: dict[str, Any], spill_dir: str,
                 stage_name: str = "shards", export_dir: str | None = None):
        super().__init__()
        self.config, self.directory, self.tokenizer, self.stage_name = config, directory, tokenizer, stage_name
        self.spill_dir = spill_dir
        self.export_dir = export_dir or os.path.join(os.path.dirname(directory), EXPORT_DIR)

    def expand(self, docs):
        config, directory, info = self.config, self.directory, self.tokenizer
        dtype_name = shard_io.token_dtype(info["vocab_size"]).name
        extra = {"shard_size": config["shard_size"], "default_difficulty": config["default_difficulty"]}
        split = docs | "Records" >> beam.ParDo(_ParkRecords(
            config["default_difficulty"], self.spill_dir, dtype_name, info["vocab_size"], self.stage_name)
        ).with_outputs(_PARKED, _TOTALS, REJECTED, main=KEPT)
        totals = split[_TOTALS] | "SumPerBucket" >> beam.CombinePerKey(sum)
        written = (split[_PARKED]
                   | "CutByShard" >> beam.ParDo(_CutByShard(self.spill_dir, config["shard_size"], self.stage_name),
                                                beam.pvalue.AsDict(totals))
                   | "GroupShards" >> beam.GroupByKey()
                   | "WriteShard" >> beam.ParDo(_WriteShard(directory, dtype_name, self.stage_name, self.spill_dir)))
        manifest = (written
                    | "GatherShards" >> beam.combiners.ToList()
                    | "WriteManifest" >> beam.Map(write_manifest_from, directory, dtype_name, info, extra))
        if config.get("export"):
            manifest | "Export" >> beam.Map(export_written, directory, config["export"], self.export_dir)
        return {KEPT: split[KEPT], REJECTED: split[REJECTED]}


def composite(stage, context) -> WriteShards:
    """The shards stage's transform; the nearest upstream `tokenize` names the tokenizer."""
    config = stage.transform_config()
    if config.get("export") and location.is_remote(context.run_dir):
        raise StageConfigError(f"shards.export writes local files and the output '{context.run_dir}' is remote; "
                               "drop shards.export and run `dsdata shards export` on a copy of OUT/shards")
    return WriteShards(config, location.join(context.run_dir, SHARDS_DIR), tokenizer_info(config, context.upstream),
                       spill_directory(context.run_dir, stage.name), stage.name)
