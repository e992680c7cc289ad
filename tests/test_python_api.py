"""The Python API: `dsdata.run()` runs a recipe as `dsdata run` does (the same checks, the same
outputs), returns the stats, and says every problem with one `dsdata.RunError`; `import dsdata`
stays light; the README's example runs as written."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import dsdata
from dsdata.beam.pipeline import run_recipe
from dsdata.io.inputs import InputPathError
from dsdata.recipe import load_recipe
from dsdata.stages import DocumentStage

REPO = Path(__file__).resolve().parents[1]


def _corpus(folder: Path, texts: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)),
                                     encoding="utf-8")


def test_import_dsdata_loads_neither_beam_nor_pyarrow():
    code = ("import sys, dsdata\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'pyarrow', 'torch'))\n"
            "print(heavy, callable(dsdata.run), dsdata.RunError.__name__, callable(dsdata.register_stage))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[] True RunError True"


def test_run_returns_the_stats_json_and_applies_overrides(tmp_path):
    _corpus(tmp_path / "data", ["这是一个中文文档，用来测试语言识别。"])
    (tmp_path / "r.yaml").write_text("input: {paths: [data/in.jsonl]}\nstages:\n  - lang: {keep: [zh], min_score: 0}\n",
                                     encoding="utf-8")
    english = tmp_path / "other.jsonl"
    english.write_text(json.dumps({"id": "o", "text": "This English sentence is given through the inputs argument."})
                       + "\n", encoding="utf-8")
    stats = dsdata.run(tmp_path / "r.yaml", inputs=str(english), output=tmp_path / "out")
    written = json.loads((tmp_path / "out" / "stats.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in stats.items() if k != "seconds"} == written
    assert stats["input"] == 1 and stats["rejected"] == {"lang": {"lang_not_kept": 1}}
    stats = dsdata.run(tmp_path / "r.yaml", inputs=[str(english)], output=tmp_path / "out",
                       overrides={"lang.keep": ["en", "zh"]})
    assert stats["input"] == 1 and stats["kept"] == 1 and stats["ledger_ok"]
    kept = pq.read_table(tmp_path / "out" / "kept").to_pylist()
    assert [(r["id"], r["lang"]) for r in kept] == [("o", "en")]
    stats = dsdata.run(tmp_path / "r.yaml", output=tmp_path / "out")  # the recipe's own input
    assert stats["kept"] == 1 and stats["rejected_total"] == 0


def test_problems_are_one_run_error_with_the_commands_exit_code(tmp_path):
    _corpus(tmp_path, ["a document"])
    (tmp_path / "r.yaml").write_text("input: {paths: [in.jsonl]}\nstages: [no_such_stage]\n", encoding="utf-8")
    with pytest.raises(dsdata.RunError, match="unknown stage 'no_such_stage'") as info:
        dsdata.run(tmp_path / "r.yaml", output=tmp_path / "out")
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    (tmp_path / "ok.yaml").write_text("input: {paths: [in.jsonl]}\nstages: []\n", encoding="utf-8")
    for kwargs, words in [({"overrides": ["lang.min_score=2"]}, "has no stage 'lang'"),
                          ({"inputs": [str(tmp_path / "missing*.jsonl")]}, "no files match input"),
                          ({"max_errors": "lots"}, "max-errors"),
                          ({"beam_args": ["--direct_running_mode=multi_threading"]}, "is refused"),
                          ({"progress": "bars"}, "progress mode must be one of auto, bar, lines, off"),
                          ({"resume": "yes"}, "resume must be True or False")]:
        with pytest.raises(dsdata.RunError, match=words) as info:
            dsdata.run(tmp_path / "ok.yaml", output=tmp_path / "out2", **kwargs)
        assert info.value.exit_code == 2
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()  # refused before OUT was made


class FailsOnX(DocumentStage):
    name = "fails_on_x_for_tests"
    description = "raises on documents holding an x"

    def process(self, doc):
        if "x" in doc.text:
            raise ValueError("this stage cannot read an x")
        return doc


def test_a_run_over_its_error_budget_is_a_run_error_with_exit_code_1(tmp_path):
    dsdata.register_stage(FailsOnX)
    _corpus(tmp_path, ["fine", "has an x", "also fine", "x again"])
    (tmp_path / "r.yaml").write_text(f"input: {{paths: [in.jsonl]}}\nstages: [{FailsOnX.name}]\n", encoding="utf-8")
    with pytest.raises(dsdata.RunError, match="2 records .* failed with an exception") as info:
        dsdata.run(tmp_path / "r.yaml", output=tmp_path / "out", max_errors=1)
    assert info.value.exit_code == 1
    stats = json.loads((tmp_path / "out" / "stats.json").read_text(encoding="utf-8"))  # written all the same
    assert stats["kept"] == 2 and stats["rejected"] == {FailsOnX.name: {"error": 2}}


def test_a_recipes_glob_cannot_read_through_a_link_from_python_either(tmp_path):
    """A link in the recipe's data folder to a file outside it is refused by dsdata.run() and by
    run_recipe() given the loaded recipe: the recipe's globs are link-checked on every path."""
    secret = tmp_path / "elsewhere" / "secret.jsonl"
    _corpus(secret.parent, ["a private document"])
    (secret.parent / "in.jsonl").rename(secret)
    work = tmp_path / "work"
    _corpus(work / "data", ["a public document"])
    os.symlink(secret, work / "data" / "zz.jsonl")
    (work / "r.yaml").write_text("input: {paths: ['data/*.jsonl']}\nstages: []\n", encoding="utf-8")
    with pytest.raises(dsdata.RunError, match="outside the recipe's directory") as info:
        dsdata.run(work / "r.yaml", output=tmp_path / "out")
    assert info.value.exit_code == 2
    with pytest.raises(InputPathError, match="outside the recipe's directory"):
        run_recipe(load_recipe(str(work / "r.yaml")), str(tmp_path / "out2"))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2" / "kept").exists()
    # Given by the caller, the same folder is the caller's choice and is read, the link included.
    stats = dsdata.run(work / "r.yaml", inputs=[str(work / "data")], output=tmp_path / "out3")
    assert stats["kept"] == 2


