"""dsdata's build: the Python package (pyproject.toml) and its compiled kernels, dsdata._kernels.

Every function a kernel module (`dsdata/**/*_kernels.py`) marks with `dsdata.compiled.export(signature,
...)` is compiled ahead of time with numba's pycc (numba is a build requirement, not a run-time one),
once per signature, with a digest of the module's source that tells a later process whether the
extension still matches it.  The code is for this machine's CPU, as numba's JIT makes it
(DSDATA_KERNELS_CPU names another, e.g. x86-64-v2 for a wheel run elsewhere).  Where the build fails
(no C compiler) the install goes on without it and says why: numba then compiles the kernels just in
time, as in a checkout.  Rebuild in place: `python setup.py build_ext --inplace` (or reinstall).
"""
import importlib.util
import os
import sys
import time
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def build_kernels(target: Path) -> None:
    os.environ["DSDATA_AOT"] = "0"  # the kernel modules as numba dispatchers, with their signatures
    sys.path.insert(0, str(HERE))
    from numba.pycc import CC

    from dsdata import compiled

    started, exported = time.monotonic(), 0
    cc = CC(target.name.partition(".")[0], source_module=compiled)
    cc.output_dir, cc.output_file = str(target.parent), target.name
    cc.target_cpu = os.environ.get("DSDATA_KERNELS_CPU", "host")
    for name, path in compiled.kernel_modules():
        spec = importlib.util.spec_from_file_location(name, path)  # the file alone: not its package's __init__
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        key = compiled.module_key(name)
        for attr, value in sorted(vars(module).items()):
            for i, signature in enumerate(getattr(value, "aot_signatures", ())):
                cc.export(f"{key}__{attr}__{i}", signature)(value.py_func)
                exported += 1
        namespace: dict = {}
        exec(f"def digest():\n    return {compiled.source_digest(path)}", namespace)
        cc.export(f"{key}__digest", "int64()")(namespace["digest"])
    cc.compile()
    print(f"dsdata: compiled {exported} kernel signatures into {target} in {time.monotonic() - started:.0f} s",
          file=sys.stderr)


class BuildKernels(build_ext):
    def build_extension(self, ext):
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            build_kernels(target)
        except Exception as exc:  # a build without numba or a C compiler: the JIT path
            print(f"dsdata: compiled kernels not built ({type(exc).__name__}: {exc}); "
                  "numba compiles them just in time instead", file=sys.stderr)


setup(ext_modules=[Extension("dsdata._kernels", sources=[])], cmdclass={"build_ext": BuildKernels})
