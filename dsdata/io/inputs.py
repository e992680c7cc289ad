"""Input paths as the user gives them → the file patterns the pipeline reads.

A local directory means the files in it, recursively (Beam's file matching would hand the reader
the directory itself, which becomes one `unreadable_file` row, "Is a directory").  With format
`auto` the format of each file comes from its name, so files whose name names no format (README,
LICENSE, .txt) are not inputs; they are counted in `skipped` for the caller to report.  Hidden files
and directories (a leading '.', e.g. .git) are not inputs either.  A glob that matches directories
is expanded the same way.  Remote paths (gs://, s3://) are passed to Beam unchanged.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from dsdata.io.readers import InputFormatError, detect_format


class InputPathError(ValueError):
    """An input path that names nothing to read (an empty directory)."""


@dataclass
class ExpandedInputs:
    patterns: list[str]
    skipped: list[str] = field(default_factory=list)  # files in given directories with no known format


def _files_under(directory: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(root, f) for f in sorted(files) if not f.startswith("."))
    return found


def _has_format(path: str) -> bool:
    try:
        detect_format(path)
    except InputFormatError:
        return False
    return True


def expand_directories(patterns: list[str], fmt: str = "auto") -> ExpandedInputs:
    """Replace every local directory (given, or matched by a glob) by the files under it."""
    out = ExpandedInputs([])
    for pattern in patterns:
        if "://" in pattern:
            out.patterns.append(pattern)
            continue
        if os.path.isdir(pattern):
            matches = [pattern]
        elif glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern, recursive=True))
            if not any(os.path.isdir(m) for m in matches):
                out.patterns.append(pattern)  # plain file glob: Beam matches it
                continue
        else:
            out.patterns.append(pattern)
            continue
        for match in matches:
            if not os.path.isdir(match):
                out.patterns.append(match)
                continue
            files = _files_under(match)
            readable = files if fmt != "auto" else [f for f in files if _has_format(f)]
            if not readable:
                what = "no files" if not files else f"no file whose name gives its format ({len(files)} other files)"
                if match == pattern:
                    raise InputPathError(f"input directory '{pattern}' holds {what}; "
                                         "pass --format FMT to read files by content type, or another --input")
                continue
            # Beam matches every input as a pattern: a name with [, * or ? must not act as one.
            out.patterns.extend(glob.escape(f) if glob.has_magic(f) else f for f in readable)
            kept = set(readable)
            out.skipped.extend(f for f in files if f not in kept)
    return out
