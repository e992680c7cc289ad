"""Run monitoring: RUN_DIR/metrics.jsonl, TensorBoard scalars and histograms, a console line, and a
warning when the loss jumps above mean + 3σ of the recent steps.  Only the metrics rank writes."""
from __future__ import annotations

import collections
import json
import logging
import math
import os
import statistics
from typing import Any

log = logging.getLogger("dsdata.train")


class LossAnomalyDetector:
    """Flags a loss above mean + sigma · std of the last `window` finite losses (after 10 are known)."""

    def __init__(self, window: int = 100, sigma: float = 3.0):
        self.sigma = sigma
        self.history: collections.deque[float] = collections.deque(maxlen=window)

    def check(self, loss: float) -> str | None:
        message = None
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if len(self.history) >= 10 and math.isfinite(loss):
            mean = statistics.fmean(self.history)
            std = statistics.pstdev(self.history)
            if loss > mean + self.sigma * std:
                message = f"loss {loss:.4f} > mean {mean:.4f} + {self.sigma:g}σ ({std:.4f}) of the last {len(self.history)} steps"
        if math.isfinite(loss):
            self.history.append(loss)
        return message

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history.clear()
        self.history.extend(state["history"])


class MetricsWriter:
    def __init__(self, run_dir: str, enabled: bool, tensorboard: bool, console_interval: int, total_steps: int):
        self.enabled, self.console_interval, self.total_steps = enabled, console_interval, total_steps
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tb = None
        self._fh = None
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
                except (ValueError, KeyError):
                    continue  # a line cut short by a kill
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
        # Step 1 too: the first line shows the run is training long before step console_interval.
        if self.console_interval and (step == 1 or step % self.console_interval == 0 or step == self.total_steps):
            loss, norm = record["loss"], record["grad_norm"]
            log.info("step %d/%d loss %s lr %.2e grad_norm %s clip %.3f scale %g %.0f tok/s", step, self.total_steps,
                     loss if loss is None else f"{loss:.4f}", record["lr"], norm if norm is None else f"{norm:.3f}",
                     record["clip_threshold"], record["loss_scale"], record["tokens_per_s"])

    def last_record(self) -> dict[str, Any] | None:
        """The last complete line of metrics.jsonl (None when there is none)."""
        if not os.path.isfile(self.path):
            return None
        last = None
        with open(self.path) as fh:
            for line in fh:
                try:
                    last = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill
        return last

    def histograms(self, step: int, named: dict[str, Any]) -> None:
        if self.enabled and self.tb is not None:
            for name, tensor in named.items():
                self.tb.add_histogram(name, tensor.detach().float().cpu(), step)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
            self.tb = None
