"""dsdata/runners.py is the one runner registry: Beam's runners all in it, every runner documented,
the recipe's allowlist and the CLI's resolution read it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsdata.recipe import RecipeError, load_recipe
from dsdata.runners import IN_PROCESS_RUNNER, RUNNERS, find_runner, is_in_process, resolve_runner

REPO = Path(__file__).resolve().parent.parent


def test_the_registry_holds_every_runner_beam_knows_by_name():
    from apache_beam.options.pipeline_options import StandardOptions

    for path in StandardOptions.ALL_KNOWN_RUNNERS:
        name = path.rsplit(".", 1)[-1]
        runner = find_runner(name)
        assert runner is not None, name
        # Beam's class, except where dsdata replaces it (DirectRunner → the in-process FnApiRunner).
        assert runner.class_path == path or runner.replaces_beams, (name, runner)


def test_every_runner_dsdata_names_is_documented_and_its_class_exists():
    import importlib

    engines_doc = (REPO / "docs" / "engines.md").read_text(encoding="utf-8")
    for runner in RUNNERS:
        if runner.summary:  # the runners users choose between; the rest are Beam's test/internal ones
            assert runner.name in engines_doc or f"--runner={runner.name}" in engines_doc, runner.name
        if runner.class_path.startswith("dsdata."):
            module, _, attr = runner.class_path.rpartition(".")
            assert hasattr(importlib.import_module(module), attr), runner.class_path


def test_names_resolve_as_users_type_them():
    assert resolve_runner("DirectRunner") == resolve_runner("direct") == IN_PROCESS_RUNNER
    assert resolve_runner("PrismRunner") == "PrismRunner"  # Beam resolves its own by name
    assert resolve_runner("prism") == "prism"
    assert is_in_process(None) and is_in_process(IN_PROCESS_RUNNER) and is_in_process("BundleBasedDirectRunner")
    assert not is_in_process("FlinkRunner") and not is_in_process("my.Runner")


@pytest.mark.parametrize("runner", [r.name for r in RUNNERS])
def test_a_recipe_may_name_exactly_the_in_process_runners(tmp_path, runner):
    (tmp_path / "r.yaml").write_text(f"input: {{paths: [x.jsonl]}}\nstages:\n  - clean: {{}}\nbeam:\n  runner: {runner}\n")
    entry = find_runner(runner)
    if entry.in_process:
        assert load_recipe(str(tmp_path / "r.yaml")).beam_args == [f"--runner={entry.class_path}"]
    else:
        with pytest.raises(RecipeError, match=f"runner '{runner}' starts programs"):
            load_recipe(str(tmp_path / "r.yaml"))


def test_the_retired_dask_runner_is_an_unknown_runner(tmp_path):
    """--runner=dask was removed (docs/history/2026-12-06-dask.md): it is refused like any name the
    registry does not hold, in one line that lists the runners, before anything runs."""
    import subprocess
    import sys

    (tmp_path / "a.jsonl").write_text('{"id": "1", "text": "hello"}\n', encoding="utf-8")
    (tmp_path / "r.yaml").write_text("name: t\ninput: {paths: ['*.jsonl']}\nstages: []\n", encoding="utf-8")
    assert find_runner("dask") is None and find_runner("DaskRunner") is None
    done = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", str(tmp_path / "r.yaml"), "--output",
                           str(tmp_path / "out"), "--quiet", "--runner=dask"],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in done.stderr.splitlines() if "apitools" not in line]
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("dsdata: error: unknown --runner 'dask' (runners: FnApiRunner, "), lines
    assert all(runner.name in lines[0] for runner in RUNNERS), lines
    assert not (tmp_path / "out").exists()
