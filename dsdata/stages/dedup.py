"""`dedup`: exact + MinHash-LSH near-duplicate removal over the whole corpus (a Beam transform).

Every document gets `dup_cluster` (the id of the document kept for its cluster; its own id when it
has no duplicate) and `dup_cluster_size`.  One document per cluster is kept — the lowest id, or with
`keep: highest_score` the highest `score_field` (read from annotations, then metadata; documents
without a number there come last, ties go to the lowest id) — and the others are rejected with
reason `exact_duplicate` (same normalised text as the kept one) or `near_duplicate`.
How it scales and why: dsdata/beam/dedup/composite.py (the composite, built from `transform_config()`); the MinHash maths: dsdata/dedup/minhash.py.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from dsdata.stages.base import CorpusStage, Param, StageConfigError
from dsdata.stages.params import Boolean, Choice, Integer, Number, Text

KEEP_RULES = ("lowest_id", "highest_score")
VERIFY_MODES = ("exact", "signature", "none")


class DedupStage(CorpusStage):
    name = "dedup"
    description = "exact + MinHash-LSH near-duplicate removal (keeps one document per cluster)"
    params = {
        "threshold": Param(0.8, "Jaccard similarity of shingle sets at or above which documents are near-duplicates",
                           Number(0, 1, open_min=True, open_max=True)),
        # At most 4096: choosing bands × rows costs ~num_perm·ln(num_perm) S-curve integrals (2.6 s at
        # 4096, 10^20 stalled the run) and each signature is num_perm 64-bit values per document
        # (32 KiB at 4096); the estimate's error, ~1/sqrt(num_perm), is 1.6 % there.  MinHash
        # libraries default to 128 (datasketch) or 256.
        "num_perm": Param(128, "MinHash permutations (signature length)", Integer(min=1, max=4096)),
        "bands": Param(0, "LSH bands; 0 = chosen from threshold (bands × rows ≤ num_perm)", Integer(min=0)),
        "rows": Param(0, "LSH rows per band; 0 = chosen from threshold", Integer(min=0)),
        "ngram": Param(5, "words per shingle for space-separated text", Integer(min=1)),
        "char_ngram": Param(5, "characters per shingle for scripts written without spaces (CJK, Thai, …)", Integer(min=1)),
        "verify": Param("exact", "check LSH candidate pairs against threshold: exact (true Jaccard of the shingle "
                        "sets) | signature (MinHash estimate, less shuffled data) | none",
                        # YAML booleans are accepted for the verify modes of earlier recipes.
                        Choice(VERIFY_MODES, aliases={True: "signature", False: "none"})),
        "exact": Param(True, "remove exact duplicates (same text after NFKC, lower-casing, whitespace collapse)", Boolean()),
        "near": Param(True, "remove near-duplicates with MinHash-LSH", Boolean()),
        "keep": Param("lowest_id", "which document of a cluster to keep: lowest_id | highest_score", Choice(KEEP_RULES)),
        "score_field": Param("quality_score", "annotation or metadata field read by keep: highest_score", Text()),
        "seed": Param(1, "selects the MinHash permutations; runs compared with each other must share it", Integer(min=0)),
        "cc_rounds": Param(8, "large-star/small-star rounds of the connected-components step", Integer(min=1)),
        "batch_size": Param(256, "documents per signature batch", Integer(min=1)),
        "spill": Param(True, "park documents in files under RUN_DIR/.spill while only keys and decisions shuffle "
                       "(bounded memory on the in-process runner); false: documents travel through the shuffles",
                       Boolean()),
    }
    annotations = {"dup_cluster": pa.string(), "dup_cluster_size": pa.int64()}

    def validate(self) -> None:
        def need(cond: bool, message: str) -> None:
            if not cond:
                raise StageConfigError(f"stage 'dedup': {message}")

        need((self.bands == 0) == (self.rows == 0), "set both bands and rows, or neither (then threshold chooses them)")
        need(self.bands * self.rows <= self.num_perm,
             f"bands × rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        need(self.keep != "highest_score" or bool(self.score_field),
             "keep: highest_score needs score_field (an annotation or metadata field name)")
        need(self.exact or self.near, "at least one of exact and near must be true")

    def bands_rows(self) -> tuple[int, int]:
        """(bands, rows): as configured, or chosen from the threshold (see dsdata/dedup/lsh.py)."""
        if self.bands:
            return self.bands, self.rows
        from dsdata.dedup.lsh import choose_bands_rows

        weights = (0.05, 0.95) if self.verify != "none" else (0.5, 0.5)
        return choose_bands_rows(float(self.threshold), self.num_perm, *weights)

    def transform_config(self) -> dict[str, Any]:
        bands, rows = self.bands_rows()
        return {
            "num_perm": self.num_perm, "ngram": self.ngram, "char_ngram": self.char_ngram, "seed": self.seed,
            "bands": bands, "rows": rows, "threshold": float(self.threshold), "verify": self.verify,
            "exact": self.exact, "near": self.near,
            "score_field": self.score_field if self.keep == "highest_score" else None,
            "cc_rounds": self.cc_rounds, "batch_size": self.batch_size, "stage_name": self.name,
        }
