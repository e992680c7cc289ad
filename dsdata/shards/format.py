"""Training shards: Arrow IPC files of token lists plus a checksummed `manifest.json`, written last
(docs/shards.md).  Each shard is ONE record batch (one contiguous values buffer), uncompressed so it
memory-maps; every file is written under a temporary name, fsynced and renamed into place.  Manifest
paths are plain file names: one that would escape the manifest's directory is refused.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from dsdata.io.outfiles import TEMP_MARK, atomic_file, atomic_write_bytes, file_sha256
from dsdata.io.untrusted_files import UntrustedFileError, confined_path, load_json_file

MANIFEST = "manifest.json"
FORMAT = "dsdata-shards"
VERSION = 1
TOKEN_COLUMN = "tokens"
BUCKETS = ("easy", "medium", "hard")


class ShardError(ValueError):
    """A shard directory, manifest or shard file is missing, malformed or corrupt; names the file."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def shard_name(bucket: str, index: int, count: int) -> str:
    return f"shard-{bucket}-{index:05d}-of-{count:05d}.arrow"


# ------------------------------------------------------------------------------------------ writing


def shard_table(token_arrays: Sequence[np.ndarray], ids: Sequence[str], difficulties: Sequence[str | None],
                dtype: np.dtype) -> pa.Table:
    """One shard's table: the token arrays concatenated into a single values buffer + offsets."""
    lengths = np.fromiter((len(a) for a in token_arrays), dtype=np.int64, count=len(token_arrays))
    offsets = np.zeros(len(token_arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate([np.asarray(a, dtype=dtype) for a in token_arrays]) if token_arrays else np.zeros(0, dtype)
    value_type = pa.from_numpy_dtype(dtype)
    if offsets[-1] < (1 << 31):
        tokens = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type))
    else:  # more than 2^31 tokens in one shard: 64-bit offsets
        tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type))
    return pa.table({
        TOKEN_COLUMN: tokens,
        "id": pa.array(list(ids), type=pa.string()),
        "difficulty": pa.array(list(difficulties), type=pa.string()),
    })


def write_shard(directory: str, name: str, token_arrays: Sequence[np.ndarray], ids: Sequence[str],
                difficulties: Sequence[str | None], dtype: np.dtype) -> dict[str, Any]:
    """Write one shard atomically (temp name → fsync → rename) and return its manifest entry."""
    if os.path.basename(name) != name or name.startswith("."):
        raise ShardError(f"shard name '{name}' must be a plain file name")
    table = shard_table(token_arrays, ids, difficulties, dtype)
    path = os.path.join(directory, name)
    # One record batch: the token values stay one contiguous buffer for the whole shard.
    with atomic_file(path) as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(1, table.num_rows))
    size = os.path.getsize(path)
    buckets: dict[str, dict[str, int]] = {}
    lengths = [len(a) for a in token_arrays]
    for length, bucket in zip(lengths, difficulties):
        entry = buckets.setdefault(str(bucket), {"docs": 0, "tokens": 0})
        entry["docs"] += 1
        entry["tokens"] += length
    single = {str(b) for b in difficulties}
    return {
        "file": name,
        "difficulty": single.pop() if len(single) == 1 else None,
        "docs": len(lengths),
        "tokens": int(sum(lengths)),
        "bytes": size,
        "sha256": file_sha256(path),
        "buckets": buckets,
    }


def build_manifest(entries: Iterable[dict[str, Any]], dtype: np.dtype, tokenizer: dict[str, Any] | None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    shards = sorted(entries, key=lambda e: e["file"])
    buckets: dict[str, dict[str, int]] = {}
    for shard in shards:
        for bucket, counts in shard.get("buckets", {}).items():
            total = buckets.setdefault(bucket, {"shards": 0, "docs": 0, "tokens": 0})
            total["docs"] += counts["docs"]
            total["tokens"] += counts["tokens"]
        if shard.get("difficulty") is not None:
            buckets.setdefault(shard["difficulty"], {"shards": 0, "docs": 0, "tokens": 0})["shards"] += 1
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": np.dtype(dtype).name,
        "token_column": TOKEN_COLUMN,
        "tokenizer": tokenizer,
        "shards": shards,
        "buckets": dict(sorted(buckets.items())),
        "totals": {"shards": len(shards), "docs": sum(s["docs"] for s in shards),
                   "tokens": sum(s["tokens"] for s in shards)},
    }
    if extra:
        manifest.update(extra)
    return manifest


