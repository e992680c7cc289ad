"""Readers under damage and hostile content: every complete record before damage is kept, decoding
resumes at the next gzip member / zstd frame, and no record's content can raise out of a reader."""
import gzip
import io
import json
import zlib

import pyarrow.parquet as pq
import pytest
import zstandard
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from dsdata.document import Document, Rejected
from dsdata.io.readers import read_local


def _line(i, text=None):
    return json.dumps({"id": f"d{i}", "text": text or f"document number {i} " * 5}).encode() + b"\n"


def _kept_ids(results):
    return [r.id for r in results if isinstance(r, Document)]


def _reasons(results):
    return [r.reason for r in results if isinstance(r, Rejected)]


def _complete_lines_in(prefix_of_gzip: bytes) -> int:
    """How many newline-terminated lines a truncated gzip stream holds (decoded as far as it goes)."""
    out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(prefix_of_gzip)
    return out.count(b"\n")


# ---------------------------------------------------------------------------------- record content


def test_lone_surrogate_escape_is_replaced_so_text_is_utf8(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"id": "a", "text": "left \\ud800 right", "title": "\\udfff"}\n'
                     b'{"id": "b", "text": "pair \\ud83d\\ude00 ok"}\n')
    a, b = read_local(str(path))
    assert isinstance(a, Document) and isinstance(b, Document)
    assert a.text == "left \ufffd right" and a.metadata == {"title": "\ufffd"}
    assert b.text == "pair \U0001F600 ok"  # a valid pair is one character, untouched
    for doc in (a, b):
        doc.text.encode("utf-8")
        json.dumps(doc.metadata, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("depth", [150, 5000, 200_000])
def test_deeply_nested_json_is_one_bad_json_row(tmp_path, depth):
    path = tmp_path / "deep.jsonl"
    deep = b'{"text": "x", "m": ' + b"[" * depth + b"]" * depth + b"}\n"
    path.write_bytes(_line(0) + deep + _line(2))
    results = read_local(str(path))
    assert _kept_ids(results) == ["d0", "d2"]
    assert _reasons(results) == ["bad_json"]
    assert "nested deeper" in results[1].detail


def test_utf8_bom_at_start_of_jsonl_is_not_a_bad_record(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _line(0) + _line(1))
    assert _kept_ids(read_local(str(path))) == ["d0", "d1"]


def test_utf8_bom_of_a_concatenated_file_is_not_a_bad_record(tmp_path):
    # `cat a.jsonl b.jsonl` (or `cat a.gz b.gz`) where each part starts with a BOM.
    part = lambda k: b"\xef\xbb\xbf" + _line(k) + _line(k + 1)  # noqa: E731
    (tmp_path / "cat.jsonl").write_bytes(part(0) + part(2) + part(4))
    (tmp_path / "cat.jsonl.gz").write_bytes(gzip.compress(part(0)) + gzip.compress(part(2)))
    assert _kept_ids(read_local(str(tmp_path / "cat.jsonl"))) == [f"d{i}" for i in range(6)]
    assert _kept_ids(read_local(str(tmp_path / "cat.jsonl.gz"))) == [f"d{i}" for i in range(4)]


def test_control_bytes_in_first_line_reject_that_line_only(tmp_path):
    path = tmp_path / "ctl.jsonl"
    garbage = bytes(range(0, 9)) * 1200 + b"\n"  # ~10 KiB of control bytes: the whole sniff window
    path.write_bytes(garbage + b"".join(_line(i) for i in range(1, 21)))
    results = read_local(str(path))
    assert _kept_ids(results) == [f"d{i}" for i in range(1, 21)]
    assert _reasons(results) == ["bad_json"]


def test_a_binary_file_is_still_one_row(tmp_path):
    path = tmp_path / "image.jsonl"
    path.write_bytes(bytes(range(256)) * 64)
    assert _reasons(read_local(str(path))) == ["binary_file"]


# --------------------------------------------------------------------------------------- damage


@pytest.mark.parametrize("n_lines, keep_fraction", [(12, 0.7), (12, 0.95), (5000, 0.5), (5000, 0.97)])
def test_truncated_gzip_keeps_every_complete_line(tmp_path, n_lines, keep_fraction):
    body = b"".join(_line(i) for i in range(n_lines))
    data = gzip.compress(body)
    cut = data[: int(len(data) * keep_fraction)]
    expected = _complete_lines_in(cut)
    assert 0 < expected <= n_lines
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(cut)
    results = read_local(str(path))
    assert _kept_ids(results) == [f"d{i}" for i in range(expected)]
    assert _reasons(results) == ["truncated_compression"]


def _corrupt_member(members: list[bytes], index: int) -> bytes:
    bad = bytearray(members[index])
    bad[10:40] = b"\xff" * 30  # right after the 10-byte header: BTYPE=11, an invalid deflate block
    return b"".join(members[:index]) + bytes(bad) + b"".join(members[index + 1:])


def test_corrupt_gzip_member_resumes_at_the_next_member(tmp_path):
    groups = [range(0, 50), range(50, 100), range(100, 150)]
    members = [gzip.compress(b"".join(_line(i) for i in g)) for g in groups]
    path = tmp_path / "multi.jsonl.gz"
    path.write_bytes(_corrupt_member(members, 1))
    results = read_local(str(path))
    assert _kept_ids(results) == [f"d{i}" for i in list(groups[0]) + list(groups[2])]
    (damage,) = [r for r in results if isinstance(r, Rejected)]
    assert damage.reason == "corrupt_compression"
    assert f"{len(members[1])} compressed bytes" in damage.detail and "resumed" in damage.detail


def test_damaged_zstd_frame_keeps_frames_before_and_after(tmp_path):
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    groups = [range(0, 40), range(40, 80), range(80, 120)]
    frames = [cctx.compress(b"".join(_line(i) for i in g)) for g in groups]
    bad = bytearray(frames[1])
    for k in range(12, len(bad) - 8, 7):
        bad[k] ^= 0x5A
    path = tmp_path / "multi.jsonl.zst"
    path.write_bytes(frames[0] + bytes(bad) + frames[2])
    results = read_local(str(path))
    kept = _kept_ids(results)
    assert kept[:40] == [f"d{i}" for i in groups[0]] and kept[-40:] == [f"d{i}" for i in groups[2]]
    assert "corrupt_compression" in _reasons(results)
    # Whatever of frame 2 decoded before the damage showed is accounted for, not lost.
    assert len(results) >= 81


def test_truncated_zstd_keeps_intact_frames(tmp_path):
    cctx = zstandard.ZstdCompressor()
    frames = [cctx.compress(b"".join(_line(i) for i in range(k, k + 30))) for k in (0, 30, 60)]
    data = b"".join(frames)
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(data[: len(frames[0]) + len(frames[1]) + 5])
    results = read_local(str(path))
    assert _kept_ids(results) == [f"d{i}" for i in range(60)]
    assert _reasons(results) == ["truncated_compression"]


def test_zstd_skippable_frames_are_metadata_and_lines_go_on_across_frames(tmp_path):
    # pzstd (shipped with zstd) writes a skippable frame before every frame and cuts frames at any
    # byte, so a line goes on in the next frame; `zstd -d` gives the input back byte for byte.
    import struct

    data = b"".join(_line(i) for i in range(90))
    cuts = [0, data.index(b'"d29"') + 7, data.index(b'"d61"') + 3, len(data)]  # inside d29's and d61's lines
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    packed = b""
    for n, (a, b) in enumerate(zip(cuts, cuts[1:])):
        payload = struct.pack("<I", b - a) + b"x" * n * 1000  # pzstd records the frame size; any bytes may follow
        packed += struct.pack("<II", 0x184D2A50 + n, len(payload)) + payload + cctx.compress(data[a:b])
    path = tmp_path / "pz.jsonl.zst"
    path.write_bytes(packed)
    results = read_local(str(path))
    assert _kept_ids(results) == [f"d{i}" for i in range(90)] and _reasons(results) == []
    # A skippable frame the file ends inside: the frames before it are read, and one row says so.
    path.write_bytes(cctx.compress(data) + struct.pack("<II", 0x184D2A5F, 1000) + b"y" * 10)
    results = read_local(str(path))
    assert _kept_ids(results) == [f"d{i}" for i in range(90)] and _reasons(results) == ["truncated_compression"]


@pytest.mark.parametrize("compressed_dictionary", [False, True])
def test_warc_zstd_with_its_dictionary_frame_is_read(tmp_path, compressed_dictionary):
    # IIPC's WARC-zstd: a skippable frame (magic 0x184D2A5D) first holds the dictionary (raw, or
    # itself zstd-compressed), and each record is a frame compressed with it.
    import struct

    recs = []
    for i in range(60):
        payload = f"<html><body><p>page {i} has words about packages and mirrors.</p></body></html>".encode()
        http = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(payload)) + payload
        recs.append((f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:r{i}>\r\n"
                     f"WARC-Target-URI: http://x.example/{i}\r\nContent-Length: {len(http)}\r\n\r\n").encode()
                    + http + b"\r\n\r\n")
    dictionary = zstandard.train_dictionary(1024, recs)
    cctx = zstandard.ZstdCompressor(dict_data=dictionary)
    raw = dictionary.as_bytes()
    if compressed_dictionary:
        raw = zstandard.ZstdCompressor().compress(raw)
    path = tmp_path / "d.warc.zst"
    path.write_bytes(struct.pack("<II", 0x184D2A5D, len(raw)) + raw + b"".join(cctx.compress(r) for r in recs))
    results = read_local(str(path))
    assert [r.id for r in results] == [f"<urn:uuid:r{i}>" for i in range(60)] and _reasons(results) == []
    # A dictionary frame that holds no dictionary: one row says so, not one per record.
    path.write_bytes(struct.pack("<II", 0x184D2A5D, 8) + b"\x28\xb5\x2f\xfd\x00\x00\x00\x00"
                     + b"".join(cctx.compress(r) for r in recs[:3]))
    reasons = _reasons(read_local(str(path)))
    assert reasons[0] == "corrupt_compression" and len(reasons) <= 2


