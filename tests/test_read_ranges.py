"""A plain JSON Lines file read in line-aligned byte ranges (readers.jsonl_ranges + read_jsonl with
first_line) gives exactly the rows of reading it whole; in a Beam run on several workers each range
is read by whichever worker takes it (ReadDocuments with spread_documents)."""
import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsdata.io.readers.common import _looks_binary
from dsdata.io.readers import (
    RANGE_MAX_BYTES, RANGE_MIN_BYTES, RangeReader, cuttable_format, jsonl_ranges, parquet_ranges,
    range_bytes_for, read_jsonl, read_parquet,
)



def _key(result):
    doc = getattr(result, "doc", result)
    return (type(result).__name__, doc.id, doc.text, json.dumps(doc.metadata, sort_keys=True, default=str),
            getattr(result, "reason", None), getattr(result, "detail", None))


def _whole(data: bytes) -> list:
    return [_key(r) for r in read_jsonl("f.jsonl", io.BytesIO(data))]


def _by_ranges(data: bytes, range_bytes: int) -> tuple[list, list]:
    ranges = jsonl_ranges(io.BytesIO(data), range_bytes)
    assert ranges is not None
    rows = []
    for start, end, first_line in ranges:
        raw = io.BytesIO(data)
        raw.seek(start)
        length = None if end is None else end - start
        rows += [_key(r) for r in read_jsonl("f.jsonl", RangeReader(raw, length), first_line=first_line)]
    return rows, ranges


def _check_cover(data: bytes, ranges) -> None:
    """The ranges tile the file, each after the first starts a line, and first_line counts the lines before it."""
    assert ranges[0][0] == 0 and ranges[-1][1] is None
    for (s0, e0, _), (s1, _, l1) in zip(ranges, ranges[1:]):
        assert e0 == s1 and e0 > s0
        assert data[s1 - 1:s1] == b"\n"
        assert l1 == data[:s1].count(b"\n")


def _mixed_lines(n: int) -> bytes:
    lines = []
    for i in range(n):
        kind = i % 9
        if kind == 0:
            lines.append(b"{broken json")
        elif kind == 1:
            lines.append(b"")  # a blank line: no record, but a line number
        elif kind == 2:
            lines.append(b'{"id": "bad%d", "text": "\xff\xfe"}' % i)
        elif kind == 3:
            lines.append(json.dumps({"text": f"no id here {i}", "n": i}).encode() + b"\r")  # CRLF
        elif kind == 4:
            lines.append(b'{"title": "no text"}')
        else:
            lines.append(json.dumps({"id": f"d{i}", "text": "段落 " * (i % 13 + 1) + f"text {i}"},
                                    ensure_ascii=False).encode())
    return b"\n".join(lines)


@pytest.mark.parametrize("range_bytes", [1, 7, 64, 200, 1000])
@pytest.mark.parametrize("trailing", [b"", b"\n", b"\n\n"])
def test_ranges_give_the_rows_of_the_whole_file(range_bytes, trailing):
    data = b"\xef\xbb\xbf" + _mixed_lines(120) + trailing  # a BOM, read as at the start of the file only
    rows, ranges = _by_ranges(data, range_bytes)
    _check_cover(data, ranges)
    assert len(ranges) > 1
    assert rows == _whole(data)
    ids = [k[1] for k in rows]
    assert "f.jsonl:4" in ids and "f.jsonl:1" in ids  # PATH:LINE ids count the lines of earlier ranges


def test_ranges_of_real_prose(shared_data):
    text = (shared_data / "prose-zh.txt").read_text(encoding="utf-8").splitlines()[:3000]
    data = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in text if t.strip()).encode()
    rows, ranges = _by_ranges(data, 20_000)
    _check_cover(data, ranges)
    assert len(ranges) >= 10 and rows == _whole(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=30).map(
        lambda t: json.dumps({"text": t}, ensure_ascii=False).encode()),
    st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"")),
    st.just(b""),
), max_size=40), range_bytes=st.integers(1, 120), trailing=st.booleans())
def test_ranges_equal_the_whole_file_on_generated_lines(lines, range_bytes, trailing):
    data = b"\n".join(lines) + (b"\n" if trailing else b"")
    ranges = jsonl_ranges(io.BytesIO(data), range_bytes)
    if ranges is None:
        # Read whole: a binary-looking head, or no line ends past the first cut.
        assert b"\n" not in data[range_bytes:] or _looks_binary(data[:8192])
        return
    _check_cover(data, ranges)
    rows, _ = _by_ranges(data, range_bytes)
    assert rows == _whole(data)


