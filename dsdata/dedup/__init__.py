"""MinHash / LSH core of the `dedup` stage: batched signatures, band parameters, band keys."""
from dsdata.dedup.lsh import band_keys, candidate_probability, choose_bands_rows
from dsdata.dedup.minhash import (
    MinHasher,
    estimate_jaccard,
    exact_hash,
    normalise_for_exact,
    normalise_for_shingles,
    shingle_strings,
)

__all__ = [
    "MinHasher",
    "band_keys",
    "candidate_probability",
    "choose_bands_rows",
    "estimate_jaccard",
    "exact_hash",
    "normalise_for_exact",
    "normalise_for_shingles",
    "shingle_strings",
]
