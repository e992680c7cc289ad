"""Readers: turn one input file into Documents, and every unreadable part of it into a Rejected.

One module per format and ONE registry, `REGISTRY` below: its name (`--format`, a recipe's
`input.format`), the file-name suffixes `auto` knows it by, its reader, and, for a format several
workers may read apart, how to cut a file into ranges.  Adding a reader: docs/architecture.md.

Each reader takes the file's name and a binary file object and yields `Document` or
`Rejected(stage="read")`: nothing is skipped silently (blank JSONL lines are not records).
Compressed input is decoded member by member (dsdata/io/decompress.py).  Every text that leaves a
reader is valid Unicode.

Reason codes (stage `read`): bad_json, not_an_object, invalid_utf8, missing_text, empty_text,
binary_file, unknown_format, line_too_long, too_large, truncated_compression, corrupt_compression,
bad_parquet, bad_warc, truncated_record, undecodable_payload, unreadable_file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.decompress import compression_of
from dsdata.io.readers import delimited, html, json_document, jsonl, parquet, text, warc
from dsdata.io.readers.common import READ_STAGE, InputFormatError, _file_rejection, base_name, scrub_surrogates
from dsdata.io.readers.html import decode_html
from dsdata.io.readers.jsonl import jsonl_ranges, read_jsonl
from dsdata.io.readers.parquet import parquet_ranges, read_parquet
from dsdata.io.readers.ranges import RANGE_MAX_BYTES, RANGE_MIN_BYTES, RangeReader, range_bytes_for
from dsdata.io.readers.warc import read_warc

__all__ = [
    "READ_STAGE", "InputFormatError", "InputFormat", "REGISTRY", "READERS", "FORMATS", "detect_format",
    "cuttable_format", "read_file", "read_local", "read_jsonl", "read_parquet", "read_warc", "decode_html",
    "jsonl_ranges", "parquet_ranges", "range_bytes_for", "RangeReader", "RANGE_MIN_BYTES", "RANGE_MAX_BYTES",
    "scrub_surrogates",
]

Reader = Callable[..., Iterator[Document | Rejected]]


@dataclass(frozen=True)
class InputFormat:
    """One input format: everything dsdata needs to know about it, in one place."""

    name: str                    # --format NAME, input.format: NAME
    suffixes: tuple[str, ...]    # lower-case file-name endings `auto` recognises (before .gz/.zst)
    read: Reader                 # read(path, raw, text_field=..., id_field=...) → Documents / Rejected
    # Several workers read a big uncompressed file apart: ranges(raw, range_bytes) → [(start, end,
    # first_line)] or None (read whole); read_range(path, raw, start, end, first_line, text_field,
    # id_field) reads one of them with the ids and rows reading the file whole gives.
    ranges: Callable[[IO[bytes], int], list[tuple[int, int | None, int]] | None] | None = None
    read_range: Reader | None = None
    summary: str = ""

    @property
    def splits_into_ranges(self) -> bool:
        return self.ranges is not None


REGISTRY: tuple[InputFormat, ...] = (
    InputFormat("jsonl", (".jsonl", ".ndjson"), jsonl.read_jsonl, jsonl.jsonl_ranges, jsonl.read_jsonl_range,
                summary="JSON Lines: one object per line, its text in text_field"),
    InputFormat("parquet", (".parquet", ".pq"), parquet.read_parquet, parquet.parquet_ranges,
                parquet.read_parquet_range, summary="Parquet: one row per document, its text in text_field"),
    InputFormat("html", html.HTML_SUFFIXES, html.read_html, summary="one HTML page per file"),
    InputFormat("warc", (".warc", ".arc"), warc.read_warc, summary="web archives: each HTML response record"),
    InputFormat("text", text.TEXT_SUFFIXES, text.read_text, summary="plain text / Markdown: one document per file"),
    InputFormat("csv", delimited.CSV_SUFFIXES, delimited.read_csv,
                summary="CSV / TSV: a header row, then one record per row, its text in text_field"),
    InputFormat("json", json_document.JSON_SUFFIXES, json_document.read_json,
                summary="one JSON document per file: an object, or an array of objects (JSON Lines in a .json "
                        "file are read as such)"),
)
READERS: dict[str, InputFormat] = {fmt.name: fmt for fmt in REGISTRY}
FORMATS: tuple[str, ...] = tuple(READERS)  # the names, in registry order


def detect_format(path: str) -> str:
    """Input format from the file name: a registered format's suffix, optionally then .gz/.zst."""
    name = base_name(path)
    for fmt in REGISTRY:
        if name.endswith(fmt.suffixes):
            return fmt.name
    raise InputFormatError(
        f"cannot tell the format of '{path}' from its name; set input.format in the recipe "
        f"or pass --format ({', '.join(FORMATS)})"
    )


def cuttable_format(path: str, fmt: str = "auto") -> str | None:
    """The format's name when `path` is read in a format that splits into ranges read apart and the
    file is not compressed, else None."""
    if fmt == "auto":
        try:
            fmt = detect_format(path)
        except InputFormatError:
            return None
    entry = READERS.get(fmt)
    return fmt if entry is not None and entry.splits_into_ranges and compression_of(path) is None else None


def read_file(path: str, raw: IO[bytes], fmt: str = "auto", text_field: str = "text", id_field: str = "id"):
    """Dispatch to the reader for `fmt` ('auto' = from the file name)."""
    if fmt == "auto":
        try:
            fmt = detect_format(path)
        except InputFormatError as exc:
            # One file a glob matched by accident (a README among the data) is a row, not a crash.
            return iter([_file_rejection(path, "unknown_format", str(exc))])
    if fmt not in READERS:
        raise InputFormatError(f"unknown input format '{fmt}' (known: {', '.join(FORMATS)})")
    return READERS[fmt].read(path, raw, text_field=text_field, id_field=id_field)


def read_local(path: str, fmt: str = "auto", **kwargs: Any) -> list[Document | Rejected]:
    """Read a local file fully (for tests and small tools)."""
    with open(path, "rb") as fh:
        return list(read_file(os.fspath(path), fh, fmt, **kwargs))
