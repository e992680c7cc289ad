"""The output directory of a run: checked writable up front, and locked while a run writes it
(`OUT/.dsdata.lock`, an exclusive `flock`; docs/reliability.md).  The kernel drops a dead process's
flock, so its lock is taken over; without flock, a lock whose pid is dead on this host is.  Remote
outputs are not locked: object stores have no exclusive create here.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
import time
from typing import Iterator

from dsdata.io.untrusted_files import load_json_file
from dsdata.core.names import shown_path

LOCK_NAME = ".dsdata.lock"


class OutputDirError(ValueError):
    """OUT cannot be created or written, or another run holds its lock; one line."""


def check_output_dir(path: str) -> str:
    """Create `path` if needed and make sure it is a writable directory; returns its absolute path."""
    absolute = os.path.abspath(path)
    shown = shown_path(path)
    if os.path.exists(absolute) and not os.path.isdir(absolute):
        raise OutputDirError(f"--output {shown} is a file, not a directory")
    parent = absolute
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputDirError(f"--output {shown} cannot be created: {shown_path(parent)} is a file, not a directory")
    try:
        os.makedirs(absolute, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"--output {shown} cannot be created: {exc.strerror or exc}") from None
    from dsdata.io.outfiles import create_exclusive

    probe = os.path.join(absolute, f".dsdata-write-probe-{os.getpid()}")
    try:
        with os.fdopen(create_exclusive(probe), "wb") as fh:
            fh.write(b"x")
        os.remove(probe)
    except OSError as exc:
        raise OutputDirError(f"--output {shown} is not writable: {exc.strerror or exc}") from None
    return absolute


def _describe(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
            if holder else "an unreadable lock file")


def _read_holder(path: str) -> dict:
    try:
        holder = load_json_file(path, "lock file")
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def output_lock(directory: str) -> Iterator[str]:
    """Hold OUT's lock for the duration of the block; OutputDirError if a live run holds it."""
    path = os.path.join(directory, LOCK_NAME)
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv[:8]}
    while True:
        fd = _open_lock_file(path)
        _lock(fd, path, directory, me)
        # The file we locked must still be the one at `path` (a releasing run unlinks it).
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(me) + "\n").encode("utf-8"))
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _open_lock_file(path: str) -> int:
    """The lock file, opened (made when absent) without following a link; a link planted there is
    removed, and anything else that is not a regular file is refused."""
    while True:
        try:
            # O_NOFOLLOW: a link planted as the lock would have the run truncate its target.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symbolic link: no run made it; remove the link itself
                os.unlink(path)
                continue
            if exc.errno == errno.EISDIR:
                raise OutputDirError(f"{shown_path(path)} is a directory, not a lock file dsdata made; remove it") from None
            raise OutputDirError(f"cannot create the lock {shown_path(path)}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted there
            os.close(fd)
            raise OutputDirError(f"{shown_path(path)} is not a regular file, not a lock file dsdata made; remove it")
        return fd


def _lock(fd: int, path: str, directory: str, me: dict) -> None:
    """flock the lock file; where the file system has no flock, the holder it names must be gone."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OutputDirError(
            f"another run is writing {shown_path(directory)} ({_describe(_read_holder(path))}); wait for it to "
            "finish or choose another --output"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
        holder = _read_holder(path)
        live = holder and not (holder.get("host") == me["host"] and isinstance(holder.get("pid"), int)
                               and not pid_alive(holder["pid"]))
        if live and holder.get("pid") != me["pid"]:
            os.close(fd)
            raise OutputDirError(
                f"another run holds {shown_path(path)} ({_describe(holder)}); the file system has no flock, so "
                "remove the file if that run is gone"
            ) from None


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
