"""`--input DIR` (and a recipe path naming a folder) reads the files in it, recursively, each in
the format its name gives (issue 17: a directory used to become one unreadable_file row)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsdata.cli import main as cli_main
from dsdata.io.inputs import InputPathError, expand_directories

REPO = Path(__file__).resolve().parents[1]
HTML = sorted((REPO / "pipelines" / "samples" / "html").glob("*.html"))


def _site(root: Path) -> list[Path]:
    """A folder as a user has one: nested pages, a README, a hidden folder, a JSONL beside them."""
    (root / "en" / "deep").mkdir(parents=True)
    (root / ".git").mkdir()
    pages = [root / "a[1].html", root / "en" / HTML[0].name, root / "en" / "deep" / HTML[1].name]
    for src, dst in zip(HTML, pages):
        shutil.copy(src, dst)
    (root / "README.txt").write_text("not a page\n")
    (root / ".git" / "x.html").write_text("<html><body>hidden</body></html>")
    (root / ".hidden.html").write_text("<html><body>hidden</body></html>")
    docs = root / "en" / "docs.jsonl"
    docs.write_text(json.dumps({"id": "j1", "text": "A JSONL record beside the pages."}) + "\n")
    return pages + [docs]


def test_expand_directories_lists_files_by_format(tmp_path):
    files = _site(tmp_path / "site")
    expanded = expand_directories([str(tmp_path / "site")])
    assert sorted(p.replace("[[]", "[") for p in expanded.patterns) == sorted(str(f) for f in files)
    assert expanded.skipped == [str(tmp_path / "site" / "README.txt")]
    # --format given: every (non-hidden) file is an input
    assert len(expand_directories([str(tmp_path / "site")], "html").patterns) == len(files) + 1
    # a file glob is listed by the folder form's rules (Beam's matcher took hidden files); a glob
    # matching directories is expanded
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / ".b.jsonl").write_text("{}\n")
    assert expand_directories([str(tmp_path / "*.jsonl")]).patterns == [str(tmp_path / "a.jsonl")]
    assert len(expand_directories([str(tmp_path / "si*")]).patterns) == len(files)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputPathError, match="holds no files"):
        expand_directories([str(tmp_path / "empty")])


@pytest.mark.slow
def test_run_with_input_directory_reads_every_file(tmp_path, capsys):
    files = _site(tmp_path / "site")
    out = tmp_path / "out"
    assert cli_main(["run", str(REPO / "pipelines" / "extract.yaml"), "--input", str(tmp_path / "site"),
                     "--format", "auto", "--output", str(out)]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["input"] == len(files) and stats["ledger_ok"]
    assert "read" not in stats["rejected"]
    ids = set(pq.read_table(out / "kept").column("id").to_pylist()) | \
        set(pq.read_table(out / "rejected").column("id").to_pylist())
    assert {str(f) for f in files[:3]} | {"j1"} == ids
    err = capsys.readouterr().err
    assert "1 file(s) in the input director(ies) have no known format" in err and "README.txt" in err


def test_run_with_empty_input_directory_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli_main(["run", str(REPO / "pipelines" / "extract.yaml"), "--input", str(tmp_path / "empty"),
                     "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsdata: error: input directory") and "holds no files" in err[0]


def _dsdata(args: list[str], cwd: Path):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))


@pytest.mark.slow
def test_an_output_directory_inside_the_input_folder_is_never_read_as_input(tmp_path):
    """`--input DIR --output DIR/out` twice: the second run reads the same 3 documents, not the first
    run's outputs (3 → 8 before), and says so in one line; OUT given relative, through a link, or
    as a glob's match is left out the same way; an input that is OUT, or lies in it, is refused."""
    import os

    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"f{i}.jsonl").write_text(json.dumps({"id": f"d{i}", "text": f"Document {i} of the folder."}) + "\n")
    (tmp_path / "r.yaml").write_text("input: {paths: [data]}\nstages: [clean]\n")
    (tmp_path / "out-link").symlink_to(data / "out")
    first = _dsdata(["--input", "data", "--output", "data/out"], tmp_path)
    assert first.returncode == 0 and json.loads((data / "out" / "stats.json").read_text())["input"] == 3, first.stderr
    for output in ("data/out", "out-link", str(data / "out")):
        res = _dsdata(["--input", "data", "--output", output], tmp_path)
        assert res.returncode == 0, res.stderr
        stats = json.loads((data / "out" / "stats.json").read_text())
        assert stats["input"] == 3 and stats["kept"] == 3, stats
        said = [ln for ln in res.stderr.splitlines() if "output directory lies inside an input directory" in ln]
        assert len(said) == 1 and "are not read as input" in said[0], res.stderr
        assert stats["inputs_left_out"]["in_output_directory"]["count"] >= 3  # kept/, rejected/, stats.json, …
    res = _dsdata(["--input", "data/*", "--output", "data/out"], tmp_path)  # a glob that matches OUT itself
    assert res.returncode == 0 and json.loads((data / "out" / "stats.json").read_text())["input"] == 3, res.stderr
    before = sorted(os.listdir(data))
    for args, named in [(["--input", "data", "--output", "data"], "data"),
                        (["--input", "data/out/kept", "--output", "data/out"], "data/out/kept"),
                        (["--input", "out-link/stats.json", "--format", "jsonl", "--output", "data/out"], "out-link/stats.json")]:
        res = _dsdata(args, tmp_path)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert f"{named}' lies in the output directory" in res.stderr and "pass another --output" in res.stderr
    assert sorted(os.listdir(data)) == before
