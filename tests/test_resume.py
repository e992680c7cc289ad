"""`dsdata run --resume` (issue 38 item 4): a run killed or failed part-way is continued without
redoing the per-document work it committed, and every output equals an uninterrupted run's.

Real runs: the pretrain recipe SIGKILLed in a real `dsdata run` process once some input files are
committed (the test polls for commit markers), then resumed; the refusals (recipe, --set, inputs,
a committed stage's file changed) and the tidying of a damaged OUT/resume on a run that failed over
its error budget; and the committed record format itself."""
from __future__ import annotations

import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dsdata import cli
from dsdata.document import Document, Rejected
from dsdata.io.resume import (RESUME_REFUSED_EXIT, CommitGroup, NotCommittable, committed_index,
                              fingerprint_difference, read_unit, unit_key, unit_problem, unit_record_batch)
from dsdata.stages import REGISTRY
from dsdata.stages.base import DocumentStage
from run_outputs import assert_same_outputs

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "pipelines" / "pretrain.yaml"


def _markers(out: Path) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(out / "resume" / "units" / "*.json")))


def _committed(out: Path) -> int:
    """Units committed in OUT (each marker lists the units of one commit group)."""
    count = 0
    for marker in _markers(out):
        try:
            count += len(json.loads(marker.read_text())["units"])
        except (OSError, ValueError):  # being renamed into place this instant
            pass
    return count


# --- the pretrain recipe, SIGKILLed and resumed ----------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> Path:
    """1,800 documents of benchmarks/million_corpus.py (real prose, other languages, junk, duplicates)
    in 6 files: enough that the run is killed with files left to read (units finished within about a
    second are committed together)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from million_corpus import generate

    folder = tmp_path_factory.mktemp("corpus")
    generate(folder, 1800, docs_per_file=300)
    return folder


def _dsdata(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "dsdata.cli", "run", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1200)


def _kill_after_commits(args: list[str], out: Path, units: int) -> int:
    """Start `dsdata run ARGS`, SIGKILL it once `units` units are committed; the units committed then."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "dsdata.cli", "run", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 900
    while _committed(out) < units:
        assert proc.poll() is None, f"the run ended before {units} units were committed: {proc.stderr.read()[-3000:]}"
        assert time.time() < deadline, "timed out waiting for commit markers"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    return _committed(out)


def test_a_sigkilled_pretrain_run_resumes_to_an_uninterrupted_runs_outputs(corpus, tmp_path):
    inputs = ["--input", str(corpus / "*.jsonl")]
    base = tmp_path / "base"
    done = _dsdata(str(PRETRAIN), *inputs, "--output", str(base), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (base / "resume").exists(), "a finished run keeps no committed work"

    out = tmp_path / "out"
    committed = _kill_after_commits([str(PRETRAIN), *inputs, "--output", str(out), "--quiet"], out, 2)
    assert 2 <= committed < 6, "the run was to be killed with input files left"
    assert not (out / "stats.json").exists()

    resumed = _dsdata(str(PRETRAIN), *inputs, "--output", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert f"resuming {out}: {committed} unit(s) committed by the earlier run" in resumed.stderr
    assert_same_outputs(base, out)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["resume"] == {"resumed": True, "units": {"reused": committed, "processed": 6 - committed},
                               "records": {"reused": 300 * committed, "processed": 300 * (6 - committed)}}
    # Only the files not committed were read from the input (the reader logs one line per file read).
    read = [line for line in resumed.stderr.splitlines() if line.startswith(f"dsdata: read {corpus}")]
    assert len(read) == 6 - committed, read
    assert not (out / "resume").exists()


# --- a run that failed over its error budget, on a light recipe ---------------------------------------------

class PoisonStage(DocumentStage):
    name = "poison"
    description = "test-only: raises on a document holding POISON; puts a tuple in TUPLE's metadata"

    def process(self, doc):
        if "POISON" in doc.text:
            raise ValueError("poisoned")
        if "TUPLE" in doc.text:
            doc.metadata["pair"] = (1, 2)  # JSON would give it back as a list: not committable
        return doc


RECIPE = """name: light
input: {paths: ["data/*.jsonl"]}
output: out
stages:
  - clean: {}
  - poison: {}
  - rules: {min_words: 3}
  - decontaminate: {benchmarks: [bench.jsonl], fields: [text], min_tokens: 5, ngram: 5, max_doc_frequency: null}
  - dedup: {}
"""
PROSE = ("The river runs past the old mill where {i} children learn to swim every summer, "
         "and the miller tells them stories about the floods of long ago number {i}.")


def _light_corpus(folder: Path, poison: bool = True) -> None:
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "r.yaml").write_text(RECIPE, encoding="utf-8")
    (folder / "bench.jsonl").write_text(json.dumps({"text": "a quiet evening by the lake with the bright stars"})
                                        + "\n", encoding="utf-8")
    for f in range(4):
        with open(folder / "data" / f"part-{f}.jsonl", "w", encoding="utf-8") as fh:
            for i in range(30):
                n = f * 30 + i
                text = PROSE.format(i=n)
                if n == 45 and poison:
                    text += " POISON"
                if n == 100:
                    text += " TUPLE"
                if n % 17 == 0:
                    text = "too short"
                if n % 23 == 0:
                    text = "a quiet evening by the lake with the bright stars, said the note"
                fh.write(json.dumps({"id": f"d{n:03d}", "text": text}) + "\n")
                if n % 11 == 0:
                    fh.write("{not json\n")


def _cli(folder: Path, *args: str, capsys) -> tuple[int, list[str]]:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = cli.main(["run", "r.yaml", *args])
    finally:
        os.chdir(cwd)
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("dsdata:")]