def _readme_example() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written(tmp_path):
    code = _readme_example()
    assert "dsdata.run(" in code
    shutil.copytree(REPO / "pipelines", tmp_path / "pipelines",
                    ignore=shutil.ignore_patterns("models", "html", "*.py"))
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 0, res.stderr
    outputs = [p for p in tmp_path.iterdir() if (p / "stats.json").is_file()]
    assert len(outputs) == 1
    stats = json.loads((outputs[0] / "stats.json").read_text(encoding="utf-8"))
    assert stats["ledger_ok"] and stats["kept"] > 0 and stats["rejected_total"] > 0
    claimed = re.search(r"# on the samples: (.+)", code).group(1)  # what the README says it prints
    assert res.stdout.strip() == claimed == f"{stats['input']} {stats['kept']} {stats['rejected']}"


def test_unknown_beam_options_are_refused_as_the_cli_refuses_them_and_a_run_prints_no_library_noise(tmp_path):
    """A mistyped option is one RunError with the command's line (Beam would drop it and run); a
    `dsdata run` flag given as a Beam option is refused too; a normal run, API or CLI, prints no
    library warning (Beam's `apitools not found`, logged through the root logger at import)."""
    _corpus(tmp_path, ["one small document for the run"])
    (tmp_path / "r.yaml").write_text("input: {paths: [in.jsonl]}\nstages: [clean]\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cli = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--output", "out", "--ouput=x"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert cli.returncode == 2, cli.stderr
    code = ("import dsdata, sys\n"
            "for args in (['--ouput=x'], ['--output=x'], ['--direct_num_workers']):\n"
            "    try:\n"
            "        dsdata.run('r.yaml', output='out', beam_args=args)\n"
            "    except dsdata.RunError as exc:\n"
            "        print(exc.exit_code, exc)\n"
            "stats = dsdata.run('r.yaml', output='out', beam_args=['--direct_num_workers=1'])\n"
            "print(stats['kept'])\n")
    api = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert api.returncode == 0, api.stderr
    lines = api.stdout.splitlines()
    assert lines[0] == "2 " + cli.stderr.strip().removeprefix("dsdata: error: ") == "2 unknown option --ouput; did you mean --output?"
    assert lines[1].startswith("2 --output is an option of dsdata run, not of Beam")
    assert lines[2] == "2 Beam option --direct_num_workers takes its value after '=': --direct_num_workers=VALUE"
    assert lines[3:] == ["1"] and api.stderr == ""
    cli = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "r.yaml", "--output", "out"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert cli.returncode == 0 and all(ln.startswith("dsdata: ") for ln in cli.stderr.splitlines()), cli.stderr