def _warc_members(n):
    members = []
    for i in range(n):
        buf = io.BytesIO()
        writer = WARCWriter(buf, gzip=True)
        headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.0")
        payload = f"<html><body><p>page {i} words</p></body></html>".encode()
        writer.write_record(writer.create_warc_record(f"http://x.example/{i}", "response",
                                                      payload=io.BytesIO(payload), http_headers=headers))
        members.append(buf.getvalue())
    return members


def test_warc_with_one_corrupt_member_reads_the_records_after_it(tmp_path):
    members = _warc_members(6)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(_corrupt_member(members, 2))
    results = read_local(str(path))
    urls = [r.metadata["url"] for r in results if isinstance(r, Document)]
    assert urls == [f"http://x.example/{i}" for i in (0, 1, 3, 4, 5)]
    assert _reasons(results) == ["corrupt_compression"]


def test_extract_recipe_reads_warc_records(tmp_path, monkeypatch):
    from dsdata.cli import main

    members = _warc_members(4)
    warc = tmp_path / "crawl.warc.gz"
    warc.write_bytes(b"".join(members))
    out = tmp_path / "out"
    assert main(["run", "pipelines/extract.yaml", "--input", str(warc), "--output", str(out), "--quiet"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["input"] == 4 and stats["kept"] == 4
    texts = sorted(r["text"] for f in (out / "kept").glob("*.parquet") for r in pq.read_table(f).to_pylist())
    assert texts == [f"page {i} words" for i in range(4)]


@pytest.mark.parametrize("long_size", [5_000, 300_000])  # inside one 64 KiB read, and across several
def test_overlong_line_is_one_row_and_reading_resumes(tmp_path, monkeypatch, long_size):
    from dsdata.io.readers import jsonl

    monkeypatch.setattr(jsonl, "_MAX_LINE", 1_000)  # the real limit is 256 MiB; same code path
    path = tmp_path / "long.jsonl"
    path.write_bytes(_line(0) + b'{"text": "' + b"x" * long_size + b'"}\n' + _line(2))
    results = read_local(str(path))
    assert _kept_ids(results) == ["d0", "d2"]
    (row,) = [r for r in results if isinstance(r, Rejected)]
    assert row.reason == "line_too_long" and row.doc.id == f"{path}:2"


def test_decompression_bomb_html_is_one_too_large_row(tmp_path, monkeypatch):
    from dsdata.io.readers import common, warc

    for module in (common, warc):  # each reads up to it or names it in a row's detail (html through common)
        monkeypatch.setattr(module, "_MAX_LINE", 1 << 20)  # the real bound is 256 MiB; same code path
    path = tmp_path / "bomb.html.gz"
    path.write_bytes(gzip.compress(b"<p>" + b"a" * (8 << 20)))
    (row,) = read_local(str(path))
    assert isinstance(row, Rejected) and row.reason == "too_large"
    members = _warc_members(2)
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html")], protocol="HTTP/1.0")
    writer.write_record(writer.create_warc_record("http://x.example/bomb", "response",
                                                  payload=io.BytesIO(b"a" * (4 << 20)), http_headers=headers))
    warc = tmp_path / "bomb.warc.gz"
    warc.write_bytes(members[0] + buf.getvalue() + members[1])
    results = read_local(str(warc))
    assert _kept_ids(results)[:1] and len(_kept_ids(results)) == 2
    assert _reasons(results) == ["too_large"]


def _plain_warc_records(n):
    records = []
    for i in range(n):
        buf = io.BytesIO()
        writer = WARCWriter(buf, gzip=False)
        headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html")], protocol="HTTP/1.0")
        writer.write_record(writer.create_warc_record(f"http://x.example/{i}", "response",
                                                      payload=io.BytesIO(f"<p>page {i}</p>".encode()),
                                                      http_headers=headers))
        records.append(buf.getvalue())
    return records


def _garbled_header(rec):
    return b"XXXX" + rec[4:]


@pytest.mark.parametrize("damage, expected_urls, expected_reasons", [
    (lambda r: _garbled_header(r), [0, 1, 3, 4], ["bad_warc"]),
    (lambda r: r.replace(b"Content-Length: ", b"Content-Length: 9", 1), [0, 1, 3, 4], ["truncated_record"]),
    (lambda r: r.replace(b"Content-Length: ", b"Content-Length: 1", 1), [0, 1, 2, 3, 4], ["bad_warc"]),
    (lambda r: b"garbage\x00\x01" * 50 + r, [0, 1, 2, 3, 4], ["bad_warc"]),
])
def test_uncompressed_warc_resumes_at_the_next_record(tmp_path, damage, expected_urls, expected_reasons):
    records = _plain_warc_records(5)
    path = tmp_path / "crawl.warc"
    path.write_bytes(b"".join(records[:2]) + damage(records[2]) + b"".join(records[3:]))
    results = read_local(str(path))
    urls = [r.metadata["url"] for r in results if isinstance(r, Document)]
    assert urls == [f"http://x.example/{i}" for i in expected_urls]
    assert _reasons(results) == expected_reasons


def test_uncompressed_warc_cut_inside_a_header_is_one_row(tmp_path):
    records = _plain_warc_records(3)
    path = tmp_path / "cut.warc"
    path.write_bytes(b"".join(records[:2]) + records[2][: len(records[2]) // 2])
    results = read_local(str(path))
    assert len(_kept_ids(results)) == 2 and _reasons(results) == ["truncated_record"]
