"""A run's MinHash index on disk (`dedup.index: DIR`) and the lookup `dedup.against: DIR` makes.

Layout and rules: docs/dedup.md.  No pickle anywhere: each .npy header is checked before its data is
read, JSON is bounded (dsdata/io/untrusted_files.py); a folder that breaks a rule is BadIndex, one
line.  num_perm, seed, ngram and char_ngram must match the later run's; bands and rows are its own.
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass

import numpy as np

from dsdata.dedup.lsh import band_keys
from dsdata.io.untrusted_files import (UntrustedFileError, confined_file, confined_path, load_json_file, load_npy,
                                       npy_header)

FORMAT = "dsdata-minhash-index"
MANIFEST = "manifest.json"
COMPARABLE = ("num_perm", "seed", "ngram", "char_ngram")
_PART_NAME = re.compile(r"^[0-9a-f]{32}$")
MAX_MANIFEST_BYTES = 64 << 20  # a part name is 35 bytes listed: over a million parts


class BadIndex(ValueError):
    """An index folder that cannot be used: one line naming the folder and what is wrong."""


def write_part(folder: str, name: str, ids: list[str], signatures: np.ndarray) -> None:
    np.save(os.path.join(folder, f"{name}.signatures.npy"), np.ascontiguousarray(signatures, dtype=np.uint32))
    with open(os.path.join(folder, f"{name}.ids.json"), "w", encoding="utf-8") as fh:
        json.dump(ids, fh, ensure_ascii=False)


def write_manifest(folder: str, params: dict, parts: list[str], documents: int) -> None:
    """The manifest last (an index without one is incomplete); part files of an earlier index removed."""
    keep = set(parts)
    for entry in os.listdir(folder):
        stem = entry.split(".", 1)[0]
        if _PART_NAME.match(stem) and stem not in keep and entry.endswith((".signatures.npy", ".ids.json")):
            os.unlink(os.path.join(folder, entry))
    manifest = {"format": FORMAT, "version": 1, **{k: params[k] for k in COMPARABLE},
                "documents": documents, "parts": sorted(parts)}
    tmp = os.path.join(folder, MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2)
    os.replace(tmp, os.path.join(folder, MANIFEST))


def read_manifest(folder: str) -> dict:
    """The index's manifest, read as an untrusted file (dsdata/io/untrusted_files.py: a regular file
    inside the folder, bounded size and nesting); BadIndex in one line otherwise."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.lexists(path):
        raise BadIndex(f"{folder} holds no {MANIFEST}: not a dedup index (write one with dedup.index: DIR)")
    try:
        manifest = load_json_file(confined_path(folder, MANIFEST, "dedup index manifest"), "dedup index manifest",
                                  max_bytes=MAX_MANIFEST_BYTES)
    except UntrustedFileError as exc:
        raise BadIndex(str(exc)) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != 1:
        raise BadIndex(f"{path} is not a {FORMAT} version 1 manifest")
    parts = manifest.get("parts")
    if not isinstance(parts, list) or not all(isinstance(p, str) and _PART_NAME.match(p) for p in parts):
        raise BadIndex(f"{path}: 'parts' must list part names (32 hex digits)")
    if len(set(parts)) != len(parts):
        raise BadIndex(f"{path}: 'parts' names a part twice")
    return manifest


def check_parts(folder: str, manifest: dict, num_perm: int) -> None:
    """Every part's files present and regular inside the folder, each signatures header honest
    (uint32 [n, num_perm], exactly the file's bytes): read before a run, headers only."""
    for part in manifest["parts"]:
        _part_files(folder, part, num_perm)


def _part_files(folder: str, part: str, num_perm: int) -> tuple[str, str]:
    what = f"dedup index part {part}"
    try:
        sig_path = confined_file(folder, f"{part}.signatures.npy", what)
        ids_path = confined_file(folder, f"{part}.ids.json", what)
        npy_header(sig_path, what, "<u4", (None, num_perm))
    except UntrustedFileError as exc:
        raise BadIndex(f"{exc} (in the index {folder})") from None
    return sig_path, ids_path


@dataclass
class LoadedIndex:
    ids: list[str]
    signatures: np.ndarray        # uint32 [n, num_perm]
    keys: list[np.ndarray]        # per band: sorted band keys
    rows_of: list[np.ndarray]     # per band: the signature row of each sorted key


def load_index(folder: str, params: dict, bands: int, rows: int) -> LoadedIndex:
    manifest = read_manifest(folder)
    different = [f"{k}={manifest.get(k)!r} (this stage: {params[k]!r})" for k in COMPARABLE if manifest.get(k) != params[k]]
    if different:
        raise BadIndex(f"the index in {folder} was built with {', '.join(different)}; set the same values "
                          "(signatures are only comparable then)")
    ids: list[str] = []
    sigs = []
    for part in manifest["parts"]:
        sig_path, ids_path = _part_files(folder, part, params["num_perm"])
        what = f"dedup index part {part}"
        try:
            arr = load_npy(sig_path, what, "<u4", (None, params["num_perm"]))
            part_ids = load_json_file(ids_path, what)
        except UntrustedFileError as exc:
            raise BadIndex(f"{exc} (in the index {folder})") from None
        if not isinstance(part_ids, list) or not all(isinstance(i, str) for i in part_ids):
            raise BadIndex(f"index part {part} in {folder}: its ids.json must be a list of id strings")
        if len(part_ids) != arr.shape[0]:
            raise BadIndex(f"index part {part} in {folder} is malformed ({arr.shape[0]} signatures, {len(part_ids)} ids)")
        ids.extend(part_ids)
        sigs.append(arr)
    signatures = np.concatenate(sigs) if sigs else np.empty((0, params["num_perm"]), dtype=np.uint32)
    all_keys = band_keys(signatures, bands, rows) if len(signatures) else np.empty((0, bands), dtype=np.uint64)
    keys, rows_of = [], []
    for b in range(bands):
        order = np.argsort(all_keys[:, b], kind="stable")
        keys.append(all_keys[order, b])
        rows_of.append(order)
    return LoadedIndex(ids, signatures, keys, rows_of)


_LOADED: dict[tuple, LoadedIndex] = {}
_LOCK = threading.Lock()


def shared_index(folder: str, params: dict, bands: int, rows: int) -> LoadedIndex:
    """load_index once per process (per folder, manifest version and parameters)."""
    st = os.stat(os.path.join(folder, MANIFEST))
    key = (os.path.abspath(folder), st.st_mtime_ns, st.st_size, tuple(params[k] for k in COMPARABLE), bands, rows)
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = load_index(folder, params, bands, rows)
        return _LOADED[key]


def best_match(index: LoadedIndex, doc_keys: np.ndarray, signature: np.ndarray, threshold: float) -> tuple[int, float] | None:
    """(row, estimated Jaccard) of the most similar indexed document sharing a band key with at least
    `threshold` estimated Jaccard, or None."""
    candidates: set[int] = set()
    for b, key in enumerate(doc_keys):
        keys = index.keys[b]
        lo = np.searchsorted(keys, key, side="left")
        hi = np.searchsorted(keys, key, side="right")
        if hi > lo:
            candidates.update(int(r) for r in index.rows_of[b][lo:hi])
    if not candidates:
        return None
    rows = np.fromiter(candidates, dtype=np.int64, count=len(candidates))
    sims = (index.signatures[rows] == signature).mean(axis=1)
    best = int(np.argmax(sims))
    return (int(rows[best]), float(sims[best])) if sims[best] >= threshold else None
