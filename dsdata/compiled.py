"""Optional numba kernels: the one rule for whether compiled code is used."""
from __future__ import annotations

import importlib
import os
from types import ModuleType


def import_compiled(module_name: str) -> ModuleType | bool:
    """The kernel module, or False when numba is not installed or DSDATA_NO_NUMBA=1 asks for the
    pure-Python / numpy path (same results, slower).  Callers cache the answer: importing compiles."""
    if os.environ.get("DSDATA_NO_NUMBA", "") not in ("", "0"):
        return False
    try:
        return importlib.import_module(module_name)
    except ImportError:
        return False
