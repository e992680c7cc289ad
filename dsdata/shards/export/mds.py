"""MosaicML streaming (MDS) datasets: one MDS directory per difficulty bucket.

Written by our own code (mosaicml-streaming pins numpy < 2.2 and transformers < 5, so it cannot be
a dependency of dsdata); the format is `streaming.base.format.mds` version 2, uncompressed:

  <bucket>/index.json        {"version": 2, "shards": [{"column_names", "column_encodings",
                              "column_sizes", "compression": null, "format": "mds", "hashes": [],
                              "raw_data": {"basename", "bytes", "hashes": {}}, "samples",
                              "size_limit", "version": 2, "zip_data": null}, …]}
  <bucket>/shard.NNNNN.mds   <u4 samples> <u4 offsets[samples + 1]> <shard config JSON> samples…
                             (offsets are absolute in the file; a sample is the <u4 sizes of its
                             variable-size columns followed by each column's bytes, columns in name
                             order)

Columns, per document (one sample = one document, EOS included): `input_ids` (encoding
`ndarray:uint16` or `ndarray:uint32`: a 1-D array of the ids), `id`, `difficulty`, `source` (str).
`StreamingDataset(local=DST/mds/<bucket>)` reads one bucket; `streams=[Stream(local=…,
proportion=…), …]` mixes them.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from dsdata.shards.export.files import atomic_file
from dsdata.shards.export.source import ShardSource

SIZE_LIMIT = 1 << 26  # streaming's default shard size (64 MiB)
_SHAPE_DTYPES = ((1 << 8, 0, np.uint8), (1 << 16, 1, np.uint16), (1 << 32, 2, np.uint32))


def _ndarray_bytes(tokens: np.ndarray) -> bytes:
    """streaming's NDArray encoding with the dtype in the column encoding and the shape per sample:
    one byte (ndim << 2 | shape dtype code), the shape, the values."""
    length = len(tokens)
    for bound, code, shape_dtype in _SHAPE_DTYPES:
        if length < bound:
            break
    else:
        code, shape_dtype = 3, np.uint64
    return bytes([(1 << 2) | code]) + np.array([length], dtype=shape_dtype).tobytes() + tokens.tobytes()


class _MdsWriter:
    def __init__(self, directory: str, dtype: np.dtype, size_limit: int = SIZE_LIMIT):
        self.directory, self.size_limit = directory, size_limit
        self.names = ["difficulty", "id", "input_ids", "source"]
        self.encodings = ["str", "str", f"ndarray:{np.dtype(dtype).name}", "str"]
        self.config = {"column_encodings": self.encodings, "column_names": self.names,
                       "column_sizes": [None] * len(self.names), "compression": None, "format": "mds",
                       "hashes": [], "size_limit": size_limit, "version": 2}
        self.config_bytes = json.dumps(self.config, sort_keys=True).encode("utf-8")
        # A shard's bytes besides its samples (count, last offset, config), counted against the limit
        # as streaming's MDSWriter counts them, so both split a bucket at the same samples.
        self.shard_overhead = 4 + 4 + len(self.config_bytes)
        self.samples: list[bytes] = []
        self.pending = self.shard_overhead
        self.shards: list[dict[str, Any]] = []

    def add(self, values: dict[str, Any]) -> None:
        parts = [values["difficulty"].encode("utf-8"), values["id"].encode("utf-8"),
                 _ndarray_bytes(values["input_ids"]), values["source"].encode("utf-8")]
        sample = np.array([len(p) for p in parts], dtype=np.uint32).tobytes() + b"".join(parts)
        # Unlike streaming, never flush an empty shard (before a sample larger than the limit).
        if self.samples and self.pending + len(sample) + 4 > self.size_limit:
            self.flush()
        self.samples.append(sample)
        self.pending += len(sample) + 4

    def flush(self) -> None:
        if not self.samples:
            return
        header = 4 + 4 * (len(self.samples) + 1) + len(self.config_bytes)
        offsets = np.zeros(len(self.samples) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in self.samples], out=offsets[1:])
        offsets += header
        if offsets[-1] >= 1 << 32:
            raise ValueError("an MDS shard must stay under 4 GiB (32-bit offsets); a document is too large")
        basename = f"shard.{len(self.shards):05d}.mds"
        with atomic_file(os.path.join(self.directory, basename)) as fh:
            fh.write(np.uint32(len(self.samples)).tobytes())
            fh.write(offsets.astype(np.uint32).tobytes())
            fh.write(self.config_bytes)
            for sample in self.samples:
                fh.write(sample)
        self.shards.append({**self.config, "raw_data": {"basename": basename, "bytes": int(offsets[-1]), "hashes": {}},
                            "samples": len(self.samples), "zip_data": None})
        self.samples, self.pending = [], self.shard_overhead

    def close(self) -> None:
        self.flush()
        with atomic_file(os.path.join(self.directory, "index.json")) as fh:
            fh.write(json.dumps({"shards": self.shards, "version": 2}, sort_keys=True).encode("utf-8"))


def write(source: ShardSource, out_dir: str, size_limit: int = SIZE_LIMIT) -> dict[str, Any]:
    buckets = {}
    for bucket in source.buckets:
        directory = os.path.join(out_dir, bucket)
        os.mkdir(directory)
        writer = _MdsWriter(directory, source.dtype, size_limit)
        docs = tokens = 0
        for doc in source.documents(bucket):
            writer.add({"difficulty": doc.difficulty, "id": doc.id, "input_ids": doc.tokens, "source": source.name})
            docs += 1
            tokens += len(doc.tokens)
        writer.close()
        buckets[bucket] = {"directory": bucket, "documents": docs, "tokens": tokens, "shards": len(writer.shards)}
    return {"dtype": source.dtype.name, "buckets": buckets}