@pytest.fixture
def failed_run(tmp_path, monkeypatch, capsys) -> Path:
    """OUT of a run that failed over its error budget (--max-errors 0: one poisoned document): its
    outputs are written and its committed work kept, one unit short (the TUPLE metadata)."""
    monkeypatch.setitem(REGISTRY, "poison", f"{__name__}:PoisonStage")
    _light_corpus(tmp_path)
    code, err = _cli(tmp_path, "--quiet", "--max-errors", "0", capsys=capsys)
    assert code == 1 and "over the budget" in err[-1], err
    assert _committed(tmp_path / "out") == 3, "the unit with a tuple in its metadata is not committed"
    return tmp_path


@pytest.fixture
def finished(failed_run, tmp_path_factory, monkeypatch, capsys) -> Path:
    """The same recipe and inputs run whole with a budget that lets it finish, in another OUT."""
    base = tmp_path_factory.mktemp("finished") / "out"
    code, err = _cli(failed_run, "--quiet", "--max-errors", "1", "--output", str(base), capsys=capsys)
    assert code == 0, err
    return base


def _resume_stats(folder: Path) -> dict:
    return json.loads((folder / "out" / "stats.json").read_text())["resume"]


def test_resume_after_a_failed_run_reuses_its_committed_units(failed_run, finished, capsys, caplog):
    code, err = _cli(failed_run, "--resume", "--max-errors", "1", capsys=capsys)
    assert code == 0, err
    assert f"resuming {failed_run / 'out'}: 3 unit(s) committed by the earlier run" in caplog.messages
    assert_same_outputs(finished, failed_run / "out", side_files=(), shards=False)
    assert _resume_stats(failed_run) == {"resumed": True, "units": {"reused": 3, "processed": 1},
                                         "records": {"reused": 99, "processed": 32}}
    assert not (failed_run / "out" / "resume").exists()


def test_the_python_api_resumes_too(failed_run, finished):
    import dsdata

    cwd = os.getcwd()
    os.chdir(failed_run)
    try:
        stats = dsdata.run("r.yaml", max_errors=1, resume=True)
    finally:
        os.chdir(cwd)
    assert stats["resume"]["units"] == {"reused": 3, "processed": 1}
    assert_same_outputs(finished, failed_run / "out", side_files=(), shards=False)


