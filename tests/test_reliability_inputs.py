"""Input matching and recipe checks found by fuzzing: each file is read once however it is reached
(links to directories, overlapping --input values, link cycles); a dangling link, a FIFO or a device
is never opened (one error line when named, a warning when a glob matched it); recipe mistakes
(non-string keys, NUL bytes, unknown input keys, a non-string name, an output behind a symbolic link,
an absurd dedup.num_perm) are one line, exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsdata.cli import main
from dsdata.io.inputs import InputPathError, expand_directories

REPO = Path(__file__).resolve().parents[1]


def _records(path: Path, n: int, tag: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"{tag}{i}", "text": f"record {i} of {tag} has words"}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _recipe(tmp_path: Path, body: str = "stages: []\n") -> Path:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(body, encoding="utf-8")
    return recipe


def _run(tmp_path: Path, *inputs: str, output: Path | None = None) -> tuple[int, dict | None]:
    out = output or tmp_path / "out"
    args = ["run", str(_recipe(tmp_path)), "--output", str(out), "--quiet"]
    for item in inputs:
        args += ["--input", item]
    rc = main(args)
    stats = out / "stats.json"
    return rc, json.loads(stats.read_text()) if stats.exists() else None


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and "apitools" not in ln]
    assert len(lines) == 1 and lines[0].startswith("dsdata: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ----------------------------------------------------------------------------- each file once

def test_link_to_a_directory_matched_by_the_same_glob_is_read_once(tmp_path, capsys):
    data = tmp_path / "data"
    _records(data / "real" / "a.jsonl", 2, "a")
    (data / "latest").symlink_to("real")
    rc, stats = _run(tmp_path, str(data / "*"))
    assert rc == 0 and stats["input"] == 2 and stats["ledger_ok"]
    expanded = expand_directories([str(data / "*")])
    assert expanded.patterns == [str(data / "real" / "a.jsonl")]  # the real spelling, not the link's
    assert expanded.duplicates == [(str(data / "latest"), str(data / "real"))]


def test_overlapping_inputs_read_each_file_once_keeping_the_first_spelling(tmp_path, capsys):
    f = _records(tmp_path / "d" / "a.jsonl", 2, "a")
    _records(tmp_path / "d" / "b.jsonl", 3, "b")
    other = tmp_path / "d" / ".." / "d" / "a.jsonl"
    rc, stats = _run(tmp_path, str(f), str(tmp_path / "d" / "*"), str(other), str(tmp_path / "d"))
    assert rc == 0 and stats["input"] == 5 and stats["ledger_ok"]
    patterns = expand_directories([str(f), str(tmp_path / "d" / "*"), str(other)]).patterns
    assert patterns == [str(f), str(tmp_path / "d" / "b.jsonl")]
    # without --quiet the repeats are one note line
    capsys.readouterr()
    assert main(["run", str(_recipe(tmp_path)), "--output", str(tmp_path / "o2"), "--input", str(f),
                 "--input", str(other)]) == 0
    assert "1 input path(s) name a file or directory already read and add nothing" in capsys.readouterr().err


def test_a_link_cycle_is_not_followed(tmp_path, capsys):
    data = tmp_path / "n"
    _records(data / "a.jsonl", 3, "a")
    _records(data / "sub" / "b.jsonl", 2, "b")
    (data / "loop.jsonl").symlink_to(".")
    (data / "sub" / "up").symlink_to("..")
    rc, stats = _run(tmp_path, str(data / "*"))
    assert rc == 0 and stats["input"] == 5 and stats["ledger_ok"]
    rc, stats = _run(tmp_path, str(data), output=tmp_path / "out2")
    assert rc == 0 and stats["input"] == 5
    assert str(data / "loop.jsonl") in expand_directories([str(data / "*")]).not_followed


def test_a_link_to_a_file_in_the_same_directory_is_read_once(tmp_path, capsys):
    data = tmp_path / "n"
    _records(data / "space file.jsonl", 2, "s")
    (data / "alias.jsonl").symlink_to("space file.jsonl")
    rc, stats = _run(tmp_path, str(data))
    assert rc == 0 and stats["input"] == 2
    rc, stats = _run(tmp_path, str(data / "*.jsonl"), output=tmp_path / "out2")
    assert rc == 0 and stats["input"] == 2


def test_hard_links_to_one_file_are_read_once(tmp_path, capsys):
    data = tmp_path / "h"
    _records(data / "a.jsonl", 3, "h")
    os.link(data / "a.jsonl", data / "b.jsonl")
    expanded = expand_directories([str(data)])
    assert expanded.duplicates == [(str(data / "b.jsonl"), str(data / "a.jsonl"))]
    rc, stats = _run(tmp_path, str(data))
    assert rc == 0 and stats["input"] == 3
    rc, stats = _run(tmp_path, str(data / "a.jsonl"), str(data / "b.jsonl"), output=tmp_path / "out2")
    assert rc == 0 and stats["input"] == 3
    assert stats["inputs_left_out"] == {"repeats": {"count": 1, "paths": [
        {"path": str(data / "b.jsonl"), "same_as": str(data / "a.jsonl")}]}}


def test_stats_json_lists_the_inputs_left_out(tmp_path, capsys):
    data = tmp_path / "m"
    _records(data / "a.jsonl", 2, "m")
    os.mkfifo(data / "pipe.jsonl")
    (data / "notes.xyz").write_text("no known format", encoding="utf-8")
    (data / "loop").symlink_to(data)
    rc, stats = _run(tmp_path, str(data))
    assert rc == 0 and stats["input"] == 2
    left = stats["inputs_left_out"]
    assert left["not_regular_files"] == {"count": 1, "paths": [{"path": str(data / "pipe.jsonl"), "why": "not a regular file but a FIFO"}]}
    assert left["no_known_format"] == {"count": 1, "paths": [str(data / "notes.xyz")]}
    assert left["links_not_followed"] == {"count": 1, "paths": [str(data / "loop")]}
    rc, clean = _run(tmp_path, str(data / "a.jsonl"), output=tmp_path / "out2")
    assert rc == 0 and "inputs_left_out" not in clean


# ----------------------------------------------------------------- only regular files are opened

def test_a_dangling_link_named_as_input_is_one_line(tmp_path, capsys):
    link = tmp_path / "b.jsonl"
    link.symlink_to("/nonexistent/x.jsonl")
    capsys.readouterr()
    rc, stats = _run(tmp_path, str(link))
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and stats is None and not (tmp_path / "out").exists()
    assert str(link) in line and "does not exist" in line


def test_a_dangling_link_under_a_glob_is_a_warning_and_the_rest_is_read(tmp_path, capsys):
    _records(tmp_path / "d" / "a.jsonl", 2, "a")
    (tmp_path / "d" / "b.jsonl").symlink_to("/nonexistent/x.jsonl")
    capsys.readouterr()
    rc, stats = _run(tmp_path, str(tmp_path / "d" / "*"))
    err = capsys.readouterr().err
    assert rc == 0 and stats["input"] == 2 and stats["ledger_ok"]
    assert "warning: 1 matched path(s) are not read" in err and "b.jsonl" in err  # shown even with --quiet
    rc, stats = _run(tmp_path, str(tmp_path / "d"), output=tmp_path / "out2")
    assert rc == 0 and stats["input"] == 2


def _cli(args, cwd, timeout):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_fifo_is_never_opened(tmp_path):
    """Opening a FIFO without a writer blocks for ever: the run is a subprocess with a timeout, so a
    regression fails here instead of hanging the suite."""
    d = tmp_path / "d"
    _records(d / "a.jsonl", 2, "a")
    os.mkfifo(d / "fifo.jsonl")
    _recipe(tmp_path)
    proc = _cli(["run", "r.yaml", "--input", str(d / "*"), "--output", "out", "--quiet"], tmp_path, 240)
    assert proc.returncode == 0, proc.stderr
    assert "fifo.jsonl is not a regular file but a FIFO" in proc.stderr
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["input"] == 2
    proc = _cli(["run", "r.yaml", "--input", str(d / "fifo.jsonl"), "--output", "out2"], tmp_path, 240)
    assert proc.returncode == 2 and "a FIFO" in _one_line(proc.stderr)
    assert not (tmp_path / "out2").exists()
    # a glob that matches nothing but the FIFO reads nothing: one line, like no match at all
    proc = _cli(["run", "r.yaml", "--input", str(d / "f*"), "--output", "out3"], tmp_path, 240)
    assert proc.returncode == 2 and "no regular file to read" in _one_line(proc.stderr)
    assert expand_directories([str(d)]).patterns == [str(d / "a.jsonl")]


def test_a_character_device_is_refused_by_name(tmp_path):
    with pytest.raises(InputPathError, match="character device"):
        expand_directories(["/dev/null"])


# ------------------------------------------------------------------------------- recipes

@pytest.mark.parametrize("body, needle", [
    ("1: 2\nstages: []\n", "unknown key(s) 1 "),
    ("true: x\nstages: []\n", "unknown key(s) True"),
    ('input: {paths: ["sub/a\\0.jsonl"]}\nstages: []\n', "NUL byte"),
    ("input: {paths: [in.jsonl], 1: x}\nstages: []\n", "unknown key(s) input.1"),
    ("input: {paths: [in.jsonl], fromat: jsonl}\nstages: []\n", "unknown key(s) input.fromat"),
    ("name: [1]\ninput: {paths: [in.jsonl]}\nstages: []\n", "'name' must be a string"),
    ("description: {a: 1}\ninput: {paths: [in.jsonl]}\nstages: []\n", "'description' must be a string"),
    ('input: {paths: [in.jsonl]}\noutput: "o\\0x"\nstages: []\n', "'output' must be a plain relative"),
    ("input: {paths: [in.jsonl]}\noutput: ''\nstages: []\n", "'output' must be a plain relative"),
])
def test_recipe_mistakes_are_one_line(tmp_path, capsys, body, needle):
    _records(tmp_path / "in.jsonl", 1, "x")
    capsys.readouterr()
    assert main(["run", str(_recipe(tmp_path, body)), "--output", str(tmp_path / "out")]) == 2
    assert needle in _one_line(capsys.readouterr().err)


def test_recipe_output_behind_a_symbolic_link_is_refused(tmp_path, capsys, monkeypatch):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _records(work / "in.jsonl", 2, "x")
    (work / "escdir").symlink_to(elsewhere)
    recipe = _recipe(work, "input: {paths: [in.jsonl]}\noutput: escdir\nstages: []\n")
    monkeypatch.chdir(work)
    capsys.readouterr()
    assert main(["run", str(recipe), "--quiet"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "escdir" in line and "outside the working directory" in line and not any(elsewhere.iterdir())
    # the same place given on the command line is the user's choice
    assert main(["run", str(recipe), "--quiet", "--output", "escdir"]) == 0
    assert json.loads((elsewhere / "stats.json").read_text())["input"] == 2
    # a recipe output that is a plain new directory under the working directory still works
    recipe.write_text("input: {paths: [in.jsonl]}\noutput: sub/out\nstages: []\n", encoding="utf-8")
    assert main(["run", str(recipe), "--quiet"]) == 0 and (work / "sub" / "out" / "stats.json").is_file()
    # run_recipe() from Python applies the same check to the recipe's own output
    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import RecipeError, load_recipe

    for f in elsewhere.iterdir():
        f.unlink() if f.is_file() else None
    recipe.write_text("input: {paths: [in.jsonl]}\noutput: escdir\nstages: []\n", encoding="utf-8")
    with pytest.raises(RecipeError, match="outside the working directory"):
        run_recipe(load_recipe(str(recipe)))
    assert not any(p.is_file() for p in elsewhere.iterdir())


@pytest.mark.parametrize("value", ["99999999999999999999", "4097"])
def test_dedup_num_perm_has_a_maximum(tmp_path, capsys, value):
    _records(tmp_path / "in.jsonl", 1, "x")
    recipe = _recipe(tmp_path, "input: {paths: [in.jsonl]}\nstages: [{dedup: {}}]\n")
    capsys.readouterr()
    assert main(["run", str(recipe), "--output", str(tmp_path / "out"), "--set", f"dedup.num_perm={value}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "num_perm" in line and "between 1 and 4096" in line
