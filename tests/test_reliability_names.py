"""Names are bytes (issue 35): an input file whose name is not UTF-8 is read and named losslessly
in ids and rows, an OUT path that is not UTF-8 works, and globs select files by the folder form's
rules (hidden files skipped, FIFOs never opened).  Zstd decompression bombs are bounded."""
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from dsdata.document import Document, Rejected
from dsdata.core.names import recovered_path, shown_path
from dsdata.io.readers import read_file

REPO = Path(__file__).resolve().parents[1]


def _run(cwd: bytes, *args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--quiet", *args], cwd=cwd, env=env,
                          capture_output=True, timeout=600)


def _tree(tmp_path):
    base = os.fsencode(str(tmp_path))
    os.makedirs(base + b"/in")
    for i, name in enumerate([b"caf\xe9.jsonl", b"back\\slash\xff.jsonl", b"ok.jsonl", b".hidden.jsonl"]):
        with open(base + b"/in/" + name, "w") as fh:
            fh.write(json.dumps({"text": f"document {i}"}) + "\n" + "{bad json\n")
    os.mkfifo(base + b"/in/.hidden-fifo.jsonl")
    with open(base + b"/r.yaml", "w") as fh:
        fh.write("input: {paths: [in]}\noutput: out\nstages: []\n")
    return base


@pytest.mark.parametrize("form", ["folder", "glob"])
def test_non_utf8_names_are_read_and_named_losslessly(tmp_path, form):
    base = _tree(tmp_path)
    out = b"out"
    proc = _run(base, "--input", "in" if form == "folder" else "in/*.jsonl", "--output", "out")
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")[-3000:]
    stats = json.loads(open(base + b"/" + out + b"/stats.json", "rb").read())
    assert stats["input"] == 6 and stats["kept"] == 3 and stats["ledger_ok"]  # the hidden file is not read
    rejected = pq.read_table(os.fsdecode(base + b"/" + out + b"/rejected")).to_pylist()
    ids = sorted(r["id"] for r in rejected)
    assert any("caf\\xe9.jsonl:2" in i for i in ids), ids
    assert any("back\\\\slash\\xff.jsonl:2" in i for i in ids), ids
    # The shown name gives the file's bytes back.
    shown = next(i for i in ids if "caf" in i).rsplit(":", 1)[0]
    assert os.fsencode(recovered_path(shown)).endswith(b"/in/caf\xe9.jsonl")
    assert b"Traceback" not in proc.stderr


def _dsdata(*args, cwd=REPO):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=900)


def test_an_out_path_that_is_not_utf8_gets_every_output(tmp_path):
    """pretrain.yaml (every stage kind: spill files, side outputs, shards, the report) into OUT named
    b'out-\\xff': every output is written there, and every line names OUT as shown_path shows it."""
    out = os.fsencode(str(tmp_path)) + b"/out-\xff"
    shown = str(tmp_path) + "/out-\\xff"
    proc = _dsdata("run", "pipelines/pretrain.yaml", "--output", os.fsdecode(out))
    err = proc.stderr.decode("utf-8")  # strict: every line dsdata printed is UTF-8
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "\\udc" not in err, err[-3000:]
    assert f"→ {shown}" in err and f"report: {shown}/report.html" in err, err
    stats = json.loads(open(out + b"/stats.json", "rb").read())
    assert stats["ledger_ok"] and stats["kept"] > 0 and stats["rejected_total"] > 0
    # pyarrow is handed the bytes: a str path crosses into Arrow as UTF-8.
    kept = pq.read_table(pa.OSFile(out + b"/kept/part-00000-of-00001.parquet"))
    rejected = pq.read_table(pa.OSFile(out + b"/rejected/part-00000-of-00001.parquet"))
    assert (kept.num_rows, rejected.num_rows) == (stats["kept"], stats["rejected_total"])
    page = open(out + b"/report.html", "rb").read().decode("utf-8")
    assert shown in page and 'id="funnel"' in page
    assert json.loads(open(out + b"/run.json", "rb").read())["recipe"]
    assert json.loads(open(out + b"/difficulty.json", "rb").read())
    assert sorted(os.listdir(out)) == [b"difficulty.json", b"kept", b"rejected", b"report.html", b"run.json",
                                       b"shards", b"stats.json"]  # no lock, no .spill, no temporary folder
    verify = _dsdata("shards", "verify", os.fsdecode(out))
    assert verify.returncode == 0 and f"in {shown}/shards; every sha256 matches" in verify.stdout.decode(), verify
    # The shown name, as the run's lines print it, is accepted where the real one is not there.
    os.remove(out + b"/report.html")
    again = _dsdata("report", shown)
    assert again.returncode == 0 and again.stdout.decode().strip() == shown + "/report.html", again
    assert os.path.getsize(out + b"/report.html") > 0


