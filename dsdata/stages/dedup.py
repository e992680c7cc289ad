"""`dedup`: exact + MinHash-LSH near-duplicate removal over the whole corpus (a Beam transform).

Annotations, which document of a cluster is kept, the rejection reasons and the URL, line/span and
cross-run modes: docs/dedup.md.  The composite: dsdata/beam/dedup/composite.py, built from
`transform_config()`.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from dsdata.stages.base import Chart, CorpusStage, Param, StageConfigError
from dsdata.dedup.spans import LINE_UNITS
from dsdata.core.params import Boolean, Choice, Integer, Number, Path, Text

KEEP_RULES = ("lowest_id", "highest_score")


@dataclass(frozen=True)
class DedupConfig:
    """What the dedup composite (dsdata/beam/dedup/composite.py) needs: plain values, no stage."""

    stage_name: str
    num_perm: int
    ngram: int
    char_ngram: int
    seed: int
    bands: int
    rows: int
    threshold: float
    verify: str                      # one of VERIFY_MODES
    exact: bool
    near: bool
    score_field: str | None          # None: keep the lowest id of a cluster
    cc_rounds: int
    batch_size: int
    environment_errors: tuple[type[BaseException], ...] = ()
    spill_dir: str | None = None     # set by the composite from the run directory (`spill: true`)
    url: bool = False                # one document per normalised URL (dsdata/beam/dedup/spans.py)
    url_field: str = "url"
    lines: bool = False              # corpus-wide line / three-sentence-span dedup
    lines_unit: str = "line"
    lines_min_chars: int = 20
    lines_min_doc_chars: int = 50
    index: str | None = None         # write the kept documents' index here (dsdata/beam/dedup/index.py)
    against: str | None = None       # reject near-duplicates of the index there


VERIFY_MODES = ("exact", "signature", "none")


class DedupStage(CorpusStage):
    name = "dedup"
    charts = (Chart("clusters", "dup_cluster_size", "hist-dup-cluster",
                    "Duplicate-cluster sizes (one kept document per cluster)", "duplicate cluster sizes",
                    label="cluster size (documents)", also="dup_cluster"),)
    description = "exact + MinHash-LSH near-duplicate removal (keeps one document per cluster)"
    params = {
        "threshold": Param(0.8, "Jaccard similarity of shingle sets at or above which documents are near-duplicates",
                           Number(0, 1, open_min=True, open_max=True)),
        # At most 4096: choosing bands × rows costs ~num_perm·ln(num_perm) S-curve integrals (10^20
        # stalled the run), and the estimate's error, ~1/sqrt(num_perm), is already 1.6 % there.
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
        "url": Param(False, "keep one document per normalised URL (the record's url_field); the others are "
                     "rejected duplicate_url", Boolean()),
        "url_field": Param("url", "metadata (or annotation) field holding a record's URL", Text(nonempty=True)),
        "lines": Param(False, "corpus-wide: remove from each document the lines (or three-sentence spans) an "
                       "earlier document in keep order holds", Boolean()),
        "lines_unit": Param("line", "line | sentences (C4: every span of three sentences; CJK sentence ends count)",
                            Choice(LINE_UNITS)),
        "lines_min_chars": Param(20, "lines/spans shorter than this (normalised characters) are never removed",
                                 Integer(min=1)),
        "lines_min_doc_chars": Param(50, "a document left with fewer characters is rejected duplicate_lines",
                                     Integer(min=0)),
        "index": Param(None, "write the kept documents' MinHash signatures to this folder (a later run's "
                             "against)", Path(), nullable=True),
        "against": Param(None, "a previous run's index folder: documents near-duplicating one of its documents "
                               "(estimated Jaccard >= threshold) are rejected indexed_duplicate",
                         Path(must_exist="dir"), nullable=True),
        "spill": Param(True, "park documents in files under RUN_DIR/.spill while only keys and decisions shuffle "
                       "(bounded memory on the in-process runner); false: documents travel through the shuffles",
                       Boolean()),
    }
    annotations = {"dup_cluster": pa.string(), "dup_cluster_size": pa.int64(), "dup_lines_removed": pa.int64()}

    def validate(self) -> None:
        def need(cond: bool, message: str) -> None:
            if not cond:
                raise StageConfigError(f"stage 'dedup': {message}")

        need((self.bands == 0) == (self.rows == 0), "set both bands and rows, or neither (then threshold chooses them)")
        need(self.bands * self.rows <= self.num_perm,
             f"bands × rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        need(self.keep != "highest_score" or bool(self.score_field),
             "keep: highest_score needs score_field (an annotation or metadata field name)")
        need(self.exact or self.near or self.url or self.lines or self.against is not None,
             "at least one of exact, near, url and lines must be true (or against set)")
        for key in ("index", "against"):
            need(getattr(self, key) is None or "://" not in getattr(self, key), f"{key} must be a local folder")
        if self.against is not None:
            from dsdata.dedup.index import COMPARABLE, BadIndex, check_parts, read_manifest

            try:
                manifest = read_manifest(self.against)
            except BadIndex as exc:
                raise StageConfigError(f"dedup.against: {exc}") from None
            different = [f"{k}={manifest.get(k)!r} (this stage: {getattr(self, k)!r})" for k in COMPARABLE
                         if manifest.get(k) != getattr(self, k)]
            need(not different, f"against: the index in {self.against} was built with {', '.join(different)}; "
                                "set the same values (signatures are only comparable then)")
            try:  # each part's files and array header (not its data), before the run
                check_parts(self.against, manifest, self.num_perm)
            except BadIndex as exc:
                raise StageConfigError(f"dedup.against: {exc}") from None

    def bands_rows(self) -> tuple[int, int]:
        """(bands, rows): as configured, or chosen from the threshold (see dsdata/dedup/lsh.py)."""
        if self.bands:
            return self.bands, self.rows
        from dsdata.dedup.lsh import choose_bands_rows

        weights = (0.05, 0.95) if self.verify != "none" else (0.5, 0.5)
        return choose_bands_rows(float(self.threshold), self.num_perm, *weights)

    def transform_config(self) -> DedupConfig:
        bands, rows = self.bands_rows()
        return DedupConfig(
            stage_name=self.name, num_perm=self.num_perm, ngram=self.ngram, char_ngram=self.char_ngram,
            seed=self.seed, bands=bands, rows=rows, threshold=float(self.threshold), verify=self.verify,
            exact=self.exact, near=self.near,
            score_field=self.score_field if self.keep == "highest_score" else None,
            cc_rounds=self.cc_rounds, batch_size=self.batch_size, environment_errors=self.environment_errors,
            url=self.url, url_field=self.url_field, lines=self.lines, lines_unit=self.lines_unit,
            lines_min_chars=self.lines_min_chars, lines_min_doc_chars=self.lines_min_doc_chars,
            index=self.index, against=self.against,
        )
