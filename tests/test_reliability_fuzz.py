"""Fuzzing every reader (`read_file`, in-process) with arbitrary bytes, arbitrary JSON and damaged
compression: nothing raises, every text is UTF-8-encodable, and every input record — found by its
marker id — comes out exactly once, kept or rejected."""
import gzip
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from dsdata.document import Document, Rejected
from dsdata.io.readers import read_file

def fuzz(n):
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# Per-test example counts; their sum is the case count reported for issue 14.
N_BYTES, N_JSONL, N_COMPRESSED, N_PARQUET, N_HTML, N_WARC = 300, 200, 150, 60, 150, 80

# Strings with lone surrogates too: valid JSON escapes (json.dumps writes "\\ud800"), not Unicode.
json_text = st.text() | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(max_codepoint=0x7F))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | json_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
junk_line = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" "))
deep_json = st.integers(90, 3000).map(lambda d: b'{"text": "deep", "m": ' + b"[" * d + b"]" * d + b"}")


def _all_rows(path: str, data: bytes):
    rows = list(read_file(path, io.BytesIO(data)))
    for row in rows:
        doc = row.doc if isinstance(row, Rejected) else row
        assert isinstance(row, (Document, Rejected))
        if isinstance(row, Rejected):
            assert row.stage == "read" and row.reason
        doc.text.encode("utf-8")
        doc.id.encode("utf-8")
        json.dumps(doc.metadata, ensure_ascii=False, default=str).encode("utf-8")
    return rows


def _ids(rows):
    return [(r.doc if isinstance(r, Rejected) else r).id for r in rows]


@fuzz(N_BYTES)
@given(data=st.binary(max_size=4096), name=st.sampled_from([
    "x.jsonl", "x.jsonl.gz", "x.jsonl.zst", "x.parquet", "x.html", "x.html.gz", "x.warc", "x.warc.gz"]))
def test_arbitrary_bytes_never_raise(data, name):
    _all_rows(name, data)
    # The same bytes behind a valid compression header exercise the decoders' damage paths.
    if name.endswith(".gz"):
        _all_rows(name, b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + data)
    elif name.endswith(".zst"):
        _all_rows(name, b"\x28\xb5\x2f\xfd" + data)


def _jsonl_items(draw_items):
    """(line bytes, marker id or None) → file bytes and the ids that must come out."""
    lines, markers = [], []
    for kind, value, k in draw_items:
        if kind == "record":
            mid = f"m{k}"
            lines.append(json.dumps({"id": mid, "text": value, "extra": k}).encode())
            markers.append(mid)
        elif kind == "json":
            mid = f"j{k}"
            lines.append(json.dumps({"id": mid, "text": value}).encode())  # ensure_ascii: lone surrogates escaped
            markers.append(mid)
        else:
            lines.append(value)
    return lines, markers


item = st.one_of(
    st.tuples(st.just("record"), st.text(min_size=1).filter(str.strip), st.integers(0, 10**9)),
    st.tuples(st.just("json"), json_values, st.integers(0, 10**9)),
    st.tuples(st.just("json"), json_text, st.integers(0, 10**9)),
    st.tuples(st.just("junk"), junk_line, st.just(0)),
    st.tuples(st.just("junk"), deep_json, st.just(0)),
)


def _unique(items):
    seen, out = set(), []
    for kind, value, k in items:
        if kind != "junk" and (kind, k) in seen:
            continue
        seen.add((kind, k))
        out.append((kind, value, k))
    return out


@fuzz(N_JSONL)
@given(items=st.lists(item, max_size=30).map(_unique), bom=st.booleans(), crlf=st.booleans())
def test_jsonl_every_marked_record_comes_out_once(items, bom, crlf):
    lines, markers = _jsonl_items(items)
    data = (b"\xef\xbb\xbf" if bom else b"") + (b"\r\n" if crlf else b"\n").join(lines) + b"\n"
    rows = _all_rows("f.jsonl", data)
    ids = _ids(rows)
    for mid in markers:
        assert ids.count(mid) == 1, mid
    for row in rows:
        if isinstance(row, Document) and row.id.startswith("m"):
            assert row.text.strip()


@fuzz(N_COMPRESSED)
@given(items=st.lists(st.tuples(st.just("record"), st.text(min_size=1).filter(str.strip), st.integers(0, 10**9)),
                      min_size=3, max_size=40).map(_unique),
       codec=st.sampled_from(["gz", "zst"]), members=st.integers(1, 4),
       damage=st.sampled_from(["none", "truncate", "corrupt"]), where=st.floats(0.0, 1.0), seed=st.integers(0, 255))
