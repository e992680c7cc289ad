"""Parquet (.parquet, .pq): row group by row group, ids `PATH:ROW`; cut into runs of row groups
(parquet_ranges) for several workers."""
from __future__ import annotations

from typing import IO, Any, Iterator

from dsdata.document import Document, Rejected
from dsdata.io.readers.common import READ_STAGE, _file_rejection, record_to_document


def parquet_ranges(raw: IO[bytes], range_bytes: int) -> list[tuple[int, int | None, int]] | None:
    """Runs of consecutive row groups of about `range_bytes` (uncompressed) each: (first group, end
    group, rows before first), end None for the last.  None when the footer cannot be read or there
    would be one range."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(raw).metadata
    except Exception:  # noqa: BLE001 - not readable as Parquet: read whole, which rejects it once
        return None
    ranges: list[tuple[int, int | None, int]] = []
    first = row = first_row = size = 0
    for group in range(meta.num_row_groups):
        info = meta.row_group(group)
        size += info.total_byte_size
        row += info.num_rows
        if size >= range_bytes and group + 1 < meta.num_row_groups:
            ranges.append((first, group + 1, first_row))
            first, first_row, size = group + 1, row, 0
    if not ranges:
        return None
    ranges.append((first, None, first_row))
    return ranges


def read_parquet(path: str, raw: IO[bytes], text_field: str = "text", id_field: str = "id",
                 groups: tuple[int, int | None, int] | None = None) -> Iterator[Document | Rejected]:
    """Parquet, row group by row group. Ids default to `PATH:ROW` (0-based).

    groups: (first, end, rows before first) — one of `parquet_ranges`' ranges: only row groups
    first..end-1 (end None: to the last) are read, their rows numbered as reading the whole file
    numbers them."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(raw)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a non-Parquet file
        where = path if groups is None else f"{path}:groups{groups[0]}-{groups[1]}"
        yield _file_rejection(where, "bad_parquet", f"{type(exc).__name__}: {exc}")
        return
    first, end, row = (0, None, 0) if groups is None else groups
    end = pf.num_row_groups if end is None else min(end, pf.num_row_groups)
    for group in range(first, end):
        rows = pf.metadata.row_group(group).num_rows
        bomb = _decompression_bomb(pf.metadata.row_group(group))
        try:
            if bomb:
                raise _Bomb(bomb)
            records = _parquet_records(_text_as_string(pf.read_row_group(group), text_field))
        except Exception as exc:  # noqa: BLE001 - a damaged row group: its rows are lost, each one counted
            yield from _lost_group(path, pf.num_row_groups, group, row, rows, exc)
            row += rows
            continue
        for record in records:
            yield _parquet_row(record, f"{path}:{row}", text_field, id_field)
            row += 1


def _lost_group(path: str, groups: int, group: int, row: int, rows: int, exc: Exception) -> Iterator[Rejected]:
    """The rows of a row group that could not be read (or is a decompression bomb): one row each,
    or one for the group when it claims more than _LOST_ROWS_LISTED."""
    reason = "too_large" if isinstance(exc, _Bomb) else "bad_parquet"
    detail = (f"row group {group} of {groups} " +
              (str(exc) if isinstance(exc, _Bomb) else f"unreadable ({type(exc).__name__}: {exc})"))
    if rows > _LOST_ROWS_LISTED:  # the footer's count; not millions of rows of nothing
        yield _file_rejection(f"{path}:group{group}", reason,
                              f"{detail}; its {rows} rows are lost (one row here, over {_LOST_ROWS_LISTED})")
    else:
        for lost in range(row, row + rows):
            yield _file_rejection(f"{path}:{lost}", reason, detail)


def _parquet_row(record, doc_id: str, text_field: str, id_field: str) -> Document | Rejected:
    """One Parquet record as a document, or its rejection (a bad value, a binary text that is not UTF-8)."""
    if isinstance(record, _BadValue):
        return Rejected(Document(doc_id, "", {}), READ_STAGE, "bad_value", record.detail)
    raw_text = record.get(text_field)
    if isinstance(raw_text, bytes):  # a binary text column that is not all UTF-8 (_text_as_string)
        try:
            record[text_field] = raw_text.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejected(Document(doc_id, raw_text.decode("utf-8", "replace"), {}), READ_STAGE,
                            "invalid_utf8", f"field '{text_field}' is binary and this value is not UTF-8: {exc}")
    try:
        return record_to_document(record, doc_id, text_field, id_field)
    except Exception as exc:  # noqa: BLE001 - one record's failure rejects that record only
        return Rejected(Document(doc_id, "", {}), READ_STAGE, "bad_value", f"{type(exc).__name__}: {exc}")


class _Bomb(ValueError):
    """A row group whose column chunks decompress to far more than a codec's ratio allows."""


