"""THE table of export formats: plain data, importable without numpy or pyarrow, read by the shards
stage, the CLI and the docs.  A new format is one module under dsdata/shards/export/ with
`write(source, out_dir) -> summary` and one row below; nothing else names it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExportFormat:
    name: str      # the --format value and the shards stage's `export` item
    # "module:function": writer(source, out_dir) writes one format folder from a verified ShardSource
    # and returns its summary, {"buckets": {bucket: {"documents": n, "tokens": n}}, …}
    writer: str
    summary: str   # what a trainer reads it with


# The rows, in the order help texts list them.
EXPORT_FORMATS: list[ExportFormat] = [
    ExportFormat("megatron", "dsdata.shards.export.megatron:write", "Megatron-LM / NeMo .bin/.idx"),
    ExportFormat("mds", "dsdata.shards.export.mds:write", "MosaicML streaming"),
    ExportFormat("hf", "dsdata.shards.export.hf:write", "Hugging Face datasets"),
]


def format_names() -> tuple[str, ...]:
    return tuple(f.name for f in EXPORT_FORMATS)


def find_format(name: str) -> ExportFormat | None:
    return next((f for f in EXPORT_FORMATS if f.name == name), None)


def formats_help() -> str:
    """`megatron (Megatron-LM / NeMo .bin/.idx), mds (…), hf (…)`: for help texts."""
    return ", ".join(f"{f.name} ({f.summary})" for f in EXPORT_FORMATS)


def register_export_format(fmt: ExportFormat) -> ExportFormat:
    """Add a format for this process (one that does not ship with dsdata); refused when its name is
    taken.  Returns `fmt`."""
    if find_format(fmt.name) is not None:
        raise ValueError(f"export format '{fmt.name}' already exists")
    EXPORT_FORMATS.append(fmt)
    return fmt
