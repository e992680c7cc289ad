"""Export a dsdata shard set to the formats other trainers read: one module per format, one registry.

  dsdata shards export --format megatron|mds|hf SRC DST      → DST/<format>/ (one folder per format)
  shards stage option  export: [megatron, …]                 → RUN_DIR/export/<format>/

Each format folder is written under a hidden temp name beside its target and renamed into place when
complete (an older export there is replaced only then), with the shards' tokenizer in
<format>/tokenizer/ and `export.json` (what was exported from which manifest) written inside it last.  The shard set is verified shard by shard as it is read
(dsdata/export/source.py), so a corrupt shard stops the export naming its file.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

from dsdata.export import hf, mds, megatron
from dsdata.export.files import atomic_file, staged_directory
from dsdata.export.source import ShardSource
from dsdata.io.shard_tokenizer import bundled_files, tokenizer_dir, tokenizer_sources
from dsdata.io.shards import file_sha256

# name → writer(source, out_dir) -> summary; the names are the --format values and stage options.
FORMATS: dict[str, Callable[[ShardSource, str], dict[str, Any]]] = {
    "megatron": megatron.write,
    "mds": mds.write,
    "hf": hf.write,
}
EXPORT_DIR = "export"


class ExportError(ValueError):
    """An export request that cannot be done (unknown format, DST inside SRC, …); one line."""


def check_formats(formats: list[str]) -> list[str]:
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ExportError(f"unknown export format(s) {', '.join(map(repr, unknown))}; choose from {', '.join(FORMATS)}")
    if not formats:
        raise ExportError(f"no export format given; choose from {', '.join(FORMATS)}")
    return list(dict.fromkeys(formats))


def copy_tokenizer(source: ShardSource, out_dir: str) -> list[str]:
    """Copy the shards' tokenizer into out_dir/tokenizer/ (what each trainer needs beside the ids):
    the bundled files, each checked against its sha256; for a manifest from before bundling, the
    tokenizer directory it names when its tokenizer.json still has the recorded sha256.  Returns
    the names copied ([] when the tokenizer is not on this machine)."""
    directory = tokenizer_dir(source.directory, source.manifest)
    if directory is None:
        return []
    bundled = {e["file"].split("/", 1)[1]: e["sha256"] for e in bundled_files(source.directory, source.manifest)}
    if not bundled:
        json_path = directory if os.path.isfile(directory) else os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(json_path) or file_sha256(json_path) != source.tokenizer.get("sha256"):
            return []
    os.mkdir(os.path.join(out_dir, "tokenizer"))
    copied = []
    for path, name in tokenizer_sources(directory):
        with open(path, "rb") as fh:
            data = fh.read()
        if name in bundled and hashlib.sha256(data).hexdigest() != bundled[name]:
            raise ExportError(f"{path}: sha256 does not match the shard manifest's; not exporting a changed tokenizer")
        with atomic_file(os.path.join(out_dir, "tokenizer", name)) as fh:
            fh.write(data)
        copied.append(name)
    return copied


def export_shards(src: str, dst: str, formats: list[str], source_name: str | None = None) -> dict[str, Any]:
    """Export the shard set at `src` (a shard folder or a `dsdata run` OUT) to DST/<format> for each
    format; returns {format: summary}."""
    formats = check_formats(formats)
    source = ShardSource(src, source_name)
    shard_dir = os.path.realpath(source.directory)
    target_root = os.path.realpath(dst)
    if target_root == shard_dir or target_root.startswith(shard_dir + os.sep):
        raise ExportError(f"export destination {dst} lies inside the shard set {source.directory}; "
                          "choose a folder outside it (e.g. RUN_DIR/export)")
    results = {}
    for name in formats:
        with staged_directory(os.path.join(dst, name)) as out:
            summary = FORMATS[name](source, out)
            summary = {"format": name, "source": source.name, "manifest_sha256": source.manifest_sha256,
                       "tokenizer": source.tokenizer, "tokenizer_files": copy_tokenizer(source, out), **summary}
            with atomic_file(os.path.join(out, "export.json")) as fh:
                fh.write((json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
        results[name] = {**summary, "path": os.path.join(dst, name)}
    return results
