"""Readers turn every input record into a Document or a Rejected with a reason; nothing is skipped."""
import gzip
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from dsdata.document import Document, Rejected
from dsdata.io.readers import InputFormatError, detect_format, read_file, read_local

LINES = [
    b'{"id": "a", "text": "first document", "url": "http://x"}',
    b'{"text": "no id"}',
    b"{not json",
    b'{"id": "c", "body": "text under another field"}',
    b'"just a string"',
    b'{"id": "d", "text": "caf\xe9"}',  # latin-1 byte: invalid UTF-8
    b'{"id": "e", "text": "   "}',
    b'{"id": 7, "text": "numeric id"}',
]


def _reasons(results):
    return [r.reason if isinstance(r, Rejected) else "kept" for r in results]


def test_jsonl_every_line_accounted_for(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(LINES) + b"\n\n")
    results = read_local(str(path))
    assert _reasons(results) == [
        "kept", "kept", "bad_json", "missing_text", "not_an_object", "invalid_utf8", "empty_text", "kept",
    ]
    first, second = results[0], results[1]
    assert first.id == "a" and first.metadata == {"url": "http://x"}
    # Absent ids are deterministic: source file + line number.
    assert second.id == f"{path}:2"
    assert results[7].id == "7"
    assert results[3].doc.metadata == {"body": "text under another field"}


@pytest.mark.parametrize("suffix, compress", [(".jsonl.gz", gzip.compress), (".jsonl.zst", lambda b: zstandard.ZstdCompressor().compress(b))])
def test_compressed_jsonl(tmp_path, suffix, compress):
    path = tmp_path / f"in{suffix}"
    path.write_bytes(compress(b"\n".join(LINES[:2]) + b"\n"))
    assert _reasons(read_local(str(path))) == ["kept", "kept"]


def test_truncated_gzip_keeps_what_was_readable_and_rejects_the_rest(tmp_path):
    body = b"".join(json.dumps({"id": i, "text": f"document number {i} " * 20}).encode() + b"\n" for i in range(2000))
    data = gzip.compress(body)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    results = read_local(str(path))
    kept = [r for r in results if isinstance(r, Document)]
    rejected = [r for r in results if isinstance(r, Rejected)]
    assert 0 < len(kept) < 2000
    assert [r.reason for r in rejected] == ["truncated_compression"]
    assert [d.id for d in kept] == [str(i) for i in range(len(kept))]


def test_binary_file_is_one_rejection(tmp_path):
    path = tmp_path / "image.jsonl"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    results = read_local(str(path))
    assert _reasons(results) == ["binary_file"]
    assert results[0].doc.id == str(path)


def test_a_truncated_binary_archive_keeps_its_truncation_row(tmp_path):
    """Found by test_ledger_fuzz: control-byte lines in a cut gzip became one binary_file row and
    the truncated_compression row was folded into it, so the damage went unreported."""
    data = gzip.compress(b"{\x00\n{\x00\n")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[:20])
    assert _reasons(read_local(str(cut))) == ["binary_file", "truncated_compression"]
    nothing_whole = tmp_path / "head.jsonl.gz"
    nothing_whole.write_bytes(data[:13])  # no complete line: only the truncation to report
    assert _reasons(read_local(str(nothing_whole))) == ["truncated_compression"]
    whole = tmp_path / "whole.jsonl.gz"
    whole.write_bytes(data)
    assert _reasons(read_local(str(whole))) == ["binary_file"]


def test_parquet_rows_and_missing_text(tmp_path):
    table = pa.table({"id": ["x", None, "z"], "text": ["hello", "no id", None], "score": [1.0, 2.0, 3.0]})
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    results = read_local(str(path))
    assert _reasons(results) == ["kept", "kept", "missing_text"]
    assert results[0].metadata == {"score": 1.0}
    assert results[1].id == f"{path}:1"


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"this is not parquet at all")
    assert _reasons(read_local(str(path))) == ["bad_parquet"]


def test_html_file_id_is_path(tmp_path):
    path = tmp_path / "page.html"
    path.write_text("<html><head><meta charset='utf-8'></head><body><p>你好，世界。</p></body></html>", encoding="utf-8")
    (doc,) = read_local(str(path))
    assert doc.id == str(path) and "你好" in doc.text and doc.metadata["content_type"] == "text/html"


