"""How live progress looks on the console, shared by the pipeline and the trainer: the
`--progress auto|bar|lines|off` choice, the elapsed clock and the tqdm bar.  No Beam, no torch.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys

MODES = ("auto", "bar", "lines", "off")


def resolve_mode(mode: str, quiet: bool = False, stream=None) -> str:
    """auto → bar on a terminal (when tqdm is installed), lines otherwise; off under --quiet."""
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {', '.join(MODES)}, not {mode!r}")
    if quiet:
        return "off"
    if mode != "auto":
        return mode
    stream = stream or sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        try:
            import tqdm  # noqa: F401
        except ImportError:
            return "lines"
        return "bar"
    return "lines"


def clock(seconds: float) -> str:
    """Elapsed time as H:MM:SS, the second field of every progress line."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def open_bar(stream, desc: str, unit: str, started: float, total: int | None = None, initial: int = 0,
             mininterval: float = 1.0):
    """A tqdm bar on `stream` whose elapsed time and average rate count from `started` (time.time()),
    the start of the run, not from the moment the bar appeared (else the first update of a bar
    shown late looks like millions of items per second)."""
    from tqdm import tqdm

    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    # A pty that reports a 0 x 0 size (docker -t, script(1), some CI consoles) makes tqdm hide the
    # bar as "below the screen": give it the fallback size instead.
    fallback = shutil.get_terminal_size()
    width = {"dynamic_ncols": True} if columns else {"ncols": fallback.columns, "nrows": fallback.lines}
    bar = tqdm(desc=desc, unit=unit, total=total, file=stream, initial=initial, mininterval=mininterval, **width)
    bar.start_t = bar.last_print_t = started
    return bar


def logging_above_bar() -> contextlib.AbstractContextManager:
    """While a bar is shown: console log lines go through tqdm.write, above the bar, instead of
    being printed into the middle of it (other handlers, e.g. log files, are left alone)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()
