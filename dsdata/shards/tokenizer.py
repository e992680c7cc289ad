"""The tokenizer inside a shard set, so the set stays portable (docs/shards.md): its files (only
tokenizer files, only regular files: a symlink is not followed) are copied into `<shard dir>/tokenizer/`
and recorded relatively with their sha256.  An older manifest (an absolute `path`) still reads.
"""
from __future__ import annotations

import os
import stat
from typing import Any

from dsdata.shards.format import ShardError, resolve_shard_path, verify_shards

from dsdata.io.outfiles import atomic_write_bytes, file_sha256

BUNDLE_DIR = "tokenizer"
# What AutoTokenizer / tokenizers read; model weights or anything else in the folder stay behind.
_TOKENIZER_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "added_tokens", "vocab", "merges", "spiece",
                            "sentencepiece")
MAX_TOKENIZER_FILE_BYTES = 1 << 30


def tokenizer_sources(path: str) -> list[tuple[str, str]]:
    """(source file, name in the bundle) of the tokenizer at `path` (a directory or a tokenizer.json)."""
    info = os.lstat(path)
    if stat.S_ISREG(info.st_mode):
        return [(path, "tokenizer.json")]
    if not stat.S_ISDIR(os.stat(path).st_mode):
        return []
    out = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith(_TOKENIZER_FILE_PREFIXES) and stat.S_ISREG(os.lstat(full).st_mode):
            out.append((full, name))
    return out


def bundle_tokenizer(directory: str, tokenizer: dict[str, Any] | None) -> dict[str, Any] | None:
    """Copy the tokenizer the manifest will name into `directory/tokenizer/`; returns the manifest's
    tokenizer entry naming the copies relatively.  A tokenizer without an existing path (a writer
    given only vocab_size / eos_id) is recorded as given."""
    if not tokenizer or tokenizer.get("bundled"):
        return tokenizer
    origin = tokenizer.get("path")
    if not isinstance(origin, str) or not origin or not os.path.exists(origin):
        return tokenizer
    sources = tokenizer_sources(origin)
    if not sources:
        return tokenizer
    target = os.path.join(directory, BUNDLE_DIR)
    os.makedirs(target, exist_ok=True)
    files = []
    for source, name in sources:
        if os.path.getsize(source) > MAX_TOKENIZER_FILE_BYTES:
            raise ShardError(f"tokenizer file {source} is over {MAX_TOKENIZER_FILE_BYTES} bytes; not bundling it with the shards")
        with open(source, "rb") as fh:
            data = fh.read()
        atomic_write_bytes(os.path.join(target, name), data)
        files.append({"file": f"{BUNDLE_DIR}/{name}", "sha256": file_sha256(os.path.join(target, name))})
    bundled = dict(tokenizer, path=BUNDLE_DIR, bundled=True, origin=os.path.abspath(origin), files=files)
    json_entry = next((f for f in files if f["file"] == f"{BUNDLE_DIR}/tokenizer.json"), None)
    if json_entry is not None:
        bundled["sha256"] = json_entry["sha256"]
    return bundled


def bundled_files(directory: str, manifest: dict[str, Any]) -> list[dict[str, str]]:
    """The bundled tokenizer files a manifest names ({"file", "sha256"}), each checked to be a plain
    relative name inside the shard directory; [] for a manifest without a bundle."""
    tokenizer = manifest.get("tokenizer") or {}
    files = tokenizer.get("files") if isinstance(tokenizer, dict) and tokenizer.get("bundled") else None
    if files is None:
        return []
    where = os.path.join(directory, "manifest.json")
    if not isinstance(files, list):
        raise ShardError(f"{where}: tokenizer.files must be a list")
    for entry in files:
        if not (isinstance(entry, dict) and isinstance(entry.get("file"), str) and isinstance(entry.get("sha256"), str)
                and entry["file"].startswith(BUNDLE_DIR + "/") and ".." not in entry["file"].split("/")):
            raise ShardError(f"{where}: tokenizer file entry {entry!r} must be {{file: tokenizer/NAME, sha256}}")
        resolve_shard_path(directory, entry["file"])
    return files


def verify_bundled_tokenizer(directory: str, manifest: dict[str, Any]) -> list[str]:
    """One line per bundled tokenizer file that is missing, a symlink, or fails its sha256."""
    problems = []
    for entry in bundled_files(directory, manifest):
        path = os.path.join(directory, entry["file"])
        if not os.path.isfile(path) or os.path.islink(path):
            problems.append(f"{path}: tokenizer file named in the manifest is missing")
        elif file_sha256(path) != entry["sha256"]:
            problems.append(f"{path}: sha256 does not match the manifest's {entry['sha256']} (changed tokenizer file)")
    return problems


def tokenizer_dir(directory: str, manifest: dict[str, Any]) -> str | None:
    """Where the shards' tokenizer is on this machine: the bundled copy (its files checked), else an
    older manifest's path when it exists; None when neither is there."""
    tokenizer = manifest.get("tokenizer") or {}
    if not isinstance(tokenizer, dict):
        return None
    if tokenizer.get("bundled"):
        if verify_bundled_tokenizer(directory, manifest):
            return None
        return resolve_shard_path(directory, BUNDLE_DIR)
    path = tokenizer.get("path")
    if isinstance(path, str) and path and "\x00" not in path:
        candidate = path if os.path.isabs(path) else os.path.join(directory, path)
        if os.path.exists(candidate):
            return candidate
    return None


def verify_shard_set(directory: str) -> tuple[dict[str, Any], list[str]]:
    """`verify_shards` plus the bundled tokenizer files: (manifest, one line per bad file)."""
    manifest, problems = verify_shards(directory)
    try:
        problems += verify_bundled_tokenizer(directory, manifest)
    except ShardError as exc:
        problems.append(str(exc))
    return manifest, problems
