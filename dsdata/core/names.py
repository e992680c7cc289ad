"""How a file name is shown to people: in ids, rejected rows, stats.json, logs, error lines and
the report.  Names are bytes, and not every byte string is printable UTF-8 on one line; the shown
name is, and gives the bytes back (`recovered_path`).  Imports nothing: every layer shows names."""
from __future__ import annotations

import os
import re

# What a shown name cannot hold as itself: a backslash (the escape), C0/DEL/C1 controls (a newline
# would forge a log line, U+009B starts a terminal escape), line separators, lone surrogates.
_NOT_SHOWN_AS_IS = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def shown_path(path: str) -> str:
    """A file name as it appears in ids, rows, logs and reports: each byte that is not UTF-8 and each
    byte of a control character or line separator written `\\xNN`, each backslash doubled
    (`recovered_path` gives the bytes back); a plain UTF-8 name is shown unchanged."""
    if not _NOT_SHOWN_AS_IS.search(path):
        return path
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:  # a str holding a surrogate no byte stands for: its UTF-8 bytes
        raw = path.encode("utf-8", "surrogatepass")
    out = []
    for ch in raw.decode("utf-8", "surrogateescape"):
        if ch == "\\":
            out.append("\\\\")
        elif "\udc80" <= ch <= "\udcff":
            out.append(f"\\x{ord(ch) - 0xdc00:02x}")
        elif _NOT_SHOWN_AS_IS.match(ch):  # a control character or separator: its UTF-8 bytes
            out.extend(f"\\x{byte:02x}" for byte in ch.encode("utf-8"))
        else:
            out.append(ch)
    return "".join(out)


def recovered_path(shown: str) -> str:
    """The path `shown_path` showed (its exact bytes, as os.fsdecode holds them)."""
    out, i = bytearray(), 0
    data = shown.encode("utf-8")
    while i < len(data):
        if data[i:i + 2] == b"\\\\":
            out += b"\\"
            i += 2
        elif data[i:i + 2] == b"\\x" and i + 4 <= len(data):
            out.append(int(data[i + 2:i + 4], 16))
            i += 4
        else:
            out.append(data[i])
            i += 1
    return os.fsdecode(bytes(out))


def is_remote(path: str) -> bool:
    """A URL with a scheme (s3://, gs://, …): served by one of Beam's remote file systems."""
    return "://" in path
