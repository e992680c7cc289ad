"""A Rust binding's panic, caught as a record's error, leaves no report on stderr: Rust's hook writes
it to fd 2, so `hidden_panic_reports()` points fd 2 at a temporary file for a native call and writes
back what went there minus the panic reports (nested and concurrent uses share one redirection);
`silenced_fd2()` (a chatty native loader) waits for none to be active and holds them off meanwhile.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from contextlib import contextmanager, suppress
from typing import Iterator

_lock = threading.Condition()  # fd 2 is the process's: every redirection of it takes this
_depth = 0
_silencers = 0  # silenced_fd2() blocks waiting: a new capture waits for them
_saved_fd: int | None = None
_capture = None

# Rust's panic hook writes "thread 'NAME' [(TID) ]panicked at FILE:LINE:COL:\n" MESSAGE "\n", then a
# "note: run with `RUST_BACKTRACE=1` …" line or "stack backtrace:" with indented frames.
_PANIC_START = re.compile(r"thread '[^'\n]*'(?: \(\d+\))? panicked at ")
_FRAME = re.compile(r"\s+(?:\d+:|at )")


def strip_panic_reports(text: str) -> str:
    """`text` without the Rust panic reports in it."""
    if "panicked at " not in text:
        return text
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not _PANIC_START.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        if out and not out[-1].strip():  # the blank line the hook writes first
            out.pop()
        i += 1
        # the message: up to a note, a backtrace, a blank line, the next report or a dsdata line
        while i < len(lines) and lines[i].strip() and not lines[i].startswith(("note: ", "stack backtrace:", "dsdata")) \
                and not _PANIC_START.match(lines[i]):
            i += 1
        if i < len(lines) and lines[i].startswith("stack backtrace:"):
            i += 1
            while i < len(lines) and _FRAME.match(lines[i]):
                i += 1
        if i < len(lines) and lines[i].startswith("note: ") and "RUST_BACKTRACE" in lines[i]:
            i += 1
    return "".join(out)


@contextmanager
def hidden_panic_reports() -> Iterator[None]:
    """Run the block with fd 2 captured; afterwards everything it wrote but panic reports goes to stderr."""
    global _depth, _saved_fd, _capture
    with _lock:
        _lock.wait_for(lambda: _depth > 0 or not _silencers)
        if _depth == 0:
            with suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            capture = tempfile.TemporaryFile()
            _saved_fd = os.dup(2)
            os.dup2(capture.fileno(), 2)
            _capture = capture
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                with suppress(OSError, ValueError, AttributeError):
                    sys.stderr.flush()
                os.dup2(_saved_fd, 2)
                os.close(_saved_fd)
                capture, _capture, _saved_fd = _capture, None, None
                _lock.notify_all()
                with capture:
                    if os.fstat(capture.fileno()).st_size:
                        capture.seek(0)
                        text = strip_panic_reports(capture.read().decode("utf-8", "surrogateescape"))
                        data = text.encode("utf-8", "surrogateescape")
                        while data:
                            data = data[os.write(2, data):]


@contextmanager
def silenced_fd2() -> Iterator[None]:
    """Run the block with fd 2 on /dev/null; other threads' redirections wait until it ends."""
    global _silencers
    with _lock:
        _silencers += 1
        _lock.wait_for(lambda: _depth == 0)
        with suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        saved = os.dup(2)
        try:
            with open(os.devnull, "wb") as devnull:
                os.dup2(devnull.fileno(), 2)
                yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            _silencers -= 1
            _lock.notify_all()