def test_a_binary_head_is_read_whole():
    data = bytes(range(256)) * 64 + b"\n" + b'{"text": "late line"}\n' * 100
    assert jsonl_ranges(io.BytesIO(data), 100) is None  # one binary_file row needs the whole file


def test_a_line_longer_than_a_range_stays_one_line():
    long_line = json.dumps({"text": "x" * 5000}).encode()
    data = b'{"text": "a"}\n' + long_line + b'\n{"text": "b"}\n{"text": "c"}\n'
    rows, ranges = _by_ranges(data, 50)
    _check_cover(data, ranges)
    assert rows == _whole(data) and [r[1] for r in rows] == ["f.jsonl:1", "f.jsonl:2", "f.jsonl:3", "f.jsonl:4"]


def test_what_can_be_cut_and_how_fine():
    assert cuttable_format("a/b.jsonl") == "jsonl" == cuttable_format("x.ndjson") == cuttable_format("x.txt", "jsonl")
    assert cuttable_format("b.parquet") == "parquet" == cuttable_format("b.dat", "parquet")
    for name in ("b.jsonl.gz", "b.jsonl.zst", "b.warc.gz", "b.html", "README", "b.parquet.gz"):
        assert cuttable_format(name) is None
    assert cuttable_format("b.jsonl", "warc") is None
    assert range_bytes_for(10) == RANGE_MIN_BYTES
    assert range_bytes_for(1 << 40) == RANGE_MAX_BYTES
    assert RANGE_MIN_BYTES < range_bytes_for(100 << 20) < RANGE_MAX_BYTES


def _parquet(path: Path, rows: list[dict], row_group_size: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path), row_group_size=row_group_size)
    return path.read_bytes()


@pytest.mark.parametrize("range_bytes", [1, 500, 3000])
def test_parquet_row_group_ranges_give_the_rows_of_the_whole_file(tmp_path, range_bytes):
    rows = [{"id": None if i % 4 else f"p{i}", "text": "" if i % 11 == 0 else f"row {i} " * (i % 7 + 1), "n": i}
            for i in range(230)]
    data = _parquet(tmp_path / "f.parquet", rows, 17)
    ranges = parquet_ranges(io.BytesIO(data), range_bytes)
    assert ranges is not None and len(ranges) > 1
    assert ranges[0][:1] == (0,) and ranges[-1][1] is None and ranges[-2][1] < 14  # 230 rows in groups of 17
    for (_, e0, _), (s1, _, _) in zip(ranges, ranges[1:]):
        assert e0 == s1
    whole = [_key(r) for r in read_parquet("f.parquet", io.BytesIO(data))]
    parts = [_key(r) for first, end, row in ranges
             for r in read_parquet("f.parquet", io.BytesIO(data), groups=(first, end, row))]
    assert parts == whole and "f.parquet:229" in {k[1] for k in parts}


def test_a_parquet_file_of_one_row_group_or_no_footer_is_not_cut(tmp_path):
    data = _parquet(tmp_path / "one.parquet", [{"text": f"t{i}"} for i in range(50)], 1000)
    assert parquet_ranges(io.BytesIO(data), 1) is None
    assert parquet_ranges(io.BytesIO(b"PAR1 not really"), 1) is None


def test_range_reader_stops_at_its_end():
    raw = io.BytesIO(b"0123456789")
    raw.seek(2)
    reader = RangeReader(raw, 5)
    assert reader.read(3) == b"234" and reader.read() == b"56" and reader.read(4) == b""
    buf = bytearray(4)
    raw.seek(0)
    assert RangeReader(raw, 3).readinto(buf) == 3 and bytes(buf[:3]) == b"012"


