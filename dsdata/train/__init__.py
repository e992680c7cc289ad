"""The companion trainer: `torchrun -m dsdata.train --config models/tiny.toml` (see docs/train.md)."""
from __future__ import annotations


def __getattr__(name: str):
    # Lazy so `import dsdata.train` stays cheap and the parallel package (its own issue) is optional.
    if name == "MixedParallel":
        from dsdata.train.parallel import MixedParallel

        return MixedParallel
    raise AttributeError(f"module 'dsdata.train' has no attribute {name!r}")
