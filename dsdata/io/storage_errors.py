"""A full or read-only file system, anywhere a command writes, is one line naming the path, the
bytes needed where known and what is free there.  `storage_failure` finds the error in an OSError,
its causes and contexts, or the text of Beam's, torch's or pyarrow's re-raise.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from dataclasses import dataclass

from dsdata.core.names import shown_path

# Never a record's fault nor the code's: the disk, the quota or the mount.
STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EFBIG: "file too large for the file system",
}
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\] [^:'\]\n]*(?::\s*'([^'\n]*)')?")
_TEXT_ERRNO = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
               "Read-only file system": errno.EROFS}
_MESSAGE_TEXT = re.compile("|".join(_TEXT_ERRNO))


@dataclass(frozen=True)
class StorageFailure:
    errno: int
    path: str | None
    needed: int | None = None  # bytes the write needed, where the writer knew

    def describe(self, where: str | None = None) -> str:
        """`no space left on device writing PATH (N bytes needed; M bytes free there)`."""
        path = self.path or where
        parts = [STORAGE_ERRNOS[self.errno]]
        if path:
            parts.append(f"writing {shown_path(path)}")
        facts = []
        if self.needed is not None:
            facts.append(f"{self.needed} bytes needed")
        free = free_bytes(path) if path and self.errno != errno.EROFS else None
        if free is not None:
            facts.append(f"{free} bytes free there")
        return " ".join(parts) + (f" ({'; '.join(facts)})" if facts else "")

    def inside(self, folder: str) -> bool:
        """Whether the failed write was under `folder` (False when the path is not known)."""
        if self.path is None:
            return False
        if "://" in folder or "://" in self.path:
            return self.path.rstrip("/").startswith(folder.rstrip("/") + "/") or self.path == folder
        try:
            path, folder = os.path.realpath(self.path), os.path.realpath(folder)
            return os.path.commonpath([path, folder]) == folder
        except ValueError:  # one relative, one absolute after all, or another drive
            return False


class OutOfSpace(OSError):
    """ENOSPC raised where the writer knows how many bytes it needed (a library hid the errno: torch's
    zip writer says "unexpected pos 704 vs 598")."""

    def __init__(self, path: str, bytes_needed: int):
        super().__init__(errno.ENOSPC, STORAGE_ERRNOS[errno.ENOSPC], path)
        self.bytes_needed = bytes_needed


def tree_bytes(path: str) -> int:
    """Bytes in the files under `path` (what a partial write had put there)."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def is_storage_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


def storage_failure(exc: BaseException) -> StorageFailure | None:
    """The full/read-only file system behind `exc` (itself, a cause or context, or its text)."""
    seen, current = set(), exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_storage_error(current):
            return StorageFailure(current.errno, current.filename if isinstance(current.filename, str) else None,
                                  getattr(current, "bytes_needed", None))
        found = _from_text(str(current))
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


def _from_text(text: str) -> StorageFailure | None:
    for match in _ERRNO_TEXT.finditer(text):
        number = int(match.group(1))
        if number in STORAGE_ERRNOS:
            return StorageFailure(number, match.group(2))
    match = _MESSAGE_TEXT.search(text)
    if match:
        return StorageFailure(_TEXT_ERRNO[match.group(0)], None)
    return None


def free_bytes(path: str) -> int | None:
    """Free bytes on the file system holding `path` (its nearest existing ancestor)."""
    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None
