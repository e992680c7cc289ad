"""One start-up cost of Beam's, cut where it is paid: `userstate.get_dofn_specs` remembered per DoFn.

Beam looks for state and timer parameters by calling `get_dofn_specs(dofn)`, which runs
`inspect.signature` on every method of the DoFn (~30 with DoFn's own), several times for the
same DoFn instance while a pipeline is built, turned into its runner proto and started (326 calls
and 10.8k signatures for the 80 transforms of `pipelines/langid.yaml`; docs/throughput.md §4).
The answer depends only on the instance's methods, which do not change once it is made, so it is
kept per instance (by identity, dropped with the instance) and each caller gets its own sets.
`install()` is idempotent; `tests/test_stage_kinds.py` checks the remembered answer against
Beam's own for the DoFns of a real graph, stateful ones included.
"""
from __future__ import annotations

import weakref

from apache_beam.transforms import userstate

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


def install() -> None:
    """Point Beam's module attribute at the remembering version (its callers look it up per call)."""
    if userstate.get_dofn_specs is not get_dofn_specs:
        userstate.get_dofn_specs = get_dofn_specs