def test_shown_path_is_printable_utf8_on_one_line_and_invertible():
    # A UTF-8 name that holds `\\xff` as text and one whose byte is 0xff were both shown `\\xff`;
    # a newline in a name split the log line it was in.
    names = [b"plain.jsonl", "caf\u00e9.jsonl".encode(), b"\xff\xfe.jsonl", b"a\\xff\x80.jsonl", b"a\\xff.jsonl",
             b"two\nlines.jsonl", b"tab\tbell\x07del\x7f", b"\\\\", "csi\u009b2J nel\u0085 ls\u2028".encode()]
    shown = [shown_path(os.fsdecode(raw)) for raw in names]
    assert shown[:2] == ["plain.jsonl", "caf\u00e9.jsonl"]  # nearly every name: unchanged
    assert len(set(shown)) == len(names)
    for raw, text in zip(names, shown):
        text.encode("utf-8")
        assert len(text.splitlines()) == 1 and not any(unicodedata.category(c) == "Cc" for c in text), text
        assert os.fsencode(recovered_path(text)) == raw


def _deep_file(top: str, text: str, depth: int = 25) -> str:
    """A JSONL file under `depth` folders of 200-byte names below `top` (its path is over PATH_MAX),
    made as a user would: each folder made and entered relative to the one before."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d" * 200, dir_fd=fd)
        deeper = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    out = os.open("deep.jsonl", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(out, json.dumps({"text": text}).encode() + b"\n")
    os.close(out)
    os.close(fd)
    path = os.path.join(top, *["d" * 200] * depth, "deep.jsonl")
    assert len(os.fsencode(path)) > os.pathconf("/", "PC_PATH_MAX")
    with pytest.raises(OSError):  # the kernel refuses the path itself
        os.stat(path)
    return path


def _rows(out: Path) -> tuple[dict, list[dict], list[dict]]:
    stats = json.loads((out / "stats.json").read_text())
    return stats, pq.read_table(out / "kept").to_pylist(), pq.read_table(out / "rejected").to_pylist()


@pytest.mark.parametrize("given", ["in", "in/*", "in/**/*.jsonl"], ids=["folder", "glob", "recursive-glob"])
def test_a_path_longer_than_path_max_in_an_input_folder_is_read(tmp_path, given):
    """os.walk could not list the folder that holds it, nor Python's glob go there: the file was
    silently not read, ledger ok."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"text": "near the top"}) + "\n")
    deep = _deep_file(str(tmp_path / "in"), "at the bottom of a very deep folder")
    (tmp_path / "r.yaml").write_text("input: {paths: [in]}\noutput: out\nstages: []\n")
    proc = _run(os.fsencode(str(tmp_path)), "--input", given)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    stats, kept, rejected = _rows(tmp_path / "out")
    assert stats["input"] == 2 and stats["kept"] == 2 and stats["ledger_ok"] and not rejected, (stats, rejected)
    assert sorted(r["text"] for r in kept) == ["at the bottom of a very deep folder", "near the top"]
    assert f"{deep}:1" in {r["id"] for r in kept}