def test_an_input_rewritten_with_its_size_and_time_kept_is_read_again(failed_run, capsys, caplog):
    """A committed file rewritten in place, same size, its modification time set back (the
    fingerprint cannot see it): its content digest differs, so the resumed run reads it again and
    the kept text is the new one, not the committed one."""
    path = failed_run / "data" / "part-0.jsonl"
    before = path.stat()
    data = path.read_bytes()
    path.write_bytes(data.replace(b"The river runs", b"THE RIVER RUNS"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    code, err = _cli(failed_run, "--resume", "--max-errors", "1", capsys=capsys)
    assert code == 0, err
    assert any("is not reused: its input's bytes changed" in m and "part-0.jsonl" in m for m in caplog.messages)
    assert _resume_stats(failed_run)["units"] == {"reused": 2, "processed": 2}
    rows = [pq.read_table(failed_run / "out" / part, columns=["text"]).to_pydict() for part in ("kept", "rejected")]
    texts = [t for table in rows for t in table["text"]]
    assert sum(t.startswith("THE RIVER RUNS") for t in texts) == data.count(b"The river runs")
    assert sum(t.startswith("The river runs") for t in texts) == sum(
        (failed_run / "data" / f"part-{f}.jsonl").read_bytes().count(b"The river runs") for f in (1, 2, 3))


def _set_min_words(folder: Path) -> list[str]:
    return ["--set", "rules.min_words=4"]


def _drop_dedup(folder: Path) -> list[str]:
    (folder / "r.yaml").write_text(RECIPE.replace("  - dedup: {}\n", ""), encoding="utf-8")
    return []


def _append_a_line(folder: Path) -> list[str]:
    with open(folder / "data" / "part-2.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"id": "x", "text": "one more"}\n')
    return []


def _add_a_file(folder: Path) -> list[str]:
    (folder / "data" / "part-9.jsonl").write_text('{"id": "x", "text": "new"}\n', encoding="utf-8")
    return []


def _read_fewer_files(folder: Path) -> list[str]:
    return ["--input", str(folder / "data" / "part-[012].jsonl")]


def _touch_the_benchmark(folder: Path) -> list[str]:
    os.utime(folder / "bench.jsonl", ns=(1, 1))  # same bytes, another modification time
    return []


@pytest.mark.parametrize("change, why", [
    (_set_min_words, "the recipe changed: rules.min_words was 3, is 4"),
    (_drop_dedup, "the recipe's stages changed (clean → poison → rules → decontaminate → dedup then, "
                  "clean → poison → rules → decontaminate now)"),
    (_append_a_line, "the input files changed: 1 changed in size or modification time (part-2.jsonl)"),
    (_add_a_file, "the input files changed: 1 new (part-9.jsonl)"),
    (_read_fewer_files, "the input files changed: 1 gone (part-3.jsonl)"),
    (_touch_the_benchmark, "the files decontaminate.benchmarks[0] names changed since (their sizes or "
                           "modification times)"),
])
def test_a_changed_recipe_or_input_set_refuses_resume_in_one_line(failed_run, capsys, change, why):
    out = failed_run / "out"
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    extra = change(failed_run)
    code, err = _cli(failed_run, "--resume", "--quiet", "--max-errors", "1", *extra, capsys=capsys)
    assert code == RESUME_REFUSED_EXIT == 3
    assert err == [f"dsdata: error: cannot resume {out}: {why}; its committed work is not this run's "
                   "(run without --resume to start again)"], err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before, "a refused resume touches nothing"


def test_resume_with_nothing_to_resume_starts_fresh_and_says_so(tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.setitem(REGISTRY, "poison", f"{__name__}:PoisonStage")
    _light_corpus(tmp_path, poison=False)
    code, err = _cli(tmp_path, "--resume", capsys=capsys)
    assert code == 0, err
    assert f"--resume: {tmp_path / 'out'} holds no committed work to resume; starting a fresh run" in caplog.messages
    assert _resume_stats(tmp_path) == {"resumed": False, "units": {"reused": 0, "processed": 4},
                                       "records": {"reused": 0, "processed": 131}}


def test_resume_of_a_recipe_with_nothing_per_document_says_it_commits_nothing(tmp_path, caplog, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"id": "a", "text": "same words"}\n{"id": "b", "text": "same words"}\n')
    (tmp_path / "r.yaml").write_text("input: {paths: [data/a.jsonl]}\nstages:\n  - dedup: {}\n", encoding="utf-8")
    code, err = _cli(tmp_path, "--resume", "--quiet", capsys=capsys)
    assert code == 0, err
    why = "the recipe has no per-document stage before its first whole-corpus stage"
    assert f"--resume: this run commits nothing: {why}" in caplog.messages
    assert _resume_stats(tmp_path) == {"resumed": False, "why_not": why}
    assert not (tmp_path / "out" / "resume").exists()


def test_a_plain_run_replaces_an_unfinished_runs_committed_work_and_says_so(failed_run, capsys, caplog):
    code, err = _cli(failed_run, "--max-errors", "1", capsys=capsys)
    assert code == 0, err
    assert any("holds the committed work of an unfinished run (3 unit(s)); this run replaces it" in line
               for line in caplog.messages), caplog.messages
    assert "resume" not in json.loads((failed_run / "out" / "stats.json").read_text())
    assert not (failed_run / "out" / "resume").exists()


def _units(out: Path) -> tuple[Path, dict]:
    """The one commit group of the failed run: its marker's path and content."""
    [marker] = _markers(out)
    return marker, json.loads(marker.read_text())


def test_resume_discards_partial_and_damaged_units_and_follows_no_link(failed_run, finished, capsys, caplog,
                                                                      tmp_path_factory):
    units_dir = failed_run / "out" / "resume" / "units"
    marker, content = _units(failed_run / "out")
    data = marker.with_suffix(".arrow")
    outside = tmp_path_factory.mktemp("outside") / "target.json"
    outside.write_text("keep me")
    # One unit's bytes changed after its marker was written; a group's data left without a marker
    # (the run died before committing it) and a temporary file; a marker whose data is gone; links
    # planted where markers and data go.
    raw = bytearray(data.read_bytes())
    damaged = content["units"][1]
    raw[damaged["offset"] + damaged["bytes"] - 40] ^= 0xFF
    data.write_bytes(bytes(raw))
    (units_dir / ("a" * 32 + ".arrow")).write_bytes(bytes(raw))
    (units_dir / (".tmp-" + "b" * 32 + ".arrow")).write_bytes(b"partial")
    (units_dir / ("c" * 32 + ".json")).write_text(marker.read_text().replace(data.name, "c" * 32 + ".arrow"))
    (units_dir / ("f" * 32 + ".json")).symlink_to(outside)
    (units_dir / ("e" * 32 + ".arrow")).symlink_to(outside)
    code, err = _cli(failed_run, "--resume", "--max-errors", "1", capsys=capsys)
    assert code == 0, err
    assert any("is not reused" in line and "size or sha256 differ" in line for line in caplog.messages), caplog.messages
    assert _resume_stats(failed_run)["units"] == {"reused": 2, "processed": 2}
    assert_same_outputs(finished, failed_run / "out", side_files=(), shards=False)
    assert outside.read_text() == "keep me"


def test_a_resume_folder_planted_as_a_link_is_not_followed(failed_run, capsys, caplog, tmp_path_factory):
    import shutil

    elsewhere = tmp_path_factory.mktemp("elsewhere") / "resume"
    shutil.move(str(failed_run / "out" / "resume"), elsewhere)
    (failed_run / "out" / "resume").symlink_to(elsewhere, target_is_directory=True)
    before = {p: p.stat().st_mtime_ns for p in elsewhere.rglob("*")}
    code, err = _cli(failed_run, "--resume", "--max-errors", "1", capsys=capsys)
    assert code == 0, err
    assert any("holds no committed work to resume" in line for line in caplog.messages), caplog.messages
    assert _resume_stats(failed_run)["units"] == {"reused": 0, "processed": 4}
    assert not (failed_run / "out" / "resume").exists()
    assert {p: p.stat().st_mtime_ns for p in elsewhere.rglob("*")} == before, "the link's target is untouched"


def test_a_crafted_unit_whose_marker_matches_stops_the_run_in_one_line(failed_run, capsys):
    marker, content = _units(failed_run / "out")
    data = marker.with_suffix(".arrow")
    crafted = b"\xff\xff\xff\xff" + b"\x00" * 64  # not an Arrow stream
    size = data.stat().st_size
    with open(data, "ab") as fh:
        fh.write(crafted)
    content["units"][0].update(offset=size, bytes=len(crafted), sha256=hashlib.sha256(crafted).hexdigest())
    marker.write_text(json.dumps(content))
    code, err = _cli(failed_run, "--resume", "--quiet", "--max-errors", "1", capsys=capsys)
    assert code == 1
    assert len(err) == 1 and "is damaged" in err[0] and "run again without --resume" in err[0], err


def test_resume_and_limit_or_a_remote_output_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(REGISTRY, "poison", f"{__name__}:PoisonStage")
    _light_corpus(tmp_path)
    code, err = _cli(tmp_path, "--resume", "--limit", "5", capsys=capsys)
    assert code == 2 and err == ["dsdata: error: --resume cannot be combined with --limit: a --limit run is a trial "
                                 "that commits nothing to resume"], err
    code, err = _cli(tmp_path, "--resume", "--output", "s3://bucket/out", capsys=capsys)
    assert code == 2 and "--resume needs a local output directory" in err[0], err
    assert not (tmp_path / "out").exists()


def test_resume_on_worker_processes_reuses_what_the_in_process_runner_committed(failed_run, finished, capsys,
                                                                                  monkeypatch):
    # The worker processes unpickle the test's own stage: they must find this module.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(Path(__file__).parent)]))
    code, err = _cli(failed_run, "--resume", "--quiet", "--max-errors", "1", "--direct_running_mode=multi_processing",
                     "--direct_num_workers=2", capsys=capsys)
    assert code == 0, err
    assert _resume_stats(failed_run)["units"] == {"reused": 3, "processed": 1}
    assert_same_outputs(finished, failed_run / "out", side_files=(), shards=False)


# --- the committed records ---------------------------------------------------------------------------------

def test_committed_records_read_back_exactly(tmp_path):
    docs = [Document("a", "text é 中", {"n": 1, "x": 1.5, "nested": {"l": [None, True, "s"]}, "nan": float("nan")},
                     {"lang": "en", "lang_score": 0.123456789012345, "tally": {"bench": 1}}),
            Document("b", "", {}, {}, derived_from="a")]
    rejected = [Rejected(Document("c", "x" * 200_000, {"source": "f"}, {"rules_cjk": False}), "rules", "too_short",
                         "detail"),
                Rejected(Document("f:3", "", {}), "read", "bad_json", "line 3")]
    units = tmp_path / "units"
    units.mkdir()
    first, failed, spoiled, last = (["file", f"/data/{n}.jsonl"] for n in "abcd")
    group = CommitGroup(str(units))
    group.begin(first, "digest-a")
    group.add(docs, rejected)
    group.add(docs[:1], [])
    assert group.end()
    group.begin(failed, "")  # a unit whose reading failed part-way
    group.add(docs, [])
    group.drop()
    group.begin(spoiled, "")
    group.add([Document("t", "t", {"pair": (1, 2)})], [])
    assert not group.end() and "JSON cannot hold exactly" in group.spoiled
    group.begin(last, "digest-d")  # a unit with no record (an empty file) is committed too
    assert group.end()
    assert group.commit() == 2
    index = committed_index(str(units))
    assert sorted(index) == sorted([unit_key(first), unit_key(last)])
    unit = index[unit_key(first)]
    assert unit_problem(unit, first, "digest-a") is None
    assert "describes another unit" in unit_problem(unit, last, "digest-a")
    assert "input's bytes changed" in unit_problem(unit, first, "digest-x")
    back = list(read_unit(unit))
    assert len(back) == 2
    (docs_back, rejected_back), (second, none) = back
    assert [d.id for d in second] == ["a"] and none == []
    assert [(d.id, d.text, d.annotations, d.derived_from) for d in docs_back] == \
        [(d.id, d.text, d.annotations, d.derived_from) for d in docs]
    assert json.dumps(docs_back[0].metadata) == json.dumps(docs[0].metadata)
    assert [(r.doc.id, r.doc.text, r.doc.metadata, r.doc.annotations, r.stage, r.reason, r.detail) for r in rejected_back] \
        == [(r.doc.id, r.doc.text, r.doc.metadata, r.doc.annotations, r.stage, r.reason, r.detail) for r in rejected]
    assert list(read_unit(index[unit_key(last)])) == []


@pytest.mark.parametrize("value", [(1, 2), {1: "a"}, np.float32(0.5), np.int64(3), b"bytes", {"s": {"x"}}])
def test_a_value_json_cannot_hold_exactly_is_not_committable(value):
    with pytest.raises(NotCommittable):
        unit_record_batch([Document("a", "t", {"v": value})], [])
    with pytest.raises(NotCommittable):
        unit_record_batch([Document("a", "t", {}, {"v": value})], [])
    unit_record_batch([Document("a", "t", {"v": [[{"k": None}]]})], [])  # plain JSON is


def test_fingerprint_differences_name_what_changed():
    base = {"dsdata_version": "1", "recipe": {"name": "r", "stages": [{"name": "lang", "params": {"keep": ["en"]}}]},
            "stage_files": {"lang.model": "a"}, "inputs": {"/d/a.jsonl": [3, 1.0]}}
    assert fingerprint_difference(base, json.loads(json.dumps(base))) is None
    other = json.loads(json.dumps(base))
    other["recipe"]["stages"][0]["params"]["keep"] = ["en", "zh"]
    assert fingerprint_difference(base, other) == 'the recipe changed: lang.keep was ["en"], is ["en", "zh"]'
    other = json.loads(json.dumps(base))
    other["dsdata_version"] = "2"
    assert fingerprint_difference(base, other) == "it was written by dsdata 1, this is 2"
    other = json.loads(json.dumps(base))
    other["stage_files"]["lang.model"] = "b"
    assert "the files lang.model names changed" in fingerprint_difference(base, other)
