"""Dedup on Beam: the composite (composite.py) and the spill files it parks documents in (spill.py)."""
