"""Recipes (paths confined to their folder, --set overrides) and the `dsdata` command line."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsdata.recipe import RecipeError, load_recipe

REPO = Path(__file__).resolve().parents[1]


def _recipe(tmp_path, body):
    path = tmp_path / "r.yaml"
    path.write_text(body, encoding="utf-8")
    return str(path)


def test_paths_are_confined_to_the_recipe_folder(tmp_path):
    with pytest.raises(RecipeError, match="escapes the recipe's directory"):
        load_recipe(_recipe(tmp_path, "input: {paths: ['../secret/*.jsonl']}\nstages: []\n"))
    with pytest.raises(RecipeError, match="not relative to the recipe"):
        load_recipe(_recipe(tmp_path, "input: {paths: ['/etc/passwd']}\nstages: []\n"))
    with pytest.raises(RecipeError, match="not relative to the recipe"):
        load_recipe(_recipe(tmp_path, "input: {paths: ['gs://bucket/x.jsonl']}\nstages: []\n"))
    with pytest.raises(RecipeError, match="'output' must be a plain relative"):
        load_recipe(_recipe(tmp_path, "input: {paths: [a.jsonl]}\noutput: ../../tmp/x\n"))
    with pytest.raises(RecipeError, match="escapes"):
        load_recipe(_recipe(tmp_path, "input: {paths: [a.jsonl]}\nstages:\n  - lang: {model: ../../lid.bin}\n"))
    # a symlink out of the folder is an escape too
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(RecipeError, match="escapes"):
        load_recipe(_recipe(tmp_path, "input: {paths: ['link/passwd']}\n"))


def test_files_a_recipe_matches_through_links_stay_in_its_folder(tmp_path):
    # The recipe names a folder or a glob of its own; a link inside it to a file outside would put
    # that file's text into OUT/kept.  The same inputs given with --input are the user's choice.
    from dsdata.io.inputs import InputPathError, expand_directories

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "credentials.jsonl").write_text('{"text": "secret from outside"}\n')
    rec = tmp_path / "rec"
    for name in ("data", "data2"):
        (rec / name).mkdir(parents=True)
        (rec / name / "ok.jsonl").write_text('{"text": "a document of the recipe"}\n')
        (rec / name / "x.jsonl").symlink_to(outside / "credentials.jsonl")
    (rec / "data" / "inner.jsonl").symlink_to(rec / "data" / "ok.jsonl")  # a link inside is fine
    for inputs in ([str(rec / "data")], [str(rec / "data2" / "*.jsonl")], [str(rec / "data2" / "[ox].jsonl")]):
        with pytest.raises(InputPathError, match="outside the recipe's directory"):
            expand_directories(inputs, confine_to=str(rec))
        expand_directories(inputs)  # unconfined (--input): read as given
    inside = expand_directories([str(rec / "data" / "ok.jsonl"), str(rec / "data2" / "ok.jsonl")], confine_to=str(rec))
    assert inside.patterns == [str(rec / "data" / "ok.jsonl"), str(rec / "data2" / "ok.jsonl")]
    # A clean glob is handed on as the files checked, not matched again by Beam.
    (rec / "data2" / "x.jsonl").unlink()
    assert expand_directories([str(rec / "data2" / "*.jsonl")], confine_to=str(rec)).patterns == [
        str(rec / "data2" / "ok.jsonl")]

    (rec / "r.yaml").write_text("input: {paths: [data]}\noutput: out\nstages: []\n")
    proc = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--quiet"], cwd=rec,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "outside the recipe's directory" in proc.stderr, proc.stderr
    assert not (rec / "out" / "kept").exists()
    proc = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--quiet", "--input", "data"],
                          cwd=rec, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((rec / "out" / "stats.json").read_text())["input"] == 2  # ok.jsonl and the link out


def test_set_overrides(tmp_path):
    path = _recipe(tmp_path, "input: {paths: [a.jsonl]}\nstages:\n  - lang: {}\n  - rules: {}\n")
    recipe = load_recipe(path, ["lang.min_score=0.7", "lang.keep=[zh, ja]", "rules.min_words=null", "input.text_field=body"])
    assert recipe.stages[0].params == {"min_score": 0.7, "keep": ["zh", "ja"]}
    assert recipe.stages[1].params == {"min_words": None}
    assert recipe.text_field == "body"
    stages = recipe.build_stages()
    assert stages[0].keep == ["zh", "ja"] and stages[1].min_words is None
    with pytest.raises(RecipeError, match="has no stage 'dedup'"):
        load_recipe(path, ["dedup.threshold=0.9"])
    with pytest.raises(RecipeError, match="no parameter 'minscore'"):
        load_recipe(path, ["lang.minscore=0.9"])
    with pytest.raises(RecipeError, match="expected STAGE.PARAM=VALUE"):
        load_recipe(path, ["lang=0.9"])
    # a path given on the command line is the user's own: resolved against the working directory
    recipe = load_recipe(path, ["lang.model=some/model.bin"])
    assert recipe.stages[0].params["model"] == str(Path("some/model.bin").resolve())


def test_bad_recipes(tmp_path):
    with pytest.raises(RecipeError, match="unknown stage 'cleaner'"):
        load_recipe(_recipe(tmp_path, "input: {paths: [a.jsonl]}\nstages:\n  - cleaner: {}\n"))
    with pytest.raises(RecipeError, match="unknown key"):
        load_recipe(_recipe(tmp_path, "inputs: {paths: [a.jsonl]}\n"))
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(_recipe(tmp_path, "input: [unclosed\n"))
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(str(tmp_path / "missing.yaml"))
    with pytest.raises(RecipeError, match="has no parameter"):
        load_recipe(_recipe(tmp_path, "input: {paths: [a.jsonl]}\nstages:\n  - rules: {min_wrds: 3}\n")).build_stages()


def test_yaml_is_loaded_safely(tmp_path):
    with pytest.raises(RecipeError):
        load_recipe(_recipe(tmp_path, "input: !!python/object/apply:os.system ['echo pwned']\n"))


def _dsdata(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cli_errors_are_one_line(tmp_path):
    res = _dsdata("run", str(REPO / "pipelines" / "langid.yaml"), "--input", str(tmp_path / "nothing*.jsonl"), cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"dsdata: error: no files match input '{tmp_path / 'nothing*.jsonl'}'; check the path or pass --input GLOB"]
    res = _dsdata("run", str(REPO / "pipelines" / "langid.yaml"), "--set", "lang.bogus=1", cwd=tmp_path)
    assert res.returncode == 2 and "no parameter 'bogus'" in res.stderr and "Traceback" not in res.stderr
    res = _dsdata("frobnicate", cwd=tmp_path)
    assert res.returncode == 2 and "unknown command" in res.stderr


@pytest.mark.slow
def test_cli_run_with_overrides_and_beam_flags(tmp_path):
    (tmp_path / "in.jsonl").write_text(
        "\n".join(json.dumps({"id": str(i), "text": t}) for i, t in enumerate(
            ["The quick brown fox jumps over the lazy dog near the river bank.", "敏捷的棕色狐狸跳过了懒狗。", "Der schnelle braune Fuchs springt."]
        )) + "\n", encoding="utf-8")
    res = _dsdata("run", str(REPO / "pipelines" / "langid.yaml"), "--input", "in.jsonl", "--output", "o",
                  "--set", "lang.keep=[en]", "--set", "lang.min_score=0.1", "--direct_num_workers=1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["input"] == 3 and summary["kept"] == 1
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert stats["rejected"] == {"lang": {"lang_not_kept": 2}}


def test_stages_command_documents_every_parameter(tmp_path):
    res = _dsdata("stages", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for name in ("clean:", "lang:", "rules:", "min_score", "gopher", "adds columns"):
        assert name in res.stdout


@pytest.mark.slow
def test_multi_processing_run_is_as_quiet_as_in_process(tmp_path):
    """Issue 17: --direct_running_mode=multi_processing printed 123 lines of SDK-worker INFO/WARN."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": str(i), "text": f"Document number {i} in English."}) + "\n"
                                               for i in range(20)))
    common = ["run", str(REPO / "pipelines" / "langid.yaml"), "--input", "in.jsonl"]
    quiet = _dsdata(*common, "--output", "a", cwd=tmp_path)
    multi = _dsdata(*common, "--output", "b", "--direct_running_mode=multi_processing", "--direct_num_workers=2",
                    cwd=tmp_path)
    assert quiet.returncode == 0 and multi.returncode == 0, multi.stderr
    assert json.loads(multi.stdout.strip().splitlines()[-1])["kept"] == 20
    # The live progress line comes every 10 s of a run: how many a run prints depends on the
    # machine's speed (a loaded CI machine took 12.8 s for this one), not on worker noise.
    progress = re.compile(r"^dsdata: \d+:\d\d:\d\d ")

    def lines_of(run):
        return [ln for ln in run.stderr.strip().splitlines() if not progress.match(ln)]

    lines = lines_of(multi)
    for noise in ("INFO:apache_beam", "Discarding unparseable args", "semi_persistent_directory", "Worker: severity"):
        assert not [ln for ln in lines if noise in ln], (noise, multi.stderr)
    # What is left from each worker is what it prints while importing Beam, before it reads its
    # options (at most two lines each).
    assert len(lines) <= len(lines_of(quiet)) + 2 * 2, multi.stderr
