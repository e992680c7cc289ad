"""Hostile recipes and user mistakes end in one line; a recipe cannot make Beam run a command; OUT
is locked while a run writes it."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsdata.cli import main
from dsdata.io.outlock import LOCK_NAME, output_lock
from dsdata.recipe import RecipeError, load_recipe

REPO = Path(__file__).resolve().parents[1]


def _cli(args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _one_error_line(proc):
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "apitools" not in ln]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("dsdata: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def _workdir(tmp_path, beam_yaml="", docs=3):
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": f"document {i} has some words"}) + "\n" for i in range(docs)),
        encoding="utf-8")
    (tmp_path / "r.yaml").write_text(f"input: {{paths: [in.jsonl]}}\noutput: out\nstages: []\n{beam_yaml}",
                                     encoding="utf-8")
    return tmp_path


# ---------------------------------------------------------------------------- recipes run no code


def test_recipe_cannot_start_a_subprocess_environment(tmp_path):
    marker = tmp_path / "MARKER"
    beam = ("beam:\n  runner: PortableRunner\n  job_endpoint: embed\n"
            "  environment_type: 'beam:env:harness_subprocess_python:v1'\n"
            f"  environment_config: 'touch {marker}'\n")
    work = _workdir(tmp_path, beam)
    line = _one_error_line(_cli(["run", "r.yaml", "--quiet"], cwd=work, timeout=300))
    assert "runner 'PortableRunner' starts programs" in line and "--runner=PortableRunner" in line
    assert not marker.exists()
    # Without the runner line the environment options are refused by name.
    (work / "r.yaml").write_text((work / "r.yaml").read_text().replace("  runner: PortableRunner\n", ""))
    line = _one_error_line(_cli(["run", "r.yaml", "--quiet"], cwd=work, timeout=300))
    assert "may not be set in a recipe" in line and "job_endpoint" in line
    assert not marker.exists()


def test_recipe_cannot_start_worker_processes(tmp_path):
    path = _workdir(tmp_path, "beam:\n  direct_running_mode: multi_processing\n  direct_num_workers: 2\n") / "r.yaml"
    with pytest.raises(RecipeError, match="'multi_processing' starts worker processes"):
        load_recipe(str(path))
    path = _workdir(tmp_path, "beam:\n  direct_running_mode: in_memory\n") / "r.yaml"
    assert load_recipe(str(path)).beam_args == ["--direct_running_mode=in_memory"]


def test_recipe_direct_runner_runs_in_this_process(tmp_path):
    # Beam's DirectRunner would try Prism first (a download, then a binary): a recipe's
    # DirectRunner is the in-process FnApiRunner, and the run starts no process at all.
    work = _workdir(tmp_path, "beam:\n  runner: DirectRunner\n")
    proc = _cli(["run", "r.yaml", "--quiet"], cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "prism" not in proc.stderr.lower()
    assert json.loads((work / "out" / "stats.json").read_text())["input"] == 3


_REFUSED_OPTIONS = [
    ("environment_type", "PROCESS"), ("environment_config", "{\"command\": \"/bin/sh\"}"),
    ("environment_options", "process_command=/bin/sh"), ("sdk_container_image", "evil/image"),
    ("job_endpoint", "localhost:8099"), ("flink_job_server_jar", "x.jar"), ("prism_location", "./prism"),
    ("setup_file", "./setup.py"), ("requirements_file", "req.txt"), ("extra_packages", "x.tar.gz"),
    ("sdk_location", "x.tar.gz"), ("pickle_library", "dill"), ("temp_location", "/tmp"),
]
# Prism runs a binary from Beam's download cache, Flink and Spark a job-server jar: a shared file
# may not start them; the command line may.
_PROGRAM_RUNNERS = ["PrismRunner", "prism", "FlinkRunner", "SparkRunner", "PortableRunner", "DataflowRunner",
                    "InteractiveRunner"]


@pytest.mark.parametrize("line, message", [
    *[(f"{option}: {json.dumps(value)}", f"beam option '{option}' may not be set in a recipe")
      for option, value in _REFUSED_OPTIONS],
    *[(f"runner: {runner}", f"runner '{runner}' starts programs.*--runner={runner} on the command line")
      for runner in _PROGRAM_RUNNERS],
])
def test_recipe_beam_options_outside_the_allowlist_are_refused(tmp_path, line, message):
    path = _workdir(tmp_path, f"beam:\n  {line}\n") / "r.yaml"
    with pytest.raises(RecipeError, match=message):
        load_recipe(str(path))


def test_recipe_runner_must_be_a_runner_name(tmp_path):
    path = _workdir(tmp_path, "beam:\n  runner: os.system\n") / "r.yaml"
    with pytest.raises(RecipeError, match="not one of Beam's runners by name"):
        load_recipe(str(path))
    path = _workdir(tmp_path, "beam:\n  runner: DirectRunner\n  direct_num_workers: 2\n") / "r.yaml"
    assert load_recipe(str(path)).beam_args == [
        "--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner", "--direct_num_workers=2"]


def test_yaml_alias_bomb_is_refused_before_expansion(tmp_path):
    levels = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        levels.append(f"a{i}: &a{i} [{', '.join([prev] * 9)}]")
    (tmp_path / "bomb.yaml").write_text("\n".join(levels) + "\nstages: []\n", encoding="utf-8")
    line = _one_error_line(_cli(["run", "bomb.yaml"], cwd=tmp_path))
    assert "alias" in line


@pytest.mark.parametrize("body, needle", [
    ("name: " + "x" * (2 << 20) + "\n", "at most"),
    ("name: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested too deeply"),
])
def test_oversized_and_overdeep_yaml_is_one_line(tmp_path, body, needle):
    (tmp_path / "big.yaml").write_text(body, encoding="utf-8")
    with pytest.raises(RecipeError, match=needle):
        load_recipe(str(tmp_path / "big.yaml"))


# ------------------------------------------------------------------------------ one-line errors


@pytest.mark.parametrize("runner, needle", [
    ("NoSuchRunner", "unknown --runner 'NoSuchRunner'"),
    ("no_such_pkg.mod.Runner", "cannot import no_such_pkg.mod"),
    ("json.JSONDecoder", "not a Beam PipelineRunner class"),
    pytest.param("InteractiveRunner", "needs a Beam extra that is not installed",
                 marks=pytest.mark.skipif(importlib.util.find_spec("pandas") is not None,
                                          reason="Beam's InteractiveRunner imports here (pandas installed)")),
])
def test_unknown_runner_is_one_line(tmp_path, runner, needle):
    work = _workdir(tmp_path)
    assert needle in _one_error_line(_cli(["run", "r.yaml", f"--runner={runner}"], cwd=work))


def test_output_that_is_or_is_under_a_file_is_one_line(tmp_path):
    work = _workdir(tmp_path)
    (work / "afile").write_text("x")
    assert "is a file, not a directory" in _one_error_line(_cli(["run", "r.yaml", "--output", "afile"], cwd=work))
    line = _one_error_line(_cli(["run", "r.yaml", "--output", "afile/sub/out"], cwd=work))
    assert "afile is a file" in line


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a read-only mount")
def test_output_on_a_read_only_file_system_is_one_line(tmp_path):
    work = _workdir(tmp_path)
    (work / "ro").mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o ro none {work / 'ro'}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no user namespaces with mount here")
    cmd = (f"mount -t tmpfs -o ro none {work / 'ro'} && cd {work} && "
           f"PYTHONPATH={REPO} {sys.executable} -m dsdata.cli run r.yaml --output ro/out")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    line = _one_error_line(proc)
    assert "cannot be created" in line and "Read-only file system" in line


def test_multi_threading_mode_is_refused_with_the_reason(tmp_path):
    work = _workdir(tmp_path)
    line = _one_error_line(_cli(["run", "r.yaml", "--direct_running_mode=multi_threading"], cwd=work))
    assert "multi_threading is refused" in line and "loses records" in line


# ----------------------------------------------------------------------------------- the lock


def test_second_run_into_a_locked_output_is_refused(tmp_path, capsys):
    work = _workdir(tmp_path)
    out = work / "out"
    out.mkdir()
    with output_lock(str(out)):
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid() and holder["host"]
        rc = main(["run", str(work / "r.yaml"), "--output", str(out), "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "another run is writing" in err and f"pid {os.getpid()}" in err
    assert not (out / "stats.json").exists()
    assert not (out / LOCK_NAME).exists()  # released when the holder finished


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    work = _workdir(tmp_path)
    out = work / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "started": "then"}))
    assert main(["run", str(work / "r.yaml"), "--output", str(out), "--quiet"]) == 0
    assert json.loads((out / "stats.json").read_text())["kept"] == 3
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("body, needle", [
    ("input: {paths: 5}\n", "input.paths must be"),
    ("input: 7\n", "'input' must be a mapping"),
    ("input: {paths: [[a.jsonl]]}\n", "input.paths must be"),
    ("input: {paths: [a.jsonl], format: [1]}\n", "input.format must be a string"),
    ("input: {paths: [a.jsonl], format: xml}\n", "input.format 'xml' is not one of"),
    ("input: {paths: [a.jsonl], text_field: {a: 1}}\n", "input.text_field must be a string"),
])
def test_wrong_typed_recipe_input_is_one_line(tmp_path, body, needle):
    (tmp_path / "r.yaml").write_text(body, encoding="utf-8")
    with pytest.raises(RecipeError, match=needle):
        load_recipe(str(tmp_path / "r.yaml"))


def test_set_input_format_is_checked_before_the_run(tmp_path):
    work = _workdir(tmp_path)
    assert "is not one of" in _one_error_line(_cli(["run", "r.yaml", "--set", "input.format=xml"], cwd=work))


def test_a_file_of_unknown_format_in_a_glob_is_a_row_not_a_crash(tmp_path):
    from dsdata.io.readers import read_local

    (tmp_path / "notes.rtf").write_text("not data")  # .txt and .md are the text format now
    (row,) = read_local(str(tmp_path / "notes.rtf"))
    assert row.reason == "unknown_format" and "cannot tell the format" in row.detail


@pytest.mark.parametrize("args", [["--help"], ["stages"]])
def test_output_into_a_closed_pipe_is_exit_141_without_a_traceback(args):
    """`dsdata --help | head -1` where head has already left: every write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "dsdata.cli", *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr
