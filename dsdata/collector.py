"""The cyclic garbage collector in processes that are dsdata's own (`dsdata run`, Beam SDK workers):
a batch of documents allocates more than Python's 700-object youngest generation, and documents are
freed by their reference counts, so only Python's default threshold is raised, never the user's.
"""
from __future__ import annotations

import gc

YOUNG_OBJECTS = 10_000
PYTHON_YOUNG_OBJECTS = 700  # CPython's default threshold0 (3.8 to 3.13)


def collect_young_less() -> None:
    young, *older = gc.get_threshold()
    if young == PYTHON_YOUNG_OBJECTS:
        gc.set_threshold(YOUNG_OBJECTS, *older)