def _pipeline_rows(tmp_path: Path, patterns: list[str], range_bytes: int | None, name: str) -> list:
    import apache_beam as beam

    from dsdata.beam.transforms import KEPT, REJECTED, ReadDocuments

    out = tmp_path / name
    with beam.Pipeline() as p:  # the in-process runner, running the several-workers graph
        read = p | ReadDocuments(patterns, spread_documents=True, range_bytes=range_bytes)
        ((read[KEPT], read[REJECTED]) | beam.Flatten() | beam.Map(lambda r: json.dumps(_key(r)))
         | beam.io.WriteToText(str(out)))
    return sorted(line for f in tmp_path.glob(f"{name}*") for line in f.read_text(encoding="utf-8").splitlines())


def test_read_documents_on_several_workers_reads_ranges_and_whole_files_alike(tmp_path):
    import gzip

    from dsdata.beam.transforms import all_cuttable
    from dsdata.io.readers import read_local

    data = _mixed_lines(300) + b"\n"
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "big.jsonl").write_bytes(data)
    (tmp_path / "cut" / "small.jsonl.gz").write_bytes(gzip.compress(b'{"text": "tiny"}\n'))  # under one range
    _parquet(tmp_path / "cut" / "rows.parquet", [{"text": f"parquet row {i}"} for i in range(120)], 10)
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "big.jsonl.gz").write_bytes(gzip.compress(data.replace(b'"d', b'"z')))  # cannot be cut
    (tmp_path / "gz" / "big.jsonl").write_bytes(data)
    assert len(jsonl_ranges(io.BytesIO(data), 500)) > 10
    for folder, cuttable in (("cut", True), ("gz", False)):
        patterns = [str(tmp_path / folder / "*.jsonl"), str(tmp_path / folder / "*.jsonl.gz"),
                    str(tmp_path / folder / "*.parquet")]
        assert all_cuttable(patterns, range_bytes=500) is cuttable
        expected = sorted(json.dumps(_key(r)) for f in sorted((tmp_path / folder).iterdir()) for r in read_local(str(f)))
        got = _pipeline_rows(tmp_path, patterns, 500, f"rows-{folder}")
        assert got == expected, folder
        # every line but the blank ones (and the tiny file's one)
        records = sum(1 for i in range(300) if i % 9 != 1)
        assert len(got) == records + (1 + 120 if cuttable else records)


@pytest.mark.slow
def test_one_big_file_on_two_workers_is_read_in_ranges_with_the_rows_of_one_worker(tmp_path, shared_data):
    """A file over the smallest range (1 MiB) on two multi_processing workers: cut into ranges,
    read by both, and the run's rows and stats are those of one worker reading it whole."""
    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe

    import pyarrow.parquet as pq

    prose = [t for t in (shared_data / "prose-en.txt").read_text(encoding="utf-8").splitlines() if t.strip()]
    lines = [json.dumps({"text": t}, ensure_ascii=False) for t in prose]
    while sum(map(len, lines)) < 1.6 * RANGE_MIN_BYTES:
        lines += lines
    lines[7] = "{broken"
    (tmp_path / "all.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(tmp_path / "all.jsonl", "rb") as fh:
        assert len(jsonl_ranges(fh, range_bytes_for((tmp_path / "all.jsonl").stat().st_size))) > 1
    (tmp_path / "recipe.yaml").write_text(
        'name: t\ninput: {paths: ["*.jsonl"]}\nstages:\n  - rules: {}\n', encoding="utf-8")
    recipe = load_recipe(str(tmp_path / "recipe.yaml"))
    one = run_recipe(recipe, str(tmp_path / "one"))
    two = run_recipe(recipe, str(tmp_path / "two"), ["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    for key in ("input", "kept", "rejected", "stages", "ledger_ok"):
        assert two[key] == one[key], key
    assert one["rejected"]["read"] == {"bad_json": 1}
    for kind in ("kept", "rejected"):
        rows = {}
        for name in ("one", "two"):
            got = [r for f in sorted((tmp_path / name / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
            rows[name] = sorted(got, key=lambda r: r["id"])
        assert rows["two"] == rows["one"], kind
