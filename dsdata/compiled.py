"""Compiled kernels: the one rule for whether and how compiled code runs.

A kernel module (`*_kernels.py`) writes its loops for numba with this module's two decorators:
`njit(...)` for a helper and `export(signature, ...)` for a function Python calls, with the numba
signatures it is called with.  Installing dsdata compiles every export ahead of time into one
extension, `dsdata._kernels` (setup.py).  A process that finds it, built from
the kernel module's current source, runs the exports without importing numba: about 105 MB and
1 CPU-s less in each process.  The JIT stays the fallback, with the same loops: for a call whose
arrays match no exported signature, a kernel module edited since the build, a missing extension, or
DSDATA_AOT=0.  DSDATA_NO_NUMBA=1 skips compiled code altogether (callers take their numpy path).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

AOT_EXTENSION = "dsdata._kernels"

_numba_ready = False
_numba_loading = threading.Lock()
_jit_lock = threading.Lock()
_aot: ModuleType | bool | None = None  # the extension, or False
_aot_modules: dict[str, bool] = {}  # kernel module → does the extension hold its current source?


def _load_numba_registries() -> None:
    """Load numba's registries now, scipy.linalg unimportable meanwhile (~0.35 CPU-s, only for the
    np.dot/np.linalg dsdata never compiles).  Other threads wait: half-loaded registries fail to type."""
    global _numba_ready
    if _numba_ready:
        return
    with _numba_loading:
        if _numba_ready:
            return
        blocked = [name for name in ("scipy", "scipy.linalg") if name not in sys.modules][:1]
        for name in blocked:
            sys.modules[name] = None  # an import of it (or below it) raises ImportError
        try:
            from numba.core.compiler_lock import global_compiler_lock
            from numba.core.registry import cpu_target

            with global_compiler_lock:  # and no other compile in this process meanwhile
                cpu_target.typing_context.refresh()
                cpu_target.target_context.refresh()
        finally:
            for name in blocked:
                if name in sys.modules and sys.modules[name] is None:
                    del sys.modules[name]
        _numba_ready = True


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def import_compiled(module_name: str) -> ModuleType | bool:
    """The kernel module, or False when neither the extension nor numba can run it, or DSDATA_NO_NUMBA=1
    asks for the pure-Python / numpy path (same results, slower).  Callers cache the answer."""
    if _flag("DSDATA_NO_NUMBA"):
        return False
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return False
    if not _aot_modules.get(module_name):
        _load_numba_registries()
    return module


def kernel_modules() -> list[tuple[str, str]]:
    """(module name, file) of every kernel module, `dsdata/**/*_kernels.py`, in a stable order."""
    package = Path(__file__).resolve().parent
    return [(".".join(("dsdata", *p.relative_to(package).with_suffix("").parts)), str(p))
            for p in sorted(package.rglob("*_kernels.py"))]


def module_key(module_name: str) -> str:
    """The prefix of a kernel module's names in the extension: dsdata.stages.rules_kernels → stages_rules_kernels."""
    return module_name.removeprefix("dsdata.").replace(".", "_")


def source_digest(path: str) -> int:
    """A kernel module's source as the extension records it (63 bits of its SHA-256)."""
    with open(path, "rb") as f:
        return int.from_bytes(hashlib.sha256(f.read()).digest()[:8], "little") >> 1


def _aot_holds(module_name: str) -> bool:
    """Whether the extension holds `module_name`'s exports compiled from its current source."""
    global _aot
    if module_name not in _aot_modules:
        if _aot is None:
            _aot = False
            if os.environ.get("DSDATA_AOT", "") != "0" and not _flag("DSDATA_NO_NUMBA"):
                try:
                    _aot = importlib.import_module(AOT_EXTENSION)
                except ImportError:
                    pass
        recorded = getattr(_aot, f"{module_key(module_name)}__digest", None)
        path = getattr(sys.modules.get(module_name), "__file__", None)
        _aot_modules[module_name] = bool(recorded and path and recorded() == source_digest(path))
    return _aot_modules[module_name]


