"""Parquet ids and values of every Arrow type, damaged row groups, UTF-16 HTML (found by fuzzing)."""
import datetime as dt
import decimal
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.document import Document, Rejected
from dsdata.io.readers import read_local
from dsdata.recipe import load_recipe

TEXT = "A plain English sentence about reading files, long enough to be a document."


def _write(path, columns: dict, **kwargs):
    pq.write_table(pa.table(columns), str(path), **kwargs)
    return path


@pytest.mark.parametrize("ids, want", [
    ([dt.datetime(2020, 1, 1, 0, 0, s) for s in range(3)], ["2020-01-01 00:00:00", "2020-01-01 00:00:01",
                                                            "2020-01-01 00:00:02"]),
    ([dt.date(2021, 5, d) for d in (1, 2, 3)], ["2021-05-01", "2021-05-02", "2021-05-03"]),
    ([decimal.Decimal("1.50"), decimal.Decimal("2"), None], ["1.50", "2.00", None]),
    ([b"abc", b"\x00\xffbin", "文".encode("utf-8")], ["abc", "00ff62696e", "文"]),
    ([{"x": dt.datetime(2020, 1, 1)}, {"x": None}, {"x": dt.datetime(2020, 1, 2)}],
     ['{"x": "2020-01-01 00:00:00"}', '{"x": null}', '{"x": "2020-01-02 00:00:00"}']),
    ([dt.timedelta(seconds=5), dt.timedelta(0), dt.timedelta(days=1)], ["0:00:05", "0:00:00", "1 day, 0:00:00"]),
])
def test_a_parquet_id_of_any_type_becomes_a_string_and_no_row_is_lost(tmp_path, ids, want):
    path = _write(tmp_path / "ids.parquet", {"id": ids, "text": [TEXT] * 3})
    got = read_local(str(path))
    assert all(isinstance(d, Document) for d in got)
    # A null id takes the default id, PATH:ROW.
    assert [d.id for d in got] == [w if w is not None else f"{path}:{i}" for i, w in enumerate(want)]


def test_a_value_with_no_python_form_keeps_its_row_with_the_values_text(tmp_path):
    """A timestamp past year 9999 has no datetime, a timestamp[ns] off whole microseconds none
    without pandas: the row is kept with Arrow's exact text of the value; the rows around it too."""
    seconds = pa.array([0, 10**12, 86_400], type=pa.timestamp("s"))
    nanos = pa.array([0, 1704110400123456789, 5], type=pa.timestamp("ns"))
    path = _write(tmp_path / "ts.parquet", {"id": ["a", "b", "c"], "text": [TEXT] * 3, "seen": seconds,
                                            "crawled": nanos})
    got = read_local(str(path))
    assert [r.id for r in got if isinstance(r, Document)] == ["a", "b", "c"]
    # Arrow's text of it: the count in the stored unit (Parquet keeps seconds as milliseconds).
    assert got[1].metadata["seen"] == "<value out of range: 1000000000000000>"
    assert got[0].metadata["seen"] == dt.datetime(1970, 1, 1) and got[2].metadata["seen"] == dt.datetime(1970, 1, 2)
    # The same with or without pandas installed (pyarrow would give a pandas.Timestamp where it is).
    assert got[1].metadata["crawled"] == "2024-01-01 12:00:00.123456789"
    assert got[0].metadata["crawled"] == dt.datetime(1970, 1, 1) and got[2].metadata["crawled"] == "1970-01-01 00:00:00.000000005"


def _corrupt_row_group(path, group: int) -> None:
    meta = pq.ParquetFile(str(path)).metadata.row_group(group)
    columns = [meta.column(c) for c in range(meta.num_columns)]
    start = min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in columns)
    size = sum(c.total_compressed_size for c in columns)
    data = bytearray(path.read_bytes())
    rng = random.Random(7)
    for i in range(start + 4, start + size - 4):
        data[i] = rng.randrange(256)
    path.write_bytes(bytes(data))


