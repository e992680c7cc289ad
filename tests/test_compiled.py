"""dsdata/compiled.py and setup.py: the kernel modules' exports compiled ahead of time
into dsdata._kernels (built by `pip install`), run without importing numba, with the JIT as the
fallback for a call no exported signature matches and for a kernel module edited since the build."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsdata import compiled
from dsdata.compiled import kernel_modules

REPO = Path(__file__).resolve().parents[1]
HAS_NUMBA = __import__("importlib").util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (the dedup extra)")


def _built() -> bool:
    out = subprocess.run([sys.executable, "-c", "import dsdata._kernels"], capture_output=True, cwd=str(REPO),
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return out.returncode == 0


needs_extension = pytest.mark.skipif(
    not HAS_NUMBA or not _built(),
    reason="dsdata._kernels is not built: `pip install -e .` (or `python setup.py build_ext --inplace`) builds it")


def _python(code: str, *args: str, env: dict | None = None, cwd: Path = REPO) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=str(cwd),
                         timeout=600, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_signature_names_its_arrays_and_scalars():
    assert compiled.parse_signature(
        "Tuple((int32[:, ::1], uint64[::1]))(int32[::1], uint16[:, ::1], int64, boolean[::1], float32)"
    ) == [("int32", 1), ("uint16", 2), None, ("bool", 1), None]
    assert compiled.parse_signature("UniTuple(int64, 3)()") == []
    with pytest.raises(ValueError, match="C-contiguous"):
        compiled.parse_signature("int64(uint8[:])")


def test_every_kernel_module_is_found_and_keyed_apart():
    names = [name for name, _path in kernel_modules()]
    assert {"dsdata.stages.rules_kernels", "dsdata.stages.pii_kernels", "dsdata.stages.fasttext_kernels",
            "dsdata.dedup.numba_kernels", "dsdata.clean.html_kernels"} <= set(names)
    assert len({compiled.module_key(name) for name in names}) == len(names)


_RUNS = r"""
import json, sys
from pathlib import Path
from dsdata.cli import main
rcs = [main(["run", f"pipelines/{recipe}.yaml", "--output", str(Path(sys.argv[1]) / recipe), "--quiet"])
       for recipe in ("pretrain", "extract")]
from dsdata.clean import html  # its kernel scans only past 8 MB of pages: called here on one
names, longest = html._scan_compiled(html._html_kernels(), Path("pipelines/samples/html/py-library-bisect.html").read_bytes(), 64)
from dsdata import compiled
print(json.dumps({"rcs": rcs, "numba": "numba" in sys.modules, "ahead": compiled._aot_modules,
                  "scan": [sorted(names or ()), longest]}))
"""


@needs_extension
def test_real_runs_use_every_kernel_ahead_of_time_without_numba_and_write_what_the_jit_writes(tmp_path):
    """pretrain.yaml, extract.yaml (HTML pages) and the HTML tag scan: every kernel module runs from
    the extension, numba is never imported, and the outputs equal those of the same runs compiled
    just in time."""
    import pyarrow.parquet as pq

    ahead = _python(_RUNS, str(tmp_path / "aot"))
    jit = _python(_RUNS, str(tmp_path / "jit"), env={"DSDATA_AOT": "0"})
    assert ahead["rcs"] == jit["rcs"] == [0, 0]
    assert ahead["numba"] is False and jit["numba"] is True
    assert ahead["ahead"] == dict.fromkeys(ahead["ahead"], True)
    assert set(ahead["ahead"]) == {name for name, _path in kernel_modules()}  # all five are exercised
    assert not any(jit["ahead"].values()) and ahead["scan"] == jit["scan"] and len(ahead["scan"][0]) > 10
    for recipe in ("pretrain", "extract"):
        for table in ("kept", "rejected"):
            got = pq.read_table(tmp_path / "aot" / recipe / table).to_pylist()
            assert got == pq.read_table(tmp_path / "jit" / recipe / table).to_pylist(), (recipe, table)
        stats = [json.loads((tmp_path / side / recipe / "stats.json").read_text()) for side in ("aot", "jit")]
        for s in stats:
            s.pop("stage_time")  # CPU-seconds
        assert stats[0] == stats[1]


@needs_extension
def test_a_call_no_exported_signature_matches_compiles_just_in_time():
    """rules_kernels exports prescan for UTF-32 code points only: one-byte code points take the JIT,
    with the same counts; numba loads at that call, not before."""
    code = r"""
