"""The trainer's parallel layouts (docs/parallel.md): the `Layout` protocol, pure data parallel,
data × pipeline × tensor parallel, `build_layout(config, env)` (the one factory) and `MixedParallel`.
"""
from __future__ import annotations

from dsdata.train.parallel.data_parallel import DataParallelLayout
from dsdata.train.parallel.dims import ParallelDims, resolve_dims
from dsdata.train.parallel.facade import MixedParallel
from dsdata.train.parallel.layout import HybridLayout, build_layout
from dsdata.train.parallel.protocol import Layout, LossFn

__all__ = ["DataParallelLayout", "HybridLayout", "Layout", "LossFn", "MixedParallel", "ParallelDims", "build_layout",
           "resolve_dims"]