def test_html_declared_charset(tmp_path):
    path = tmp_path / "gbk.htm"
    path.write_bytes("<html><head><meta charset=gbk></head><body>中文网页</body></html>".encode("gbk"))
    (doc,) = read_local(str(path))
    assert "中文网页" in doc.text


def _warc(records, gz=True) -> bytes:
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=gz)
    for uri, ctype, payload in records:
        headers = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.0")
        writer.write_record(writer.create_warc_record(uri, "response", payload=io.BytesIO(payload), http_headers=headers))
    writer.write_record(writer.create_warc_record("http://x/req", "request", payload=io.BytesIO(b"GET / HTTP/1.0\r\n\r\n")))
    return buf.getvalue()


@pytest.mark.parametrize("gz", [True, False])
def test_warc_response_records(tmp_path, gz):
    data = _warc([
        ("http://a.example/", "text/html; charset=utf-8", "<html><body><p>héllo 世界</p></body></html>".encode()),
        ("http://b.example/logo.png", "image/png", b"\x89PNG\x00\x00binary"),
    ], gz=gz)
    path = tmp_path / ("crawl.warc.gz" if gz else "crawl.warc")
    path.write_bytes(data)
    results = read_local(str(path))
    assert _reasons(results) == ["kept", "binary_file"]
    assert results[0].metadata["url"] == "http://a.example/"
    assert results[0].id.startswith("<urn:uuid:")
    assert "世界" in results[0].text


def test_truncated_warc(tmp_path):
    data = _warc([(f"http://a.example/{i}", "text/html", b"<p>" + b"word " * 2000 + b"</p>") for i in range(5)])
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(data[: int(len(data) * 0.6)])
    results = read_local(str(path))
    reasons = _reasons(results)
    assert reasons[-1] in ("bad_warc", "truncated_compression")
    assert 1 <= reasons.count("kept") < 5


def test_detect_format():
    assert detect_format("gs://b/x.jsonl.gz") == "jsonl"
    assert detect_format("a/b.parquet") == "parquet"
    assert detect_format("a/b.HTM") == "html"
    assert detect_format("a/b.warc.gz") == "warc"
    assert detect_format("notes.txt") == detect_format("README.md.gz") == "text"
    assert detect_format("rows.tsv") == detect_format("rows.csv.zst") == "csv"
    with pytest.raises(InputFormatError, match="cannot tell the format"):
        detect_format("LICENSE")


def test_read_file_explicit_format(tmp_path):
    path = tmp_path / "data.txt"
    path.write_bytes(b'{"text": "x"}\n')
    with open(path, "rb") as fh:
        assert _reasons(list(read_file(str(path), fh, "jsonl"))) == ["kept"]


def _outcome(fn, text):
    try:
        return "ok", fn(text)
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


def test_json_fast_path_equals_json_loads_on_every_kind_of_line():
    """`_parse_json` (the C scanner straight, json.loads for the rest) gives json.loads' value or
    json.loads' error, message included, on lines of every shape: whitespace around the value, a
    BOM, extra data, nothing, NaN, huge integers, escapes, lone surrogates, deep nesting, truncation."""
    import random

    from dsdata.io.readers.jsonl import _parse_json

    rng = random.Random(7)
    values = ['{"id": "a", "text": "x"}', '{"text":"\\ud800 lone"}', '{"text": "\\ud83d\\ude00"}', "[1, 2.5e3, -0.0]",
              '{"n": NaN, "i": Infinity}', '{"big": ' + "9" * 5000 + "}", '{"f": 1e400}', '"str"', "17", "null",
              '{"a": {"a": {"a": []}}}', '{"dup": 1, "dup": 2}', '{"t": "tab\\there", "u": "\\u00e9"}',
              "[" * 3000 + "]" * 3000, '{"text": "ok"} {"text": "two"}', '{"text": "cut', "{", "]", "", "tru",
              '{"x": 1,}', '{"text": "ctrl\x01char"}', '{"中文": "值"}']
    lines = []
    for v in values:
        for pre, post in [("", ""), (" ", ""), ("", " "), ("\t", "\r"), ("\ufeff", ""), ("", "\r"), ("", "x"), ("\n", "")]:
            lines.append(pre + v + post)
    for _ in range(300):  # random cuts and splices of the valid ones
        v = rng.choice(values)
        i, j = sorted(rng.randrange(len(v) + 1) for _ in range(2))
        lines.append(v[:i] + rng.choice(["", " ", '"', "}", "\\"]) + v[j:])
    for line in lines:
        fast, slow = _outcome(_parse_json, line), _outcome(json.loads, line)
        assert fast[0] == slow[0], line[:80]
        if fast[0] == "ok":
            assert json.dumps(fast[1], allow_nan=True) == json.dumps(slow[1], allow_nan=True), line[:80]
        else:
            assert fast[1] == slow[1], line[:80]