def test_compressed_jsonl_keeps_every_record_of_intact_members(items, codec, members, damage, where, seed):
    lines, markers = _jsonl_items(items)
    groups = [lines[i::members] for i in range(members)]
    group_markers = [markers[i::members] for i in range(members)]
    compress = gzip.compress if codec == "gz" else zstandard.ZstdCompressor(write_checksum=True).compress
    blobs = [compress(b"\n".join(g) + b"\n") for g in groups if g]
    group_markers = [m for g, m in zip(groups, group_markers) if g]
    damaged = None
    if damage != "none":
        damaged = min(int(where * len(blobs)), len(blobs) - 1)
        blob = bytearray(blobs[damaged])
        if damage == "truncate":
            blobs = blobs[:damaged] + [bytes(blob[: max(1, int(len(blob) * where))])]
            group_markers = group_markers[: damaged + 1]
        else:
            header = 10 if codec == "gz" else 6
            for k in range(header, len(blob), 5):
                blob[k] ^= (seed | 1)
            blobs[damaged] = bytes(blob)
    rows = _all_rows(f"f.jsonl.{codec}", b"".join(blobs))
    ids = _ids(rows)
    for index, group in enumerate(group_markers):
        for mid in group:
            if index == damaged:
                assert ids.count(mid) <= 1
            else:
                assert ids.count(mid) == 1, (mid, index, damaged)
    reasons = [r.reason for r in rows if isinstance(r, Rejected)]
    if damage == "none":
        assert not reasons


