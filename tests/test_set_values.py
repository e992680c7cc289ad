"""Parameter values from `--set`, recipe files and `dsdata.run(overrides=)`: parsed as YAML (a value
YAML cannot read is refused, never taken as a string), checked against the parameter's type and,
where the stage knows them, its allowed values (`Param.choices`: lang.keep against the labels of the
language model it runs), with "did you mean" for a near miss.  Every refusal is one line and exit 2
before OUT is touched."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dsdata
from dsdata.recipe import RecipeError, load_recipe
from dsdata.stages import StageConfigError
from dsdata.stages.lang import LanguageStage

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["这是一个中文文档，用来测试语言识别的效果。", "This is an English document about language identification."]


def _work(tmp_path: Path, stages: str = "  - lang: {min_score: 0}\n") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(TEXTS)), encoding="utf-8")
    (tmp_path / "r.yaml").write_text(f"input: {{paths: [in.jsonl]}}\nstages:\n{stages}", encoding="utf-8")
    return tmp_path


def _cli(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--output", "out", "--quiet", *args],
                          cwd=work, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("dsdata: error: "), proc.stderr
    return lines[0]


@pytest.mark.slow
def test_bad_list_values_on_the_command_line_are_one_line_and_leave_out_untouched(tmp_path):
    work = _work(tmp_path)
    good = _cli(work, "--set", "lang.keep=[en]")
    assert good.returncode == 0, good.stderr
    before = (work / "out" / "stats.json").read_bytes()
    assert json.loads(before)["kept"] == 1
    for value, words in [("[zh, en", "not valid YAML"),                  # a bracket missing
                         ("zh,en", "a list is written [zh, en]"),        # never silently ['zh']
                         ("[zh, eng]", "did you mean 'en'?"),            # not a label of lid.176
                         ("[zh, 5]", "lang.keep must be"),               # not a list of codes
                         ("{zh: en}", "lang.keep must be")]:
        line = _error_line(_cli(work, "--set", f"lang.keep={value}"))
        assert words in line and "lang.keep" in line, line
    # Another stage's list of fixed choices: the same hints.
    work2 = _work(tmp_path / "pii", "  - pii: {}\n")
    assert "a list is written [email, phone]" in _error_line(_cli(work2, "--set", "pii.types=email,phone"))
    assert "did you mean 'email'?" in _error_line(_cli(work2, "--set", "pii.types=[emial]"))
    assert (work / "out" / "stats.json").read_bytes() == before  # the refused runs wrote nothing
    assert not (work2 / "out").exists()


def test_the_same_checks_for_recipe_files_and_the_python_api(tmp_path):
    work = _work(tmp_path, "  - lang: {keep: [zh, eng]}\n")
    with pytest.raises(RecipeError, match=r"r\.yaml: lang\.keep: 'eng' is not one of the 176 languages "
                                          r"lid\.176\.ftz reports; did you mean 'en'\?"):
        load_recipe(str(work / "r.yaml"))
    with pytest.raises(RecipeError, match=r"^lang\.backend must be one of fasttext, langdetect, got 'fasttex'; "
                                          r"did you mean 'fasttext'\?$"):
        load_recipe(str(work / "r.yaml"), ["lang.backend=fasttex"])  # a fixed Choice: the same hint
    with pytest.raises(RecipeError, match=r"input\.text_field must be a single name, got \['body', 'text'\]"):
        load_recipe(str(work / "r.yaml"), ["input.text_field=[body, text]"])  # was the field "['body', 'text']"
    work = _work(tmp_path / "api")
    for overrides, words in [({"lang.keep": ["zh", "eng"]}, "did you mean 'en'"),
                             ({"lang.keep": "zh,en"}, "a list is written"),
                             (["lang.keep=[zh, en"], "not valid YAML")]:
        with pytest.raises(dsdata.RunError, match=words) as info:
            dsdata.run(work / "r.yaml", output=work / "out", overrides=overrides)
        assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert not (work / "out").exists()


def test_allowed_values_follow_the_stages_other_parameters(tmp_path):
    """lang.keep's choices come from the backend and model the stage is given, not a fixed list:
    langdetect reports no 'yue' (lid.176 does), and a model that cannot be read checks nothing here
    (its own setup says what is wrong with it)."""
    assert LanguageStage(keep=["yue", "zh-Hant", "EN"]).keep == ["yue", "zh", "en"]
    with pytest.raises(StageConfigError, match="'yue' is not one of the languages langdetect reports"):
        LanguageStage(backend="langdetect", keep=["yue"])
    assert LanguageStage(backend="langdetect", keep=["zh-tw", "en"]).keep == ["zh", "en"]
    assert LanguageStage(model=str(tmp_path / "missing.ftz"), keep=["xx"]).keep == ["xx"]
    assert LanguageStage(keep="all").keep == [] and LanguageStage(keep=[]).keep == []


def test_difficulty_lang_is_one_of_the_languages_its_model_folder_has(tmp_path):
    """The same mechanism on another stage: difficulty.lang names a language model_dir holds a model
    for (the shipped folder: en, zh); a folder that is one model for all takes any language."""
    work = _work(tmp_path, "  - difficulty: {}\n")
    assert load_recipe(str(work / "r.yaml"), ["difficulty.lang=zh"]).stages[0].params["lang"] == "zh"
    with pytest.raises(RecipeError, match=r"^difficulty\.lang: 'eng' is not one of the languages .* has models for; "
                                          r"did you mean 'en'\?$"):
        load_recipe(str(work / "r.yaml"), ["difficulty.lang=eng"])
    one = REPO / "pipelines" / "models" / "lm" / "en"
    assert load_recipe(str(work / "r.yaml"), [f"difficulty.model_dir={one}", "difficulty.lang=fr"]).stages[0].params["lang"] == "fr"


def test_a_misspelt_parameter_in_set_is_named_with_the_nearest_one(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(str(_work(tmp_path) / "r.yaml"), overrides=["lang.min_scor=0.5"])
    line = str(err.value)
    assert "--set 'lang.min_scor=0.5': stage 'lang' has no parameter 'min_scor'" in line
    assert line.endswith("did you mean 'min_score'?") and "\n" not in line, line
