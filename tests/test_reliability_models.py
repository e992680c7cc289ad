"""Model and tokenizer files are input too (issue 35): a truncated or garbled fastText model is one
line at setup (the binding segfaulted), a tokenizer regex over the engine's backtracking limit is
one line at setup, or when only a record finds it, rejects that record with no panic report on
stderr (pyo3's PanicException is a BaseException and killed the run), an n-gram folder
whose lm.json names files outside it is refused, a truncated ARPA is one line."""
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsdata.stages.fasttext_model import UnusableModel, check_model_file

REPO = Path(__file__).resolve().parents[1]
LID = REPO / "dsdata" / "models" / "lid176" / "lid.176.ftz"
MODELS = REPO / "pipelines" / "models"


def _run(tmp_path, stages, docs=None, extra=(), env_extra=None):
    docs = docs or [{"id": f"d{i}", "text": f"This is an English sentence number {i}."} for i in range(5)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "r.yaml").write_text(f"input: {{paths: [in.jsonl]}}\noutput: out\nstages:\n{stages}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RUST_BACKTRACE": "0", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--quiet", *extra], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)


def _one_line(proc):
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "apitools" not in ln]
    assert len(lines) == 1 and lines[0].startswith("dsdata: error: "), proc.stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------------------------- fastText

@pytest.mark.parametrize("keep", [0, 3, 8, 60, 100, 4096, 100_000, 500_000, -1])
def test_a_truncated_fasttext_model_is_refused_before_the_binding_reads_it(tmp_path, keep):
    data = LID.read_bytes()
    bad = tmp_path / "lid.ftz"
    bad.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    with pytest.raises(UnusableModel, match="is not a fastText model"):
        check_model_file(str(bad))


def test_a_fasttext_model_with_garbled_sizes_or_trailing_bytes_is_refused(tmp_path):
    data = bytearray(LID.read_bytes())
    check_model_file(str(LID))
    cases = {"dim": (8, b"\xff\xff\x00\x00"), "size": (64, b"\xff\xff\xff\x7f"), "magic": (0, b"\0\0\0\0")}
    for name, (offset, patch) in cases.items():
        garbled = bytearray(data)
        garbled[offset:offset + len(patch)] = patch
        (tmp_path / name).write_bytes(bytes(garbled))
        with pytest.raises(UnusableModel):
            check_model_file(str(tmp_path / name))
    (tmp_path / "joined").write_bytes(bytes(data) + b"extra")
    with pytest.raises(UnusableModel, match="bytes after the output matrix"):
        check_model_file(str(tmp_path / "joined"))


@pytest.mark.parametrize("engine", ["compiled", "binding"])
def test_a_truncated_lang_model_is_one_line_not_a_segfault(tmp_path, engine):
    (tmp_path / "lid.ftz").write_bytes(LID.read_bytes()[:200_000])
    extra = dict(os.environ)
    proc_env = {"DSDATA_NO_NUMBA": "1"} if engine == "binding" else {}
    os.environ.update(proc_env)
    try:
        proc = _run(tmp_path, "  - lang: {backend: fasttext, model: lid.ftz, keep: [], min_score: 0}\n")
    finally:
        os.environ.clear()
        os.environ.update(extra)
    line = _one_line(proc)
    assert "is not a fastText model" in line and "lid.ftz" in line


# ------------------------------------------------------------------------------------ tokenizers

def _tokenizer_with_split(tmp_path, pattern):
    folder = tmp_path / "tok"
    shutil.copytree(MODELS / "tokenizer", folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        spec["pre_tokenizer"]]}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


@pytest.mark.skipif(not (MODELS / "tokenizer" / "tokenizer.json").is_file(), reason="no tokenizer model")
@pytest.mark.parametrize("pattern", ["(a+)+$", r"(\w+\s?)+z", "(x+x+)+y", "(q|z|qz)+$"])
def test_a_tokenizer_whose_regex_gives_up_is_one_line_at_setup(tmp_path, pattern):
    """Probe texts (runs of each kind of character, and of the pattern's own literals) meet the
    pattern once when the tokenizer loads: one line naming it, and no panic report on stderr."""
    _tokenizer_with_split(tmp_path, pattern)
    proc = _run(tmp_path, "  - tokenize: {tokenizer: tok}\n", env_extra={"RUST_BACKTRACE": "1"})
    line = _one_line(proc)
    assert repr(pattern) in line and "backtracking limit" in line and "tok/tokenizer.json" in line, line
    assert not (tmp_path / "out" / "stats.json").exists()


