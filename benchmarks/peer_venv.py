"""The peers' own virtual environment for the side-by-side benchmarks (filters, langid, clean).

datatrove, spaCy (its word tokenizer), resiliparse and pycld2 pin versions that do not fit Apache
Beam's, so they live in a separate venv that the benchmarks create on first use (one `pip install`,
a few minutes, needs the package index once) and then reuse.  Location: $DSDATA_PEER_VENV, else
../.cache/datatrove-venv beside the checkout.  Code runs there as a child process; its CPU time is
read from the parent's RUSAGE_CHILDREN, the same way the `dsdata run` children are timed.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("DSDATA_PEER_VENV") or REPO.parent / ".cache" / "datatrove-venv")
# module to import → pip requirement.  datatrove's [processing] extra brings fasttext-numpy2-wheel.
PACKAGES = {
    "datatrove": "datatrove[processing]==0.10.1",
    "spacy": "spacy",
    "resiliparse": "resiliparse",
    "pycld2": "pycld2",
    "orjson": "orjson",  # datatrove's JsonlReader
}


def python() -> Path:
    """The venv's interpreter, creating the venv and installing what is missing."""
    exe = VENV / "bin" / "python"
    if not exe.exists():
        print(f"creating the peers' venv at {VENV} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    probe = "import importlib.util, json, sys; print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))"
    missing = json.loads(subprocess.run([str(exe), "-c", probe, *PACKAGES], capture_output=True, text=True,
                                        check=True).stdout)
    if missing:
        print(f"installing into {VENV}: {', '.join(PACKAGES[m] for m in missing)}", file=sys.stderr)
        subprocess.run([str(exe), "-m", "pip", "install", "-q", *(PACKAGES[m] for m in missing)], check=True)
    return exe


def timed_child(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """(completed process, CPU seconds of the child and its children, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        what = " ".join(str(c) for c in cmd[:4] if "\n" not in str(c))
        raise RuntimeError(f"{what} … failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def dsdata_env(**extra: str) -> dict[str, str]:
    """The environment of a timed `python -m dsdata.cli` child: this checkout's dsdata, run as an
    installed copy runs, with its bytecode cached.  This machine sets PYTHONDONTWRITEBYTECODE=1, so
    every start would compile dsdata's ~100 source files again (~0.1 CPU-s that no pip-installed
    dsdata, and no checkout under Python's defaults, pays); the first call byte-compiles them
    (dsdata/**/__pycache__, ignored by git) and the children read that cache."""
    global _compiled
    if not _compiled:
        import compileall

        compileall.compile_dir(str(REPO / "dsdata"), quiet=1)
        _compiled = True
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


_compiled = False


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])
