"""WARC/ARC records with malformed headers or wrong lengths: one row each, and reading resumes at
the next record (docs/reliability.md, "uncompressed WARC with a corrupt record").  Real files
written with warcio, read by the real reader and, end to end, by the extract recipe on Beam."""
import gzip
import io
import json

import pyarrow.parquet as pq
import pytest
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from dsdata.document import Document, Rejected
from dsdata.io.readers import read_local


def _record(i: int, rtype: str = "response") -> bytes:
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=False)
    headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
    writer.write_record(writer.create_warc_record(
        f"http://x.example/{i}", rtype, payload=io.BytesIO(f"<p>page {i} has words.</p>".encode()),
        http_headers=headers))
    return buf.getvalue()


BAD_HEADERS = {
    "empty_header_block": b"WARC/1.0\r\n\r\n",
    "line_without_colon": b"WARC/1.0\r\nWARC-Type: response\r\nBroken-Header-No-Colon\r\n\r\n",
    "no_content_length": (b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://x.example/bad\r\n\r\n"
                          b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<p>lost body</p>\r\n\r\n"),
    "no_warc_type": b"WARC/1.0\r\nContent-Length: 4\r\n\r\nabcd\r\n\r\n",
    "content_length_not_a_number": None,  # made from a real record below
    "content_length_negative": None,
}


def _bad(kind: str) -> bytes:
    if kind == "content_length_not_a_number":
        return _record(99).replace(b"Content-Length: ", b"Content-Length: abc", 1)
    if kind == "content_length_negative":
        rec = _record(99)
        head, _, _ = rec.partition(b"Content-Length: ")
        return rec.replace(b"Content-Length: " + rec[len(head) + 16:].split(b"\r\n")[0], b"Content-Length: -5", 1)
    return BAD_HEADERS[kind]


def _write(tmp_path, parts: list[bytes], packing: str):
    if packing == "plain":
        path, data = tmp_path / "c.warc", b"".join(parts)
    elif packing == "gzip_per_record":
        path, data = tmp_path / "c.warc.gz", b"".join(gzip.compress(p) for p in parts)
    else:  # one gzip member for the whole file: the resync happens on the decoded stream
        path, data = tmp_path / "c.warc.gz", gzip.compress(b"".join(parts))
    path.write_bytes(data)
    return path


def _urls(results):
    return [r.metadata["url"] for r in results if isinstance(r, Document)]


def _rejected(results):
    return [r for r in results if isinstance(r, Rejected)]


@pytest.mark.parametrize("packing", ["plain", "gzip_per_record", "gzip_one_member"])
@pytest.mark.parametrize("kind", list(BAD_HEADERS))
def test_malformed_header_is_one_row_and_the_records_after_it_are_read(tmp_path, kind, packing):
    good = [_record(i) for i in range(4)]
    parts = good[:2] + [_bad(kind)] + good[2:]
    results = read_local(str(_write(tmp_path, parts, packing)))
    assert _urls(results) == [f"http://x.example/{i}" for i in range(4)]
    (row,) = _rejected(results)
    assert row.reason == "bad_warc"
    bad_at = len(good[0]) + len(good[1])  # offset in the decoded stream
    assert f"offset {bad_at}" in row.detail and "malformed WARC record" in row.detail
    assert len(results) == 5  # 4 good records + 1 row for the bad one: the ledger counts 5 records


def test_content_length_too_short_is_one_row(tmp_path):
    good = [_record(i) for i in range(4)]
    rec = _record(99)
    head = rec.split(b"Content-Length: ")[1].split(b"\r\n")[0]
    short = rec.replace(b"Content-Length: " + head, b"Content-Length: 20", 1)
    results = read_local(str(_write(tmp_path, good[:2] + [short] + good[2:], "plain")))
    assert _urls(results) == [f"http://x.example/{i}" for i in range(4)]
    (row,) = _rejected(results)
    assert row.reason == "bad_warc" and "Content-Length 20 ends inside the record" in row.detail
    assert len(results) == 5


def test_content_length_too_long_does_not_glue_the_next_record_into_the_text(tmp_path):
    good = [_record(i) for i in range(5)]
    long = good[2].replace(b"Content-Length: ", b"Content-Length: 1", 1)  # runs into record 4
    results = read_local(str(_write(tmp_path, good[:2] + [long] + good[3:], "plain")))
    assert _urls(results) == [f"http://x.example/{i}" for i in range(5)]
    assert all("WARC/1.0" not in r.text and "WARC-Type" not in r.text for r in results if isinstance(r, Document))
    assert [r.reason for r in _rejected(results)] == ["bad_warc"]


def test_version_line_split_across_read_pieces_after_garbage_without_newline(tmp_path):
    good = [_record(i) for i in range(3)]
    for pad in (65536 - 3, 65536 - 7, 65536):  # the next record's "WARC/1.0" straddles a 64 KiB piece
        garbage = b"x" * pad
        results = read_local(str(_write(tmp_path, good[:1] + [garbage] + good[1:], "plain")))
        assert _urls(results) == [f"http://x.example/{i}" for i in range(3)], pad
        (row,) = _rejected(results)
        assert row.reason == "bad_warc" and f"{pad} bytes at offset {len(good[0])}" in row.detail


@pytest.mark.parametrize("packing", ["plain", "gzip_per_record", "gzip_one_member"])
def test_good_files_read_every_response_in_order(tmp_path, packing):
    parts = [_record(0, "request"), _record(1), _record(2, "metadata"), _record(3), _record(4)]
    path = _write(tmp_path, parts, packing)
    results = read_local(str(path))
    assert not _rejected(results)
    expected = [r.rec_headers.get_header("WARC-Record-ID") for r in ArchiveIterator(io.BytesIO(b"".join(parts)))
                if r.rec_type == "response"]
    assert [r.id for r in results] == expected and len(expected) == 3
    assert [r.text for r in results] == [f"<p>page {i} has words.</p>" for i in (1, 3, 4)]


_ARC_HEAD = (b"filedesc://x.arc 0.0.0.0 20200101000000 text/plain 76\n1 0 InternetArchive\n"
             b"URL IP-address Archive-date Content-type Archive-length\n\n")
_ARC_BODY = b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<p>hello world. two sentences. three.</p>"


def _arc_record(i: int) -> bytes:
    return b"http://ex.com/%d 1.2.3.4 20200101000000 text/html %d\n" % (i, len(_ARC_BODY)) + _ARC_BODY + b"\n"


def test_arc_files_good_and_malformed(tmp_path):
    good = tmp_path / "good.arc"
    good.write_bytes(_ARC_HEAD + b"".join(_arc_record(i) for i in range(3)))
    assert _urls(read_local(str(good))) == [f"http://ex.com/{i}" for i in range(3)]
    ids = [r.id for r in read_local(str(good))]
    assert ids == [r.id for r in read_local(str(good))] and len(set(ids)) == 3  # the same ids on every read
    assert all(i.startswith("<urn:uuid:") for i in ids)
    bad = tmp_path / "bad.arc"  # the file header's length is wrong: warcio stops on the next line
    bad.write_bytes(b"filedesc://x.arc 0.0.0.0 20200101000000 text/plain 10\n1 0 ex\n\n"
                    b"http://ex.com/ 1.2.3.4 20200101000000 text/html 20\n<p>hello world</p>\n\n")
    rows = _rejected(read_local(str(bad)))
    assert rows and rows[0].reason == "bad_warc" and "malformed ARC record at offset" in rows[0].detail


def test_extract_recipe_counts_the_malformed_record(tmp_path):
    from dsdata.cli import main

    good = [_record(i) for i in range(4)]
    path = _write(tmp_path, good[:2] + [BAD_HEADERS["line_without_colon"]] + good[2:], "gzip_one_member")
    out = tmp_path / "out"
    assert main(["run", "pipelines/extract.yaml", "--input", str(path), "--output", str(out), "--quiet"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["input"] == 5 and stats["kept"] == 4 and stats["rejected"] == {"read": {"bad_warc": 1}}
    texts = sorted(r["text"] for f in (out / "kept").glob("*.parquet") for r in pq.read_table(f).to_pylist())
    assert texts == [f"page {i} has words." for i in range(4)]
    (row,) = [r for f in (out / "rejected").glob("*.parquet") for r in pq.read_table(f).to_pylist()]
    assert row["reason"] == "bad_warc" and "not a 'Name: value' field" in row["detail"]


def test_response_without_target_uri_is_read_with_a_null_url(tmp_path):
    # The standard requires WARC-Target-URI on a response; warcio raises (AttributeError) without
    # one, which lost the record.  Its payload is intact, so it is a document, url null, in place.
    good = [_record(i) for i in range(3)]
    no_uri = _record(99).replace(b"WARC-Target-URI: ", b"X-Not-The-URI: ", 1)
    for packing in ("plain", "gzip_per_record", "gzip_one_member"):
        results = read_local(str(_write(tmp_path, good[:1] + [no_uri] + good[1:], packing)))
        assert _rejected(results) == []
        assert _urls(results) == ["http://x.example/0", None, "http://x.example/1", "http://x.example/2"]
        assert results[1].text == "<p>page 99 has words.</p>"
        assert results[1].metadata["content_type"] == "text/html"


def test_response_without_target_uri_and_no_http_head_is_one_row(tmp_path):
    block = b"just some bytes, no HTTP status line"
    no_uri = (b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:nohttp>\r\n"
              b"Content-Length: %d\r\n\r\n" % len(block)) + block + b"\r\n\r\n"
    results = read_local(str(_write(tmp_path, [_record(0), no_uri, _record(1)], "plain")))
    assert _urls(results) == ["http://x.example/0", "http://x.example/1"]
    assert [(r.doc.id, r.stage) for r in _rejected(results)] == [("<urn:uuid:nohttp>", "read")]
