"""Test tooling: a shard set written without Beam (tests and benchmarks/loader.py), through the same
shard and manifest writers the pipeline's shards stage uses."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsdata.io.outfiles import fsync_dir
from dsdata.shards.format import MANIFEST, build_manifest, write_manifest, write_shard


@dataclass
class ShardSetWriter:
    """Write a shard set without Beam (tests, benchmarks): `add()` documents, then `close()`.
    Shards of about `shard_size` tokens per bucket; an existing manifest is removed first."""

    directory: str
    dtype: np.dtype = np.dtype(np.uint16)
    shard_size: int = 1 << 22
    tokenizer: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        manifest = os.path.join(self.directory, MANIFEST)
        if os.path.exists(manifest):
            os.remove(manifest)
            fsync_dir(self.directory)
        self._pending: dict[str, list[tuple[str, np.ndarray]]] = {}
        self._pending_tokens: dict[str, int] = {}
        self._entries: list[dict[str, Any]] = []
        self._count: dict[str, int] = {}

    def add(self, doc_id: str, tokens: np.ndarray, difficulty: str = "medium") -> None:
        self._pending.setdefault(difficulty, []).append((doc_id, np.asarray(tokens)))
        self._pending_tokens[difficulty] = self._pending_tokens.get(difficulty, 0) + len(tokens)
        if self._pending_tokens[difficulty] >= self.shard_size:
            self._flush(difficulty)

    def _flush(self, bucket: str) -> None:
        docs = self._pending.pop(bucket, [])
        self._pending_tokens[bucket] = 0
        if not docs:
            return
        index = self._count.get(bucket, 0)
        self._count[bucket] = index + 1
        # A streaming writer cannot know how many shards a bucket will have, so its names carry only
        # the index (not -of-N, as the pipeline's shards do); the manifest lists every file.
        name = f"shard-{bucket}-{index:05d}.arrow"
        entry = write_shard(self.directory, name, [d[1] for d in docs], [d[0] for d in docs],
                            [bucket] * len(docs), self.dtype)
        self._entries.append(entry)

    def close(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        for bucket in list(self._pending):
            self._flush(bucket)
        manifest = build_manifest(self._entries, self.dtype, self.tokenizer, extra)
        write_manifest(self.directory, manifest)
        return manifest
