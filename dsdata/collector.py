"""The cyclic garbage collector in processes that are dsdata's own (`dsdata run`, Beam SDK workers).

Python collects its youngest generation every 700 container objects allocated (more than freed).
One batch of documents makes more than that, so a run collected hundreds of times and found nothing
to free: documents, rows and batches are freed by their reference counts.  Only Python's own default
is raised: a threshold the user set (gc.set_threshold, or 0: collections off) is kept.
"""
from __future__ import annotations

import gc

YOUNG_OBJECTS = 10_000
PYTHON_YOUNG_OBJECTS = 700  # CPython's default threshold0 (3.8 to 3.13)


def collect_young_less() -> None:
    young, *older = gc.get_threshold()
    if young == PYTHON_YOUNG_OBJECTS:
        gc.set_threshold(YOUNG_OBJECTS, *older)
