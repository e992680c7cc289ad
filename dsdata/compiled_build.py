"""Compile the kernel modules' exports ahead of time into the extension dsdata._kernels.

setup.py runs this when dsdata is installed (numba is then a build requirement only);
`python -m dsdata.compiled_build [DIR]` rebuilds it by hand, by default into the installed package.
A kernel module is any `dsdata/**/*_kernels.py`; each function it marks with
`dsdata.compiled.export(signature, ...)` is compiled once per signature, with a digest of the
module's source that tells a later process whether the extension still matches it.  The code is
generated for this machine's CPU, as numba's JIT does (DSDATA_KERNELS_CPU names another, e.g.
x86-64-v2 for a wheel run elsewhere).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def kernel_modules() -> list[tuple[str, Path]]:
    """(module name, file) of every kernel module in the package, in a stable order."""
    return [(".".join(("dsdata", *p.relative_to(PACKAGE).with_suffix("").parts)), p)
            for p in sorted(PACKAGE.rglob("*_kernels.py"))]


def _load(name: str, path: Path):
    """The module from its file alone (its package's __init__, which may import Beam, is skipped)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build(out_dir: Path | str | None = None, log=print) -> Path:
    """Compile the extension into `out_dir` (default: the package's own folder); its path."""
    os.environ["DSDATA_AOT"] = "0"  # the kernel modules as numba dispatchers, with their signatures
    from numba.pycc import CC

    from dsdata import compiled

    started = time.monotonic()
    cc = CC(compiled.AOT_EXTENSION.rpartition(".")[2], source_module=compiled)
    cc.output_dir = str(out_dir or PACKAGE)
    cc.target_cpu = os.environ.get("DSDATA_KERNELS_CPU", "host")
    exported = 0
    for name, path in kernel_modules():
        key = compiled.module_key(name)
        module = _load(name, path)
        for attr, value in sorted(vars(module).items()):
            for i, signature in enumerate(getattr(value, "aot_signatures", ())):
                cc.export(f"{key}__{attr}__{i}", signature)(value.py_func)
                exported += 1
        namespace: dict = {}
        exec(f"def digest():\n    return {compiled.source_digest(str(path))}", namespace)
        cc.export(f"{key}__digest", "int64()")(namespace["digest"])
    cc.compile()
    target = Path(cc.output_dir) / cc.output_file
    log(f"dsdata: compiled {exported} kernel signatures into {target} in {time.monotonic() - started:.0f} s")
    return target


if __name__ == "__main__":
    if len(sys.argv) > 2 or sys.argv[1:2] in (["-h"], ["--help"]):
        print("usage: python -m dsdata.compiled_build [DIR]", file=sys.stderr)
        sys.exit(2)
    build(sys.argv[1] if len(sys.argv) > 1 else None)
