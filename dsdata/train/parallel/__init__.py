"""The trainer's parallel layouts (docs/parallel.md): the `Layout` protocol (protocol.py), pure data
parallel (data_parallel.py), data × pipeline × tensor parallel over one DeviceMesh (layout.py), and
`build_layout(config, env)`, the one factory.  `MixedParallel` builds the hybrid layout from a plain
dict of `[parallel]` values.
"""
from __future__ import annotations

from dsdata.train.parallel.data_parallel import DataParallelLayout
from dsdata.train.parallel.dims import ParallelDims, resolve_dims
from dsdata.train.parallel.facade import MixedParallel
from dsdata.train.parallel.layout import HybridLayout, build_layout
from dsdata.train.parallel.protocol import Layout, LossFn

__all__ = ["DataParallelLayout", "HybridLayout", "Layout", "LossFn", "MixedParallel", "ParallelDims", "build_layout",
           "resolve_dims"]
