"""Recipe stages and the trainer's config tables share one parameter system (dsdata/core/params.py):
the same `Param` and types declare a stage parameter and a trainer key, and a bad value is the same
one line, with the same did-you-mean, from `dsdata run --set` and from `python -m dsdata.train --set`."""
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from dsdata.cli import main as run_main
from dsdata.core.params import ConfigError, Integer, Param, Settings, parse
from dsdata.stages import DocumentStage, stage_class
from dsdata.stages.base import StageConfigError
from dsdata.train.__main__ import main as train_main
from dsdata.train.config import SECTIONS

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "models" / "tiny.toml")


def _error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


def test_a_stage_parameter_and_a_trainer_key_are_the_same_declaration():
    stage = stage_class("decontaminate").params["ngram"]
    trainer = {f.name: f.metadata["param"] for f in fields(SECTIONS["training"])}["steps"]
    assert type(stage) is type(trainer) is Param
    assert type(stage.type) is type(trainer.type) is Integer and str(stage.type) == str(trainer.type)
    assert StageConfigError is ConfigError  # one error class: `param` names the refused parameter


def test_a_bad_value_is_the_same_line_in_a_recipe_and_in_a_trainer_config(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"id": "1", "text": "x"}\n', encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("input: {paths: ['*.jsonl']}\nstages:\n  - decontaminate: {}\n", encoding="utf-8")
    assert run_main(["run", str(recipe), "--output", str(tmp_path / "out"), "--set", "decontaminate.ngram=0"]) == 2
    stage_line = _error_line(capsys)
    assert train_main(["--config", TINY, "--run-dir", str(tmp_path / "t"), "--set", "training.steps=0"]) == 2
    trainer_line = _error_line(capsys)
    assert stage_line == "dsdata: error: decontaminate.ngram must be a positive integer, got 0"
    assert trainer_line == f"dsdata-train: error: {TINY}: training.steps must be a positive integer, got 0"
    assert not (tmp_path / "out").exists() and not (tmp_path / "t" / "checkpoints").exists()


def test_near_misses_get_the_same_did_you_mean_on_both_sides(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("input: {paths: ['*.jsonl']}\nstages:\n  - clean: {}\n", encoding="utf-8")
    assert run_main(["run", str(recipe), "--output", str(tmp_path / "out"), "--set", "clean.html=ato"]) == 2
    assert _error_line(capsys).endswith("clean.html must be auto, true or false, got 'ato'; did you mean 'auto'?")
    assert train_main(["--config", TINY, "--run-dir", str(tmp_path / "t"), "--set", "logging.progress=bra"]) == 2
    assert _error_line(capsys).endswith("logging.progress must be one of auto, bar, lines, off, got 'bra'; "
                                        "did you mean 'bar'?")
    # An unknown key: the stage's and the table's line come from the same function.
    with pytest.raises(StageConfigError, match=r"^stage 'clean' has no parameter 'htm' \(it takes: .*\); "
                                               r"did you mean 'html'\?$"):
        stage_class("clean")(htm="auto")
    assert train_main(["--config", TINY, "--run-dir", str(tmp_path / "t"), "--set", "training.stepz=3"]) == 2
    assert _error_line(capsys).endswith("[training] has no parameter 'stepz' (it takes: compile, device, fp32_retry, "
                                        "global_batch_size, precision, seed, seq_len, steps, threads, "
                                        "unfreeze_fraction, unfreeze_layers); did you mean 'steps'?")


SHARED = Param(3, "how many", Integer(min=1, max=8))


class CountStage(DocumentStage):
    name = "count_test"
    params = {"count": SHARED}

    def process(self, doc):
        return doc


@dataclass
class CountTable(Settings):
    count: int = SHARED


@pytest.mark.parametrize("value", [0, 9, "three", 2.5, True, None])
def test_one_param_object_declares_both_and_refuses_alike(value):
    with pytest.raises(ConfigError) as stage:
        CountStage(count=value)
    with pytest.raises(ConfigError) as table:
        parse(CountTable, {"count": value}, "count_test")
    assert str(stage.value) == str(table.value) == f"count_test.count must be an integer between 1 and 8, got {value!r}"
    assert stage.value.param == table.value.param == "count"
    assert CountStage(count=5).count == parse(CountTable, {"count": 5}, "t").count == 5
    assert CountTable().count == CountStage().count == 3
