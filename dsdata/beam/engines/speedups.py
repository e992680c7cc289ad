"""Start-up and shut-down costs of Beam's, cut where they are paid (history:
docs/history/2026-12-throughput.md §4).

1. `userstate.get_dofn_specs` remembered per DoFn instance (it depends only on the instance's
   methods; each caller gets its own sets).
2. `interactive_utils.is_in_ipython` answers False while `IPython` is not in `sys.modules`, instead
   of importing all of IPython.
3. Exit without the interpreter's last garbage collections: an exit handler (before logging's and
   weakref finalizers') calls `gc.freeze()`; in an SDK worker the objects are also frozen at
   `install()`, after its imports, so collections walk what the run makes, not Beam's modules.
4. `PipelineOptions.view_as` remembered per options object and view class: a view only reads and
   writes its object's `_all_options`, so what is set through one view is seen through all.
"""
from __future__ import annotations

import atexit
import gc
import sys
import weakref

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate
from apache_beam.utils import interactive_utils

from dsdata.collector import collect_young_less

_original = userstate.get_dofn_specs
_memo: dict[int, tuple[weakref.ref, tuple[frozenset, frozenset]]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    found = _memo.get(key)
    if found is not None and found[0] is ref:
        del _memo[key]


def get_dofn_specs(dofn):
    """`userstate.get_dofn_specs(dofn)`, computed once per DoFn instance."""
    key = id(dofn)
    found = _memo.get(key)
    if found is not None and found[0]() is dofn:
        states, timers = found[1]
        return set(states), set(timers)
    states, timers = _original(dofn)
    try:
        ref = weakref.ref(dofn, lambda r, key=key: _forget(key, r))
    except TypeError:  # not weak-referenceable (a __slots__ class): not remembered
        return states, timers
    _memo[key] = (ref, (frozenset(states), frozenset(timers)))
    return set(states), set(timers)


_original_is_in_ipython = interactive_utils.is_in_ipython


def is_in_ipython() -> bool:
    """Beam's `is_in_ipython()`, False at once while IPython has not been imported."""
    if "IPython" not in sys.modules:
        return False
    return _original_is_in_ipython()


# Modules that hold their own reference to Beam's function (`from … import is_in_ipython`).
_IPYTHON_CALLERS = ("apache_beam.utils.interactive_utils", "apache_beam.pipeline",
                    "apache_beam.runners.direct.direct_runner")


_original_view_as = PipelineOptions.view_as
_views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def view_as(self, cls):
    """`PipelineOptions.view_as(cls)`, made once per options object and class."""
    views = _views.get(self)
    if views is None:
        views = _views[self] = {}
    view = views.get(cls)
    if view is None:
        view = views[cls] = _original_view_as(self, cls)
    return view


_exit_handler_registered = False
_SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"


def is_sdk_worker() -> bool:
    """Whether this process is a Beam SDK worker (`python -m apache_beam.runners.worker.sdk_worker_main`:
    the FnApiRunner's multi_processing workers, a portable runner's Python workers)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == _SDK_WORKER_MAIN


def install() -> None:
    """Point Beam's module attributes at these versions (their callers look them up per call), and
    register the exit handler (once per process)."""
    global _exit_handler_registered
    if not _exit_handler_registered:
        atexit.register(gc.freeze)
        _exit_handler_registered = True
        if is_sdk_worker():
            gc.freeze()
            collect_young_less()
    if userstate.get_dofn_specs is not get_dofn_specs:
        userstate.get_dofn_specs = get_dofn_specs
    if PipelineOptions.view_as is _original_view_as:
        PipelineOptions.view_as = view_as
    for name in _IPYTHON_CALLERS:
        module = sys.modules.get(name)
        if module is None:
            __import__(name)
            module = sys.modules[name]
        if getattr(module, "is_in_ipython", None) is _original_is_in_ipython:
            module.is_in_ipython = is_in_ipython
