"""Dedup on Beam: the composite (composite.py), the spill files it parks documents in (spill.py), the
URL and line/span steps (spans.py), the index steps (index.py) and the stage's steps in order (steps.py)."""