def _without_privileges():
    """Run a command as this user without capabilities: root without CAP_DAC_OVERRIDE meets file
    permissions as any user does (the tests run as root here)."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to drop capabilities")
    return ["setpriv", "--inh-caps=-all", "--bounding-set=-all"] if os.geteuid() == 0 else []


@pytest.mark.parametrize("given", ["in", "in/**/*.jsonl"], ids=["folder", "recursive-glob"])
def test_entries_the_os_lists_but_cannot_open_are_rows_never_absent(tmp_path, given):
    """No read permission, a folder that cannot be listed, a link cycle (ELOOP): each one
    `unreadable_file` row with the system's reason; the other files are read; the ledger holds."""
    data = tmp_path / "in"
    (data / "locked").mkdir(parents=True)
    for name in ["ok.jsonl", "no-permission.jsonl", "locked/inside.jsonl"]:
        (data / name).write_text(json.dumps({"text": name}) + "\n")
    (data / "no-permission.jsonl").chmod(0)
    (data / "locked").chmod(0)
    (data / "cycle-a.jsonl").symlink_to("cycle-b.jsonl")
    (data / "cycle-b.jsonl").symlink_to("cycle-a.jsonl")
    (tmp_path / "r.yaml").write_text("input: {paths: [in]}\noutput: out\nstages: []\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        proc = subprocess.run([*_without_privileges(), sys.executable, "-m", "dsdata.cli", "run", "r.yaml",
                               "--input", given],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        (data / "locked").chmod(0o755)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"1 folder(s) in the input directories cannot be listed, each one unreadable_file row: {data}/locked" \
        in proc.stderr, proc.stderr
    stats, kept, rejected = _rows(tmp_path / "out")
    assert [r["text"] for r in kept] == ["ok.jsonl"]
    why = {r["id"].rsplit("/", 1)[-1]: (r["reason"], r["detail"]) for r in rejected}
    assert why == {"no-permission.jsonl": ("unreadable_file", "[Errno 13] Permission denied"),
                   "locked": ("unreadable_file", "[Errno 13] a folder that cannot be listed (Permission denied)"),
                   "cycle-a.jsonl": ("unreadable_file", "[Errno 40] Too many levels of symbolic links"),
                   "cycle-b.jsonl": ("unreadable_file", "[Errno 40] Too many levels of symbolic links")}, why
    assert stats["input"] == 5 and stats["ledger_ok"]


def test_a_file_gone_between_listing_and_reading_is_a_row(tmp_path):
    """The launcher lists a folder's files and hands them on; one removed before its reader opens it
    (here: never there) is an `unreadable_file` row, also when its name holds a wildcard character
    (the escaped name `a[[]1].jsonl` was taken for a pattern matching nothing: silently absent)."""
    import glob

    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from dsdata.beam.transforms import KEPT, REJECTED, ReadDocuments

    (tmp_path / "here.jsonl").write_text(json.dumps({"text": "present"}) + "\n")
    names = [str(tmp_path / "here.jsonl"), str(tmp_path / "gone.jsonl"), glob.escape(str(tmp_path / "a[1]*?.jsonl"))]
    with beam.Pipeline() as p:
        read = p | ReadDocuments(names)
        rows = ((read[KEPT], read[REJECTED]) | beam.Flatten()
                | beam.Map(lambda r: (r.id.rsplit("/", 1)[-1], "kept", "") if isinstance(r, Document)
                           else (r.doc.id.rsplit("/", 1)[-1], r.reason, r.detail)))
        assert_that(rows, equal_to([("here.jsonl:1", "kept", ""),
                                    ("gone.jsonl", "unreadable_file", "[Errno 2] No such file or directory"),
                                    ("a[1]*?.jsonl", "unreadable_file", "[Errno 2] No such file or directory")]))


