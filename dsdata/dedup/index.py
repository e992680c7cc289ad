"""A run's MinHash index on disk (`dedup.index: DIR`) and the lookup `dedup.against: DIR` makes.

Layout (no pickle anywhere: numpy arrays loaded with allow_pickle=False, JSON):
  DIR/manifest.json            {"format": "dsdata-minhash-index", "version": 1, "num_perm", "seed",
                                "ngram", "char_ngram", "documents", "parts": [name, …]}
  DIR/NAME.signatures.npy      uint32 [n, num_perm]: the MinHash signatures of one part's documents
  DIR/NAME.ids.json            their ids, in the same order
Only the kept documents of the run are written (the deduplicated corpus).  The MinHash parameters
that make signatures comparable (num_perm, seed, ngram, char_ngram) are recorded and a later run
must use the same; bands and rows are the later run's own (band keys are recomputed).
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass

import numpy as np

from dsdata.dedup.lsh import band_keys

FORMAT = "dsdata-minhash-index"
MANIFEST = "manifest.json"
COMPARABLE = ("num_perm", "seed", "ngram", "char_ngram")
_PART_NAME = re.compile(r"^[0-9a-f]{32}$")


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
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise BadIndex(f"{folder} holds no {MANIFEST}: not a dedup index (write one with dedup.index: DIR)")
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except ValueError as exc:
        raise BadIndex(f"{path} is not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != 1:
        raise BadIndex(f"{path} is not a {FORMAT} version 1 manifest")
    parts = manifest.get("parts")
    if not isinstance(parts, list) or not all(isinstance(p, str) and _PART_NAME.match(p) for p in parts):
        raise BadIndex(f"{path}: 'parts' must list part names (32 hex digits)")
    return manifest


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
        sig_path = os.path.join(folder, f"{part}.signatures.npy")
        try:
            arr = np.load(sig_path, allow_pickle=False)
            with open(os.path.join(folder, f"{part}.ids.json"), encoding="utf-8") as fh:
                part_ids = json.load(fh)
        except (OSError, ValueError) as exc:
            raise BadIndex(f"index part {part} in {folder} cannot be read: {exc}") from None
        if (arr.dtype != np.uint32 or arr.ndim != 2 or arr.shape[1] != params["num_perm"]
                or not isinstance(part_ids, list) or len(part_ids) != arr.shape[0]):
            raise BadIndex(f"index part {part} in {folder} is malformed (signatures {arr.dtype} {arr.shape}, "
                              f"{len(part_ids) if isinstance(part_ids, list) else 'no'} ids)")
        ids.extend(str(i) for i in part_ids)
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