@pytest.mark.skipif(not (MODELS / "tokenizer" / "tokenizer.json").is_file(), reason="no tokenizer model")
@pytest.mark.parametrize("backtrace", ["0", "1"])
def test_a_tokenizer_panic_on_one_record_is_its_row_and_no_line(tmp_path, backtrace):
    """A pattern that passes the probes (its literals written as escapes, which they take no runs
    from) and blows up on one record: that record is a row, the others are kept, and stderr holds
    dsdata's own lines only (Rust's panic report — with RUST_BACKTRACE=1 a whole backtrace — went
    there, through the binding's own handler)."""
    _tokenizer_with_split(tmp_path, r"(\x71|\x7a|\x71\x7a)+$")
    docs = [{"id": "ok1", "text": "plain words"}, {"id": "bomb", "text": "qz" * 40 + "!"},
            {"id": "ok2", "text": "more plain words"}, {"id": "bomb2", "text": "zq" * 50 + "?"}]
    proc = _run(tmp_path, "  - tokenize: {tokenizer: tok}\n", docs=docs, extra=["--max-errors=5"],
                env_extra={"RUST_BACKTRACE": backtrace})
    assert proc.returncode == 0, proc.stderr[-3000:]
    foreign = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("dsdata") and "apitools" not in ln]
    assert not foreign, proc.stderr[-3000:]
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["kept"] == 2 and stats["ledger_ok"]
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "out" / "rejected").to_pylist()
    assert sorted(r["id"] for r in rows) == ["bomb", "bomb2"] and {r["reason"] for r in rows} == {"error"}
    assert all("PanicException" in r["detail"] and "retry-limit" in r["detail"] for r in rows), rows


def test_panic_reports_are_cut_from_what_a_native_call_wrote():
    from dsdata.native_panics import strip_panic_reports

    first = ("\nthread '<unnamed>' (17389) panicked at /x/onig-6.5.3/src/lib.rs:647:23:\n"
             "Onig: Regex search error: retry-limit-in-match over\n"
             "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n")
    later = "\nthread 'rayon' panicked at src/a.rs:1:2:\nboom\n"
    traced = ("\nthread '<unnamed>' (9) panicked at src/a.rs:1:2:\nboom\nstack backtrace:\n"
              "   0: __rustc::rust_begin_unwind\n  12: <x>::encode\n             at ./Objects/call.c:299:12\n"
              "note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n")
    ours = "dsdata: 0:05 read 1,000 records\n"
    assert strip_panic_reports(first + ours + later + ours + traced + ours) == ours * 3
    assert strip_panic_reports(ours) == ours


def test_a_model_load_with_fd2_silenced_waits_for_a_native_calls_capture_and_leaves_fd2_as_it_was(capfd):
    """Flink's two worker threads: one tokenises (fd 2 captured) while the other loads KenLM (fd 2
    silenced).  Each used to restore what it had saved, so stderr could end on /dev/null or a deleted file."""
    import threading

    from dsdata.lm.scorers import NgramScorer
    from dsdata.native_panics import hidden_panic_reports

    before = os.fstat(2)
    inside, release, loaded = threading.Event(), threading.Event(), threading.Event()

    def native_call():
        with hidden_panic_reports():
            inside.set()
            release.wait(30)
            os.write(2, b"written during the native call\n")

    caller = threading.Thread(target=native_call)
    caller.start()
    inside.wait(30)
    loader = threading.Thread(target=lambda: (NgramScorer(str(MODELS / "lm" / "en")), loaded.set()))
    loader.start()
    assert not loaded.wait(0.5)  # the load waits for the capture to end
    release.set()
    caller.join(30)
    loader.join(60)
    assert loaded.is_set()
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    os.write(2, b"after both\n")
    err = capfd.readouterr().err
    assert "written during the native call" in err and "after both" in err and "binary file" not in err


# -------------------------------------------------------------------------------- n-gram folders

def _lm_folder(tmp_path):
    folder = tmp_path / "lm" / "en"
    shutil.copytree(MODELS / "lm" / "en", folder)
    return folder


@pytest.mark.skipif(not (MODELS / "lm" / "en" / "lm.json").is_file(), reason="no n-gram model")
@pytest.mark.parametrize("how", ["dotdot", "absolute", "link", "fifo"])
def test_an_ngram_folder_cannot_name_files_outside_it(tmp_path, how):
    folder = _lm_folder(tmp_path)
    outside = tmp_path / "outside.arpa"
    shutil.copy(folder / "lm.arpa.gz", outside)
    meta = json.loads((folder / "lm.json").read_text())
    if how == "dotdot":
        meta["arpa"] = "../../outside.arpa"
    elif how == "absolute":
        meta["arpa"] = str(outside)
    elif how == "link":
        (folder / "lm.arpa.gz").unlink()
        os.symlink(outside, folder / "lm.arpa.gz")
        meta.pop("arpa", None)
    else:
        (folder / "lm.arpa.gz").unlink()
        os.mkfifo(folder / "lm.arpa.gz")
        meta.pop("arpa", None)
    (folder / "lm.json").write_text(json.dumps(meta))
    proc = _run(tmp_path, "  - difficulty: {model_dir: lm, backend: ngram}\n", extra=["--set", "difficulty.lang=en"])
    line = _one_line(proc)
    assert ("leads out of" in line or "not a plain relative" in line or "a FIFO" in line), line


@pytest.mark.skipif(not (MODELS / "lm" / "en" / "lm.json").is_file(), reason="no n-gram model")
def test_a_truncated_arpa_is_one_line(tmp_path):
    folder = _lm_folder(tmp_path)
    text = gzip.decompress((folder / "lm.arpa.gz").read_bytes())
    (folder / "lm.arpa.gz").write_bytes(gzip.compress(text[: len(text) // 2]))
    proc = _run(tmp_path, "  - difficulty: {model_dir: lm, backend: ngram}\n", extra=["--set", "difficulty.lang=en"])
    line = _one_line(proc)
    assert "lm.arpa.gz" in line
