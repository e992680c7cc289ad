"""Optional numba kernels: the one rule for whether compiled code is used."""
from __future__ import annotations

import importlib
import os
import sys
import threading
from types import ModuleType

_numba_ready = False
_numba_loading = threading.Lock()


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


def import_compiled(module_name: str) -> ModuleType | bool:
    """The kernel module, or False when numba is not installed or DSDATA_NO_NUMBA=1 asks for the
    pure-Python / numpy path (same results, slower).  Callers cache the answer: importing compiles."""
    if os.environ.get("DSDATA_NO_NUMBA", "") not in ("", "0"):
        return False
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return False
    _load_numba_registries()
    return module
