"""Megatron-LM / NeMo indexed datasets: `<bucket>.bin` + `<bucket>.idx` per difficulty bucket.

The layout `megatron.core.datasets.indexed_dataset.IndexedDataset` reads (and its
`IndexedDatasetBuilder` writes), with one sequence per document, as `tools/preprocess_data.py` makes
without sentence splitting:

  .bin  every document's token ids back to back (dtype below), nothing else
  .idx  b"MMIDIDX\\x00\\x00"           9-byte magic
        <Q version = 1
        <B dtype code                   (DType: 8 = uint16, 4 = int32)
        <Q sequence count  S
        <Q document count  D = S + 1    (document indices, including the leading 0)
        int32[S]  sequence lengths (tokens)
        int64[S]  sequence pointers (byte offsets into .bin)
        int64[D]  document indices: 0, 1, …, S (sequence i is document i)

Megatron's DType enum has no uint32: vocabularies over 65,536 ids are written as int32 (what
Megatron's own builder picks above 65,500 ids).  Each document keeps its EOS, so document
boundaries survive Megatron's concatenation of documents into training samples.
"""
from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from dsdata.shards.export.files import atomic_file
from dsdata.shards.export.source import ShardSource

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {"uint16": 8, "int32": 4}


def write(source: ShardSource, out_dir: str) -> dict[str, Any]:
    dtype = np.dtype(np.uint16) if np.dtype(source.dtype) == np.uint16 else np.dtype(np.int32)
    buckets = {}
    for bucket in source.buckets:
        lengths: list[int] = []
        with atomic_file(os.path.join(out_dir, f"{bucket}.bin")) as data:
            for doc in source.documents(bucket):
                tokens = doc.tokens if doc.tokens.dtype == dtype else doc.tokens.astype(dtype)
                data.write(memoryview(np.ascontiguousarray(tokens)).cast("B"))
                lengths.append(len(tokens))
        with atomic_file(os.path.join(out_dir, f"{bucket}.idx")) as index:
            index.write(index_bytes(np.asarray(lengths, dtype=np.int64), dtype))
        buckets[bucket] = {"prefix": bucket, "documents": len(lengths), "tokens": int(sum(lengths))}
    return {"dtype": dtype.name, "buckets": buckets}


def index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    if len(lengths) and int(lengths.max()) >= 1 << 31:
        raise ValueError("a document of 2^31 tokens or more does not fit Megatron's int32 sequence lengths")
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    documents = np.arange(len(lengths) + 1, dtype=np.int64)
    return b"".join([
        INDEX_MAGIC, struct.pack("<Q", INDEX_VERSION), struct.pack("<B", DTYPE_CODES[dtype.name]),
        struct.pack("<Q", len(lengths)), struct.pack("<Q", len(documents)),
        lengths.astype(np.int32).tobytes(), pointers.tobytes(), documents.tobytes(),
    ])