def _numba(needed_by: str = "") -> ModuleType:
    try:
        import numba
    except ImportError:
        if not needed_by:
            raise
        raise RuntimeError(f"{needed_by}: a call no compiled signature matches needs numba: pip install numba") from None
    return numba


def _jit_module(module_name: str) -> None:
    """Give `module_name` numba dispatchers in place of its deferred functions, all at once: a
    function numba compiles calls its helpers through the module's globals."""
    numba = _numba(module_name)
    _load_numba_registries()
    namespace = vars(sys.modules[module_name])
    for name, value in list(namespace.items()):
        if isinstance(value, _Deferred) and value.dispatcher is None:
            value.dispatcher = numba.njit(**value.options)(value.py_func)
            namespace[name] = value.dispatcher


class _Deferred:
    """A kernel function in a process running the extension: numba compiles it on its first call."""

    def __init__(self, func, options: dict):
        self.py_func, self.options, self.dispatcher = func, options, None
        self.__name__, self.__doc__, self.__module__ = func.__name__, func.__doc__, func.__module__

    def __call__(self, *args):
        if self.dispatcher is None:
            with _jit_lock:
                _jit_module(self.__module__)
        return self.dispatcher(*args)


_ARRAY = re.compile(r"(\w+)\[([:, 1]+)\]$")


def parse_signature(signature: str) -> list[tuple[str, int] | None]:
    """Each parameter of a numba signature string: (dtype, ndim) of a C-contiguous array, or None
    for a scalar.  "int64(uint32[::1], int64)" → [("uint32", 1), None]."""
    depth, start = 0, None
    for i in range(len(signature) - 1, -1, -1):  # the parameter list: the last top-level (...)
        depth += {")": 1, "(": -1}.get(signature[i], 0)
        if depth == 0:
            start = i
            break
    params, depth, item = [], 0, ""
    for ch in signature[start + 1 : -1] + ",":
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            params.append(item.strip())
            item = ""
        else:
            item += ch
    out = []
    for param in filter(None, params):
        array = _ARRAY.match(param.replace(" ", ""))
        if array and not array.group(2).endswith("::1"):
            raise ValueError(f"{signature!r}: exported arrays are C-contiguous ([::1])")
        out.append(array and ({"boolean": "bool"}.get(array.group(1), array.group(1)), array.group(2).count(",") + 1))
    return out


class _Export(_Deferred):
    """An exported kernel function: the extension's code for the signature the arrays match, else
    the JIT's."""

    def __init__(self, func, options: dict, signatures: tuple[str, ...]):
        super().__init__(func, options)
        import numpy as np

        self._ndarray, self._compiled = np.ndarray, []
        for i, signature in enumerate(signatures):
            arrays = tuple((p, np.dtype(a[0]), a[1]) for p, a in enumerate(parse_signature(signature)) if a)
            self._compiled.append((arrays, getattr(_aot, f"{module_key(func.__module__)}__{func.__name__}__{i}")))

    def __call__(self, *args):
        ndarray = self._ndarray
        for arrays, compiled in self._compiled:
            for p, dtype, ndim in arrays:
                a = args[p] if p < len(args) else None
                if not (type(a) is ndarray and a.dtype == dtype and a.ndim == ndim and a.flags.c_contiguous):
                    break
            else:
                return compiled(*args)
        return super().__call__(*args)


def njit(**options):
    """numba.njit(**options), or its compile deferred to a first call where the extension holds the module."""
    return lambda func: _Deferred(func, options) if _aot_holds(func.__module__) else _numba().njit(**options)(func)


def export(*signatures: str, **options):
    """njit for a function Python calls, with the signatures it is called with (compiled into the
    extension; a call matching none of them compiles just in time)."""
    def decorate(func):
        if _aot_holds(func.__module__):
            return _Export(func, options, signatures)
        dispatcher = _numba().njit(**options)(func)
        dispatcher.aot_signatures = signatures  # what setup.py compiles
        return dispatcher
    return decorate
