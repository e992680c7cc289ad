"""CSV and TSV: a header row, then one record per row (the `csv` input format)."""
from __future__ import annotations

import csv
from typing import IO, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.decompress import MEMBER_END, Damage, decoded_chunks
from dsdata.io.readers.common import READ_STAGE, _MAX_LINE, _file_rejection, base_name, record_to_document
from dsdata.io.readers.jsonl import _BOM, _LineTooLong, _as_utf8, _cr_lines, _iter_lines

CSV_SUFFIXES = (".csv", ".tsv", ".tab")

def _csv_lines(path: str, raw: IO[bytes], bad: set[int], problems: list):
    """Decoded text lines (newline kept) for csv.reader; numbers of lines that were not UTF-8 go to
    `bad`, the first damage or over-long line to `problems` (reading stops there)."""
    lineno = 0
    for line in _iter_lines(_cr_lines(_as_utf8(decoded_chunks(path, raw)))):
        if line is MEMBER_END:
            continue
        if isinstance(line, (Damage, _LineTooLong)):
            problems.append(line)
            return
        lineno += 1
        if lineno == 1 and line.startswith(_BOM):
            line = line[len(_BOM):]
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            bad.add(lineno)
            text = line.decode("utf-8", "replace")
        yield text + "\n"


def read_csv(path: str, raw: IO[bytes], text_field: str = "text", id_field: str = "id") -> Iterator[Document | Rejected]:
    """CSV (comma) or TSV (tab, from a .tsv name) with a header row: `text_field` and `id_field` name
    columns; the other columns go to metadata.  Ids default to `PATH:ROW` (1-based data rows).  A row
    with another number of fields than the header is rejected `bad_row`; a file without the text
    column is one `missing_text_column` row."""
    # A document is one cell: allow cells as long as a JSONL line may be (the default is 128 KiB).
    if csv.field_size_limit() < _MAX_LINE:
        csv.field_size_limit(_MAX_LINE)
    delimiter = "\t" if base_name(path).endswith((".tsv", ".tab")) else ","
    bad: set[int] = set()
    problems: list = []
    try:
        reader = csv.reader(_csv_lines(path, raw, bad, problems), delimiter=delimiter, strict=True)
        header = None
        row_no = 0
        last_line = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                row_no += 1
                yield Rejected(Document(f"{path}:{row_no}", "", {"source": path}), READ_STAGE, "bad_row",
                               f"line {reader.line_num}: {exc}")
                last_line = reader.line_num
                continue
            lines = set(range(last_line + 1, reader.line_num + 1))
            last_line = reader.line_num
            if header is None:
                header = row
                if text_field not in header:
                    yield _file_rejection(path, "missing_text_column",
                                          f"the header has no column '{text_field}' (columns: {', '.join(header)[:500]})")
                    return
                continue
            if not row:
                continue  # a blank line
            row_no += 1
            bad_lines = lines & bad
            yield _csv_row(row, header, f"{path}:{row_no}", path, delimiter, reader.line_num,
                           min(bad_lines) if bad_lines else None, text_field, id_field)
    except OSError as exc:
        yield _file_rejection(path, "unreadable_file", f"{type(exc).__name__}: {exc}")
        return
    yield from _file_problems(path, problems)


def _csv_row(row: list[str], header: list[str], default_id: str, path: str, delimiter: str, line_num: int,
             bad_line: int | None, text_field: str, id_field: str) -> Document | Rejected:
    """One data row: a document, or `bad_row` (its field count is not the header's) or
    `invalid_utf8` (`bad_line`, one of its lines, is not UTF-8)."""
    raw_row = delimiter.join(row)
    if len(row) != len(header):
        return Rejected(Document(default_id, raw_row, {"source": path}), READ_STAGE, "bad_row",
                        f"line {line_num}: {len(row)} fields, the header has {len(header)}")
    if bad_line is not None:
        return Rejected(Document(default_id, raw_row, {"source": path}), READ_STAGE, "invalid_utf8",
                        f"line {bad_line} is not UTF-8")
    return record_to_document(dict(zip(header, row)), default_id, text_field, id_field, raw_row)


def _file_problems(path: str, problems: list) -> Iterator[Rejected]:
    """What stopped the line reader (damaged compression, a line too long): one row each."""
    for problem in problems:
        if isinstance(problem, Damage):
            yield _file_rejection(path, problem.reason, problem.detail)
        else:
            yield _file_rejection(path, "line_too_long", f"a line of {problem.size} bytes; the rest of the file is not read")
