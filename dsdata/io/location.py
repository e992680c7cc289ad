"""Where a run's files go: a local directory or an object-store prefix (s3://, gs://, …), one API.

Every output a run writes (kept/, rejected/, stats.json, side files, shards + manifest, report.html)
goes through Beam's FileSystems, which picks the file system by the path's scheme: the same code
writes a local folder, S3 (apache-beam[aws]) or GCS (apache-beam[gcp]); nothing here names a scheme.
What differs is how a file becomes complete:

- local: written under a temporary name in the same folder, fsynced, then renamed (`os.replace`), so
  a file with its final name is never partial;
- object stores: an object appears only when its upload completes (Beam's S3 and GCS writers use
  multipart / resumable uploads committed on close), so writing the final name directly is already
  all-or-nothing; a "rename" there is a copy + delete and would add nothing.

Files that mark a finished result (stats.json, shards/manifest.json) are written last, with
`write_bytes`.  Object stores have no folders: `make_dirs` is a no-op there and removing a folder
removes the objects under its prefix.
"""
from __future__ import annotations

import logging
import os
import shutil
import uuid
from contextlib import contextmanager

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

TMP_MARK = ".tmp-"
_COPY_CHUNK = 8 << 20


def is_remote(path: str) -> bool:
    """A URL with a scheme (s3://, gs://, …): served by one of Beam's remote file systems."""
    return "://" in path


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(path: str) -> str:
    """A local temporary name beside `path`: hidden, and marked so a cleanup can find it."""
    return f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}{TMP_MARK}{uuid.uuid4().hex}"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TMP_MARK in name


def commit_local(tmp: str, path: str) -> None:
    """fsync the finished local file `tmp` and rename it to `path` (then fsync the folder)."""
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to the local `path` via a temp file in the same directory + fsync + rename."""
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        commit_local(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_bytes(path: str, data: bytes) -> None:
    """Write a whole file so that no reader ever sees it partial (see the module docstring)."""
    if is_remote(path):
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            fh.write(data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write_bytes(path, data)


def upload(local_path: str, path: str) -> None:
    """Copy the finished local file `local_path` to the remote `path`, streamed in chunks."""
    with open(local_path, "rb") as src, \
            FileSystems.create(path, "application/octet-stream", CompressionTypes.UNCOMPRESSED) as dst:
        while block := src.read(_COPY_CHUNK):
            dst.write(block)


def storage_error(exc: BaseException) -> str:
    """One line for what a file system raised: Beam wraps a client's error (S3's AccessDenied,
    NoSuchBucket, a refused connection) in a BeamIOError holding it per path."""
    details = getattr(exc, "exception_details", None)
    while isinstance(details, dict) and details:  # a match wraps an exists() wraps the client's error
        exc = next(iter(details.values()))
        details = getattr(exc, "exception_details", None)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def check_writable(folder: str) -> None:
    """Write and delete one probe file in `folder` (remote too): a missing bucket, refused
    credentials or an unreachable endpoint surface as OSError (one line) before a run starts."""
    probe = join(folder, f".dsdata-write-probe-{uuid.uuid4().hex}")
    with _one_line_errors():
        write_bytes(probe, b"x")
        remove_file(probe)


def matching(pattern: str) -> list[str]:
    """The files a pattern matches (remote: listing it also checks the endpoint and credentials);
    OSError in one line when it cannot be listed."""
    with _one_line_errors():
        return [m.path for m in FileSystems.match([pattern])[0].metadata_list]


@contextmanager
def _one_line_errors():
    """What a file system raises inside the block → OSError(one line).  Beam's S3 client logs a
    failed request with its traceback before raising; that log is held back here, the raised
    error says the same in one line."""
    logging.disable(logging.ERROR)
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every file system raises its own kinds
        raise OSError(storage_error(exc)) from None
    finally:
        logging.disable(logging.NOTSET)


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def size(path: str) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    return FileSystems.match([path], [1])[0].metadata_list[0].size_in_bytes


def make_dirs(path: str) -> None:
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def join(base: str, *names: str) -> str:
    return FileSystems.join(base, *names) if is_remote(base) else os.path.join(base, *names)


def list_names(folder: str) -> list[str]:
    """The names of the files directly in `folder` (remote: the objects under its prefix, one level)."""
    if not is_remote(folder):
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    prefix = folder.rstrip("/") + "/"
    found = FileSystems.match([prefix + "*"])[0].metadata_list
    return sorted(m.path[len(prefix):] for m in found if "/" not in m.path[len(prefix):])


def remove_tree(folder: str) -> None:
    """Delete `folder` and everything in it (remote: every object under its prefix); absent is fine."""
    if not is_remote(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return
    found = FileSystems.match([folder.rstrip("/") + "/**"])[0].metadata_list
    if found:
        FileSystems.delete([m.path for m in found])


def remove_file(path: str) -> None:
    """Delete one file if it is there."""
    if not is_remote(path):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return
    if FileSystems.exists(path):
        FileSystems.delete([path])
