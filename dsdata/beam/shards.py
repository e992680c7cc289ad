"""The shards stage's composite: token ids of kept documents → Arrow IPC shards + manifest.json.

  docs ─► (bucket, id hash, id, ids) ─┬─► tokens per bucket ─► CombinePerKey(sum) ─┐ side input
                                      └─► assign shard (id hash mod n) ◄───────────┘
                                           ─► GroupByKey per shard ─► write one shard (one worker)
                                           ─► gather descriptors ─► manifest.json (written last)

Every document passes through unchanged as kept; nothing is rejected.  How shards are cut and why:
dsdata/stages/shards.py; the file layout: dsdata/io/shards.py.
"""
from __future__ import annotations

import os
from time import thread_time
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from dsdata.beam.errors import passes_through
from dsdata.beam.transforms import ANY_OUTPUT, CPU_COUNTER, KEPT, REJECTED, StageCounters

from dsdata.io import shards as shard_io
from dsdata.io.shard_tokenizer import bundle_tokenizer
from dsdata.stages.base import StageConfigError
from dsdata.stages.shards import EXPORT_DIR, SHARDS_DIR, assign_shard, bucket_tokens, shard_record
from dsdata.stages.tokenize import TokenizeStage


def write_shard_group(keyed, directory: str, dtype_name: str, vocab_size: int | None) -> dict[str, Any]:
    """Write one shard from its GroupByKey group and return its manifest entry."""
    (bucket, index, count), records = keyed
    # Sorting by (id hash, id) fixes the shard's bytes whatever order the runner delivered, and
    # spreads documents of one source across the shard.
    records = sorted(records, key=lambda r: (r[1], r[2], r[3].tobytes()))
    dtype = np.dtype(dtype_name)
    if vocab_size is not None:
        for record in records:
            if len(record[3]) and int(record[3].max()) >= vocab_size:
                raise ValueError(f"shards: document '{record[2]}' has token id {int(record[3].max())} >= the "
                                 f"tokenizer's vocabulary size {vocab_size}; was it tokenized with another tokenizer?")
    os.makedirs(directory, exist_ok=True)
    return shard_io.write_shard(directory, shard_io.shard_name(bucket, index, count), [r[3] for r in records],
                                [r[2] for r in records], [bucket] * len(records), dtype)


def write_manifest_from(entries: list[dict[str, Any]], directory: str, dtype_name: str,
                        tokenizer: dict[str, Any] | None, extra: dict[str, Any]) -> str:
    os.makedirs(directory, exist_ok=True)
    tokenizer = bundle_tokenizer(directory, tokenizer)  # the shard set carries its tokenizer (portable)
    manifest = shard_io.build_manifest(entries, np.dtype(dtype_name), tokenizer, extra)
    return shard_io.write_manifest(directory, manifest)


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


def export_written(manifest_path: str, formats: list[str], export_dir: str) -> None:
    """The `export` option: the shard set just written (its manifest is `manifest_path`) → export_dir/<format>."""
    from dsdata.export import export_shards

    export_shards(os.path.dirname(manifest_path), export_dir, formats)


_RECORDS = "records"


@ANY_OUTPUT
class _ShardRecords(StageCounters, beam.DoFn):
    """Each document stays kept and yields its shard record; one whose record cannot be made (it
    raises) is rejected (reason `error`) and is in no shard."""

    def __init__(self, default_difficulty: str, stage_name: str):
        self.default_difficulty, self.stage_name = default_difficulty, stage_name

    def setup(self):
        self._init_counters(self.stage_name)

    def process(self, doc):
        self._in.inc()
        start = self._clock_start()
        try:
            record = shard_record(doc, self.default_difficulty)
        except BaseException as exc:  # noqa: BLE001 - one record's exception rejects that record only
            if passes_through(exc):  # a stop, not the record's fault; a native panic is
                raise
            rejected = self._error(doc, exc)
            self._clock_stop(start)
            yield self._route(rejected)
            return
        self._clock_stop(start)
        yield beam.pvalue.TaggedOutput(_RECORDS, record)
        yield self._route(doc)


@ANY_OUTPUT
class _WriteShard(beam.DoFn):
    """One shard group → its file and manifest entry; a write error (disk, permissions) stops the run."""

    def __init__(self, directory: str, dtype_name: str, vocab_size: int | None, stage_name: str):
        self.directory, self.dtype_name, self.vocab_size, self.stage_name = directory, dtype_name, vocab_size, stage_name

    def setup(self):
        self._cpu_counter = Metrics.counter(f"dsdata.{self.stage_name}", CPU_COUNTER)
        self._cpu = 0.0

    def process(self, keyed):
        start = thread_time()
        entry = write_shard_group(keyed, self.directory, self.dtype_name, self.vocab_size)
        self._cpu += thread_time() - start
        yield entry

    def finish_bundle(self):
        if self._cpu:
            self._cpu_counter.inc(round(self._cpu * 1e6))
            self._cpu = 0.0


class WriteShards(beam.PTransform):
    """PCollection[Document] → {"kept": the same documents, "rejected": those whose shard record
    raised}; writes `directory`."""

    def __init__(self, config: dict[str, Any], directory: str, tokenizer: dict[str, Any], stage_name: str = "shards",
                 export_dir: str | None = None):
        super().__init__()
        self.config, self.directory, self.tokenizer, self.stage_name = config, directory, tokenizer, stage_name
        self.export_dir = export_dir or os.path.join(os.path.dirname(directory), EXPORT_DIR)

    def expand(self, docs):
        config, directory, info = self.config, self.directory, self.tokenizer
        dtype_name = shard_io.token_dtype(info["vocab_size"]).name
        extra = {"shard_size": config["shard_size"], "default_difficulty": config["default_difficulty"]}
        split = docs | "Records" >> beam.ParDo(_ShardRecords(config["default_difficulty"], self.stage_name)).with_outputs(
            _RECORDS, REJECTED, main=KEPT)
        records = split[_RECORDS]
        totals = (records
                  | "BucketTokens" >> beam.Map(bucket_tokens)
                  | "SumPerBucket" >> beam.CombinePerKey(sum))
        written = (records
                   | "AssignShard" >> beam.Map(assign_shard, beam.pvalue.AsDict(totals), config["shard_size"])
                   | "GroupShards" >> beam.GroupByKey()
                   | "WriteShard" >> beam.ParDo(_WriteShard(directory, dtype_name, info["vocab_size"], self.stage_name)))
        manifest = (written
                    | "GatherShards" >> beam.combiners.ToList()
                    | "WriteManifest" >> beam.Map(write_manifest_from, directory, dtype_name, info, extra))
        if config.get("export"):
            manifest | "Export" >> beam.Map(export_written, config["export"], self.export_dir)
        return {KEPT: split[KEPT], REJECTED: split[REJECTED]}


def composite(stage, context) -> WriteShards:
    """The shards stage's transform (registered in dsdata/beam/kinds.py): the builder hands over the
    run directory and the stages upstream, whose nearest `tokenize` names the tokenizer."""
    if "://" in context.run_dir:
        raise StageConfigError(f"shards: output '{context.run_dir}' is remote; shards are written to a local "
                               "directory (run with a local --output, then copy OUT/shards)")
    config = stage.transform_config()
    return WriteShards(config, os.path.join(context.run_dir, SHARDS_DIR), tokenizer_info(config, context.upstream),
                       stage.name)
