"""`dedup`: exact + MinHash-LSH near-duplicate removal over the whole corpus (a Beam transform).

Every document gets `dup_cluster` (the id of the document kept for its cluster; its own id when it
has no duplicate) and `dup_cluster_size`.  One document per cluster is kept — the lowest id, or with
`keep: highest_score` the highest `score_field` (read from annotations, then metadata; documents
without a number there come last, ties go to the lowest id) — and the others are rejected with
reason `exact_duplicate` (same normalised text as the kept one) or `near_duplicate`.
How it scales and why: dsdata/beam/dedup.py; the MinHash maths: dsdata/dedup/minhash.py.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from dsdata.stages.base import Param, Stage, StageConfigError

KEEP_RULES = ("lowest_id", "highest_score")
VERIFY_MODES = ("exact", "signature", "none")


class DedupStage(Stage):
    name = "dedup"
    description = "exact + MinHash-LSH near-duplicate removal (keeps one document per cluster)"
    params = {
        "threshold": Param(0.8, "Jaccard similarity of shingle sets at or above which documents are near-duplicates"),
        "num_perm": Param(128, "MinHash permutations (signature length)"),
        "bands": Param(0, "LSH bands; 0 = chosen from threshold (bands × rows ≤ num_perm)"),
        "rows": Param(0, "LSH rows per band; 0 = chosen from threshold"),
        "ngram": Param(5, "words per shingle for space-separated text"),
        "char_ngram": Param(5, "characters per shingle for scripts written without spaces (CJK, Thai, …)"),
        "verify": Param("exact", "check LSH candidate pairs against threshold: exact (true Jaccard of the shingle "
                        "sets) | signature (MinHash estimate, less shuffled data) | none"),
        "exact": Param(True, "remove exact duplicates (same text after NFKC, lower-casing, whitespace collapse)"),
        "near": Param(True, "remove near-duplicates with MinHash-LSH"),
        "keep": Param("lowest_id", "which document of a cluster to keep: lowest_id | highest_score"),
        "score_field": Param("quality_score", "annotation or metadata field read by keep: highest_score"),
        "seed": Param(1, "selects the MinHash permutations; runs compared with each other must share it"),
        "cc_rounds": Param(8, "large-star/small-star rounds of the connected-components step"),
        "batch_size": Param(256, "documents per signature batch"),
    }
    annotations = {"dup_cluster": pa.string(), "dup_cluster_size": pa.int64()}

    def validate(self) -> None:
        def need(cond: bool, message: str) -> None:
            if not cond:
                raise StageConfigError(f"stage 'dedup': {message}")

        for key in ("num_perm", "ngram", "char_ngram", "cc_rounds", "batch_size"):
            value = getattr(self, key)
            need(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                 f"{key} must be a positive integer, got {value!r}")
        for key in ("bands", "rows", "seed"):
            value = getattr(self, key)
            need(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                 f"{key} must be a non-negative integer, got {value!r}")
        need(isinstance(self.threshold, (int, float)) and not isinstance(self.threshold, bool)
             and 0.0 < float(self.threshold) < 1.0,
             f"threshold must be a number between 0 and 1 (exclusive), got {self.threshold!r}")
        need((self.bands == 0) == (self.rows == 0), "set both bands and rows, or neither (then threshold chooses them)")
        need(self.bands * self.rows <= self.num_perm,
             f"bands × rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        need(self.keep in KEEP_RULES, f"keep must be one of {', '.join(KEEP_RULES)}, got {self.keep!r}")
        need(self.keep != "highest_score" or (isinstance(self.score_field, str) and self.score_field),
             "keep: highest_score needs score_field (an annotation or metadata field name)")
        # YAML booleans are accepted for the verify modes of earlier recipes.
        if isinstance(self.verify, bool):
            self.verify = "signature" if self.verify else "none"
        need(self.verify in VERIFY_MODES, f"verify must be one of {', '.join(VERIFY_MODES)}, got {self.verify!r}")
        for key in ("exact", "near"):
            need(isinstance(getattr(self, key), bool), f"{key} must be true or false, got {getattr(self, key)!r}")
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

    def beam_transform(self):
        from dsdata.beam.dedup import DedupTransform

        return DedupTransform(self.transform_config())
