"""Deduplication cores of the `dedup` stage: MinHash signatures (minhash.py), LSH bands (lsh.py),
the reference index (index.py) and URL / line / span keys (spans.py)."""
