"""The C heap (glibc's malloc) of a long run of many short-lived buffers; elsewhere these do nothing."""
from __future__ import annotations

import contextlib
import ctypes
import os

MMAP_THRESHOLD = 1 << 20  # bytes: a block this large or larger is a mapping of its own, unmapped when freed
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def fix_mmap_threshold() -> None:
    """Blocks of MMAP_THRESHOLD or more mapped on their own in this process (mallopt) and in those it
    starts (glibc reads MALLOC_MMAP_THRESHOLD_ as they start), unless the user set the variable.
    glibc's own threshold rises to the size of each such block freed (up to 32 MB), after which they
    come from the heap, whose free space below live chunks stays resident: e2e at 20k in-process
    peaked at ~340 MB with it fixed against ~360 MB, at the same CPU (docs/memory.md)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the system: glibc keeps what Python and Arrow freed (a
    16 MB row group of text read in batches left ~30 MB)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
