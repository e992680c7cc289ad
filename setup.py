"""dsdata's build: the Python package (pyproject.toml) and its compiled kernels, dsdata._kernels.

dsdata/compiled_build.py compiles the kernel modules' exported loops ahead of time with numba (a
build requirement) and the C compiler.  Where that fails the install goes on without them and says
why: numba then compiles the kernels just in time, as in a checkout (docs/architecture.md).
"""
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildKernels(build_ext):
    def build_extension(self, ext):
        target = Path(self.get_ext_fullpath(ext.name))
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        try:
            from dsdata.compiled_build import build

            target.parent.mkdir(parents=True, exist_ok=True)
            built = build(target.parent, log=lambda line: print(line, file=sys.stderr))
            if built != target:
                built.replace(target)
        except Exception as exc:  # a build without numba or a C compiler: the JIT path
            print(f"dsdata: compiled kernels not built ({type(exc).__name__}: {exc}); "
                  "numba compiles them just in time instead", file=sys.stderr)


setup(ext_modules=[Extension("dsdata._kernels", sources=[])], cmdclass={"build_ext": BuildKernels})