import json, sys
import numpy as np
from dsdata.stages.rules import _compiled
k, table = _compiled()
text = "Hello, world: 12 words and 中文字符 here"
wide = k.prescan(np.frombuffer(text.encode("utf-32-le"), np.uint32), table)
before = "numba" in sys.modules
ascii_text = text.encode("ascii", "ignore")
narrow = k.prescan(np.frombuffer(ascii_text, np.uint8), table)
wide_ascii = k.prescan(np.frombuffer(ascii_text.decode().encode("utf-32-le"), np.uint32), table)
print(json.dumps({"before": before, "after": "numba" in sys.modules, "same": list(narrow) == list(wide_ascii),
                  "wide": list(wide)}))
"""
    seen = _python(code)
    assert seen["before"] is False and seen["after"] is True and seen["same"] is True
    assert seen["wide"][0] > 0


@needs_extension
def test_a_kernel_module_edited_since_the_build_compiles_just_in_time(tmp_path):
    """A kernel module whose source no longer matches the digest the extension recorded is compiled
    by numba, not run from stale machine code; the loop itself gives what the extension gives."""
    edited = tmp_path / "numba_kernels.py"
    edited.write_text((REPO / "dsdata" / "dedup" / "numba_kernels.py").read_text(encoding="utf-8")
                      + "\n# edited after the build\n", encoding="utf-8")
    code = r"""
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("dsdata.dedup.numba_kernels", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
from dsdata import compiled
import dsdata._kernels as ext
rng = np.random.default_rng(7)
x = rng.integers(0, 2**32, 300, dtype=np.uint64).astype(np.uint32)
offsets = np.array([0, 120, 120, 300], np.int64)
a, b = (rng.integers(1, 2**32, 16, dtype=np.uint64).astype(np.uint32) for _ in range(2))
jit, aot = (np.zeros((3, 16), np.uint32) for _ in range(2))
module.signatures(x, offsets, a, b, jit)
ext.dedup_numba_kernels__signatures__0(x, offsets, a, b, aot)
print(json.dumps({"ahead": compiled._aot_holds(spec.name), "numba": "numba" in sys.modules,
                  "same": bool((jit == aot).all()), "filled": bool(jit[0].any())}))
"""
    assert _python(code, str(edited)) == {"ahead": False, "numba": True, "same": True, "filled": True}


@needs_numba
def test_setup_compiles_an_extension_a_process_loads_without_numba(tmp_path):
    """setup.py's build_ext: one extension, each kernel module's digest recorded, loaded by a process
    that never imports numba (pip runs the same command when it installs dsdata)."""
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                            "--build-temp", str(tmp_path / "temp")], capture_output=True, text=True, cwd=str(REPO),
                           timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert built.returncode == 0, built.stderr[-3000:]
    (so,) = (tmp_path / "lib" / "dsdata").glob("_kernels*")
    assert f"into {so}" in built.stderr
    code = r"""
import importlib.machinery, importlib.util, json, sys
import numpy as np
loader = importlib.machinery.ExtensionFileLoader("dsdata._kernels", sys.argv[1])
ext = importlib.util.module_from_spec(importlib.util.spec_from_loader("dsdata._kernels", loader))
loader.exec_module(ext)
from dsdata import compiled
digests = {name: getattr(ext, compiled.module_key(name) + "__digest")() == compiled.source_digest(path)
           for name, path in compiled.kernel_modules()}
table = np.zeros(65536, np.uint16)
counts = ext.stages_rules_kernels__prescan__0(np.frombuffer("ab 中".encode("utf-32-le"), np.uint32), table)
print(json.dumps({"digests": digests, "numba": "numba" in sys.modules, "counts": list(counts)}))
"""
    seen = _python(code, str(so))
    assert seen["digests"] == dict.fromkeys(seen["digests"], True) and len(seen["digests"]) >= 5
    assert seen["numba"] is False and len(seen["counts"]) == 3
