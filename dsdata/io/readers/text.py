"""Plain text and Markdown (.txt, .md): one document per file, its id the file's path."""
from __future__ import annotations

from typing import IO, Any, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.readers.common import (READ_STAGE, _BINARY_SNIFF, _file_rejection, _looks_binary, _one_record_file,
                                      base_name)

TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown")


def read_text(path: str, raw: IO[bytes], **_: Any) -> Iterator[Document | Rejected]:
    """One .txt / .md file → one document whose id is the file's path; UTF-8 (a BOM is dropped)."""
    data = _one_record_file(path, raw)
    if isinstance(data, Rejected):
        yield data
        return
    if _looks_binary(data[:_BINARY_SNIFF]):
        yield _file_rejection(path, "binary_file", "over 10 % of the first 8 KiB are control bytes; not a text file")
        return
    markdown = base_name(path).endswith((".md", ".markdown"))
    meta = {"source": path, "content_type": "text/markdown" if markdown else "text/plain"}
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        yield Rejected(Document(path, data.decode("utf-8", "replace"), meta), READ_STAGE, "invalid_utf8",
                       f"byte {exc.start}: not UTF-8")
        return
    if not text.strip():
        yield Rejected(Document(path, text, meta), READ_STAGE, "empty_text")
        return
    yield Document(path, text, meta)
