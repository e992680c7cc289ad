"""Read a verified shard set document by document, per difficulty bucket, for the exporters.

Every shard is checked before any of its tokens is exported (size, sha256, `check_shard_buffer`).
Documents come in manifest order, so exports of one shard set are byte-identical.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from dsdata.shards.format import (MANIFEST, TOKEN_COLUMN, ShardError, check_shard_buffer, locate_shard_dir,
                              manifest_vocab_size, read_manifest, verify_shard_file)


@dataclass(frozen=True)
class Document:
    id: str
    difficulty: str
    tokens: np.ndarray  # the document's ids, ending with EOS (a view of the shard's mapping)


class ShardSource:
    """A shard set opened for export: `buckets` in name order, `documents(bucket)` in manifest order."""

    def __init__(self, path: str, name: str | None = None):
        self.directory = locate_shard_dir(path)
        self.manifest = read_manifest(self.directory)
        with open(os.path.join(self.directory, MANIFEST), "rb") as fh:
            self.manifest_sha256 = hashlib.sha256(fh.read()).hexdigest()
        self.dtype = np.dtype(self.manifest["dtype"])
        self.token_column = self.manifest.get("token_column", TOKEN_COLUMN)
        # The source a document came from, as far as a shard set knows: the set's own name (its run
        # directory's name for RUN/shards), unless the caller names it.
        self.name = name or shard_set_name(self.directory)
        self._by_bucket: dict[str, list[dict[str, Any]]] = {}
        for shard in self.manifest["shards"]:
            bucket = shard.get("difficulty") or self.manifest.get("default_difficulty") or "medium"
            self._by_bucket.setdefault(str(bucket), []).append(shard)

    @property
    def buckets(self) -> list[str]:
        return sorted(self._by_bucket)

    @property
    def tokenizer(self) -> dict[str, Any]:
        return self.manifest.get("tokenizer") or {}

    def shards(self, bucket: str) -> list[dict[str, Any]]:
        """The manifest entries of a bucket's shards, in manifest order."""
        return list(self._by_bucket[bucket])

    def documents(self, bucket: str | None = None) -> Iterator[Document]:
        """Documents of one bucket (every bucket, in name order, when None)."""
        for name in ([bucket] if bucket is not None else self.buckets):
            for shard in self._by_bucket[name]:
                yield from self.shard_documents(shard)

    def shard_documents(self, shard: dict[str, Any]) -> Iterator[Document]:
        """One shard's documents, after checking the file against its manifest entry."""
        verify_shard_file(self.directory, shard)
        path = os.path.join(self.directory, shard["file"])
        with pa.memory_map(os.fsencode(path), "r") as mapped:
            buffer = mapped.read_buffer()
            values = check_shard_buffer(path, buffer, self.token_column, self.dtype, shard["tokens"],
                                        manifest_vocab_size(self.manifest))
            batch = pa.ipc.open_file(pa.BufferReader(buffer)).get_batch(0)
            offsets = batch.column(self.token_column).offsets.to_numpy()
            ids = batch.column("id").to_pylist() if "id" in batch.schema.names else [None] * batch.num_rows
            bucket = shard.get("difficulty")
            difficulties = (batch.column("difficulty").to_pylist() if "difficulty" in batch.schema.names
                            else [bucket] * batch.num_rows)
            if len(ids) != shard["docs"]:
                raise ShardError(f"{path}: {len(ids)} documents, the manifest says {shard['docs']}")
            for row in range(batch.num_rows):
                yield Document(str(ids[row]) if ids[row] is not None else f"{shard['file']}:{row}",
                               str(difficulties[row] or bucket or "medium"),
                               values[offsets[row]:offsets[row + 1]])


def shard_set_name(directory: str) -> str:
    """A shard set's name: its folder's, or its run directory's for RUN/shards (an export's `source`
    column, a mixture source's default name)."""
    directory = os.path.abspath(directory)
    base = os.path.basename(directory)
    if base == "shards":
        base = os.path.basename(os.path.dirname(directory)) or base
    return base
