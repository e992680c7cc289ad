"""Beam without what dsdata never uses: `apache_beam` imported without pandas (only its DataFrame
type hints need it: ~45 MB of every launcher and worker), pymongo and bson (MongoDB IO) and requests
(GCE metadata for BigQuery IO; ~10 MB and 0.15 CPU-s together), `apache_beam.ml.inference.base`
without its optional model manager (only for `use_model_manager=True`; it pulls in torch and scipy in
every worker).  boto3 (~8 MB per process) is deferred, not dropped: Beam's S3 I/O imports it at the
first s3:// file it opens (`_defer_boto3`).

`install()` puts a finder first on `sys.meta_path` that runs those modules while it refuses those
imports, so a later import gets the real one (Beam's BigQuery IO imports again then; its MongoDB IO
does not).  pyarrow asks once whether pandas is there (at its first pa.array() of a list) and keeps
the answer: it is asked meanwhile (its to_pandas() asks again).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys

BASE = "apache_beam.ml.inference.base"
MODEL_MANAGER = "apache_beam.ml.inference.model_manager"
HIDDEN = {"apache_beam": ("pandas", "pymongo", "bson", "requests", "boto3"), BASE: (MODEL_MANAGER,)}  # module: the imports it runs without
_refused: set[str] = set()


class _BaseLoader(importlib.abc.Loader):
    """The module's own loader; exec_module runs it without the imports HIDDEN names."""

    def __init__(self, loader, hidden: tuple[str, ...]):
        self.loader, self.hidden = loader, hidden

    def __getattr__(self, name):  # get_source, get_filename, get_code, is_package, ...: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        hidden = {name for name in self.hidden if name not in sys.modules}
        if "pymongo" in hidden:  # its one line, at import: that it found no bson
            logging.getLogger("apache_beam.io.mongodbio").disabled = True
        _refused.update(hidden)
        try:
            self.loader.exec_module(module)
            if "pandas" in hidden and "pyarrow" in sys.modules:
                sys.modules["pyarrow"].array([])
        finally:
            _refused.difference_update(hidden)
        if "boto3" in hidden:
            _defer_boto3()
        if getattr(module, "resource", False) is None:  # base's `try` set it so: dsdata runs on Unix only
            module.resource = importlib.import_module("resource")


class _DeferredS3Client:
    """Beam's S3 client module as s3io sees it until the first S3IO is made: then it is imported
    (boto3 with it), put in its place, and its requests bounded (dsdata/beam/location.py)."""

    def __getattr__(self, attr):
        from apache_beam.io.aws import s3io
        from apache_beam.io.aws.clients.s3 import boto3_client

        from dsdata.beam.location import bound_s3_requests

        s3io.boto3_client = boto3_client
        bound_s3_requests()
        return getattr(boto3_client, attr)


def _defer_boto3() -> None:
    """Beam's S3 I/O, imported without boto3, told that it is there (when it is)."""
    s3io = sys.modules.get("apache_beam.io.aws.s3io")
    if s3io is not None and not s3io.BOTO3_INSTALLED and importlib.util.find_spec("boto3") is not None:
        s3io.boto3_client = _DeferredS3Client()
        s3io.BOTO3_INSTALLED = True


class _BaseFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in _refused or name.partition(".")[0] in _refused:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden while Beam imports)", name=name)
        if name not in HIDDEN:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, _BaseLoader):
            spec.loader = _BaseLoader(spec.loader, HIDDEN[name])
        return spec


def install() -> None:
    """Put the finder first on sys.meta_path (once per process)."""
    if not any(isinstance(f, _BaseFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _BaseFinder())
