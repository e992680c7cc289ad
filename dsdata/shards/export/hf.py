"""Hugging Face `datasets`: the `Dataset.save_to_disk` layout, the same rows as Parquet, a dataset card.

  DST/hf/README.md                           dataset card  ─┐ datasets.load_dataset(DST/hf, split="train")
  DST/hf/data/train-NNNNN-of-MMMMM.parquet   the rows      ─┘ (the card's YAML `configs` names them)
  DST/hf/save_to_disk/data-NNNNN-of-MMMMM.arrow   Arrow IPC streams ─┐ datasets.load_from_disk(
  DST/hf/save_to_disk/state.json, dataset_info.json                  ┘   DST/hf/save_to_disk)

(`load_dataset` refuses a folder holding the save_to_disk files, hence their own sub-folder.)

One row per document (EOS included): `input_ids` (list<uint16>, or list<uint32> above 65,536 ids),
`id`, `difficulty`, `source`.  One file of each kind per dsdata shard, buckets in name order.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dsdata.shards.export.files import atomic_file
from dsdata.shards.export.source import ShardSource

SAVE_TO_DISK = "save_to_disk"


def _table(docs: list, dtype, source_name: str) -> pa.Table:
    from dsdata.shards.format import shard_table

    table = shard_table([d.tokens for d in docs], [d.id for d in docs], [d.difficulty for d in docs], dtype)
    return pa.table({"input_ids": table.column("tokens"), "id": table.column("id"),
                     "difficulty": table.column("difficulty"),
                     "source": pa.array([source_name] * len(docs), type=pa.string())})


def write(source: ShardSource, out_dir: str) -> dict[str, Any]:
    shards = [(bucket, shard) for bucket in source.buckets for shard in source.shards(bucket)]
    count = len(shards)
    disk = os.path.join(out_dir, SAVE_TO_DISK)
    os.mkdir(os.path.join(out_dir, "data"))
    os.mkdir(disk)
    files, fingerprint = [], hashlib.sha256(source.manifest_sha256.encode())
    buckets: dict[str, dict[str, int]] = {}
    for i, (bucket, shard) in enumerate(shards):
        docs = list(source.shard_documents(shard))
        table = _table(docs, source.dtype, source.name)
        arrow_name = f"data-{i:05d}-of-{count:05d}.arrow"
        with atomic_file(os.path.join(disk, arrow_name)) as fh:
            with pa.ipc.new_stream(fh, table.schema) as writer:
                writer.write_table(table)
        with atomic_file(os.path.join(out_dir, "data", f"train-{i:05d}-of-{count:05d}.parquet")) as fh:
            pq.write_table(table, fh)
        files.append({"filename": arrow_name})
        fingerprint.update(shard["sha256"].encode())
        counts = buckets.setdefault(bucket, {"documents": 0, "tokens": 0})
        counts["documents"] += len(docs)
        counts["tokens"] += sum(len(d.tokens) for d in docs)
    state = {"_data_files": files, "_fingerprint": fingerprint.hexdigest()[:16], "_format_columns": None,
             "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": "train"}
    info = {"description": f"dsdata shards of {source.name}, one row per document", "citation": "",
            "homepage": "", "license": ""}
    for name, obj in (("state.json", state), ("dataset_info.json", info)):
        with atomic_file(os.path.join(disk, name)) as fh:
            fh.write((json.dumps(obj, indent=2) + "\n").encode("utf-8"))
    with atomic_file(os.path.join(out_dir, "README.md")) as fh:
        fh.write(dataset_card(source, buckets).encode("utf-8"))
    return {"dtype": source.dtype.name, "files": count, "buckets": buckets}


def dataset_card(source: ShardSource, buckets: dict[str, dict[str, int]]) -> str:
    tok = source.tokenizer
    rows = "\n".join(f"| {b} | {c['documents']:,} | {c['tokens']:,} |" for b, c in buckets.items())
    return f"""---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
---
# {source.name}

Token ids of curated documents, exported by `dsdata shards export --format hf` from a dsdata shard set
(manifest sha256 `{source.manifest_sha256}`).

Tokenizer: `{tok.get('kind')}`, vocabulary {tok.get('vocab_size')}, EOS `{tok.get('eos_token')}` = {tok.get('eos_id')}
(tokenizer.json sha256 `{tok.get('sha256')}`). Every document ends with EOS.

| difficulty | documents | tokens |
|---|---|---|
{rows}

Columns: `input_ids` (list<{source.dtype.name}>), `id`, `difficulty` (easy / medium / hard), `source`.

```python
import datasets
ds = datasets.load_dataset("PATH", split="train")            # the Parquet files named above
ds = datasets.load_from_disk("PATH/save_to_disk")            # the same rows as Arrow files
```
"""
