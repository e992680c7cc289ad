"""Stage counters: a Beam Metrics counter that also feeds this worker's live progress tally
(dsdata/report/progress.py sums the tallies in the launching process)."""
from __future__ import annotations

from apache_beam.metrics import Metrics

from dsdata.report.progress import NAMESPACE_PREFIX, TALLY


class StageCounter:
    """A Beam Metrics counter that also feeds the live progress tally of this worker process."""

    def __init__(self, namespace: str, name: str):
        self.namespace, self.name = namespace, name
        self._beam = Metrics.counter(namespace, name)
        stage = namespace[len(NAMESPACE_PREFIX):] if namespace.startswith(NAMESPACE_PREFIX) else namespace
        self.key = (stage, name)
        self.value = 0
        TALLY.register(self)

    def inc(self, n: int = 1) -> None:
        self._beam.inc(n)
        self.value += n

    def __reduce__(self):
        return StageCounter, (self.namespace, self.name)