def write_manifest(directory: str, manifest: dict[str, Any]) -> str:
    """Write manifest.json atomically after checking every shard it names exists; remove stale temp files."""
    for shard in manifest["shards"]:
        path = resolve_shard_path(directory, shard["file"])
        if not os.path.isfile(path) or os.path.getsize(path) != shard["bytes"]:
            raise ShardError(f"{path}: missing or not {shard['bytes']} bytes; not writing a manifest that names it")
    remove_stale_temp_files(directory)
    path = os.path.join(directory, MANIFEST)
    atomic_write_bytes(path, manifest_bytes(manifest))
    return path


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """manifest.json's bytes (the same wherever it is written)."""
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def remove_stale_temp_files(directory: str) -> None:
    """Delete temp files a crashed writer left behind (they never carry a final name)."""
    for name in os.listdir(directory):
        if name.startswith(".") and TEMP_MARK in name:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))


# ------------------------------------------------------------------------------------------ reading


def resolve_shard_path(directory: str, name: Any) -> str:
    """The path of a shard named in a manifest, refusing names that leave the manifest's directory."""
    try:
        return confined_path(directory, name, f"{os.path.join(directory, MANIFEST)}: shard path")
    except UntrustedFileError as exc:
        raise ShardError(str(exc)) from None


def locate_shard_dir(path: str) -> str:
    """The shard directory itself, or the shards/ folder of a `dsdata run` output directory (as the
    trainer's data.path accepts); anything else is returned unchanged for read_manifest to refuse."""
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    nested = os.path.join(path, "shards")
    if os.path.isfile(os.path.join(nested, MANIFEST)):
        return nested
    if os.path.isdir(nested):
        raise ShardError(f"{os.path.join(nested, MANIFEST)} not found: the run that writes {path} did not finish "
                         "writing its shards (the manifest is written last); run it again")
    if os.path.isfile(os.path.join(path, "stats.json")):
        raise ShardError(f"{path} is a `dsdata run` output without shards/ (its recipe has no shards stage); "
                         "shards come from pipelines/pretrain.yaml or a recipe ending in tokenize → shards")
    return path