def _decompression_bomb(group_meta) -> str | None:
    """Why reading this row group would be a decompression bomb, from the sizes its footer declares:
    a column chunk that decompresses past BOMB_MIN_OUTPUT at over BOMB_RATIO:1 (as decompress.py)."""
    from dsdata.io.decompress import BOMB_MIN_OUTPUT, BOMB_RATIO

    for i in range(group_meta.num_columns):
        chunk = group_meta.column(i)
        packed, unpacked = chunk.total_compressed_size, chunk.total_uncompressed_size
        if unpacked > BOMB_MIN_OUTPUT and unpacked > BOMB_RATIO * max(1, packed):
            return (f"column '{chunk.path_in_schema}' decompresses to {unpacked} bytes from {packed} "
                    f"(over {BOMB_RATIO}:1, a decompression bomb); not read")
    return None


# A damaged row group up to this many rows (the footer says how many) gets one rejected row per row,
# with the id a readable row there would have had; a larger one is one row saying how many are lost.
_LOST_ROWS_LISTED = 1_000_000


def _text_as_string(table, text_field: str):
    """A binary text column (older Spark and Hive) as strings when all of it is UTF-8; otherwise as it
    is, each value decoded on its own in _parquet_row."""
    import pyarrow as pa

    if text_field not in table.column_names:
        return table
    index = table.column_names.index(text_field)
    column = table.column(index)
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        return table
    try:
        return table.set_column(index, text_field, column.cast(pa.large_string()))
    except pa.ArrowInvalid:
        return table


def _nanosecond_temporal(typ) -> bool:
    import pyarrow as pa

    return ((pa.types.is_timestamp(typ) or pa.types.is_duration(typ) or pa.types.is_time64(typ))
            and typ.unit == "ns")


def _nanosecond_values(column) -> list[Any]:
    """A nanosecond timestamp / duration / time column as Python values that do not depend on whether
    pandas is installed (pyarrow gives pandas.Timestamp where it is, and raises where it is not):
    whole microseconds as datetime / timedelta / time, any other value as Arrow's exact text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    typ = column.type
    micro = (pa.timestamp("us", tz=typ.tz) if pa.types.is_timestamp(typ)
             else pa.duration("us") if pa.types.is_duration(typ) else pa.time64("us"))
    counts = pc.cast(column, pa.int64()).to_pylist()
    whole = pc.cast(column, micro, safe=False).to_pylist()
    text = pc.cast(column, pa.string()).to_pylist()
    return [None if n is None else (w if n % 1000 == 0 else t) for n, w, t in zip(counts, whole, text)]


class _BadValue:
    """A Parquet row one of whose values has neither a Python form nor an Arrow string form."""

    def __init__(self, detail: str):
        self.detail = detail


def _parquet_records(table) -> list[dict[str, Any] | _BadValue]:
    """The row group's rows as dicts; where pyarrow cannot convert the whole table, column by
    column, and a row holding a value it cannot convert is a _BadValue naming the column."""
    names = table.column_names
    nanos = [i for i, field in enumerate(table.schema) if _nanosecond_temporal(field.type)]
    try:
        if not nanos:
            return table.to_pylist()
        columns = [_nanosecond_values(c) if i in nanos else c.to_pylist() for i, c in enumerate(table.columns)]
        return [dict(zip(names, values)) for values in zip(*columns)]
    except Exception:  # noqa: BLE001 - pyarrow raises ValueError, OverflowError, ArrowException...
        pass
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    bad: dict[int, str] = {}
    for i_column, (name, column) in enumerate(zip(names, table.columns)):
        try:
            columns.append(_nanosecond_values(column) if i_column in nanos else column.to_pylist())
            continue
        except Exception:  # noqa: BLE001
            pass
        values = []
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
                continue
            except Exception as exc:  # noqa: BLE001
                problem = f"column '{name}': {type(exc).__name__}: {exc}"
            try:
                # No Python form (a timestamp[ns] off whole microseconds without pandas, a date past
                # year 9999): Arrow's own exact text of the value, so the row is not lost for it.
                values.append(pc.cast(column.slice(i, 1), pa.string())[0].as_py())
            except Exception:  # noqa: BLE001
                values.append(None)
                bad.setdefault(i, problem)
        columns.append(values)
    return [_BadValue(bad[i]) if i in bad else dict(zip(names, values))
            for i, values in enumerate(zip(*columns))]


def read_parquet_range(path: str, raw: IO[bytes], start: int, end: int | None, first_line: int,
                       text_field: str = "text", id_field: str = "id") -> Iterator[Document | Rejected]:
    """One of `parquet_ranges`' ranges: row groups start..end-1 (None: to the last), after first_line rows."""
    return read_parquet(path, raw, text_field, id_field, groups=(start, end, first_line))
