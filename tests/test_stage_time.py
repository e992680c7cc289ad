"""A stage's CPU seconds (stats.json stage_time) count every element: cheap elements are timed one
in sixteen, and an untimed element that runs long (one pathological document) is still counted."""
from time import thread_time

from dsdata.beam.transforms import _SAMPLE_STRIDE, StageCounters


def _busy(seconds: float) -> None:
    end = thread_time() + seconds
    while thread_time() < end:
        pass


def test_a_slow_element_between_samples_is_counted():
    counters = StageCounters()
    counters._init_counters("probe")
    for _ in range(200):  # cheap elements: the clock falls back to one sample in _SAMPLE_STRIDE
        counters._clock_stop(counters._clock_start())
    assert counters._stride == _SAMPLE_STRIDE
    start = counters._clock_start()
    assert start is None  # this element is not one of the sampled ones
    _busy(0.2)
    counters._clock_stop(start)
    assert counters._cpu >= 0.2


def test_cheap_elements_are_estimated_from_samples():
    counters = StageCounters()
    counters._init_counters("probe")
    for _ in range(1000):
        counters._clock_stop(counters._clock_start())
    assert 0 < counters._cpu < 0.05  # no element is taken for an outlier
