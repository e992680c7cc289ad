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
