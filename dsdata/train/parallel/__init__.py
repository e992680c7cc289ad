"""Hybrid parallelism for the trainer: data × pipeline × tensor parallel over one DeviceMesh (docs/parallel.md).

`build_layout(config, env)` is the hook dsdata/train/distributed.py calls; `MixedParallel` builds the
same layout from a plain dict of `[parallel]` values.
"""
from __future__ import annotations

from dsdata.train.parallel.dims import ParallelDims, resolve_dims
from dsdata.train.parallel.facade import MixedParallel
from dsdata.train.parallel.layout import HybridLayout, build_layout

__all__ = ["HybridLayout", "MixedParallel", "ParallelDims", "build_layout", "resolve_dims"]
