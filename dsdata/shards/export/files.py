"""Crash-safe files and folders for exports: a temp name in the same directory, fsync, rename.

An export replaces only a folder it wrote: each format folder holds the marker file `.dsdata-export`
(written first, checked with lstat: a link named so does not count); an absent or empty target is
taken too, anything else (a user's own `DST/megatron`, a link, a file) is refused, nothing deleted."""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from typing import Iterator

from dsdata.io.outfiles import atomic_file, fsync_dir

EXPORT_MARKER = ".dsdata-export"


class NotAnExportFolder(FileExistsError):
    """DST/<format> is there and is not a folder an export wrote (nor empty): it is not replaced."""


def check_replaceable(target: str) -> None:
    """NotAnExportFolder (one line) unless `target` is absent, an empty folder, or a folder holding
    the export marker as a regular file; nothing is followed (a link at `target` is refused)."""
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        kind = "a link" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise NotAnExportFolder(f"{target} exists and is {kind}; refusing to replace it")
    if not os.listdir(target):
        return
    try:
        marker = os.lstat(os.path.join(target, EXPORT_MARKER))
    except FileNotFoundError:
        marker = None
    if marker is None or not stat.S_ISREG(marker.st_mode):
        raise NotAnExportFolder(f"{target} is a folder dsdata's export did not write (no {EXPORT_MARKER} file in "
                                "it); refusing to replace it: remove it or choose another DST")


@contextlib.contextmanager
def staged_directory(target: str) -> Iterator[str]:
    """A fresh hidden directory beside `target` (holding the export marker) to fill; on success it
    replaces `target` (an older export there, checked by check_replaceable, is moved aside, then
    deleted), so `target` is always a whole export or absent."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(target)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.mkdir(tmp)
    try:
        with atomic_file(os.path.join(tmp, EXPORT_MARKER)) as fh:
            fh.write(b"written by dsdata shards export; a later export may replace this folder\n")
        yield tmp
        aside = None
        check_replaceable(target)
        if os.path.lexists(target):
            aside = os.path.join(parent, f".{os.path.basename(target)}.old-{uuid.uuid4().hex[:12]}")
            os.rename(target, aside)
        os.rename(tmp, target)
        fsync_dir(parent)
        if aside:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
