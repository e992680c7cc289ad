"""`torchrun --nproc_per_node=N -m dsdata.train --config models/tiny.toml [--set k=v ...] [--run-dir DIR]`."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from dsdata.core.display import MODES


class _StderrHandler(logging.StreamHandler):
    """Writes to the sys.stderr of the moment (main() may run more than once in a process, e.g. in tests)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


_HANDLER = _StderrHandler()


class _LineFormat(logging.Formatter):
    """Every line the trainer prints as `dsdata run` prints its own: `dsdata-train: MESSAGE`, with
    `warning: ` / `error: ` for those levels and the logger's name for lines from other libraries."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        origin = "" if record.name.startswith("dsdata") else f"[{record.name}] "
        return f"dsdata-train: {level}{origin}{text}"


_HANDLER.setFormatter(_LineFormat("%(message)s"))


def _configure_logging(level: str) -> None:
    """One format for everything the trainer prints: its own lines, progress, and Python warnings
    (torch's included); the summary JSON alone goes to stdout."""
    root = logging.getLogger()
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)
    root.setLevel(level)
    # The handler filters too: a `dsdata` logger set to INFO elsewhere in the process (an in-process
    # `dsdata run`) would otherwise still reach it under --quiet.
    _HANDLER.setLevel(level)
    logging.captureWarnings(True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dsdata-train", description="Train the dsdata decoder LM on pipeline shards "
                                     "(launch with torchrun for several processes; see docs/train.md).")
    parser.add_argument("--config", required=True, help="TOML config, e.g. models/tiny.toml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable), e.g. --set training.steps=40")
    parser.add_argument("--run-dir", default=None,
                        help="metrics, TensorBoard, checkpoints, export (default runs/<config name>); "
                             "an existing run dir with checkpoints is resumed")
    parser.add_argument("--log-level", default=None, help="INFO (default), WARNING under --quiet")
    parser.add_argument("--quiet", action="store_true",
                        help="print only warnings, errors and the final JSON summary (no set-up lines, no progress)")
    parser.add_argument("--progress", default=None, choices=MODES,
                        help="live progress, as `dsdata run --progress`: a bar on a terminal (auto, the default), "
                        "lines (logs), or off; --quiet turns it off (config: logging.progress)")
    args = parser.parse_args(argv)
    _configure_logging((args.log_level or ("WARNING" if args.quiet else "INFO")).upper())
    if args.quiet or args.progress:
        # As an override, after the --set ones: the flag wins over the config file and --set.
        args.set.append(f"logging.progress={'off' if args.quiet else args.progress}")

    from dsdata.stop_signals import Interrupted, stop_on_signals

    run_dir = args.run_dir or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    # Until the training loop takes the signals over (it checkpoints at its next step), a signal
    # stops the set-up at once: nothing to save yet.
    with stop_on_signals() as early:
        try:
            return _train(args, run_dir)
        except Interrupted:
            pass
    print(f"dsdata-train: stopped by {early.name} before training started; nothing to save", file=sys.stderr)
    return early.exit_code


def _train(args, run_dir: str) -> int:
    import signal

    from dsdata.core.params import ConfigError

    completed = False
    try:
        from dsdata.train.config import load_config
        from dsdata.train.loop import train

        summary = train(load_config(args.config, args.set), run_dir)
        completed = True
    except Exception as exc:
        from dsdata.shards.format import ShardError
        from dsdata.train.checkpoint import CheckpointError

        if isinstance(exc, (ConfigError, ShardError, CheckpointError)):  # the user can fix these: one line
            print(f"dsdata-train: error: {exc}", file=sys.stderr)
            return 2
        from dsdata.io.storage_errors import storage_failure

        failure = storage_failure(exc)
        if failure is not None:  # a checkpoint, metrics or an export on a full or read-only disk
            print(f"dsdata-train: error: {failure.describe(where=run_dir)}; no partial checkpoint is left",
                  file=sys.stderr)
            return 1
        raise
    finally:
        from dsdata.train.distributed import shutdown_distributed

        shutdown_distributed(completed)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        print(json.dumps(summary, allow_nan=False))  # valid JSON: a non-finite loss is null
    if summary.get("stopped_by"):
        if rank0:
            print(f"dsdata-train: stopped by {summary['stopped_by']}: checkpoint saved at step {summary['steps']} "
                  f"in {summary['checkpoint']}; run the same command again to resume", file=sys.stderr)
        return 128 + signal.Signals[summary["stopped_by"]].value
    return 0


if __name__ == "__main__":
    sys.exit(main())