def test_a_damaged_row_group_rejects_each_of_its_rows_and_the_ledger_counts_them(tmp_path):
    n, per_group = 400, 50
    path = _write(tmp_path / "in.parquet", {"id": [f"r{i}" for i in range(n)], "text": [f"{TEXT} {i}" for i in range(n)]},
                  row_group_size=per_group, compression="none")
    _corrupt_row_group(path, 3)
    got = read_local(str(path))
    rejected = [r for r in got if isinstance(r, Rejected)]
    assert len(got) == n and len(rejected) == per_group
    assert [r.doc.id for r in rejected] == [f"{path}:{i}" for i in range(150, 200)]
    assert {r.reason for r in rejected} == {"bad_parquet"} and "row group 3 of 8 unreadable" in rejected[0].detail
    assert [d.id for d in got if isinstance(d, Document)] == [f"r{i}" for i in range(n) if not 150 <= i < 200]

    (tmp_path / "r.yaml").write_text("input: {paths: ['in.parquet']}\nstages: []\n", encoding="utf-8")
    stats = run_recipe(load_recipe(str(tmp_path / "r.yaml")), str(tmp_path / "out"))
    assert (stats["input"], stats["kept"], stats["rejected"]) == (n, n - per_group, {"read": {"bad_parquet": per_group}})


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_utf16_html_with_a_byte_order_mark_is_read_and_binary_behind_one_is_not(tmp_path, codec):
    page = f"<html><head><title>Titre</title></head><body><main><p>{TEXT} Ça marche, 中文也是。</p></main></body></html>"
    bom = b"\xff\xfe" if codec == "utf-16-le" else b"\xfe\xff"
    (tmp_path / "page.html").write_bytes(bom + page.encode(codec))
    (doc,) = read_local(str(tmp_path / "page.html"))
    assert isinstance(doc, Document) and "Ça marche, 中文也是。" in doc.text
    # Control characters once decoded: each code unit a byte under 32 and a zero byte.
    units = [bytes([random.Random(i).randrange(1, 32), 0]) for i in range(4000)]
    noise = b"".join(u if codec == "utf-16-le" else u[::-1] for u in units)
    (tmp_path / "noise.html").write_bytes(bom + noise)
    (rej,) = read_local(str(tmp_path / "noise.html"))
    assert isinstance(rej, Rejected) and rej.reason == "binary_file" and "decoded" in rej.detail, rej


def test_the_ledger_of_a_run_over_odd_parquet_ids_is_exact(tmp_path):
    rows = 300
    _write(tmp_path / "t.parquet", {"id": [dt.datetime(2020, 1, 1) + dt.timedelta(seconds=i) for i in range(rows)],
                                    "text": [f"{TEXT} {i}" for i in range(rows)]})
    (tmp_path / "r.yaml").write_text("input: {paths: ['t.parquet']}\nstages: []\n", encoding="utf-8")
    stats = run_recipe(load_recipe(str(tmp_path / "r.yaml")), str(tmp_path / "out"))
    assert (stats["input"], stats["kept"], stats["rejected_total"]) == (rows, rows, 0)
    kept = pq.read_table(str(next((tmp_path / "out" / "kept").glob("*.parquet")))).to_pylist()
    assert sorted(r["id"] for r in kept)[:2] == ["2020-01-01 00:00:00", "2020-01-01 00:00:01"]
    assert json.loads(kept[0]["metadata"]) == {}


