"""Every stage parameter has a declared type, and a wrong-typed value given with --set ends in one
line naming STAGE.PARAM (exit status 2, no traceback) before any pipeline is built."""
import subprocess
import sys
from pathlib import Path

import pytest

from dsdata.cli import main as cli_main
from dsdata.recipe import parse_value
from dsdata.stages import REGISTRY, stage_class
from dsdata.stages.base import Param, StageConfigError
from dsdata.core.params import ParamType

REPO = Path(__file__).resolve().parents[1]

# Values of the wrong type for some parameter type or other, as typed after --set STAGE.PARAM=.
# For each parameter the first one its declared type refuses is used; a parameter that accepts
# all of them has no real type, and fails test_every_parameter_refuses_a_wrong_value.
WRONG = ["abc", "ten", "[1, 2]", "5", "-1", "2.5", "true", "{a: 1}", "''", "[]"]


def _all_params():
    for name in REGISTRY:
        for key, spec in stage_class(name).params.items():
            yield name, key, spec


def _wrong_value(name: str, key: str, spec: Param) -> str | None:
    for text in WRONG:
        try:
            spec.coerce(f"{name}.{key}", parse_value(text))
        except StageConfigError:
            return text
    return None


PARAMS = [pytest.param(name, key, spec, id=f"{name}.{key}") for name, key, spec in _all_params()]


@pytest.mark.parametrize("name, key, spec", PARAMS)
def test_every_parameter_has_a_type_its_default_passes(name, key, spec):
    assert isinstance(spec.type, ParamType) and type(spec.type) is not ParamType
    spec.coerce(f"{name}.{key}", spec.default)  # raises if the declared default is not of the declared type


@pytest.mark.parametrize("name, key, spec", PARAMS)
def test_every_parameter_refuses_a_wrong_value(name, key, spec, tmp_path, capsys):
    wrong = _wrong_value(name, key, spec)
    assert wrong is not None, f"{name}.{key} accepts every one of {WRONG}"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"input: {{paths: ['*.jsonl']}}\nstages:\n  - {name}: {{}}\n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text('{"id": "1", "text": "x"}\n', encoding="utf-8")
    code = cli_main(["run", str(recipe), "--output", str(tmp_path / "out"), "--set", f"{name}.{key}={wrong}"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"dsdata: error: {name}.{key} "), lines[0]
    assert not (tmp_path / "out").exists()  # stopped before the output directory was prepared


def test_recipe_values_are_checked_with_the_file_named(tmp_path):
    from dsdata.recipe import RecipeError, load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("input: {paths: [a.jsonl]}\nstages:\n  - rules: {min_words: ten}\n", encoding="utf-8")
    with pytest.raises(RecipeError, match=r"r\.yaml: rules\.min_words must be a non-negative integer or null, got 'ten'"):
        load_recipe(str(recipe))


def test_values_are_converted_once():
    lang = stage_class("lang")(keep="all", min_score=1)
    assert lang.keep == [] and lang.min_score == 1.0 and isinstance(lang.min_score, float)
    dedup = stage_class("dedup")(verify=True)  # a YAML boolean of earlier recipes
    assert dedup.verify == "signature"
    with pytest.raises(StageConfigError, match=r"^clean\.html must be auto, true or false, got 1$"):
        stage_class("clean")(html=1)  # YAML 1 is not true


def test_the_issue_example_through_a_real_cli_process(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "dsdata.cli", "run", "--set", "lang.min_score=abc", "--output", str(tmp_path / "o")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "dsdata: error: lang.min_score must be a number between 0 and 1, got 'abc'"
    ], res.stderr
    assert not (tmp_path / "o").exists()


def test_stages_command_shows_the_types(capsys):
    assert cli_main(["stages", "lang"]) == 0
    out = capsys.readouterr().out
    assert "min_score = 0.5  (a number between 0 and 1)" in out
    assert "model = None  (a path or null)" in out
