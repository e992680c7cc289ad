"""Publish shard sets to shared memory (/dev/shm/dsdata/NAME, or $DSDATA_SHM_ROOT/NAME) so that every
process on a node maps the same pages (docs/shards.md).  A set is copied into a private hidden temp
directory, every sha256 checked, the manifest written last, then renamed into place: readers see a
complete dataset or none.  Directories are 0700, files 0600; the root must be a real directory
owned by this user.  Publishing NAME again with the same shards is a no-op, another dataset refused.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import time
import uuid
from typing import Any

from dsdata.io.outfiles import file_sha256
from dsdata.io.outlock import pid_alive
from dsdata.shards.tokenizer import bundled_files, verify_shard_set
from dsdata.shards.format import MANIFEST, ShardError, read_manifest, resolve_shard_path

DEFAULT_ROOT = "/dev/shm/dsdata"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # \Z: "$" let "name\n" through
_STALE = re.compile(r"^\.(?P<name>.+)\.(?:tmp|rm)-(?P<pid>\d+)-[0-9a-f]+\Z")
_STALE_AGE_S = 24 * 3600
_COPY_CHUNK = 1 << 22


class ShmError(ValueError):
    """A publish/list/remove request that cannot be done; the message says why and what to do."""


def shm_root(root: str | None = None) -> str:
    return root or os.environ.get("DSDATA_SHM_ROOT") or DEFAULT_ROOT


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise ShmError(f"dataset name {name!r} must be 1-128 characters of letters, digits, '_', '-', '.' "
                       "and start with a letter or digit")


def ensure_root(root: str) -> str:
    """Create the root (0700) or check an existing one is a real directory of ours."""
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ShmError(f"cannot create shared-memory root {root} ({exc}); set DSDATA_SHM_ROOT to a writable tmpfs directory") from None
    info = os.lstat(root)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ShmError(f"{root} is not a real directory (a symlink?); refusing to publish there")
    if info.st_uid != os.getuid():
        raise ShmError(f"{root} belongs to uid {info.st_uid}, not to you ({os.getuid()}); "
                       "set DSDATA_SHM_ROOT to a directory of your own")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(root, 0o700)
    return root


def clean_stale(root: str) -> list[str]:
    """Remove temp directories of publishers/removers that died; returns their names."""
    removed = []
    if not os.path.isdir(root):
        return removed
    for entry in os.listdir(root):
        match = _STALE.match(entry)
        if not match:
            continue
        path = os.path.join(root, entry)
        pid = int(match.group("pid"))
        try:
            age = time.time() - os.lstat(path).st_mtime
        except FileNotFoundError:
            continue
        if pid != os.getpid() and (not pid_alive(pid) or age > _STALE_AGE_S):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(entry)
    return removed


def _dataset_identity(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((s["file"], s["sha256"]) for s in manifest["shards"])


def _copy_verified(src: str, dst: str, expected_sha256: str) -> None:
    digest = hashlib.sha256()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
        while block := fin.read(_COPY_CHUNK):
            fout.write(block)
            digest.update(block)
    if digest.hexdigest() != expected_sha256:
        raise ShmError(f"{src}: sha256 changed while copying (expected {expected_sha256}); the source is being modified or is corrupt")


def _verify_copy(directory: str, manifest: dict[str, Any]) -> None:
    for shard in manifest["shards"]:
        path = resolve_shard_path(directory, shard["file"])
        if file_sha256(path) != shard["sha256"]:
            raise ShmError(f"{path}: copy does not match its source's sha256 (out of memory on tmpfs?)")


def publish(shard_dir: str, name: str, root: str | None = None) -> dict[str, Any]:
    """Copy and verify `shard_dir` into ROOT/NAME atomically; returns a summary (status published/unchanged)."""
    _check_name(name)
    root = ensure_root(shm_root(root))
    clean_stale(root)
    manifest, problems = verify_shard_set(shard_dir)
    if problems:
        raise ShmError(f"not publishing {shard_dir}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
    target = os.path.join(root, name)
    summary = {"name": name, "path": target, "shards": len(manifest["shards"]),
               "tokens": sum(s["tokens"] for s in manifest["shards"]),
               "bytes": sum(s["bytes"] for s in manifest["shards"])}
    if os.path.lexists(target):
        return _same_or_refuse(target, manifest, name, summary)
    needed = summary["bytes"]
    free = shutil.disk_usage(root).free
    if needed > free:
        raise ShmError(f"{name}: needs {needed} bytes, {root} has {free} free; remove datasets (dsdata shm remove) "
                       "or raise the tmpfs size")
    tmp = os.path.join(root, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.mkdir(tmp, 0o700)
    try:
        for shard in manifest["shards"]:
            src = resolve_shard_path(shard_dir, shard["file"])
            _copy_verified(src, os.path.join(tmp, shard["file"]), shard["sha256"])
        _verify_copy(tmp, manifest)
        for entry in bundled_files(shard_dir, manifest):  # the tokenizer travels with the shards
            os.makedirs(os.path.dirname(os.path.join(tmp, entry["file"])), mode=0o700, exist_ok=True)
            _copy_verified(resolve_shard_path(shard_dir, entry["file"]), os.path.join(tmp, entry["file"]),
                           entry["sha256"])
        fd = os.open(os.path.join(tmp, MANIFEST), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(os.path.join(shard_dir, MANIFEST), "rb") as fin, os.fdopen(fd, "wb") as fout:
            fout.write(fin.read())
        try:
            os.rename(tmp, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY) or os.path.lexists(target):
                # Another publisher won the race: fine if it published the same dataset.
                return _same_or_refuse(target, manifest, name, summary)
            raise
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    summary["status"] = "published"
    return summary


def _same_or_refuse(target: str, manifest: dict[str, Any], name: str, summary: dict[str, Any]) -> dict[str, Any]:
    try:
        existing = read_manifest(target)
    except ShardError:
        existing = None
    if existing is None or _dataset_identity(existing) != _dataset_identity(manifest) or existing["dtype"] != manifest["dtype"]:
        raise ShmError(f"{target} already holds a different dataset named '{name}'; "
                       f"remove it first (dsdata shm remove {name}) or publish under another --name")
    summary["status"] = "unchanged"
    return summary


def list_published(root: str | None = None, verify: bool = False) -> list[dict[str, Any]]:
    """Published datasets under the root (hidden temp directories excluded, stale ones cleaned)."""
    root = shm_root(root)
    if not os.path.isdir(root):
        return []
    clean_stale(root)
    out = []
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry)
        if entry.startswith(".") or not os.path.isdir(path):
            continue
        item: dict[str, Any] = {"name": entry, "path": path}
        try:
            if verify:
                manifest, problems = verify_shard_set(path)
                item["ok"] = not problems
                if problems:
                    item["problems"] = problems
            else:
                manifest = read_manifest(path)
            item.update(shards=len(manifest["shards"]), tokens=sum(s["tokens"] for s in manifest["shards"]),
                        bytes=sum(s["bytes"] for s in manifest["shards"]), dtype=manifest["dtype"])
        except ShardError as exc:
            item["error"] = str(exc)
        out.append(item)
    return out


def remove(name: str, root: str | None = None) -> bool:
    """Remove ROOT/NAME (renamed aside first, so readers never see a half-deleted dataset)."""
    _check_name(name)
    root = shm_root(root)
    target = os.path.join(root, name)
    if not os.path.lexists(target):
        if os.path.isdir(root):
            clean_stale(root)
        return False
    ensure_root(root)
    aside = os.path.join(root, f".{name}.rm-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.rename(target, aside)
    shutil.rmtree(aside)
    clean_stale(root)
    return True