def test_a_page_in_the_replacement_encoding_is_rejected_not_kept_as_one_replacement_character(tmp_path):
    """ISO-2022-KR (and HZ-GB-2312, ...) decode to a single U+FFFD by the Encoding Standard: nothing
    of the page can be read, so it is a rejected row naming why, not a kept document of one character."""
    body = f"<html><head><meta charset='iso-2022-kr'></head><body><p>{TEXT}</p></body></html>"
    (tmp_path / "kr.html").write_bytes(body.encode("ascii"))
    (got,) = read_local(str(tmp_path / "kr.html"))
    assert isinstance(got, Rejected) and got.reason == "unreadable_encoding" and "replacement" in got.detail
    (tmp_path / "ok.html").write_bytes(body.replace("iso-2022-kr", "utf-8").encode("ascii"))
    (ok,) = read_local(str(tmp_path / "ok.html"))
    assert isinstance(ok, Document) and TEXT in ok.text


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary()])
def test_a_binary_text_column_is_read_as_utf8_and_a_value_that_is_not_is_rejected(tmp_path, typ):
    """Writers that do not mark strings as UTF-8 (older Spark, Hive) store text as binary."""
    good = [f"{TEXT} {i} 中文".encode("utf-8") for i in range(3)]
    path = _write(tmp_path / "all.parquet", {"id": ["a", "b", "c"], "text": pa.array(good, type=typ)})
    assert [d.text for d in read_local(str(path))] == [g.decode("utf-8") for g in good]
    mixed = _write(tmp_path / "mixed.parquet", {"id": ["a", "b", "c"],
                                                "text": pa.array([good[0], b"\xff\xfe bad", good[2]], type=typ)})
    got = read_local(str(mixed))
    assert [type(r).__name__ for r in got] == ["Document", "Rejected", "Document"]
    assert got[1].reason == "invalid_utf8" and got[1].doc.id == f"{mixed}:1" and got[2].text == good[2].decode()


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_utf16_jsonl_with_a_byte_order_mark_is_read_plain_and_compressed(tmp_path, codec):
    import gzip

    from dsdata.io.readers import jsonl_ranges

    lines = [json.dumps({"id": f"u{i}", "text": f"{TEXT} 记录 {i}，中文。"}, ensure_ascii=False) for i in range(400)]
    # a lone surrogate (valid UTF-16 code units in no pair): that line only is rejected
    lines[7] = '{"id": "u7", "text": "bad \ud800 unit"}'
    data = ("\ufeff" + "\n".join(lines) + "\n").encode(codec, "surrogatepass")
    (tmp_path / "a.jsonl").write_bytes(data)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(data))
    for name in ("a.jsonl", "b.jsonl.gz"):
        rows = read_local(str(tmp_path / name))
        assert len(rows) == 400
        assert [r.id for r in rows if isinstance(r, Document)] == [f"u{i}" for i in range(400) if i != 7]
        (bad,) = [r for r in rows if isinstance(r, Rejected)]
        assert bad.reason == "invalid_utf8" and bad.doc.id.endswith(":8")
        assert rows[0].text == f"{TEXT} 记录 0，中文。"
    with open(tmp_path / "a.jsonl", "rb") as fh:
        assert jsonl_ranges(fh, 1000) is None  # never split at a newline byte: UTF-16's is two bytes
    # an odd byte at the end: the last line is rejected, the rest kept
    (tmp_path / "odd.jsonl").write_bytes(data + b"x")
    rows = read_local(str(tmp_path / "odd.jsonl"))
    assert sum(isinstance(r, Document) for r in rows) == 399 and rows[-1].reason == "invalid_utf8"
    # and a whole run over it, on 2 workers, keeps the same records
    (tmp_path / "r.yaml").write_text("input: {paths: ['a.jsonl']}\nstages: []\n", encoding="utf-8")
    stats = run_recipe(load_recipe(str(tmp_path / "r.yaml")), str(tmp_path / "out"),
                       ["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    assert (stats["input"], stats["kept"], stats["rejected_total"]) == (400, 399, 1)


def test_jsonl_with_lone_cr_line_endings_is_read_as_lines(tmp_path):
    import gzip

    from dsdata.io.readers import jsonl_ranges

    lines = [json.dumps({"id": f"c{i}", "text": f"{TEXT} {i}"}) for i in range(3000)]
    data = ("\r".join(lines) + "\r").encode()
    (tmp_path / "mac.jsonl").write_bytes(data)
    (tmp_path / "mac.jsonl.gz").write_bytes(gzip.compress(data))
    for name in ("mac.jsonl", "mac.jsonl.gz"):
        rows = read_local(str(tmp_path / name))
        assert [r.id for r in rows] == [f"c{i}" for i in range(3000)] and all(isinstance(r, Document) for r in rows)
    with open(tmp_path / "mac.jsonl", "rb") as fh:
        assert jsonl_ranges(fh, 1000) is None
    # CRLF files are unchanged: the CR goes with the line ending as before
    (tmp_path / "dos.jsonl").write_bytes(("\r\n".join(lines[:5]) + "\r\n").encode())
    assert [r.id for r in read_local(str(tmp_path / "dos.jsonl"))] == [f"c{i}" for i in range(5)]


def test_a_parquet_decompression_bomb_is_too_large_rows_in_bounded_memory(tmp_path):
    """A 10 KB Parquet file (zstd) held one 300 MB text: it was kept, and reading it took 1.3 GB.
    A row group whose column decompresses past 16 MiB at over 1032:1 (the bound zstd and gzip input
    has) is a `too_large` row per row; the other row groups are read (in a child: its peak memory)."""
    import os
    import subprocess
    import sys

    bomb = tmp_path / "bomb.parquet"
    writer = pq.ParquetWriter(str(bomb), pa.schema([("text", pa.large_string())]), compression="zstd")
    writer.write_table(pa.table({"text": pa.array([TEXT, TEXT], type=pa.large_string())}))
    writer.write_table(pa.table({"text": pa.array(["a" * (128 << 20)], type=pa.large_string())}))
    writer.write_table(pa.table({"text": pa.array([TEXT], type=pa.large_string())}))
    writer.close()
    assert bomb.stat().st_size < 100_000
    code = ("import json, sys\nfrom dsdata.io.readers import read_local\n"
            "rows = read_local(sys.argv[1])\n"
            "print(json.dumps([[type(r).__name__, getattr(r, 'reason', ''), getattr(r, 'detail', '')] for r in rows]))\n"
            # The child's own peak (VmHWM): ru_maxrss survives execve and would report pytest's.
            "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=repo))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out, peak_kb = proc.stdout.splitlines()
    rows = json.loads(out)
    assert [r[:2] for r in rows] == [["Document", ""], ["Document", ""], ["Rejected", "too_large"], ["Document", ""]]
    assert "decompression bomb" in rows[2][2]
    assert int(peak_kb) < 250_000, peak_kb  # reading the bomb's 128 MB text took ~540 MB
