"""Stages from outside dsdata: a real distribution declaring the `dsdata.stages` entry-point group is
pip-installed (into a --target folder put on PYTHONPATH, so importlib.metadata finds its
.dist-info), then named by a recipe that `dsdata run` runs in a subprocess; `register_stage` does
the same from Python.  A broken plugin, and one taking a built-in's name, are one line each and
leave every other stage usable."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsdata.stages import BatchStage, CorpusStage, DocumentStage, StageConfigError, register_stage, stage_class
from dsdata.stages.plugins import CustomStages

REPO = Path(__file__).resolve().parents[1]

def _readme_stage() -> str:
    """The custom stage the README shows (its section's Python block), as a plug-in's module."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Custom stages"):]
    return section[section.index("```python\n") + len("```python\n"):section.index("```\n", section.index("```python"))]


STAGE_MODULE = _readme_stage()  # the README's example is what these tests install and run


def _distribution(root: Path, name: str, module: str, source: str, entry_points: dict[str, str]) -> Path:
    src = root / name
    src.mkdir()
    (src / f"{module}.py").write_text(source, encoding="utf-8")
    eps = "\n".join(f'{key} = "{value}"' for key, value in entry_points.items())
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "0.1"

        [tool.setuptools]
        py-modules = ["{module}"]

        [project.entry-points."dsdata.stages"]
        """) + eps + "\n", encoding="utf-8")
    return src


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """PYTHONPATH with three installed distributions: `dsdata-drop-short` (a working stage),
    `dsdata-broken-stages` (one entry point whose module fails to import, one taking 'clean') and
    `dsdata-exiting-stage` (a module that calls sys.exit(0) when imported)."""
    root = tmp_path_factory.mktemp("plugins")
    good = _distribution(root, "dsdata-drop-short", "drop_short_stage", STAGE_MODULE,
                         {"drop_short": "drop_short_stage:DropShortStage"})
    broken = _distribution(root, "dsdata-broken-stages", "broken_stage",
                           "import no_such_module_for_dsdata_tests\n",
                           {"broken": "broken_stage:Broken", "clean": "drop_short_stage:DropShortStage"})
    exiting = _distribution(root, "dsdata-exiting-stage", "exiting_stage", "import sys\nsys.exit(0)\n",
                            {"exits": "exiting_stage:Exits"})
    target = root / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(target), str(good), str(broken), str(exiting)],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0 and "No module named 'setuptools" in res.stderr:
        pytest.skip("setuptools is not installed: the test's stage package cannot be built")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in target.glob("*.dist-info")) == [
        "dsdata_broken_stages-0.1.dist-info", "dsdata_drop_short-0.1.dist-info", "dsdata_exiting_stage-0.1.dist-info"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(REPO)]))
    return env


def _dsdata(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_an_installed_stage_is_listed_and_broken_plugins_are_one_line_each(plugin_env, tmp_path):
    res = _dsdata(["stages"], plugin_env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "drop_short: reject documents under min_chars characters  [from drop_short_stage]" in res.stdout
    assert "    min_chars = 20  (" in res.stdout and "adds columns: chars (int64)" in res.stdout
    assert "clean: " in res.stdout and "dedup: " in res.stdout  # the built-ins are all still there
    warnings = [line for line in res.stderr.splitlines() if line.startswith("dsdata: warning:")]
    assert len(warnings) == 3, res.stderr
    assert "Traceback" not in res.stderr
    broken = next(w for w in warnings if "'broken'" in w)
    assert "distribution 'dsdata-broken-stages 0.1'" in broken
    assert "ModuleNotFoundError: No module named 'no_such_module_for_dsdata_tests'" in broken
    taken = next(w for w in warnings if "'clean'" in w)
    assert "distribution 'dsdata-broken-stages 0.1' is refused: a built-in stage has that name" in taken
    exits = next(w for w in warnings if "'exits'" in w)
    assert "distribution 'dsdata-exiting-stage 0.1' cannot be loaded (exiting_stage:Exits): SystemExit" in exits


def test_a_recipe_runs_an_installed_stage_by_its_name(plugin_env, tmp_path):
    texts = ["short", "a document long enough to be kept", "tiny", "another document that is long enough"]
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    (tmp_path / "r.yaml").write_text(
        "input: {paths: [in.jsonl]}\nstages:\n  - clean: {}\n  - drop_short: {min_chars: 10}\n", encoding="utf-8")
    res = _dsdata(["run", "r.yaml", "--output", "out", "--set", "drop_short.min_chars=12"], plugin_env, tmp_path)
    assert res.returncode == 0, res.stderr
    stats = json.loads((tmp_path / "out" / "stats.json").read_text(encoding="utf-8"))
    assert stats["input"] == 4 and stats["kept"] == 2 and stats["ledger_ok"]
    assert stats["rejected"] == {"drop_short": {"too_short": 2}}
    kept = pq.read_table(tmp_path / "out" / "kept").to_pylist()
    assert sorted((r["id"], r["chars"]) for r in kept) == [("d1", len(texts[1])), ("d3", len(texts[3]))]
    rejected = pq.read_table(tmp_path / "out" / "rejected").to_pylist()
    assert sorted((r["id"], r["stage"], r["reason"], r["detail"]) for r in rejected) == [
        ("d0", "drop_short", "too_short", "5"), ("d2", "drop_short", "too_short", "4")]


@pytest.mark.parametrize("stage, words", [
    ("broken", "stage 'broken' of distribution 'dsdata-broken-stages 0.1' cannot be loaded"),
    # sys.exit(0) at import ended the run with exit 0, no output and no message
    ("exits", "stage 'exits' of distribution 'dsdata-exiting-stage 0.1' cannot be loaded (exiting_stage:Exits): "
              "SystemExit: 0")])
def test_a_recipe_naming_a_broken_plugin_stops_in_one_line(plugin_env, tmp_path, stage, words):
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")
    (tmp_path / "r.yaml").write_text(f"input: {{paths: [in.jsonl]}}\nstages: [{stage}]\n", encoding="utf-8")
    res = _dsdata(["run", "r.yaml", "--output", "out"], plugin_env, tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "Traceback" not in res.stderr
    assert words in res.stderr
    assert not (tmp_path / "out").exists()


class Upper(DocumentStage):
    name = "upper_for_tests"
    description = "upper-cases the text"

    def process(self, doc):
        doc.text = doc.text.upper()
        return doc


def test_register_stage_refuses_what_cannot_be_a_custom_stage():
    registry = CustomStages({"clean": "dsdata.stages.clean:CleanStage"}, entry_points=list)
    assert registry.register(Upper) is Upper
    assert registry.get("upper_for_tests") is Upper

    class Clean(Upper):
        name = "clean"

    class Corpus(CorpusStage):
        name = "corpus_for_tests"

        def transform_config(self):
            return {}

    class Dotted(Upper):
        name = "has.dot"

    class Again(Upper):
        pass

    class BadBatch(BatchStage):  # a batch size as a string failed mid-run
        name = "bad_batch_for_tests"
        batch_max = "64"

        def process_batch(self, docs):
            return docs

    class BadAnnotation(Upper):  # a column type that is no Arrow type failed the kept/ writer
        name = "bad_annotation_for_tests"
        annotations = {"score": int}

    class BadErrors(Upper):  # a non-class failed the per-record error rule itself
        name = "bad_errors_for_tests"
        environment_errors = ("OSError",)

    for cls, words in [(Clean, "a built-in stage has that name"), (Corpus, "is a CorpusStage"),
                       (Dotted, "must be a name such as"), (Again, "already registered for"), (int, "not a stage class"),
                       (BadBatch, "batch_min and batch_max must be whole numbers"),
                       (BadAnnotation, "annotations must map column names to pyarrow types"),
                       (BadErrors, "environment_errors must be a tuple of exception classes")]:
        with pytest.raises(StageConfigError, match=words):
            registry.register(cls)


class FakeEntryPoint:
    """What importlib.metadata gives for one entry point: a name, a value, its distribution, load()."""

    def __init__(self, name, value, dist_name, target):
        self.name, self.value, self.target = name, value, target
        self.dist = type("Dist", (), {"name": dist_name, "version": "1.0"})()

    def load(self):
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def test_entry_points_taking_a_used_or_reserved_name_are_refused_and_the_first_one_stays():
    found = [FakeEntryPoint("upper_for_tests", "a:Upper", "first", Upper),
             FakeEntryPoint("upper_for_tests", "b:Other", "second", Upper),
             FakeEntryPoint("read", "c:Upper", "third", Upper),
             FakeEntryPoint("lang", "d:Upper", "fourth", Upper),
             FakeEntryPoint("boom", "e:Boom", "fifth", RuntimeError("model file missing\nsecond line"))]
    registry = CustomStages({"lang": "dsdata.stages.lang:LanguageStage"}, entry_points=lambda: found)
    assert registry.get("upper_for_tests") is Upper
    assert registry.get("read") is None and "dsdata reserves that name" in registry.problem("read")
    assert registry.get("boom") is None
    assert registry.problem("boom") == ("stage 'boom' of distribution 'fifth 1.0' cannot be loaded (e:Boom): "
                                        "RuntimeError: model file missing")
    assert registry.names() == ["upper_for_tests"]
    problems = sorted(registry.problems.values())
    assert any("'second 1.0' is refused: distribution 'first 1.0' declares it too" in p for p in problems)
    assert any("'fourth 1.0' is refused: a built-in stage has that name" in p for p in problems)


def test_register_stage_makes_a_class_a_recipe_stage():
    register_stage(Upper)
    assert stage_class("upper_for_tests") is Upper
    assert register_stage(Upper) is Upper  # registering the same class again is harmless
