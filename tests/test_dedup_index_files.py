"""A `dedup.against` index folder is untrusted input: a manifest or ids file nested ten thousand deep,
and `.npy` signature files whose header lies (a shape the file does not hold, object dtype (pickle),
Fortran order, another dtype, another width) are refused in one line with a defined exit code — 2
before the run for what the headers show, 1 (the stage cannot start) for an ids file — never a
RecursionError traceback, an allocation of the header's size, or pickle.  Real index files written by
dsdata's own writer, then tampered with; real `dsdata run`s of the dedup stage."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dsdata import cli
from dsdata.dedup.index import write_manifest, write_part

PARAMS = {"num_perm": 128, "seed": 1, "ngram": 5, "char_ngram": 5}
PART = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def index(tmp_path) -> Path:
    from dsdata.stages.dedup import DedupStage

    defaults = DedupStage()
    params = {k: getattr(defaults, k) for k in PARAMS}
    folder = tmp_path / "index"
    folder.mkdir()
    rng = np.random.default_rng(0)
    write_part(str(folder), PART, ["a", "b", "c"], rng.integers(0, 2**32, (3, params["num_perm"]), dtype=np.uint32))
    write_manifest(str(folder), params, [PART], 3)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i} about rivers"}) + "\n"
                                                 for i in range(5)), encoding="utf-8")
    (tmp_path / "recipe.yaml").write_text("name: d\ninput: {paths: [docs.jsonl]}\nstages:\n  - dedup: {against: index}\n",
                                          encoding="utf-8")
    return folder


def _run(tmp_path: Path, capsys) -> tuple[int, list[str]]:
    code = cli.main(["run", str(tmp_path / "recipe.yaml"), "--output", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.strip()]


def _npy(path: Path, header: dict, data: bytes) -> None:
    """An .npy file with exactly this header (numpy's own header writer) and these bytes after it."""
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(data)


def test_an_untouched_index_runs(index, capsys):
    code, err = _run(index.parent, capsys)
    assert code == 0 and err == []


@pytest.mark.parametrize("tamper, words", [
    ("manifest_deep", "dedup index manifest "),
    ("shape_lies", "its header's shape (1000000000000, 128) needs 512000000000000 bytes of data, the file holds 1536"),
    ("object_dtype", "holds |O values, not <u4"),
    ("fortran", "is in Fortran order; expected C order"),
    ("float64", "holds <f8 values, not <u4"),
    ("width", "has shape (3, 64), expected (n, 128)"),
    ("not_npy", "is not a .npy array file"),
    ("fifo", "is a FIFO, not a regular file"),
])
def test_a_lying_index_is_refused_before_the_run_in_one_line(index, capsys, tamper, words):
    sig = index / f"{PART}.signatures.npy"
    width = 128
    if tamper == "manifest_deep":
        manifest = json.loads((index / "manifest.json").read_text())
        manifest["extra"] = "[" * 100_000  # a string: placed raw below, as nested arrays
        text = json.dumps(manifest).replace('"' + "[" * 100_000 + '"', "[" * 100_000 + "]" * 100_000)
        (index / "manifest.json").write_text(text)
    elif tamper == "shape_lies":
        _npy(sig, {"descr": "<u4", "fortran_order": False, "shape": (10**12, width)}, sig.read_bytes()[128:])
    elif tamper == "object_dtype":
        sig.unlink()
        np.save(sig, np.array([[{"x": 1}] * width] * 3, dtype=object), allow_pickle=True)
    elif tamper == "fortran":
        _npy(sig, {"descr": "<u4", "fortran_order": True, "shape": (3, width)}, sig.read_bytes()[128:])
    elif tamper == "float64":
        np.save(sig, np.zeros((3, width), dtype=np.float64))
    elif tamper == "width":
        np.save(sig, np.zeros((3, 64), dtype=np.uint32))
    elif tamper == "not_npy":
        sig.write_bytes(b"\x93NUMPY\x01\x00" + b"\xff" * 200)
    elif tamper == "fifo":
        import os

        sig.unlink()
        os.mkfifo(sig)
    code, err = _run(index.parent, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("dsdata: error: ") and "dedup.against" in err[0] and words in err[0], err
    if tamper == "manifest_deep":
        assert "nested deeper than 64 levels" in err[0]
    assert not (index.parent / "out" / "stats.json").exists()


@pytest.mark.parametrize("ids, words", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
    ('["a", {"b": 1}, "c"]', "its ids.json must be a list of id strings"),
    ('["a", "b"]', "is malformed (3 signatures, 2 ids)"),
])
def test_a_bad_ids_file_stops_the_stage_in_one_line(index, capsys, ids, words):
    (index / f"{PART}.ids.json").write_text(ids)
    code, err = _run(index.parent, capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("dsdata: error: stage 'dedup' cannot start: BadIndex: ") and words in err[0], err
