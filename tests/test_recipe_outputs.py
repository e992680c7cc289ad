"""Each shipped recipe writes to its own default folder, so running one never deletes the default
job's shards/ and difficulty.json that the README's training commands read (issue 17)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsdata.cli import main as cli_main
from dsdata.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "pipelines").glob("*.yaml"))


def test_every_recipe_has_its_own_default_output():
    outputs = {path.name: load_recipe(str(path)).output for path in RECIPES}
    assert outputs["pretrain.yaml"] == "out"
    assert len(set(outputs.values())) == len(outputs), outputs
    assert outputs["langid.yaml"] == "out-langid" and outputs["difficulty.yaml"] == "out-difficulty"


@pytest.mark.slow
def test_langid_after_pretrain_leaves_pretrain_outputs_intact(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["run", str(REPO / "pipelines" / "pretrain.yaml"), "--quiet"]) == 0
    out = tmp_path / "out"
    kept = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert Path("shards/manifest.json") in kept and Path("difficulty.json") in kept

    assert cli_main(["run", str(REPO / "pipelines" / "langid.yaml"), "--quiet"]) == 0
    assert json.loads((tmp_path / "out-langid" / "stats.json").read_text())["recipe"] == "langid"
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept
    capsys.readouterr()

    # Pointed at the default job's folder on purpose: it says what it replaces.
    assert cli_main(["run", str(REPO / "pipelines" / "langid.yaml"), "--output", "out", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "out holds the outputs of recipe 'pretrain' (shards/, difficulty.json" in err
    assert "this run of 'langid' replaces them" in err
