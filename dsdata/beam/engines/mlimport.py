"""Beam's RunInference without torch and scipy: `apache_beam.ml.inference.base` imported without
its optional model manager.

The module's optional `ModelManager` import (only for `use_model_manager=True`) pulls in torch and
scipy in every worker.  `install()` puts a finder on `sys.meta_path` that loads that one module with
the model manager marked unimportable (a None entry in sys.modules) and removes the mark right
after, so a later import gets the real one; the `resource` the same `try` sets to None is put back.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

BASE = "apache_beam.ml.inference.base"
MODEL_MANAGER = "apache_beam.ml.inference.model_manager"


class _BaseLoader(importlib.abc.Loader):
    """The module's own loader; exec_module runs it without the model manager."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # get_source, get_filename, get_code, is_package, ...: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        marked = MODEL_MANAGER not in sys.modules
        if marked:
            sys.modules[MODEL_MANAGER] = None
        try:
            self.loader.exec_module(module)
        finally:
            if marked and MODEL_MANAGER in sys.modules and sys.modules[MODEL_MANAGER] is None:
                del sys.modules[MODEL_MANAGER]
        if getattr(module, "resource", False) is None:
            try:
                import resource
            except ImportError:  # not a Unix: base's own fallback (no memory metric) stands
                return
            module.resource = resource


class _BaseFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != BASE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, _BaseLoader):
            spec.loader = _BaseLoader(spec.loader)
        return spec


def install() -> None:
    """Put the finder first on sys.meta_path (once per process)."""
    if not any(isinstance(f, _BaseFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _BaseFinder())
