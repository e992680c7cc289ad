"""Which documents a method augments, and how an augmented copy is recorded.  Selection and seeds
are hashes of (seed, method, document id): independent of workers, bundles and input order.
"""
from __future__ import annotations

import copy
import hashlib

from dsdata.document import Document

# Short method tags used in derived ids: "<source id>#bt", "<source id>#syn", "<source id>#ent".
ID_SUFFIX = {"back_translation": "bt", "synonym": "syn", "entity": "ent"}
STAGE_NAME = "augment"


def stable_hash(*parts: object) -> int:
    """A 64-bit hash of `parts` that is the same in every process (unlike hash())."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def is_selected(seed: int, method: str, doc_id: str, fraction: float) -> bool:
    """True for a seeded, deterministic `fraction` of document ids."""
    return fraction >= 1.0 or stable_hash(seed, method, doc_id) < fraction * 2**64


def derived_id(source_id: str, method: str) -> str:
    return f"{source_id}#{ID_SUFFIX[method]}"


def augmented_copy(doc: Document, method: str, text: str, similarity: float | None = None) -> Document:
    """A new document derived from `doc`: same metadata and annotations, new id and text."""
    annotations = copy.deepcopy(doc.annotations)
    annotations.update(
        augmentation=method,
        source_id=doc.id,
        derived_by=STAGE_NAME,
        augment_similarity=similarity,
    )
    return Document(
        id=derived_id(doc.id, method),
        text=text,
        metadata=copy.deepcopy(doc.metadata),
        annotations=annotations,
        derived_from=doc.id,
    )