def test_metadata_keeps_every_other_field_in_order(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"z": 1, "text": "t", "a": [2], "id": "x", "m": {"k": null}}\n'
                    '{"text": "same field", "id": "text"}\n', encoding="utf-8")
    first, second = read_local(str(path))
    assert list(first.metadata.items()) == [("z", 1), ("a", [2]), ("m", {"k": None})]
    assert first.id == "x" and second.id == "text" and second.metadata == {}


# ---------------------------------------------------------------- the one registry of input formats


def test_every_place_that_lists_formats_reads_the_registry(tmp_path):
    """--format's choices, the recipe's check, detect_format and input matching all come from
    dsdata/io/readers REGISTRY: a format added there is known everywhere, a name not there nowhere."""

    from dsdata.commands.run import run_parser
    from dsdata.io import readers
    from dsdata.io.inputs import expand_directories
    from dsdata.recipe import INPUT_FORMATS, RecipeError, load_recipe

    names = [fmt.name for fmt in readers.REGISTRY]
    assert readers.FORMATS == tuple(names) and list(INPUT_FORMATS) == ["auto", *names]
    choices = next(a.choices for a in run_parser()._actions if "--format" in a.option_strings)
    assert list(choices) == ["auto", *names]
    for fmt in readers.REGISTRY:
        for suffix in fmt.suffixes:
            assert readers.detect_format(f"data/x{suffix.upper()}") == fmt.name
            assert readers.detect_format(f"data/x{suffix}.gz") == fmt.name
        assert (readers.cuttable_format(f"x{fmt.suffixes[0]}") == fmt.name) == fmt.splits_into_ranges
        assert readers.cuttable_format(f"x{fmt.suffixes[0]}.gz") is None  # compressed: read whole
    (tmp_path / "r.yaml").write_text("input: {paths: [x.xml], format: xml}\nstages:\n  - clean: {}\n")
    with pytest.raises(RecipeError, match="input.format 'xml' is not one of auto, jsonl, parquet"):
        load_recipe(str(tmp_path / "r.yaml"))
    # Input matching in a directory keeps the files whose name gives a registered format.
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.jsonl", "b.parquet", "c.html", "d.warc.gz", "README"):
        (folder / name).write_bytes(b"")
    kept = sorted(os.path.basename(p) for p in expand_directories([str(folder)], "auto").patterns)
    assert kept == ["a.jsonl", "b.parquet", "c.html", "d.warc.gz"]


def test_a_format_added_to_the_registry_is_read(tmp_path, monkeypatch):
    """Adding a reader is one registry entry: detect_format, read_file and input matching see it."""
    import dataclasses

    from dsdata.document import Document
    from dsdata.io import readers

    def read_lines(path, raw, text_field="text", id_field="id"):
        for i, line in enumerate(raw.read().decode("utf-8").splitlines(), 1):
            yield Document(f"{path}:{i}", line, {"source": path})

    extra = readers.InputFormat("lines", (".lines",), read_lines, summary="test: one document per line")
    monkeypatch.setattr(readers, "REGISTRY", (*readers.REGISTRY, extra))
    monkeypatch.setitem(readers.READERS, "lines", extra)
    monkeypatch.setattr(readers, "FORMATS", (*readers.FORMATS, "lines"))
    path = tmp_path / "a.lines"
    path.write_text("one\ntwo\n")
    assert readers.detect_format(str(path)) == "lines"
    assert [d.text for d in readers.read_local(str(path))] == ["one", "two"]
    assert readers.cuttable_format(str(path)) is None
