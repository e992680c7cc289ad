"""`.json` files: one JSON document per file (read as JSON Lines, a pretty-printed document would be
hundreds of `bad_json` rows)."""
from __future__ import annotations

import json
import shutil
import tempfile
from typing import IO, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.decompress import Damage, decoded_chunks
from dsdata.io.readers.common import (MAX_JSON_DEPTH, _MAX_LINE, _depth_exceeds, _file_rejection, record_to_document,
                                      scrub_surrogates)
from dsdata.io.readers.jsonl import read_jsonl

JSON_SUFFIXES = (".json",)


def read_json(path: str, raw: IO[bytes], text_field: str = "text", id_field: str = "id") -> Iterator[Document | Rejected]:
    """A `.json` file is one JSON document: an object is one record (id: its id field, else PATH),
    an array of objects is one record per item (ids PATH:N, 1-based), anything else one `bad_json` /
    `not_an_object` row naming the problem.  A `.json` file that holds JSON Lines (several values, one a
    line: a common misnaming) or is damaged is read as JSON Lines.  The document is held whole, so
    at most _MAX_LINE bytes decoded (over that: one `too_large` row)."""
    spool = tempfile.SpooledTemporaryFile(max_size=16 << 20)
    shutil.copyfileobj(raw, spool, 1 << 20)
    spool.seek(0)
    data = bytearray()
    damaged = False
    for chunk in decoded_chunks(path, spool):
        if isinstance(chunk, Damage):
            damaged = True
            break
        data += chunk
        if len(data) > _MAX_LINE:
            yield _file_rejection(path, "too_large", f"a .json document over {_MAX_LINE} bytes decoded; not read")
            return
    value = problem = None
    if not damaged:
        value, problem, damaged = _parsed(bytes(data))
    if damaged:
        spool.seek(0)
        yield from read_jsonl(path, spool, text_field, id_field)
        return
    if problem is None and _depth_exceeds(value, MAX_JSON_DEPTH + isinstance(value, list)):
        problem = f"nested deeper than {MAX_JSON_DEPTH} levels"
    if problem is not None:
        yield _file_rejection(path, "bad_json", problem)
        return
    value = scrub_surrogates(value)
    if isinstance(value, dict):
        yield record_to_document(value, path, text_field, id_field)
    elif isinstance(value, list):
        for i, item in enumerate(value, 1):
            yield record_to_document(item, f"{path}:{i}", text_field, id_field, raw=json.dumps(item)[:1000])
    else:
        yield _file_rejection(path, "bad_json", f"a JSON {type(value).__name__}, not an object or an array of objects")


def _parsed(data: bytes) -> tuple[object, str | None, bool]:
    """(the JSON value, what makes it no document, whether to read the file as JSON Lines instead:
    not UTF-8 — the JSON Lines reader says which line — or several values)."""
    text = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return json.loads(text.decode("utf-8")), None, False
    except RecursionError:
        return None, f"nested deeper than the JSON decoder can follow (at most {MAX_JSON_DEPTH} levels are read)", False
    except UnicodeDecodeError:
        return None, None, True  # UTF-16, or a bad byte
    except ValueError as exc:
        if str(exc).startswith("Extra data") or not text.strip():
            return None, None, True  # several values: JSON Lines in a .json file
        return None, f"not a JSON document: {exc}", False
