"""Beam without what dsdata never uses, and what it uses late loaded late.

`apache_beam`'s own import pulls in, in every launcher and SDK worker, modules only some IO or
feature needs.  `HIDDEN` says, per module whose import is wrapped, what that import runs without:

- `Refused`: the import raises ModuleNotFoundError while the module runs, and Beam's `try` leaves
  the feature out (pandas, ~45 MB: only DataFrame type hints; pymongo, bson, requests, ~10 MB and
  0.15 CPU-s: MongoDB and BigQuery IO; Beam's inference model manager: torch and scipy).  A later
  import gets the real module (Beam's BigQuery IO imports again then; its MongoDB IO does not).
  `after` runs once the module has: boto3 (~8 MB) is refused, then s3io is told it is there and
  imports it at its first S3IO (`_defer_boto3`).
- `StandIn`: a module standing in while the module runs, so that `import m` and `from m import f`
  bind it.  Its attributes are the real module's, imported at the first use; StandIn's callables and
  exceptions are stand-ins that import it at their first call.  Then every module holding a stand-in
  of that package gets the real object in its place, and a later import gets the real module.
  httplib2 with pyparsing (~7 MB; Beam's HTTP proxy helper), proto-plus (~3 MB; one coder's type
  check), beartype (~6 MB, 327 modules; `is_consistent_with`), fastavro (~4 MB; Avro IO and coder)
  and cryptography (~6 MB; GroupByEncryptedKey) are loaded only by a process that uses them.

pyarrow asks once whether pandas is there (at its first pa.array() of a list) and keeps the answer:
it is asked while pandas is refused (its to_pandas() asks again).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from dataclasses import dataclass
from typing import Callable

BASE = "apache_beam.ml.inference.base"
MODEL_MANAGER = "apache_beam.ml.inference.model_manager"


@dataclass(frozen=True)
class Refused:
    before: Callable[[], None] | None = None
    after: Callable[[], None] | None = None


@dataclass(frozen=True)
class StandIn:
    callables: tuple[str, ...] = ()
    exceptions: tuple[str, ...] = ()


def _quiet_mongodbio() -> None:  # its one line at import: that it found no bson
    logging.getLogger("apache_beam.io.mongodbio").disabled = True


def _pyarrow_asks() -> None:
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].array([])


def _defer_boto3() -> None:
    """Beam's S3 I/O, imported without boto3, told that it is there (when it is)."""
    s3io = sys.modules.get("apache_beam.io.aws.s3io")
    if s3io is not None and not s3io.BOTO3_INSTALLED and importlib.machinery.PathFinder.find_spec("boto3"):
        s3io.boto3_client = _DeferredS3Client()
        s3io.BOTO3_INSTALLED = True


HIDDEN = {  # module whose import is wrapped: {name: what its import does with it}
    "apache_beam": {
        "pandas": Refused(after=_pyarrow_asks), "pymongo": Refused(before=_quiet_mongodbio), "bson": Refused(),
        "requests": Refused(), "boto3": Refused(after=_defer_boto3), "httplib2": StandIn(), "proto": StandIn(),
        "beartype.door": StandIn(callables=("is_subhint",)), "beartype.roar": StandIn(exceptions=("BeartypeDoorException",)),
        "fastavro": StandIn(callables=("parse_schema", "schemaless_reader", "schemaless_writer")),
        "fastavro.read": StandIn(callables=("block_reader",)), "fastavro.write": StandIn(callables=("Writer",)),
        "cryptography.fernet": StandIn(callables=("Fernet",)),
    },
    BASE: {MODEL_MANAGER: Refused()},
}
_active: dict[str, object] = {}  # name: treatment, while a wrapped module runs
_stood_in: set[str] = set()  # stand-in modules in sys.modules
_stand_ins: dict[int, tuple] = {}  # id: (stand-in, module name, attribute or None for the module)


class _BaseLoader(importlib.abc.Loader):
    """The module's own loader; exec_module runs it with the treatments HIDDEN names."""

    def __init__(self, loader, hidden: dict):
        self.loader, self.hidden = loader, hidden

    def __getattr__(self, name):  # get_source, get_filename, get_code, is_package, ...: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        active = {name: how for name, how in self.hidden.items()
                  if name not in sys.modules and not (isinstance(how, StandIn) and name.partition(".")[0] in sys.modules)}
        for how in active.values():
            if isinstance(how, Refused) and how.before:
                how.before()
        _active.update(active)
        try:
            self.loader.exec_module(module)
            for how in active.values():  # while the names are still refused
                if isinstance(how, Refused) and how.after:
                    how.after()
        finally:
            for name in active:
                _active.pop(name, None)
            while _stood_in:
                sys.modules.pop(_stood_in.pop(), None)  # a later import gets the real module
        if getattr(module, "resource", False) is None:  # base's `try` set it so: dsdata runs on Unix only
            module.resource = importlib.import_module("resource")


class _StandInLoader(importlib.abc.Loader):
    """A module standing in for `name`: StandIn's callables and exceptions, any other attribute the
    real module's (PEP 562); a stand-in's parent package is one, empty."""

    def __init__(self, how: StandIn | None):
        self.how = how

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        _stood_in.add(name)
        made = {attr: _stand_in_callable(name, attr) for attr in (self.how.callables if self.how else ())}
        made.update({attr: type(attr, (Exception,), {"__module__": name}) for attr in (self.how.exceptions if self.how else ())})
        made["__getattr__"] = lambda attr: _real_attr(name, attr)
        module.__dict__.update(made)
        _stand_ins.update({id(obj): (obj, name, attr) for attr, obj in made.items() if attr != "__getattr__"})
        _stand_ins[id(module)] = (module, name, None)


def _real_attr(module_name: str, attr: str):
    if module_name in _stood_in or attr.startswith("__"):  # the import system's questions, while it stands in
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
    return getattr(_real(module_name), attr)


def _stand_in_callable(module_name: str, attr: str):
    def first_call(*args, **kwargs):
        return getattr(_real(module_name), attr)(*args, **kwargs)
    first_call.__name__ = first_call.__qualname__ = attr
    return first_call


def _real(module_name: str):
    """The real module, imported now; every module holding a stand-in of its package gets the real
    object in its place."""
    top = module_name.partition(".")[0]
    real = {}
    for key, (_, name, attr) in list(_stand_ins.items()):
        if name.partition(".")[0] == top:
            module = importlib.import_module(name)
            real[key] = module if attr is None else getattr(module, attr)
            del _stand_ins[key]
    for module in list(sys.modules.values()) if real else ():
        try:  # not getattr: that runs a lazy module
            names = object.__getattribute__(module, "__dict__")
        except AttributeError:
            continue
        for key, value in list(names.items()):
            if id(value) in real:
                names[key] = real[id(value)]
    return importlib.import_module(module_name)


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


class _BaseFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        how = _active.get(name) or _active.get(name.partition(".")[0])
        if isinstance(how, Refused):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden while Beam imports)", name=name)
        parent = any(n.startswith(name + ".") and isinstance(h, StandIn) for n, h in _active.items())
        if isinstance(how, StandIn) and name in _active or parent and how is None:
            return importlib.machinery.ModuleSpec(name, _StandInLoader(how), is_package=parent)
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
