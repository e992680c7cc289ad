"""`shards` stage: write the token ids of kept documents as Arrow IPC training shards + manifest.json.

A whole-corpus stage: every document passes through unchanged as kept (nothing is rejected), and a
side branch writes RUN_DIR/shards/ (layout in dsdata/io/shards.py):

1. each document → (difficulty bucket, id, token ids); documents without a `difficulty` annotation
   go to the bucket `default_difficulty` (medium);
2. tokens per bucket are summed, giving each bucket n = max(1, round(tokens / shard_size)) shards;
3. a document's shard is a stable hash of its id modulo n — deterministic on every runner, no
   global sort, shards of roughly `shard_size` tokens;
4. GroupByKey per shard; each shard is written by one worker under a temp name and renamed when
   complete (documents sorted by id hash inside, so shard bytes do not depend on the runner);
5. the shard descriptors are gathered into one list and manifest.json is written last.

The tokenizer recorded in the manifest is the one of the nearest `tokenize` stage upstream, or the
`tokenizer` parameter when given.
"""
from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import numpy as np

from dsdata.document import Document
from dsdata.io import shards as shard_io
from dsdata.stages.base import Param, Stage, StageConfigError

SHARDS_DIR = "shards"
_BUCKET_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def _id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "big")


def shard_record(doc: Document, default_difficulty: str) -> tuple[str, int, str, np.ndarray]:
    """(bucket, id hash, id, token ids) of one document."""
    tokens = doc.annotations.get("tokens")
    if tokens is None:
        raise StageConfigError(f"shards: document '{doc.id}' has no token ids; put a 'tokenize' stage before 'shards'")
    bucket = doc.annotations.get("difficulty") or default_difficulty
    bucket = str(bucket)
    if not _BUCKET_NAME.match(bucket):
        bucket = re.sub(r"[^A-Za-z0-9_]", "_", bucket) or default_difficulty
    return bucket, _id_hash(doc.id), doc.id, np.asarray(tokens)


def bucket_tokens(record: tuple[str, int, str, np.ndarray]) -> tuple[str, int]:
    return record[0], len(record[3])


def shard_count(tokens: int, shard_size: int) -> int:
    return max(1, int(round(tokens / shard_size)))


def assign_shard(record, totals: dict[str, int], shard_size: int):
    """((bucket, index, count), record): the shard a document goes to."""
    count = shard_count(totals[record[0]], shard_size)
    return (record[0], record[1] % count, count), record


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
    manifest = shard_io.build_manifest(entries, np.dtype(dtype_name), tokenizer, extra)
    return shard_io.write_manifest(directory, manifest)


def _upstream_tokenize_stage(pcoll):
    """The `tokenize` stage whose output flows into `pcoll` (nearest first), found in the Beam graph."""
    from dsdata.stages.tokenize import TokenizeStage

    seen: set[int] = set()
    frontier = [pcoll]
    while frontier:
        node = getattr(frontier.pop(0), "producer", None)
        while node is not None and id(node) not in seen:
            seen.add(id(node))
            stage = getattr(node.transform, "stage", None)
            if isinstance(stage, TokenizeStage):
                return stage
            frontier.extend(node.inputs)
            node = node.parent
    return None


class ShardsStage(Stage):
    name = "shards"
    description = "write token ids as Arrow IPC training shards + checksummed manifest (RUN_DIR/shards)"
    params = {
        "shard_size": Param(1 << 22, "target tokens per shard (about; shards are cut by id hash)"),
        "default_difficulty": Param("medium", "bucket for documents without a difficulty annotation"),
        "tokenizer": Param(None, "tokenizer to record in the manifest (default: the upstream tokenize stage's)",
                           kind="path"),
    }

    def validate(self) -> None:
        if not isinstance(self.shard_size, int) or self.shard_size < 1:
            raise StageConfigError(f"shards.shard_size must be a positive integer (tokens), got {self.shard_size!r}")
        if not isinstance(self.default_difficulty, str) or not _BUCKET_NAME.match(self.default_difficulty):
            raise StageConfigError("shards.default_difficulty must be a bucket name such as easy, medium or hard")

    def _tokenizer_info(self, docs) -> dict[str, Any]:
        if self.tokenizer:
            from dsdata.stages.tokenize import TokenizeStage

            return TokenizeStage(tokenizer=self.tokenizer).describe_tokenizer()
        upstream = _upstream_tokenize_stage(docs)
        if upstream is None:
            raise StageConfigError("shards: no 'tokenize' stage before 'shards' in this recipe; add one "
                                   "(or set shards.tokenizer if documents already carry token ids)")
        return upstream.describe_tokenizer()

    def beam_transform(self):
        import apache_beam as beam

        stage = self
        if not self.run_dir:
            raise StageConfigError("shards: no run directory; the stage runs inside a pipeline (dsdata run)")
        if "://" in self.run_dir:
            raise StageConfigError(f"shards: output '{self.run_dir}' is remote; shards are written to a local "
                                   "directory (run with a local --output, then copy OUT/shards)")
        directory = os.path.join(self.run_dir, SHARDS_DIR)

        class WriteShards(beam.PTransform):
            def expand(self, docs):
                info = stage._tokenizer_info(docs)
                dtype_name = shard_io.token_dtype(info["vocab_size"]).name
                extra = {"shard_size": stage.shard_size, "default_difficulty": stage.default_difficulty}
                records = docs | "Records" >> beam.Map(shard_record, stage.default_difficulty)
                totals = (records
                          | "BucketTokens" >> beam.Map(bucket_tokens)
                          | "SumPerBucket" >> beam.CombinePerKey(sum))
                written = (records
                           | "AssignShard" >> beam.Map(assign_shard, beam.pvalue.AsDict(totals), stage.shard_size)
                           | "GroupShards" >> beam.GroupByKey()
                           | "WriteShard" >> beam.Map(write_shard_group, directory, dtype_name, info["vocab_size"]))
                (written
                 | "GatherShards" >> beam.combiners.ToList()
                 | "WriteManifest" >> beam.Map(write_manifest_from, directory, dtype_name, info, extra))
                rejected = docs.pipeline | "NoRejections" >> beam.Create([])
                return {"kept": docs, "rejected": rejected}

        return WriteShards()
