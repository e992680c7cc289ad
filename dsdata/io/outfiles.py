"""Files and folders dsdata makes inside OUT, made without following a link it did not make.

OUT is untrusted (`OUT/kept -> /elsewhere` may be planted).  An entry in the way that is a link (or
any non-directory where a folder belongs) is removed (the link itself, never its target) and the new
entry is created exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`, `mkdir`), so a link planted between
the check and the create makes the create fail instead of being followed.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import uuid
from typing import Any, BinaryIO, Iterator


TEMP_MARK = ".tmp-"  # names of files being written: .<name>.tmp-<uuid>
HASH_CHUNK = 1 << 22


class OutEntryError(OSError):
    """An entry in OUT could not be replaced; one line."""


def remove_entry(path: str) -> None:
    """Remove whatever is at `path` without following it: a link or file is unlinked, a real
    directory removed with its content (shutil.rmtree never follows links inside)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def fresh_dir(path: str, mode: int = 0o777) -> str:
    """An empty directory at `path` made by this call (a link or file there is removed first)."""
    remove_entry(path)
    os.mkdir(path, mode)
    return path


def ensure_dir(path: str, mode: int = 0o777) -> str:
    """A real directory at `path`: kept when it is one, else (a link, a file) replaced by a new one."""
    for _ in range(3):  # workers of one run make the same folder at once
        try:
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                return path
            os.unlink(path)
        except FileNotFoundError:
            pass
        try:
            os.mkdir(path, mode)
            return path
        except FileExistsError:
            continue
    raise OutEntryError(errno.EEXIST, f"{path} keeps being replaced while this run makes it a folder")


def create_exclusive(path: str, mode: int = 0o644) -> int:
    """A new file at `path` opened for writing (fd): whatever was there (a link) is unlinked first,
    and the open refuses to follow a link planted since."""
    remove_entry(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)


def write_file_in_out(directory: str, name: str, text: str | bytes, durable: bool = False) -> str:
    """Write OUT/NAME whole: to a new temporary file beside it, then renamed over the name (a
    rename replaces a link, it does not write through it).  durable: the file is fsynced before the
    rename and the folder after it (a commit marker)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    path = os.path.join(directory, name)
    temp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
    fd = create_exclusive(temp)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    if durable:
        sync_dir(directory)
    return path


def sync_dir(directory: str) -> None:
    """fsync a folder: the names created or renamed in it survive a crash of the machine."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(HASH_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def buffer_sha256(buffer: Any) -> str:
    """sha256 of a (memory-mapped) buffer without copying it; hashlib drops the GIL on large blocks."""
    view = memoryview(buffer)
    digest = hashlib.sha256()
    for start in range(0, len(view), HASH_CHUNK):
        digest.update(view[start:start + HASH_CHUNK])
    return digest.hexdigest()


def fsync_dir(directory: str) -> None:
    """sync_dir, best effort: a folder that cannot be synced (some filesystems refuse) costs only durability."""
    with contextlib.suppress(OSError):
        sync_dir(directory)


@contextlib.contextmanager
def atomic_file(path: str, mode: int = 0o666) -> Iterator[BinaryIO]:
    """Write `path` under a hidden temp name in its folder (.NAME.tmp-UUID), fsync it and rename it
    into place when the block ends without an exception (then fsync the folder, best effort); the
    temp file is removed otherwise."""
    tmp = f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}{TEMP_MARK}{uuid.uuid4().hex}"
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fsync_dir(os.path.dirname(path) or ".")


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` via a temp file in the same directory + fsync + rename."""
    with atomic_file(path, mode) as fh:
        fh.write(data)
