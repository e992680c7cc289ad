"""Local paths of any length: stat, open, resolve and list them where the kernel refuses a path of
PATH_MAX bytes or more (ENAMETOOLONG) though each name is short: after the plain call fails, the path
is reached piece by piece with `openat` (links followed, `..` the physical parent).  `walk_files`
also reports the folders it cannot list, which os.walk drops silently.
"""
from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

try:
    PATH_MAX = os.pathconf("/", "PC_PATH_MAX")
except (OSError, ValueError, AttributeError):
    PATH_MAX = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
# At most this many symbolic links are followed while resolving one path (the kernel's MAXSYMLINKS).
_MAX_LINKS = 40


def _pieces(path: bytes) -> list[bytes]:
    """`path`'s names joined into pieces each shorter than PATH_MAX (one name is at most NAME_MAX)."""
    pieces, current = [], b""
    for name in path.split(b"/"):
        if not name:
            continue
        if current and len(current) + 1 + len(name) >= PATH_MAX - 1:
            pieces.append(current)
            current = name
        else:
            current = current + b"/" + name if current else name
    if current:
        pieces.append(current)
    return pieces


@contextmanager
def _folder_fd(folder: bytes) -> Iterator[int]:
    """A descriptor of `folder`, opened piece by piece whatever its length."""
    absolute = folder.startswith(b"/")
    pieces = _pieces(folder)
    fd = os.open(b"/" if absolute else b".", _DIR_FLAGS)
    try:
        for piece in pieces:
            nxt = os.open(piece, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


@contextmanager
def _at(path: str) -> Iterator[tuple[int, bytes]]:
    """(descriptor of the folder holding `path`, its last name), for a path too long to name."""
    raw = os.fsencode(path).rstrip(b"/") or b"/"
    folder, _, name = raw.rpartition(b"/")
    if not folder:
        folder = b"/" if raw.startswith(b"/") else b"."
    with _folder_fd(folder) as fd:
        yield fd, name or b"."


def path_stat(path: str, follow_symlinks: bool = True) -> os.stat_result:
    """os.stat (os.lstat with follow_symlinks=False) of a path of any length."""
    try:
        return os.stat(path, follow_symlinks=follow_symlinks)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
    with _at(path) as (fd, name):
        return os.stat(name, dir_fd=fd, follow_symlinks=follow_symlinks)


def exists(path: str, follow_symlinks: bool = True) -> bool:
    try:
        path_stat(path, follow_symlinks)
        return True
    except OSError:
        return False


def is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(path_stat(path).st_mode)
    except OSError:
        return False


def is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(path_stat(path, follow_symlinks=False).st_mode)
    except OSError:
        return False


def read_link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
    with _at(path) as (fd, name):
        return os.fsdecode(os.readlink(name, dir_fd=fd))


def open_binary(path: str) -> BinaryIO:
    """The file at `path` (any length) opened for reading in binary; a folder is refused saying so
    (and why it cannot be listed, where it cannot)."""
    try:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            _refuse_folder(path)
            raise
    with _at(path) as (fd, name):
        try:
            return os.fdopen(os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0), dir_fd=fd), "rb")
        except OSError:
            _refuse_folder(path)
            raise


def _refuse_folder(path: str) -> None:
    """If `path` is a folder, raise why it is not read as a file."""
    if not is_dir(path):
        return
    try:
        with _folder_fd(os.fsencode(path)) as fd, os.scandir(fd) as entries:
            next(entries, None)
    except OSError as exc:
        raise OSError(exc.errno, f"a folder that cannot be listed ({exc.strerror})") from None
    raise IsADirectoryError(errno.EISDIR, "a folder, not a file")


def real_path(path: str) -> str:
    """os.path.realpath of a path of any length (links resolved as far as the path exists)."""
    absolute = os.path.abspath(path)
    if len(os.fsencode(absolute)) < PATH_MAX:
        return os.path.realpath(absolute)
    todo = [n for n in reversed(os.fsencode(absolute).split(b"/")) if n]
    done: list[bytes] = []  # the resolved path's names
    links = 0
    while todo:
        name = todo.pop()
        if name == b".":
            continue
        if name == b"..":
            if done:
                done.pop()
            continue
        here = b"/" + b"/".join(done)
        try:
            with _folder_fd(here) as fd:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None
        except OSError:  # gone, not a folder, no permission: the rest as given (realpath does so)
            done.append(name)
            done.extend(reversed(todo))
            break
        if target is None:
            done.append(name)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        if target.startswith(b"/"):
            done = []
        todo.extend(n for n in reversed(target.split(b"/")) if n)
    return os.fsdecode(b"/" + b"/".join(done))


@dataclass
class Listing:
    """What `walk_files` found under a folder (hidden names, starting with '.', are skipped)."""

    files: list[str] = field(default_factory=list)  # every entry that is no folder (links to files too)
    dir_links: list[str] = field(default_factory=list)  # links to folders: not followed
    not_listed: list[tuple[str, str]] = field(default_factory=list)  # (folder, why it could not be listed)


def walk_files(top: str) -> Listing:
    """The files under folder `top`, depth first in name order as os.walk gives them, at any depth
    (folders opened relative to their parent, never by a path over PATH_MAX)."""
    out = Listing()
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with _folder_fd(os.fsencode(folder)) as fd, os.scandir(fd) as it:
                entries = sorted((os.fsdecode(e.name), e) for e in it if not e.name.startswith("."))
                subfolders = []
                for name, entry in entries:
                    path = os.path.join(folder, name)
                    if entry.is_dir(follow_symlinks=False):
                        subfolders.append(path)
                    elif entry.is_symlink() and _is_dir_at(fd, name):
                        out.dir_links.append(path)
                    else:
                        out.files.append(path)
        except OSError as exc:
            if folder == top:
                raise
            out.not_listed.append((folder, exc.strerror or str(exc)))
            continue
        stack.extend(reversed(subfolders))
    return out


def _is_dir_at(fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=fd).st_mode)
    except OSError:
        return False