def read_manifest(directory: str) -> dict[str, Any]:
    """Load and sanity-check `directory/manifest.json` (format, dtype, shard entries, paths)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        raise ShardError(f"shard directory '{directory}' does not exist")
    if not os.path.lexists(path):  # present but no regular file: load_json_file says what it is
        raise ShardError(f"{path} not found: '{directory}' is not a shard set; give a `dsdata run` output "
                         "directory (RUN_DIR, holding shards/) or its shards/ folder")
    try:
        manifest = load_json_file(path, "manifest")
    except UntrustedFileError as exc:
        raise ShardError(str(exc)) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ShardError(f"{path}: not a dsdata shard manifest (format must be '{FORMAT}')")
    if manifest.get("version") != VERSION:
        raise ShardError(f"{path}: manifest version {manifest.get('version')!r} is not supported (this dsdata reads {VERSION})")
    if manifest.get("dtype") not in ("uint16", "uint32"):
        raise ShardError(f"{path}: dtype {manifest.get('dtype')!r} must be uint16 or uint32")
    shards = manifest.get("shards")
    if not isinstance(shards, list):
        raise ShardError(f"{path}: 'shards' must be a list")
    first_entry: dict[str, int] = {}
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict) or not {"file", "sha256", "bytes", "tokens", "docs"} <= set(shard):
            raise ShardError(f"{path}: every shard entry needs file, sha256, bytes, tokens and docs")
        _check_entry_types(path, i, shard)
        resolved = resolve_shard_path(directory, shard["file"])
        # One file listed twice would be trained on twice as often (and verify ok): refused.
        if resolved in first_entry:
            raise ShardError(f"{path}: shard {shard['file']!r} is listed twice (entries {first_entry[resolved]} and {i})")
        first_entry[resolved] = i
    vocab = manifest_vocab_size(manifest)
    if vocab is not None and not (_is_count(vocab) and vocab > 0):
        raise ShardError(f"{path}: tokenizer.vocab_size must be a positive integer, not {vocab!r}")
    if "token_column" in manifest and not isinstance(manifest["token_column"], str):
        raise ShardError(f"{path}: token_column must be a string, not {manifest['token_column']!r}")
    return manifest


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entry_types(path: str, index: int, shard: dict[str, Any]) -> None:
    """Field types of one manifest entry: a hand-edited manifest fails here in one line."""
    where = f"{path}: shards[{index}]"
    for key in ("bytes", "tokens", "docs"):
        if not _is_count(shard[key]):
            raise ShardError(f"{where}.{key} must be a non-negative integer, not {shard[key]!r}")
    digest = shard["sha256"]
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise ShardError(f"{where}.sha256 must be 64 lower-case hex digits, not {digest!r}")
    if shard.get("difficulty") is not None and not isinstance(shard["difficulty"], str):
        raise ShardError(f"{where}.difficulty must be a string or null, not {shard['difficulty']!r}")


def manifest_vocab_size(manifest: dict[str, Any]) -> int | None:
    """The tokenizer vocabulary size a manifest records (read_manifest checked its type), or None."""
    tokenizer = manifest.get("tokenizer")
    return tokenizer.get("vocab_size") if isinstance(tokenizer, dict) else None


def check_shard_buffer(path: str, buffer: pa.Buffer, token_column: str, dtype: np.dtype, tokens: int,
                       vocab_size: int | None = None) -> np.ndarray:
    """Check the Arrow IPC file in `buffer` (a shard's whole mapping) against its manifest entry
    before any token is served; returns the token values as a zero-copy array.

    Whoever can write the file can write its sha256 in the manifest too, and Arrow trusts a batch's
    metadata: a file claiming more tokens than it holds would be served from beyond its mapping
    (then a segfault).  So: one record batch, full validation, every buffer inside the mapping,
    offsets from 0 to the values' length, the manifest's dtype and count."""
    try:
        reader = pa.ipc.open_file(pa.BufferReader(buffer))
        if reader.num_record_batches != 1:
            raise ShardError(f"{path}: {reader.num_record_batches} record batches; dsdata shards hold one")
        batch = reader.get_batch(0)
        batch.validate(full=True)
        index = batch.schema.get_field_index(token_column)
        if index < 0:
            raise ShardError(f"{path}: no '{token_column}' column")
        column = batch.column(index)
    except (pa.ArrowException, OSError, ValueError) as exc:  # ArrowInvalid, ArrowIOError (an OSError), …
        if isinstance(exc, ShardError):
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ShardError(f"{path}: not a valid dsdata shard ({first})") from None
    _check_inside(path, batch, buffer)
    if not isinstance(column, (pa.ListArray, pa.LargeListArray)):
        raise ShardError(f"{path}: column '{token_column}' is {column.type}, not a list of token ids")
    values = column.values
    offsets = column.offsets
    first = offsets[0].as_py() if len(offsets) else 0
    last = offsets[-1].as_py() if len(offsets) else 0
    if first != 0 or last != len(values):
        raise ShardError(f"{path}: token offsets span {first}..{last}, the values buffer holds {len(values)}")
    if len(values) != tokens or pa.from_numpy_dtype(dtype) != values.type:
        raise ShardError(f"{path}: {len(values)} {values.type} tokens, the manifest says {tokens} {np.dtype(dtype).name}")
    ids = values.to_numpy(zero_copy_only=True)
    # An id past the vocabulary indexes past the embedding table: an IndexError traceback on the CPU,
    # a device-side assert on a GPU.
    if vocab_size is not None and len(ids) and int(ids.max()) >= vocab_size:
        raise ShardError(f"{path}: token id {int(ids.max())} is outside the tokenizer's vocabulary of {vocab_size} "
                         "(written with another tokenizer, or tampered)")
    return ids


def _check_inside(path: str, batch: pa.RecordBatch, buffer: pa.Buffer) -> None:
    """Every buffer of every column (list values included) lies inside the mapped file."""
    start, end = buffer.address, buffer.address + buffer.size
    for position, array in enumerate(batch.columns):
        stack = [array]
        while stack:
            arr = stack.pop()
            for buf in arr.buffers():
                if buf and buf.size and not (start <= buf.address and buf.address + buf.size <= end):
                    raise ShardError(f"{path}: a buffer of column '{batch.schema.field(position).name}' "
                                     "lies outside the file (tampered Arrow metadata)")
            if isinstance(arr, (pa.ListArray, pa.LargeListArray)):
                stack.append(arr.values)


def verify_shard_file(directory: str, shard: dict[str, Any], dtype: str | None = None,
                      token_column: str = TOKEN_COLUMN, vocab_size: int | None = None) -> None:
    """Raise ShardError naming the file when it is missing, of the wrong size, fails its sha256, or
    (given the manifest's dtype) its Arrow content does not match its entry (`check_shard_buffer`)."""
    path = resolve_shard_path(directory, shard["file"])
    if not os.path.isfile(path):
        raise ShardError(f"{path}: shard named in the manifest is missing")
    size = os.path.getsize(path)
    if size != shard["bytes"]:
        raise ShardError(f"{path}: {size} bytes, the manifest says {shard['bytes']} (truncated or replaced)")
    actual = file_sha256(path)
    if actual != shard["sha256"]:
        raise ShardError(f"{path}: sha256 {actual} does not match the manifest's {shard['sha256']} (corrupt shard)")
    if dtype is not None:
        with pa.memory_map(os.fsencode(path), "r") as mapped:
            check_shard_buffer(path, mapped.read_buffer(), token_column, np.dtype(dtype), shard["tokens"], vocab_size)


def verify_shards(directory: str) -> tuple[dict[str, Any], list[str]]:
    """Check every shard of a set; returns (manifest, problems) — one line per bad file."""
    manifest = read_manifest(directory)
    problems = []
    for shard in manifest["shards"]:
        try:
            verify_shard_file(directory, shard, manifest["dtype"], manifest.get("token_column", TOKEN_COLUMN),
                              manifest_vocab_size(manifest))
        except ShardError as exc:
            problems.append(str(exc))
    return manifest, problems
