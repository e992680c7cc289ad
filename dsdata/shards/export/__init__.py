"""Export a dsdata shard set to the formats other trainers read: one module per format, one registry.

  dsdata shards export --format megatron|mds|hf SRC DST      → DST/<format>/ (one folder per format)
  shards stage option  export: [megatron, …]                 → RUN_DIR/export/<format>/

Each format folder is staged under a hidden temp name and renamed into place when complete
(files.py), with the shards' tokenizer in <format>/tokenizer/ and `export.json` written last.  Every
shard and every pinned tokenizer file is verified as it is read: a bad one stops the export.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import importlib

from dsdata.shards.export.formats import find_format, format_names
from dsdata.shards.export.files import atomic_file, check_replaceable, staged_directory
from dsdata.shards.export.source import ShardSource
from dsdata.shards.tokenizer import (BUNDLE_DIR, bundled_files, tokenizer_dir, tokenizer_sources,
                                       verify_bundled_tokenizer)
from dsdata.shards.format import resolve_shard_path

EXPORT_DIR = "export"


class ExportError(ValueError):
    """An export request that cannot be done (unknown format, DST inside SRC, …); one line."""


def check_formats(formats: list[str]) -> list[str]:
    unknown = [f for f in formats if find_format(f) is None]
    if unknown:
        raise ExportError(f"unknown export format(s) {', '.join(map(repr, unknown))}; "
                          f"choose from {', '.join(format_names())}")
    if not formats:
        raise ExportError(f"no export format given; choose from {', '.join(format_names())}")
    return list(dict.fromkeys(formats))


def copy_tokenizer(source: ShardSource, out_dir: str) -> list[str]:
    """Copy the shards' tokenizer into out_dir/tokenizer/: exactly the bundled files the manifest
    pins, each checked against its sha256 as it is copied (an older manifest: the folder it names,
    its tokenizer.json checked, its other tokenizer files as found).  ExportError when a pinned file
    is missing, changed or a link, or the bundle holds one the manifest does not list.  Returns the
    names copied ([] when an older manifest's tokenizer is not on this machine)."""
    bundled = bundled_files(source.directory, source.manifest)
    if bundled:
        problems = verify_bundled_tokenizer(source.directory, source.manifest)
        if problems:
            raise ExportError(f"{problems[0]}; not exporting a changed tokenizer")
        directory = resolve_shard_path(source.directory, BUNDLE_DIR)
        pinned = {e["file"].split("/", 1)[1]: e["sha256"] for e in bundled}
        extra = [name for _, name in tokenizer_sources(directory) if name not in pinned]
        if extra:
            raise ExportError(f"{os.path.join(directory, extra[0])}: a tokenizer file the shard manifest does not "
                              "list; not exporting a changed tokenizer")
    else:
        found = tokenizer_dir(source.directory, source.manifest)
        json_path = found if found and os.path.isfile(found) else os.path.join(found or "", "tokenizer.json")
        if found is None or not source.tokenizer.get("sha256") or not os.path.isfile(json_path):
            return []
        directory = os.path.dirname(json_path)
        pinned = {name: None for _, name in tokenizer_sources(found)}
        pinned["tokenizer.json"] = source.tokenizer["sha256"]
    os.mkdir(os.path.join(out_dir, "tokenizer"))
    for name, sha256 in pinned.items():
        path = os.path.join(directory, name) if bundled or name != "tokenizer.json" else json_path
        # What is copied is what is checked; a bundled file is dsdata's own: a link there is not followed.
        with os.fdopen(os.open(path, os.O_RDONLY | (os.O_NOFOLLOW if bundled else 0)), "rb") as fh:
            data = fh.read()
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise ExportError(f"{path}: sha256 does not match the shard manifest's; not exporting a changed tokenizer")
        with atomic_file(os.path.join(out_dir, "tokenizer", name)) as fh:
            fh.write(data)
    return sorted(pinned)


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
    for name in formats:  # before any work: a folder the export did not write is not replaced
        check_replaceable(os.path.join(dst, name))
    results = {}
    for name in formats:
        with staged_directory(os.path.join(dst, name)) as out:
            tokenizer_files = copy_tokenizer(source, out)  # first: a changed tokenizer stops it at once
            module, _, function = find_format(name).writer.partition(":")
            summary = getattr(importlib.import_module(module), function)(source, out)
            summary = {"format": name, "source": source.name, "manifest_sha256": source.manifest_sha256,
                       "tokenizer": source.tokenizer, "tokenizer_files": tokenizer_files, **summary}
            with atomic_file(os.path.join(out, "export.json")) as fh:
                fh.write((json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
        results[name] = {**summary, "path": os.path.join(dst, name)}
    return results