def _bomb(path, payload: bytes, total: int):
    """A zstd frame of `total` bytes of `payload` repeated, between two small frames of real records,
    written without ever holding the decoded bomb."""
    good = b"".join(json.dumps({"id": f"g{i}", "text": "hello"}).encode() + b"\n" for i in range(3))
    with open(path, "wb") as fh:
        fh.write(zstandard.ZstdCompressor().compress(good))
        with zstandard.ZstdCompressor(level=3).stream_writer(fh, closefd=False) as writer:
            block = payload * ((1 << 20) // len(payload))
            for _ in range(total // len(block)):
                writer.write(block)
        fh.write(zstandard.ZstdCompressor().compress(good.replace(b'"g', b'"h')))


@pytest.mark.parametrize("payload", [b"a", b"\n"], ids=["one-long-line", "blank-lines"])
def test_a_zstd_bomb_is_one_too_large_row_in_bounded_memory(tmp_path, payload):
    path = tmp_path / "bomb.jsonl.zst"
    _bomb(path, payload, 2 << 30)
    assert path.stat().st_size < 1 << 20
    # The peak of this process's own memory (VmHWM): ru_maxrss survives execve, so a child of a big
    # pytest process would report the parent's peak.
    code = ("import io, json, sys\nfrom dsdata.io.readers import read_file\nfrom dsdata.document import Rejected\n"
            "def peak_rss_mb():\n"
            "    for line in open('/proc/self/status'):\n"
            "        if line.startswith('VmHWM:'):\n"
            "            return int(line.split()[1]) // 1024\n"
            "rows = list(read_file(sys.argv[1], open(sys.argv[1], 'rb')))\n"
            "print(json.dumps({'kept': [r.id for r in rows if not isinstance(r, Rejected)],\n"
            "  'rejected': [r.reason for r in rows if isinstance(r, Rejected)],\n"
            "  'rss_mb': peak_rss_mb()}))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["kept"] == ["g0", "g1", "g2", "h0", "h1", "h2"]
    assert result["rejected"] == ["too_large"]
    assert result["rss_mb"] < 600, result  # the bomb decodes to 2 GiB


# ------------------------------------------------------------------------- .json files are JSON

@pytest.mark.parametrize("body, expected", [
    (json.dumps({"id": "x", "text": "one"}, indent=2), [("x", None)]),
    (json.dumps([{"text": "a"}, {"text": "b"}, 3], indent=2), [("F:1", None), ("F:2", None), ("F:3", "not_an_object")]),
    ("42", [("F", "bad_json")]),
    ('{"text": "cut', [("F", "bad_json")]),
    ('{"text": "a"}\n{"text": "b"}\n', [("F:1", None), ("F:2", None)]),  # JSON Lines named .json
    ("[" * 5000 + "]" * 5000, [("F", "bad_json")]),
])
def test_a_json_file_is_one_document(body, expected):
    for name, data in (("d.json", body.encode()), ("d.json.zst", zstandard.ZstdCompressor().compress(body.encode()))):
        rows = list(read_file(name, io.BytesIO(data)))
        got = [((r.doc.id if isinstance(r, Rejected) else r.id).replace(name, "F"),
                r.reason if isinstance(r, Rejected) else None) for r in rows]
        assert got == expected, (name, got)


def test_a_folder_of_pretty_printed_json_is_read_as_documents(tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(20):
        (tmp_path / "in" / f"doc{i}.json").write_text(json.dumps({"id": f"d{i}", "text": f"text {i}",
                                                                   "meta": {"a": [1, 2]}}, indent=4))
    (tmp_path / "r.yaml").write_text("input: {paths: [in]}\noutput: out\nstages: []\n")
    proc = _run(os.fsencode(str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["input"] == 20 and stats["kept"] == 20 and stats["rejected_total"] == 0


def _frames():
    lines = b"".join(json.dumps({"id": f"r{i}", "text": f"record {i} text " * 20}).encode() + b"\n" for i in range(300))
    c = zstandard.ZstdCompressor(write_checksum=True)
    return [c.compress(lines.replace(b'"r', b'"f%d_' % k)) for k in range(3)]


def _read(data):
    rows = list(read_file("x.jsonl.zst", io.BytesIO(data)))
    return [r for r in rows if not isinstance(r, Rejected)], [r for r in rows if isinstance(r, Rejected)]


def test_a_zstd_frame_whose_checksum_alone_is_wrong_keeps_its_rows_and_names_the_check():
    frames = _frames()
    bad = bytearray(frames[1])
    bad[-1] ^= 0xFF  # the checksum's last byte
    kept, rejected = _read(frames[0] + bytes(bad) + frames[2])
    assert len(kept) == 900
    assert len(rejected) == 1 and "fails its checksum" in rejected[0].detail


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_a_flipped_byte_inside_a_zstd_frame_is_a_row_and_the_other_frames_are_kept(where):
    frames = _frames()
    bad = bytearray(frames[1])
    bad[int(len(bad) * where)] ^= 0x55
    kept, rejected = _read(frames[0] + bytes(bad) + frames[2])
    ids = {d.id for d in kept}
    assert {f"f0_{i}" for i in range(300)} <= ids and {f"f2_{i}" for i in range(300)} <= ids
    # Whatever of the damaged frame is not kept is named by a row.
    assert rejected and all(r.reason in ("corrupt_compression", "bad_json", "invalid_utf8") for r in rejected)
    assert any("offset" in r.detail for r in rejected if r.reason == "corrupt_compression")
