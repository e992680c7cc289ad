"""The house's rules, checked on every module (docs/architecture.md "The house"):

- Beam (`apache_beam`, and dsdata's own Beam side `dsdata.beam`) is imported only under dsdata/beam/
  and, lazily (inside a function), by the launcher: the `dsdata` command (cli.py, commands/) and the
  Python API that starts a run.  Every module is read, functions included, so a lazy import counts.
- Importing any module outside dsdata/beam/ leaves `apache_beam` out of sys.modules (a fresh process).
- The report package builds a run's page without loading Beam.
- No import circle between dsdata's modules, nor between its packages (beam → recipe → beam was one).
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "dsdata"
# The launcher: what a user runs to start or inspect a run.  It may import dsdata.beam (and so Beam),
# but only inside a function, so that `dsdata stages`, `dsdata --help` and the trainer never load it.
LAUNCHERS = {"dsdata/cli.py", "dsdata/__init__.py", "dsdata/api.py"}
LAUNCHER_DIRS = ("dsdata/commands/",)


def _modules() -> dict[str, Path]:
    """Every dsdata module by dotted name (packages by their own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path, name: str | None = None) -> list[tuple[str, bool, int]]:
    """(imported module, at module level?, line) for every import in the file, functions included;
    `importlib.import_module("x")` with a literal name counts as an import of x."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    name = name or ".".join(path.relative_to(REPO).with_suffix("").parts)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    found = []

    def visit(node, top: bool):
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, top, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                found.append((module, top, child.lineno))
                # `from dsdata.beam import run_files` imports the module dsdata.beam.run_files too.
                found.extend((f"{module}.{alias.name}", top, child.lineno) for alias in child.names
                             if f"{module}.{alias.name}" in MODULES)
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                  and child.func.attr == "import_module" and child.args
                  and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)):
                found.append((child.args[0].value, top, child.lineno))
            visit(child, inner)

    visit(tree, True)
    return found


def _is_beam(module: str) -> bool:
    return module == "apache_beam" or module.startswith("apache_beam.") or module == "dsdata.beam" \
        or module.startswith("dsdata.beam.")


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _is_launcher(rel: str) -> bool:
    return rel in LAUNCHERS or rel.startswith(LAUNCHER_DIRS)


def test_beam_is_imported_only_under_dsdata_beam_and_lazily_by_the_launcher():
    wrong = []
    for name, path in MODULES.items():
        rel = _rel(path)
        if rel.startswith("dsdata/beam/"):
            continue
        for module, top, line in _imports(path):
            if not _is_beam(module):
                continue
            if not _is_launcher(rel):
                wrong.append(f"{rel}:{line} imports {module} (Beam lives under dsdata/beam/ only)")
            elif top:
                wrong.append(f"{rel}:{line} imports {module} at module level (the launcher imports Beam "
                             "inside the function that starts a run)")
    assert not wrong, "\n".join(wrong)


def test_the_rule_reader_sees_lazy_and_relative_imports(tmp_path):
    """The check above is only as good as _imports: it must see an import inside a function, a
    relative one and importlib.import_module of a literal name."""
    sample = tmp_path / "probe.py"
    sample.write_text("import json\n\ndef f():\n    from apache_beam.io import filesystems\n"
                      "    from .. import beam\n    import importlib\n    importlib.import_module('apache_beam')\n")
    seen = {(m, top) for m, top, _ in _imports(sample, "dsdata.report.probe")}
    assert ("json", True) in seen
    assert ("apache_beam.io", False) in seen
    assert ("dsdata.beam", False) in seen
    assert ("apache_beam", False) in seen


def test_no_module_outside_beam_loads_beam_when_imported():
    """A fresh interpreter imports every module outside dsdata/beam/ (the launcher included: its
    Beam imports are lazy) and names the first after which apache_beam is in sys.modules."""
    names = [name for name, path in MODULES.items()
             if not _rel(path).startswith("dsdata/beam/") and name != "dsdata.train.__main__"]
    code = (
        "import importlib, json, sys\n"
        "names = json.loads(sys.argv[1]); missing = []\n"
        "for name in names:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        if exc.name and exc.name.split('.')[0] == 'dsdata': raise\n"
        "        missing.append(f'{name}: {exc.name}')\n"
        "        continue\n"
        "    if 'apache_beam' in sys.modules:\n"
        "        print('LOADED-BEAM', name); break\n"
        "print('MISSING', json.dumps(missing))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, json.dumps(names)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED-BEAM" not in done.stdout, done.stdout
    missing = json.loads(done.stdout.split("MISSING", 1)[1])
    # An optional dependency that is not installed is not a reason to skip most modules.
    assert len(missing) <= len(names) // 4, missing


def test_the_report_builds_a_page_without_beam(tmp_path):
    """dsdata.report reads a run's files itself: building report.html of a finished run (here a run
    made by run_recipe in this process) never imports apache_beam."""
    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe

    docs = [{"id": f"d{i}", "text": ("这是第%d个中文句子，内容足够长。" % i) * 8 if i % 2 else f"English text number {i}. " * 20}
            for i in range(30)] + [{"id": "short", "text": "x"}]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in docs) + "\n")
    (tmp_path / "r.yaml").write_text("input: {paths: [in.jsonl]}\nstages:\n  - clean: {}\n  - rules: {}\n")
    out = tmp_path / "out"
    run_recipe(load_recipe(str(tmp_path / "r.yaml")), str(out), [], progress="off")
    (out / "report.html").unlink()
    code = ("import sys; from dsdata.report.page import write_report; path = write_report(sys.argv[1]); "
            "print(path); print('apache_beam' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    path, loaded = done.stdout.strip().splitlines()[-2:]
    assert loaded == "False"
    page = Path(path).read_text(encoding="utf-8")
    assert Path(path) == out / "report.html" and 'id="funnel"' in page and "rules" in page


def test_a_remote_output_without_the_beam_side_is_one_clear_error():
    from dsdata.report.files import RemoteOutputError, files_for

    code = ("from dsdata.report.files import files_for\n"
            "try:\n    files_for('gs://bucket/run')\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.stdout.startswith("RemoteOutputError gs://bucket/run is remote"), done.stdout + done.stderr
    # With the Beam side loaded (as `dsdata run` and `dsdata report gs://…` do), Beam's FileSystems serve it.
    import dsdata.beam.run_files  # noqa: F401

    assert type(files_for("gs://bucket/run")).__name__ == "BeamFiles"
    assert RemoteOutputError.__module__ == "dsdata.report.files"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def _graph(level: str) -> dict[str, set[str]]:
    """dsdata's import graph, every import counted (lazy ones too): by module, or by `unit` (a
    top-level module or subpackage of dsdata, and each subpackage of dsdata/beam, dsdata/train, …)."""

    def unit(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if level == "package" else module

    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        for module, _top, _line in _imports(path):
            if not module.startswith("dsdata"):
                continue
            target = module
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target == "dsdata" or unit(target) == unit(name):
                continue
            graph.setdefault(unit(name), set()).add(unit(target))
    return graph


@pytest.mark.parametrize("level", ["module", "package"])
def test_no_import_circle(level):
    """No module imports one that imports it back, lazily or not, and neither do dsdata's packages
    (dsdata.beam, dsdata.report, dsdata.io, dsdata.recipe, …): arrows point one way."""
    assert _cycles(_graph(level)) == []


def test_the_report_package_imports_nothing_of_the_pipeline():
    """dsdata.report reads a run's files: it imports neither Beam nor the stages, the recipe or the
    readers; only itself and the ground floor (dsdata.core)."""
    wrong = [f"{_rel(path)}:{line} imports {module}" for name, path in MODULES.items() if name.startswith("dsdata.report")
             for module, _top, line in _imports(path)
             if module.startswith("dsdata.") and not module.startswith(("dsdata.report", "dsdata.core"))
             or _is_beam(module)]
    assert not wrong, wrong


# The floors of the house, lowest first: a unit (a top-level module or package of dsdata) imports only
# units on its own floor or below.  `core` is the ground floor; the launchers are the roof.
FLOORS = [
    {"core", "document", "safe_yaml", "stop_signals", "compiled", "native_panics", "model_limits", "models"},
    {"io"},
    {"tokenizer", "clean", "dedup", "shards"},
    {"lm", "relevance", "augment", "train"},
    {"stages"},
    {"runners", "recipe", "collector"},
    {"report"},
    {"beam"},
    {"api", "cli", "commands", "dsdata"},
]


def _floor(module: str) -> int:
    parts = module.split(".")
    unit = parts[1] if len(parts) > 1 else "dsdata"
    for level, units in enumerate(FLOORS):
        if unit in units:
            return level
    raise AssertionError(f"{module}: its unit '{unit}' is on no floor of FLOORS (tests/test_structure.py)")


def test_no_package_imports_a_floor_above_its_own():
    """Shared helpers live on the ground floor (dsdata/core/), never filed under their first user:
    io/, train/, shards/ do not reach up into report/ for a path's display or a progress bar."""
    wrong = []
    for name, path in MODULES.items():
        for module, _top, line in _imports(path):
            if module.startswith("dsdata.") and module.split(".")[1] != "__version__" and _floor(module) > _floor(name):
                wrong.append(f"{_rel(path)}:{line} imports {module} (floor {_floor(module)} above {_floor(name)})")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_packages_private_names():
    """A private name (`_x`) or module (`_x.py`) is used only inside its own package."""
    wrong = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dsdata.")):
                continue
            if node.module.split(".")[:2] == name.split(".")[:2]:
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            private += [part for part in node.module.split(".") if part.startswith("_") and part != "__init__"]
            if private:
                wrong.append(f"{_rel(path)}:{node.lineno} imports {node.module}: {', '.join(private)}")
    assert not wrong, "\n".join(wrong)


def test_no_beam_module_reaches_into_the_dedup_composite():
    """beam/dedup/ is one composite: its siblings in beam/ use shared pieces (spill files, parking)
    from beam/ itself, never its internals; kinds.py names it by its registry row only."""
    wrong = [f"{_rel(path)}:{line} imports {module}" for name, path in MODULES.items()
             if name.startswith("dsdata.beam.") and not name.startswith("dsdata.beam.dedup")
             for module, _top, line in _imports(path) if module.startswith("dsdata.beam.dedup")]
    assert not wrong, wrong


def _string_literals(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.value, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_report_and_the_launcher_spell_no_stage_name():
    """What the report draws of a stage and what a run checks before it starts are declared by the
    stage (Stage.charts, Stage.preflight): report/ and api.py hold no stage's name."""
    from dsdata.stages import REGISTRY

    files = [p for n, p in MODULES.items() if n.startswith("dsdata.report")] + [MODULES["dsdata.api"]]
    wrong = [f"{_rel(path)}:{line} spells {value!r}" for path in files
             for value, line in _string_literals(path) if value in REGISTRY]
    assert not wrong, wrong