@fuzz(N_PARQUET)
@given(texts=st.lists(st.one_of(st.none(), st.text().map(lambda s: s.encode("utf-8", "replace").decode("utf-8"))),
                      max_size=30),
       groups=st.integers(1, 4), cut=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_parquet_rows_all_accounted(tmp_path_factory, texts, groups, cut):
    table = pa.table({"id": [f"p{i}" for i in range(len(texts))], "text": pa.array(texts, type=pa.string())})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=max(1, len(texts) // groups))
    data = sink.getvalue()
    if cut is not None:
        data = data[: int(len(data) * cut)]
    rows = _all_rows("t.parquet", data)
    if cut is None:
        assert _ids(rows) == [f"p{i}" for i in range(len(texts))]


@fuzz(N_HTML)
@given(body=st.one_of(st.text(), st.binary(max_size=2000).map(lambda b: b.decode("latin-1"))),
       label=st.sampled_from(["utf-8", "gb2312", "shift_jis", "iso-8859-1", "euc-kr", "utf-16", "bogus", ""]),
       bom=st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe"]))
def test_html_page_is_exactly_one_row(body, label, bom):
    html = f"<html><head><meta charset='{label}'></head><body><p>{body}</p></body></html>"
    for enc in ("utf-8", "gbk", "cp932", "utf-16-le"):
        try:
            data = bom + html.encode(enc)
        except UnicodeEncodeError:
            continue
        rows = _all_rows("page.html", data)
        assert len(rows) == 1 and _ids(rows) == ["page.html"]


@fuzz(N_WARC)
@given(payloads=st.lists(st.tuples(st.binary(max_size=300), st.sampled_from(["text/html", "text/plain; charset=gb2312",
                                                                            "image/png", "text/html; charset=bogus"])),
                         min_size=1, max_size=8),
       gz=st.booleans(), corrupt=st.one_of(st.none(), st.integers(0, 7)), where=st.floats(0.0, 1.0),
       seed=st.integers(1, 255))
def test_warc_records_of_intact_members_all_come_out(payloads, gz, corrupt, where, seed):
    members = []
    for i, (payload, ctype) in enumerate(payloads):
        buf = io.BytesIO()
        writer = WARCWriter(buf, gzip=gz)
        headers = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.0")
        writer.write_record(writer.create_warc_record(f"http://x.example/r{i}", "response",
                                                      payload=io.BytesIO(payload), http_headers=headers))
        members.append(buf.getvalue())
    damaged = None if corrupt is None else corrupt % len(members)
    if damaged is not None:
        bad = bytearray(members[damaged])
        if gz:
            bad[10:40] = b"\xff" * 30
        else:  # flip a stretch of bytes anywhere in the record: its header, length or payload
            begin = int(where * (len(bad) - 1))
            for k in range(begin, min(len(bad), begin + 24)):
                bad[k] ^= seed
        members[damaged] = bytes(bad)
    rows = _all_rows("c.warc.gz" if gz else "c.warc", b"".join(members))
    urls = [(r.doc if isinstance(r, Rejected) else r).metadata.get("url") for r in rows]
    for i in range(len(members)):
        count = urls.count(f"http://x.example/r{i}")
        if damaged is None or i < damaged or (gz and i > damaged):
            assert count == 1, (i, damaged, urls)
        elif gz:
            assert count == 0
        else:
            assert count <= 1


# ------------------------------------------------------------------------- model files (issue 35)

_LID = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dsdata", "models", "lid176",
                    "lid.176.ftz")
N_MODEL = 120


def _damaged_model(data: bytes, cut: int, flips) -> bytes:
    out = bytearray(data[:cut])
    for where, value in flips:
        if out:
            out[where % len(out)] = value
    return bytes(out)


@fuzz(N_MODEL)
@given(cut=st.integers(0, 938013), flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=4),
       whole=st.booleans())
def test_a_damaged_fasttext_model_is_refused_or_loads(tmp_path_factory, cut, flips, whole):
    from dsdata.stages import fasttext_model

    with open(_LID, "rb") as fh:
        data = fh.read()
    path = tmp_path_factory.mktemp("model") / "m.ftz"
    path.write_bytes(_damaged_model(data, len(data) if whole else cut, flips))
    try:
        fasttext_model.check_model_file(str(path))
    except fasttext_model.UnusableModel as exc:
        assert "\n" not in str(exc)
        return
    # Passed the check: the compiled reader takes it or declines it (None), never anything else.
    try:
        engine = fasttext_model.load(str(path))
    except fasttext_model.UnusableModel:
        return
    if engine is not None:
        engine.predict(["some words", "des mots"])


def test_models_that_pass_the_check_load_in_the_fasttext_binding(tmp_path):
    """The binding is what segfaulted: every damaged model the check lets through loads in it and
    predicts (in a child process, so a crash is an exit status, not the test run's end)."""
    import random
    import subprocess
    import sys

    from dsdata.stages import fasttext_model

    with open(_LID, "rb") as fh:
        data = fh.read()
    rng = random.Random(35)
    passed = []
    for i in range(60):
        flips = [(rng.randrange(len(data)), rng.randrange(256)) for _ in range(rng.randrange(1, 4))]
        damaged = _damaged_model(data, len(data) if i % 2 else rng.randrange(len(data)), flips)
        path = tmp_path / f"m{i}.ftz"
        path.write_bytes(damaged)
        try:
            fasttext_model.check_model_file(str(path))
            passed.append(str(path))
        except fasttext_model.UnusableModel:
            path.unlink()
    assert passed, "no damaged model passed the check: the binding test would test nothing"
    code = ("import sys, fasttext\nfasttext.FastText.eprint = lambda *a, **k: None\n"
            "for p in sys.argv[1:]:\n    fasttext.load_model(p).predict(['some words'], k=1)\n")
    proc = subprocess.run([sys.executable, "-c", code, *passed], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TOKENIZER = os.path.join(_REPO, "pipelines", "models", "tokenizer", "tokenizer.json")
_NGRAM = os.path.join(_REPO, "pipelines", "models", "lm", "en")
N_TOKENIZER, N_LM_JSON = 60, 80

# Regexes as a tokenizer.json could carry them: atoms, quantifiers, groups quantified again
# (nested quantifiers are what make a backtracking engine give up), alternations, anchors.
_atom = st.sampled_from(["a", "b", "x", " ", "\\w", "\\s", "\\d", ".", "[ab]", "[^ ]", "\\p{L}", "'s", "\\x71"])
_quant = st.sampled_from(["", "", "+", "*", "?", "{1,3}", "+?", "*+"])
_piece = st.tuples(_atom, _quant).map("".join)
regexes = st.recursive(
    st.lists(_piece, min_size=1, max_size=4).map("".join),
    lambda inner: st.tuples(st.lists(inner, min_size=1, max_size=3).map("|".join), _quant,
                            st.sampled_from(["", "$", "z", "!"])).map(lambda t: f"({t[0]}){t[1] or '+'}{t[2]}"),
    max_leaves=6)
texts = st.lists(st.one_of(st.text(max_size=80),
                           st.tuples(st.text(min_size=1, max_size=3), st.integers(1, 200), st.text(max_size=3))
                           .map(lambda t: t[0] * t[1] + t[2])), min_size=1, max_size=6)


def _stderr_of(call):
    """What `call()` wrote on file descriptor 2 (where a Rust panic report goes), and its result."""
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            result = call()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        return capture.read().decode("utf-8", "replace"), result


@fuzz(N_TOKENIZER)
@given(damage=st.one_of(
    st.tuples(st.just("pre_tokenizer"), regexes), st.tuples(st.just("normalizer"), regexes),
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=4))),
    sample=texts)
