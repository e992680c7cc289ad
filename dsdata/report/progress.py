"""Live progress of a running pipeline: documents read, kept, rejected, docs/s and the busy stage.
Stage DoFns also count into their process's tally, written about once a second under
`$DSDATA_PROGRESS_DIR` and summed by `ProgressWatcher` (remote workers: the runner's own Metrics).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

from dsdata.core.display import MODES, logging_above_bar, open_bar, resolve_mode  # noqa: F401 (re-exported)
from dsdata.core.display import clock as _clock

log = logging.getLogger("dsdata")

PROGRESS_DIR_ENV = "DSDATA_PROGRESS_DIR"
NAMESPACE_PREFIX = "dsdata."
_FLUSH_SECONDS = 1.0


class _ProcessTally:
    """This process's stage counters, summed and flushed to the progress directory by a thread.
    Counting takes no lock: each `StageCounter` adds to its own integer (one DoFn, one thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counters: list = []  # dsdata.beam.counters.StageCounter: .key, .value
        self._flusher: threading.Thread | None = None
        self._file = f"{socket.gethostname()}-{os.getpid()}.json"

    def register(self, counter) -> None:
        with self._lock:
            self._counters.append(counter)
            if self._flusher is None:
                # A forked worker inherits the parent's tally object; its own pid names its own file.
                self._file = f"{socket.gethostname()}-{os.getpid()}.json"
                self._flusher = threading.Thread(target=self._flush_forever, name="dsdata-progress",
                                                 daemon=True)
                self._flusher.start()

    def reset(self) -> None:
        with self._lock:
            self._counters = []

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            counters = list(self._counters)
        counts: dict[tuple[str, str], int] = {}
        for counter in counters:
            counts[counter.key] = counts.get(counter.key, 0) + counter.value
        return counts

    def _flush_forever(self) -> None:
        while True:
            time.sleep(_FLUSH_SECONDS)
            self.flush()

    def flush(self) -> None:
        directory = os.environ.get(PROGRESS_DIR_ENV)
        if not directory or not os.path.isdir(directory):
            return  # no watcher on this machine (remote worker, or a run without progress)
        rows = [[stage, name, n] for (stage, name), n in self.snapshot().items()]
        path = os.path.join(directory, self._file)
        try:
            with open(path + ".tmp", "w") as fh:
                json.dump(rows, fh)
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # the watcher removed the directory at the end of the run


TALLY = _ProcessTally()  # this process's; dsdata/beam/counters.py StageCounter registers with it


class Progress:
    """Totals at one moment, summed over stages: {stage: {"in", "kept", "rejected"}}."""

    def __init__(self, counts: dict[tuple[str, str], int], stage_order: list[str]):
        self.stages: dict[str, dict[str, int]] = {}
        for (stage, name), n in counts.items():
            entry = self.stages.setdefault(stage, {"in": 0, "kept": 0, "rejected": 0})
            if name in ("in", "kept"):
                entry[name] += n
            elif name.startswith("rejected."):
                entry["rejected"] += n
        self.order = [s for s in stage_order if s in self.stages] + sorted(set(self.stages) - set(stage_order))
        read = self.stages.get(stage_order[0] if stage_order else "read", {})
        self.read = read.get("in", 0)
        self.rejected = sum(e["rejected"] for e in self.stages.values())
        last = stage_order[-1] if len(stage_order) > 1 else None  # kept so far: passed the last stage
        self.kept = self.stages.get(last, {}).get("kept", 0) if last else read.get("kept", 0)

    def moved_since(self, earlier: "Progress | None") -> list[tuple[str, int]]:
        """(stage, documents in since `earlier`) for each stage whose input counter moved, in order."""
        moved = []
        for stage in self.order:
            now = self.stages[stage]["in"]
            before = earlier.stages.get(stage, {}).get("in", 0) if earlier else 0
            if now > before:
                moved.append((stage, now - before))
        return moved


def format_line(now: Progress, earlier: Progress | None, elapsed: float, dt: float) -> str:
    """One progress line, in the style of the run's final summary line."""
    moved = now.moved_since(earlier)
    if moved:
        # the most downstream stage that moved is the front of the stream: its rate is the chain's
        front, n = moved[-1]
        rate = f"{n / dt:.0f} docs/s" if dt > 0 else "- docs/s"
        busy = " → ".join(s for s, _ in moved) if len(moved) <= 3 else f"{moved[0][0]} … {front}"
    else:
        rate, busy = "0 docs/s", "no stage counting (grouping, whole-corpus step or writing)"
    return (f"dsdata: {_clock(elapsed)} read {now.read}, kept {now.kept}, rejected {now.rejected}, "
            f"{rate}, busy: {busy}")


class ProgressWatcher:
    """Context manager around a run: sets up the progress directory and reports every `interval` s
    (nothing before the first interval has passed)."""

    def __init__(self, mode: str = "lines", stage_order: list[str] | None = None, interval: float = 10.0,
                 stream=None):
        self.mode = mode if mode != "auto" else resolve_mode(mode, stream=stream)
        self.stage_order = stage_order or ["read"]
        self.interval = interval
        self.stream = stream or sys.stderr
        self.lines: list[str] = []
        self._dir: str | None = None
        self._old_env: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pipeline = None
        self._bar = None
        self._log_redirect = None
        self._bar_earlier: Progress | None = None
        self._start = time.time()

    def attach(self, pipeline) -> None:
        """The running Pipeline, whose result's Metrics are read where no worker tallies arrive."""
        self._pipeline = pipeline

    def __enter__(self) -> "ProgressWatcher":
        # the in-process runner counts in this process: forget an earlier run's counters (also when off)
        TALLY.reset()
        if self.mode == "off":
            return self
        self._dir = tempfile.mkdtemp(prefix="dsdata-progress-")
        self._old_env = os.environ.get(PROGRESS_DIR_ENV)
        os.environ[PROGRESS_DIR_ENV] = self._dir
        self._start = time.time()
        if self.mode == "bar":
            # log lines go through tqdm.write, above the bar
            self._log_redirect = logging_above_bar()
            self._log_redirect.__enter__()
        self._thread = threading.Thread(target=self._report_forever, name="dsdata-progress-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode == "off":
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.mode == "bar" and self._bar is not None:
            try:
                self._update_bar(self.totals(), time.time() - self._start)  # end on the final counts
            except Exception as exc:  # noqa: BLE001 - progress must never stop a run
                log.debug("progress: %s", exc)
            self._bar.close()
        if self._log_redirect is not None:
            self._log_redirect.__exit__(None, None, None)
        if self._old_env is None:
            os.environ.pop(PROGRESS_DIR_ENV, None)
        else:
            os.environ[PROGRESS_DIR_ENV] = self._old_env
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def totals(self) -> Progress:
        """The sum of every worker's last written tally (or the runner's Metrics when there are none)."""
        counts: dict[tuple[str, str], int] = {}
        if self._dir:
            TALLY.flush()  # this process's own tally (in-process runner) without waiting for its thread
            for name in os.listdir(self._dir):
                if not name.endswith(".json"):
                    continue
                try:
                    with open(os.path.join(self._dir, name)) as fh:
                        rows = json.load(fh)
                except (OSError, ValueError):
                    continue  # replaced while being read; the next poll sees it
                for stage, counter, n in rows:
                    counts[(stage, counter)] = counts.get((stage, counter), 0) + n
        result = getattr(self._pipeline, "result", None)
        if not counts and result is not None:
            counts = _runner_counts(result)
        return Progress(counts, self.stage_order)

    def _report_forever(self) -> None:
        earlier: Progress | None = None
        last = self._start
        # A bar redraws every second once shown; lines come once per interval.
        tick = min(self.interval, 1.0) if self.mode == "bar" else self.interval
        while not self._stop.wait(tick):
            try:
                now_t = time.time()
                now = self.totals()
                if self.mode == "bar":
                    self._update_bar(now, now_t - self._start)
                    continue
                line = format_line(now, earlier, now_t - self._start, now_t - last)
                self.lines.append(line)
                print(line, file=self.stream, flush=True)
                earlier, last = now, now_t
            except Exception as exc:  # noqa: BLE001 - progress must never stop a run
                log.debug("progress: %s", exc)

    def _update_bar(self, now: Progress, elapsed: float) -> None:
        if elapsed < self.interval:
            return  # quiet on short runs: the bar appears once the first interval has passed
        if self._bar is None:
            self._bar = open_bar(self.stream, desc="dsdata", unit=" docs", started=self._start)
        # The bar's own rate is the read rate; "busy" is the front stage, as in the progress lines.
        moved = now.moved_since(self._bar_earlier)
        self._bar_earlier = now
        busy = moved[-1][0] if moved else "-"
        self._bar.set_postfix_str(f"kept {now.kept}, rejected {now.rejected}, busy: {busy}", refresh=False)
        self._bar.update(now.read - self._bar.n)
        self._bar.refresh()


def _runner_counts(result) -> dict[tuple[str, str], int]:
    """dsdata.* counters of a job still running (async runners: portable, Dataflow); {} once it ended."""
    try:
        state = str(getattr(result, "state", ""))
        if any(end in state for end in ("DONE", "FAILED", "CANCELLED")):
            return {}
        return counts_from_metrics(result.metrics())
    except Exception as exc:  # noqa: BLE001 - a runner without live metrics just shows no progress
        log.debug("progress: runner metrics unavailable: %s", exc)
        return {}


def counts_from_metrics(metrics) -> dict[tuple[str, str], int]:
    """{(stage, counter): n} from a Beam MetricResults (attempted values: a running job has no committed ones)."""
    counts: dict[tuple[str, str], int] = {}
    for item in metrics.query().get("counters", []):
        key = item.key.metric
        if not key.namespace.startswith(NAMESPACE_PREFIX):
            continue
        value = item.attempted if item.attempted is not None else item.committed
        stage = key.namespace[len(NAMESPACE_PREFIX):]
        counts[(stage, key.name)] = counts.get((stage, key.name), 0) + int(value or 0)
    return counts


def watch(mode: str, stage_order: list[str], interval: float | None = None) -> ProgressWatcher:
    """The watcher `run_recipe` wraps a run in; `interval` defaults to $DSDATA_PROGRESS_INTERVAL or 10 s."""
    if interval is None:
        interval = float(os.environ.get("DSDATA_PROGRESS_INTERVAL", "10"))
    return ProgressWatcher(mode, stage_order, interval)
