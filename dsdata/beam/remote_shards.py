"""A shard set on object storage (s3://BUCKET/out, gs://…), copied to a local folder for the commands
that read shards: `dsdata shards verify|info|export` and `dsdata shm publish`.

Shards are memory-mapped, so a remote set is fetched first: its manifest, then exactly the files it
names (confined to the folder), into a temporary folder removed afterwards.  An object larger than
its manifest entry is copied only one byte past that size, so an untrusted bucket cannot fill the
disk; a missing object stays missing (verify names it).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

from dsdata.beam import location
from dsdata.shards.tokenizer import MAX_TOKENIZER_FILE_BYTES, bundled_files
from dsdata.shards.format import MANIFEST, ShardError, read_manifest, resolve_shard_path
from dsdata.io.untrusted_files import MAX_JSON_BYTES


def locate_remote_shard_dir(path: str) -> str:
    """The remote shard folder: `path` itself when it holds manifest.json, else its shards/ (a `dsdata
    run` output prefix); ShardError in one line otherwise (as dsdata.shards.format.locate_shard_dir)."""
    path = path.rstrip("/")
    nested = location.join(path, "shards")
    try:
        for candidate in (path, nested):
            if location.exists(location.join(candidate, MANIFEST)):
                return candidate
        finished_run = location.exists(location.join(path, "stats.json"))
        partial = _any_object_under(nested)
    except Exception as exc:  # noqa: BLE001 - refused credentials, a missing bucket: one line
        raise ShardError(f"cannot read {path}: {location.storage_error(exc)}") from None
    if partial:
        raise ShardError(f"{location.join(nested, MANIFEST)} not found: the run that writes {path} did not finish "
                         "writing its shards (the manifest is written last); run it again")
    if finished_run:
        raise ShardError(f"{path} is a `dsdata run` output without shards/ (its recipe has no shards stage)")
    raise ShardError(f"{path}: no {MANIFEST} there nor under shards/: not a shard set; give a `dsdata run` "
                     "output prefix (holding shards/) or its shards/ folder")


def _any_object_under(prefix: str) -> bool:
    from apache_beam.io.filesystems import FileSystems

    return bool(FileSystems.match([prefix.rstrip("/") + "/*"], [1])[0].metadata_list)


@contextmanager
def local_shard_set(path: str, with_files: bool = True) -> Iterator[tuple[str, str]]:
    """(the local copy's folder, the remote shard folder) of the shard set at `path` (a shard folder
    or a run's output prefix); only the manifest when `with_files` is False.  The copy is removed
    when the block ends."""
    remote = locate_remote_shard_dir(path)
    with tempfile.TemporaryDirectory(prefix="dsdata-shards-") as local:
        try:
            _fetch(location.join(remote, MANIFEST), os.path.join(local, MANIFEST), MAX_JSON_BYTES)
            if with_files:
                _fetch_files(local, remote)
        except ShardError as exc:  # a bad manifest: named by its remote path
            raise ShardError(shown(str(exc), local, remote)) from None
        yield local, remote


def _fetch_files(local: str, remote: str) -> None:
    manifest = read_manifest(local)  # the names it lists are checked to stay inside the folder
    wanted = [(s["file"], s["bytes"]) for s in manifest["shards"]]
    wanted += [(f["file"], MAX_TOKENIZER_FILE_BYTES) for f in bundled_files(local, manifest)]
    needed, free = sum(s["bytes"] for s in manifest["shards"]), shutil.disk_usage(local).free
    if needed > free:
        raise ShardError(f"copying the shard set {remote} to {os.path.dirname(local)} needs {needed} bytes, {free} "
                         "are free there; point TMPDIR at a larger disk")
    for name, size in wanted:
        target = resolve_shard_path(local, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _fetch(location.join(remote, name), target, size, missing_ok=True)


def _fetch(path: str, local_path: str, max_bytes: int, missing_ok: bool = False) -> None:
    try:
        if missing_ok and not location.exists(path):
            return
        location.download(path, local_path, max_bytes)
    except Exception as exc:  # noqa: BLE001 - every file system raises its own kinds
        raise ShardError(f"cannot copy {path}: {location.storage_error(exc)}") from None


def shown(text: str, local: str, remote: str) -> str:
    """A line about the local copy, naming the remote files instead."""
    for spelling in {os.path.realpath(local), local}:
        text = text.replace(spelling, remote)
    return text
