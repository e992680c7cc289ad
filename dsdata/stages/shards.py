"""`shards` stage: write the token ids of kept documents as Arrow IPC training shards + manifest.json.

A whole-corpus stage (its composite: dsdata/beam/shards.py): every document passes through as kept,
and a side branch writes RUN_DIR/shards/ (layout: dsdata/shards/format.py; how documents are
bucketed by difficulty and spread over shards: docs/shards.md), then with `export: [...]` exports the
finished set to RUN_DIR/export/<format>.  The tokenizer recorded in the manifest is the nearest
`tokenize` stage's upstream, or the `tokenizer` parameter when given.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from dsdata.document import Document
from dsdata.stages.base import CorpusStage, Param, SideOutput, StageConfigError
from dsdata.core.params import Allowed, Integer, ListOf, Path, Text

SHARDS_DIR = "shards"
EXPORT_DIR = "export"
_BUCKET_NAME = re.compile(r"^[A-Za-z0-9_]+\Z")  # \Z: "$" also matches before a final newline


def id_hash(doc_id: str) -> int:
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
    return bucket, id_hash(doc.id), doc.id, np.asarray(tokens)


def shard_count(tokens: int, shard_size: int) -> int:
    return max(1, int(round(tokens / shard_size)))


def shard_key(bucket: str, doc_id: str, totals: dict[str, int], shard_size: int) -> tuple[str, int, int]:
    """(bucket, index, count): the shard a document goes to, given the tokens of every bucket."""
    count = shard_count(totals[bucket], shard_size)
    return bucket, id_hash(doc_id) % count, count


def export_formats(values: dict) -> Allowed:
    """`shards.export`'s choices: the rows of the export-format table."""
    from dsdata.shards.export.formats import format_names

    return Allowed(format_names(), "the export formats (" + ", ".join(format_names()) + ")")


class ShardsStage(CorpusStage):
    name = "shards"
    description = "write token ids as Arrow IPC training shards + checksummed manifest (RUN_DIR/shards)"
    params = {
        "shard_size": Param(1 << 22, "target tokens per shard (about; shards are cut by id hash)", Integer(min=1)),
        "default_difficulty": Param("medium", "bucket for documents without a difficulty annotation",
                                    Text(pattern=_BUCKET_NAME.pattern,
                                         expect="a bucket name such as easy, medium or hard")),
        "tokenizer": Param(None, "tokenizer to record in the manifest (default: the upstream tokenize stage's)",
                           Path(), nullable=True),
        "export": Param([], "also write the shards for other trainers into RUN_DIR/export/<format> "
                        "(dsdata shards export; dsdata/shards/export/formats.py)", ListOf(Text(nonempty=True), single=True),
                        choices=export_formats),
    }
    side_outputs = (SideOutput(SHARDS_DIR, directory=True), SideOutput(EXPORT_DIR, directory=True))

    def transform_config(self) -> dict[str, Any]:
        return {"shard_size": self.shard_size, "default_difficulty": self.default_difficulty,
                "tokenizer": self.tokenizer, "export": list(self.export)}
