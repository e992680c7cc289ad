"""Export a dsdata shard set to the formats other trainers read: one module per format, one registry.

  dsdata shards export --format megatron|mds|hf SRC DST      → DST/<format>/ (one folder per format)
  shards stage option  export: [megatron, …]                 → RUN_DIR/export/<format>/

Each format folder is written under a hidden temp name beside its target and renamed into place when
complete (an older export there is replaced only then), with `export.json` (what was exported from
which manifest) written inside it last.  The shard set is verified shard by shard as it is read
(dsdata/export/source.py), so a corrupt shard stops the export naming its file.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

from dsdata.export import hf, mds, megatron
from dsdata.export.files import atomic_file, staged_directory
from dsdata.export.source import ShardSource

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
                       "tokenizer": source.tokenizer, **summary}
            with atomic_file(os.path.join(out, "export.json")) as fh:
                fh.write((json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
        results[name] = {**summary, "path": os.path.join(dst, name)}
    return results
