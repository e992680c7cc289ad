"""SIGINT (Ctrl-C) and SIGTERM stop a command cleanly: both raise `Interrupted` once (a
BaseException, which per-record handlers let pass), remembered whatever Beam made of it, with logging
silenced; the command cleans up and exits with 128 + the signal number (130, 143).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from contextlib import contextmanager, suppress
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """Raised in the main thread by the first SIGINT/SIGTERM; takes any arguments, as Beam re-raises."""


def is_stop(exc: BaseException) -> bool:
    """The user's stop (KeyboardInterrupt, Interrupted), which a handler of any BaseException must let
    pass (a plug-in's SystemExit is that plug-in's fault)."""
    return isinstance(exc, (KeyboardInterrupt, Interrupted))


class SignalState:
    """Which stop signal arrived first (None: none yet)."""

    def __init__(self):
        self.signum: int | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or 0)


@contextmanager
def stop_on_signals(raise_first: bool = True, unresponsive: tuple[float, str] | None = None) -> Iterator[SignalState]:
    """While the block runs, SIGINT/SIGTERM record themselves in the yielded state; the first also
    raises Interrupted in the main thread (unless raise_first is False).  Outside the main thread: no
    change.  unresponsive: (seconds, line): a watcher thread ends a process stuck in a native call
    that long after a signal, printing `line` ({signal}: its name), with 128 + the signal number."""
    state = SignalState()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    handled = threading.Event()

    def handler(signum, frame):
        handled.set()
        if state.signum is not None:
            return
        state.signum = signum
        if raise_first:
            logging.disable(logging.CRITICAL)  # no library's traceback of the stop
            # Nor a thread's: Beam's job-service thread raises when its worker dies.
            threading.excepthook = lambda args: None
            # workers first: told to shut down by an unwinding runner, they print "Fatal Python error"
            stop_child_processes(grace=0)
            raise Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    watch = _watch_unresponsive(handled, *unresponsive) if unresponsive else None
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if watch is not None:
            watch()


def _watch_unresponsive(handled: threading.Event, seconds: float, line: str):
    """Start the watcher stop_on_signals describes; returns what stops it."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        old_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread after all, or a wakeup fd the caller's loop owns
        os.close(read_end)
        os.close(write_end)
        return lambda: None
    done = threading.Event()

    def watch():
        while True:
            data = os.read(read_end, 1)
            if not data or done.is_set():  # closed: the block ended
                return
            if data[0] not in STOP_SIGNALS:
                continue
            if handled.wait(seconds) or done.is_set():
                return  # the main thread took it: it stops (and cleans up) itself
            stop_child_processes(grace=0)
            os.write(2, (line.format(signal=signal.Signals(data[0]).name) + "\n").encode("utf-8", "replace"))
            os._exit(128 + data[0])

    threading.Thread(target=watch, name="dsdata-stop-watch", daemon=True).start()

    def stop():
        done.set()
        signal.set_wakeup_fd(old_wakeup)
        os.close(write_end)  # the watcher reads EOF and returns
    return stop


def stop_child_processes(grace: float = 5.0) -> None:
    """Terminate every descendant of this process (Beam's SDK workers, a local dask cluster), then
    kill the ones still alive after `grace` seconds (0: kill at once)."""
    try:
        import psutil
    except ImportError:  # psutil is a dependency of the dist extra; without it, children get SIGTERM from /proc
        _terminate_from_proc(signal.SIGTERM if grace > 0 else signal.SIGKILL)
        return
    try:
        children = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return
    if grace > 0:
        for child in children:
            with suppress(psutil.Error):
                child.terminate()
        _, alive = psutil.wait_procs(children, timeout=grace)
    else:
        alive = children
    for child in alive:
        with suppress(psutil.Error):
            child.kill()


def _terminate_from_proc(sig: int = signal.SIGKILL) -> None:
    me = os.getpid()
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    family, grew = {me}, True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in family and pid not in family:
                family.add(pid)
                grew = True
    for pid in family - {me}:
        with suppress(OSError):
            os.kill(pid, sig)