def test_a_damaged_or_hostile_tokenizer_json_is_one_error_or_encodes(tmp_path_factory, damage, sample):
    """tokenizer.json with a generated Split or Replace regex, cut short, or with flipped bytes:
    loading it raises TokenizerError (one line) or gives a tokenizer; a loaded one encodes any text
    or fails that text alone (the per-record rule), and no panic report reaches stderr."""
    from dsdata.tokenizer import TokenizerError, load_tokenizer

    with open(_TOKENIZER, "rb") as fh:
        data = fh.read()
    kind, how = damage
    if kind in ("pre_tokenizer", "normalizer"):
        spec = json.loads(data)
        if kind == "pre_tokenizer":
            spec[kind] = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": how}, "behavior": "Isolated", "invert": False}, spec[kind]]}
        else:
            spec[kind] = {"type": "Replace", "pattern": {"Regex": how}, "content": " "}
        data = json.dumps(spec).encode()
    elif kind == "cut":
        data = data[:int(len(data) * how)]
    else:
        raw = bytearray(data)
        for where, value in how:
            raw[min(len(raw) - 1, int(len(raw) * where))] = value
        data = bytes(raw)
    folder = tmp_path_factory.mktemp("tok")
    (folder / "tokenizer.json").write_bytes(data)

    def load_and_encode():
        try:
            loaded = load_tokenizer(str(folder))
        except TokenizerError as exc:
            assert "\n" not in str(exc)
            return "refused"
        for text in sample:
            try:
                ids = loaded.encode_batch([text])[0]
                assert all(isinstance(i, int) and 0 <= i < loaded.vocab_size for i in ids)
            except BaseException as exc:  # noqa: BLE001 - a panic is this text's error (its row)
                assert isinstance(exc, Exception) or type(exc).__name__ == "PanicException", repr(exc)
        return "loaded"

    err, _ = _stderr_of(load_and_encode)
    assert "panicked" not in err, err[-2000:]


lm_paths = st.one_of(st.sampled_from(["sp.model", "lm.arpa.gz", "./sp.model", "sub/../sp.model", "../en/sp.model",
                                      "../../etc/passwd", "/etc/passwd", "", ".", "sub", "fifo", "link-out",
                                      "link-in", "a" * 300, "x\0y"]),
                     st.text(max_size=20))


@fuzz(N_LM_JSON)
@given(meta=st.one_of(json_values, st.fixed_dictionaries({}, optional={"sentencepiece": lm_paths, "arpa": lm_paths,
                                                                        "order": json_values})))
def test_an_ngram_folders_lm_json_names_only_its_own_files(tmp_path_factory, meta):
    """Whatever lm.json holds, the files it makes the scorer open are regular files inside the folder
    (never a path out of it, a link out, a FIFO or a folder), else one ModelLoadError line."""
    import shutil

    from dsdata.lm.scorers import ModelLoadError, ngram_model_files

    root = tmp_path_factory.mktemp("lm")
    folder = root / "en"
    folder.mkdir()
    for name in ("sp.model", "lm.arpa.gz"):
        shutil.copyfile(os.path.join(_NGRAM, name), folder / name)
    (folder / "sub").mkdir()
    os.mkfifo(folder / "fifo")
    (root / "outside").write_text("secret")
    (folder / "link-out").symlink_to(root / "outside")
    (folder / "link-in").symlink_to("sp.model")
    (folder / "lm.json").write_text(json.dumps(meta))
    try:
        _, sp_path, lm_path = ngram_model_files(str(folder))
    except ModelLoadError as exc:
        assert "\n" not in str(exc)
        return
    real = os.path.realpath(folder)
    for path in (sp_path, lm_path):
        assert os.path.realpath(path).startswith(real + os.sep) and os.path.isfile(path), path


def _damaged_bytes(data: bytes, rng, kind: str) -> bytes:
    if kind == "cut":
        return data[:rng.randrange(len(data))]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    lines = data.split(b"\n")  # a line dropped or doubled
    i = rng.randrange(len(lines))
    lines[i:i + 1] = [] if kind == "drop" else [lines[i], lines[i]]
    return b"\n".join(lines)


