"""Run monitoring: RUN_DIR/metrics.jsonl, TensorBoard scalars and histograms, live console progress,
and a warning when the loss jumps above mean + 3σ of the recent steps.  Only the metrics rank writes."""
from __future__ import annotations

import collections
import json
import logging
import math
import os
import statistics
import sys
import time
from typing import Any

from dsdata.core.display import clock, logging_above_bar, open_bar, resolve_mode

log = logging.getLogger("dsdata.train")


class LossAnomalyDetector:
    """Flags a loss above mean + sigma · std of the last `window` finite losses (after 10 are known)."""

    def __init__(self, window: int = 100, sigma: float = 3.0):
        self.sigma = sigma
        self.history: collections.deque[float] = collections.deque(maxlen=window)

    def check(self, loss: float) -> str | None:
        if not math.isfinite(loss):
            return f"loss is {loss}"
        message = None
        if len(self.history) >= 10:
            mean = statistics.fmean(self.history)
            std = statistics.pstdev(self.history)
            if loss > mean + self.sigma * std:
                message = f"loss {loss:.4f} > mean {mean:.4f} + {self.sigma:g}σ ({std:.4f}) of the last {len(self.history)} steps"
        self.history.append(loss)
        return message

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history.clear()
        self.history.extend(state["history"])


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)  # None: a skipped step has no loss or norm


def format_step_line(record: dict[str, Any], total_steps: int, elapsed: float) -> str:
    """One progress line, in the style of `dsdata run`'s (`dsdata: 0:00:10 read 64595, kept ...`)."""
    return (f"dsdata-train: {clock(elapsed)} step {record['step']}/{total_steps}, "
            f"loss {_number(record['loss'], '.4f')}, {record['tokens_per_s']:.0f} tok/s, lr {record['lr']:.2e}, "
            f"grad_norm {_number(record['grad_norm'], '.3f')}, clip {record['clip_threshold']:.3f}, "
            f"scale {record['loss_scale']:g}")


class ConsoleProgress:
    """Live progress on stderr as `dsdata run --progress` chooses it: a tqdm bar on a terminal, else a
    line at step 1, every `interval` steps (0: none) and at the last step."""

    def __init__(self, mode: str, interval: int, total_steps: int, started: float | None = None, stream=None):
        self._fixed_stream = stream
        self.interval, self.total_steps = interval, total_steps
        self.started = time.time() if started is None else started
        self.mode = resolve_mode(mode, stream=self.stream) if interval else "off"
        self._bar = None
        self._log_redirect = None

    @property
    def stream(self):
        # The sys.stderr of the moment: train() may run more than once in a process (tests).
        return self._fixed_stream if self._fixed_stream is not None else sys.stderr

    def show(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if self.mode == "bar":
            self._update_bar(record)
        elif self.mode == "lines" and (step == 1 or step % self.interval == 0 or step == self.total_steps):
            print(format_step_line(record, self.total_steps, time.time() - self.started), file=self.stream, flush=True)

    def _update_bar(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if self._bar is None:
            # A resumed run's bar starts at the checkpoint's step; its rate counts the new steps only.
            self._bar = open_bar(self.stream, desc="dsdata-train", unit="step", started=self.started,
                                 total=self.total_steps, initial=step - 1, mininterval=0.5)
            # Set-up, warnings and export lines are printed above the bar, not into it.
            self._log_redirect = logging_above_bar()
            self._log_redirect.__enter__()
        self._bar.set_postfix_str(f"loss {_number(record['loss'], '.4f')}, {record['tokens_per_s']:.0f} tok/s",
                                  refresh=False)
        self._bar.update(step - self._bar.n)
        if step >= self.total_steps:
            self.close()  # what follows (export, checkpoint) prints below the finished bar

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._log_redirect is not None:
            self._log_redirect.__exit__(None, None, None)
            self._log_redirect = None


class MetricsWriter:
    def __init__(self, run_dir: str, enabled: bool, tensorboard: bool, console_interval: int, total_steps: int,
                 progress: str = "auto"):
        self.enabled, self.console_interval, self.total_steps = enabled, console_interval, total_steps
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tb = None
        self._fh = None
        self.progress = ConsoleProgress(progress if enabled else "off", console_interval, total_steps)
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
            except ImportError:
                log.warning("tensorboard is not installed; TensorBoard logging is off (pip install tensorboard)")

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they are trained again)."""
        if not self.enabled or not os.path.isfile(self.path):
            return
        kept = []
        with open(self.path) as fh:
            for line in fh:
                try:
                    if json.loads(line)["step"] <= step:
                        kept.append(line if line.endswith("\n") else line + "\n")
                except (ValueError, KeyError, TypeError, RecursionError):
                    continue  # a line cut short by a kill (or not a record of ours)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            fh.writelines(kept)
        os.replace(tmp, self.path)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._fh is None:
            self._fh = open(self.path, "a")
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        step = record["step"]
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and value is not None:
                    self.tb.add_scalar(f"train/{key}", value, step)
        self.progress.show(record)

    def last_record(self) -> dict[str, Any] | None:
        """The last complete line of metrics.jsonl (None when there is none)."""
        if not os.path.isfile(self.path):
            return None
        last = None
        with open(self.path) as fh:
            for line in fh:
                try:
                    last = json.loads(line)
                except (ValueError, RecursionError):
                    continue  # a line cut short by a kill (or nested past Python's limit)
        return last

    def histograms(self, step: int, named: dict[str, Any]) -> None:
        if self.enabled and self.tb is not None:
            for name, tensor in named.items():
                self.tb.add_histogram(name, tensor.detach().float().cpu(), step)

    def close(self) -> None:
        self.progress.close()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
            self.tb = None
