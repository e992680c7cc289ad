"""Where a run's files go: a local directory or an object-store prefix (s3://, gs://, …), one API.

Every output a run writes (kept/, rejected/, stats.json, side files, shards + manifest; report.html
through dsdata/beam/run_files.py) goes through Beam's FileSystems, which picks the file system by the path's scheme: the same code
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

from dsdata.io.inputs import InputPathError
from dsdata.io.outlock import OutputDirError
from dsdata.io.shards import atomic_write_bytes

_COPY_CHUNK = 8 << 20


def is_remote(path: str) -> bool:
    """A URL with a scheme (s3://, gs://, …): served by one of Beam's remote file systems."""
    return "://" in path


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


def use_options(options) -> None:
    """Give Beam's file systems the run's PipelineOptions before its Pipeline exists (a remote file
    system, S3's --s3_endpoint_url and credentials, reads its settings from them)."""
    FileSystems.set_options(options)


def check_remote_output(path: str) -> str:
    """A remote OUT (s3://, gs://): one probe object written and deleted, so a missing bucket,
    refused credentials or an unreachable endpoint are one line (OutputDirError) before anything
    runs; returns `path` without a trailing /.  Not locked: docs/engines.md "Object storage"."""
    path = path.rstrip("/")
    probe = join(path, f".dsdata-write-probe-{uuid.uuid4().hex}")
    try:
        with _one_line_errors():
            write_bytes(probe, b"x")
            remove_file(probe)
    except OSError as exc:
        raise OutputDirError(f"--output {path} is not writable: {exc}") from None
    return path


def check_remote_inputs(patterns: list[str]) -> None:
    """Each remote input pattern matches at least one object (listing it also checks the endpoint
    and the credentials); InputPathError in one line otherwise."""
    for pattern in patterns:
        try:
            with _one_line_errors():
                matched = FileSystems.match([pattern])[0].metadata_list
        except OSError as exc:
            raise InputPathError(f"cannot list input '{pattern}': {exc}") from None
        if not matched:
            raise InputPathError(f"no files match input '{pattern}'; check the path or pass --input GLOB")


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