def test_damaged_ngram_model_files_are_one_error_or_load(tmp_path):
    """A SentencePiece model or an ARPA file (plain or gzipped) cut short, with flipped bytes, or a
    line dropped or doubled: the scorer loads and scores, or refuses with one ModelLoadError line
    (KenLM's message once came out as UnicodeDecodeError, sentencepiece's as a bare RuntimeError);
    in a child process, so a crash is an exit status, not the test run's end."""
    import random
    import shutil
    import subprocess
    import sys

    rng = random.Random(35)
    with open(os.path.join(_NGRAM, "lm.arpa.gz"), "rb") as fh:
        arpa = gzip.decompress(fh.read())
    with open(os.path.join(_NGRAM, "sp.model"), "rb") as fh:
        sp = fh.read()
    folders = []
    for i in range(36):
        folder = tmp_path / f"m{i}"
        shutil.copytree(_NGRAM, folder)
        target, kind = ["sp", "arpa", "arpa.gz"][i % 3], ["cut", "flip", "drop", "double"][(i // 3) % 4]
        if target == "sp":
            (folder / "sp.model").write_bytes(_damaged_bytes(sp, rng, "cut" if kind in ("drop", "double") else kind))
        else:
            damaged = _damaged_bytes(arpa, rng, kind)
            meta = json.loads((folder / "lm.json").read_text())
            (folder / "lm.arpa.gz").unlink()
            if target == "arpa":
                (folder / "lm.arpa").write_bytes(damaged)
                meta["arpa"] = "lm.arpa"
            else:
                (folder / "lm.arpa.gz").write_bytes(gzip.compress(damaged, 1))
            (folder / "lm.json").write_text(json.dumps(meta))
        folders.append(str(folder))
    code = ("import json, sys\nfrom dsdata.lm.scorers import NgramScorer, ModelLoadError\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        NgramScorer(p).score_documents(['Some plain words.', 'Zwei Wörter'])\n"
            "        print(json.dumps(['ok', '']), flush=True)\n"
            "    except Exception as exc:\n"
            "        print(json.dumps([type(exc).__name__, str(exc)]), flush=True)\n")
    env = dict(os.environ, PYTHONPATH=_REPO)
    proc = subprocess.run([sys.executable, "-c", code, *folders], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    outcomes = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(outcomes) == len(folders)
    for (kind, message), folder in zip(outcomes, folders):
        assert kind in ("ok", "ModelLoadError"), (folder, kind, message)
        assert "\n" not in message
    assert sum(k == "ModelLoadError" for k, _ in outcomes) >= len(folders) // 2  # the damage was real


# --------------------------------------------------------------------------- file names (issue 35)

N_NAMES = 80
name_bytes = st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"/", b"_").replace(b"\0", b"_")).filter(
    lambda b: b not in (b".", b".."))


def _one_line_no_controls(text: str) -> bool:
    import unicodedata

    return len(text.splitlines()) == 1 and not any(unicodedata.category(c) == "Cc" for c in text)


@fuzz(N_NAMES)
@given(names=st.lists(name_bytes, min_size=1, max_size=6, unique=True))
def test_any_file_name_is_listed_read_and_shown_losslessly(tmp_path_factory, names):
    """Any name the OS allows: the folder form lists every non-hidden one, each is read under its
    shown name (printable UTF-8 whose bytes recovered_path gives back; a plain UTF-8 name unchanged)."""
    import re

    import pytest

    from dsdata.io.inputs import InputPathError, expand_directories
    from dsdata.core.names import recovered_path, shown_path

    folder = os.fsencode(str(tmp_path_factory.mktemp("names")))
    for name in names:
        with open(folder + b"/" + name + b".jsonl", "wb") as fh:
            fh.write(json.dumps({"text": "x"}).encode() + b"\n")
    visible = sorted(os.fsdecode(folder + b"/" + n + b".jsonl") for n in names if not n.startswith(b"."))
    if not visible:
        with pytest.raises(InputPathError):
            expand_directories([os.fsdecode(folder)])
        return
    listed = expand_directories([os.fsdecode(folder)]).patterns
    real = sorted(re.sub(r"\[(.)\]", r"\1", p) for p in listed)  # glob.escape undone
    assert real == visible
    for path in real:
        shown = shown_path(path)
        shown.encode("utf-8")
        assert _one_line_no_controls(shown) and recovered_path(shown) == path
        if not re.search(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]", path):  # UTF-8, no \\, no control
            assert shown == path
        with open(path, "rb") as fh:
            rows = list(read_file(shown, fh))
        assert [r.id for r in rows] == [f"{shown}:1"]
