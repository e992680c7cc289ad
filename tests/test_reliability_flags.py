"""Mistyped flags and hostile recipes end in one line (issue 35, CLI): a dsdata flag Beam does not
know is no longer handed to Beam (which ignored it and ran the default samples into ./out)."""
import json

import pytest

from dsdata.beam.known_options import beam_option_names
from test_reliability_cli import _cli, _one_error_line  # the same subprocess runner and one-line check


def _workdir(tmp_path):
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": f"document {i} has some words"}) + "\n" for i in range(3)))
    (tmp_path / "r.yaml").write_text("input: {paths: [in.jsonl]}\noutput: out\nstages: []\n")
    return tmp_path


@pytest.mark.parametrize("args, suggestion", [
    (["--ouput=DIR"], "--output"),
    (["--ouput", "DIR"], "--output"),
    (["--inptu=x.jsonl"], "--input"),
    (["--max_errors=5"], "--max-errors"),
    (["--direct_num_workres=2"], "--direct_num_workers"),
])
def test_a_mistyped_flag_is_one_line_with_a_suggestion(tmp_path, args, suggestion):
    work = _workdir(tmp_path)
    line = _one_error_line(_cli(["run", "r.yaml", "--quiet", *args], cwd=work))
    assert f"did you mean {suggestion}?" in line, line
    assert not (work / "out").exists() and not (work / "DIR").exists()


def test_a_mistyped_flag_before_the_recipe_is_not_taken_for_a_recipe(tmp_path):
    work = _workdir(tmp_path)
    line = _one_error_line(_cli(["run", "--ouput", "o", "r.yaml"], cwd=work))
    assert "unknown option --ouput; did you mean --output?" in line


def test_beam_and_runner_options_pass_and_a_run_happens(tmp_path):
    work = _workdir(tmp_path)
    proc = _cli(["run", "r.yaml", "--quiet", "--output=o2", "--runner=DirectRunner", "--direct_num_workers=1",
                 "--direct_running_mode=in_memory", "--experiments=beam_fn_api"], cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["kept"] == 3


def test_known_options_cover_every_options_class():
    from apache_beam.options import pipeline_options as po

    names = beam_option_names()
    # Every option a PipelineOptions subclass in Beam's own module declares, found independently.
    for cls in vars(po).values():
        if isinstance(cls, type) and issubclass(cls, po.PipelineOptions) and "_add_argparse_args" in cls.__dict__:
            parser = po._BeamArgumentParser(conflict_handler="resolve", add_help=False)
            cls._add_argparse_args(parser)
            for action in parser._actions:
                for opt in action.option_strings:
                    if opt.startswith("--"):
                        assert opt in names, (cls.__name__, opt)


def test_a_beam_option_with_a_space_separated_value_is_one_line(tmp_path):
    work = _workdir(tmp_path)
    line = _one_error_line(_cli(["run", "r.yaml", "--runner", "DirectRunner"], cwd=work))
    assert "--runner=VALUE" in line


@pytest.mark.parametrize("body", [
    "stages: !!python/object/apply:os.system ['echo hi']\n",
    "input: {paths: [in.jsonl]\n",  # an unclosed flow mapping: PyYAML's error quotes two places
    "stages:\n  - clean: {}\n - rules: {}\n",
])
def test_a_recipe_refusal_is_one_line(tmp_path, body):
    work = _workdir(tmp_path)
    (work / "bad.yaml").write_text(body)
    line = _one_error_line(_cli(["run", "bad.yaml"], cwd=work))
    assert "line " in line and "^" not in line


@pytest.mark.parametrize("args, expected", [
    (["lm", "train", "--corpsu", "c.txt", "--lang", "en", "--out", "m"],
     "dsdata lm train: unknown option --corpsu; did you mean --corpus?"),
    (["tokenizer", "train", "--inptu=x.jsonl", "--out", "t"],
     "dsdata tokenizer train: unknown option --inptu; did you mean --input?"),
    (["shm", "publish", "--nmae", "x", "shards"], "dsdata shm publish: unknown option --nmae; did you mean --name?"),
    (["shards", "info", "--flies", "out"], "dsdata shards: unknown option --flies; did you mean --files?"),
    (["report"], "dsdata report: the following arguments are required: output"),
])
def test_a_sub_commands_mistyped_flag_is_one_line_with_a_suggestion(tmp_path, args, expected):
    """argparse printed its usage first, and took `--corpsu x` for missing arguments."""
    line = _one_error_line(_cli(args, cwd=tmp_path))
    assert line == f"dsdata: error: {expected}", line
    assert not list(tmp_path.iterdir())
