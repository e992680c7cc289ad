"""Crash-safe files and folders for exports: a temp name in the same directory, fsync, rename."""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from typing import BinaryIO, Iterator

from dsdata.io.shards import _fsync_dir


@contextlib.contextmanager
def atomic_file(path: str) -> Iterator[BinaryIO]:
    """Write `path` under a hidden temp name, fsync it and rename it into place when the block ends
    without an exception; the temp file is removed otherwise."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "xb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _fsync_dir(os.path.dirname(path) or ".")


@contextlib.contextmanager
def staged_directory(target: str) -> Iterator[str]:
    """A fresh hidden directory beside `target` to fill; on success it replaces `target` (an older
    export there is moved aside, then deleted), so `target` is always a whole export or absent."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(target)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.mkdir(tmp)
    try:
        yield tmp
        aside = None
        if os.path.lexists(target):
            if os.path.islink(target) or not os.path.isdir(target):
                raise FileExistsError(f"{target} exists and is not a directory; refusing to replace it")
            aside = os.path.join(parent, f".{os.path.basename(target)}.old-{uuid.uuid4().hex[:12]}")
            os.rename(target, aside)
        os.rename(tmp, target)
        _fsync_dir(parent)
        if aside:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
