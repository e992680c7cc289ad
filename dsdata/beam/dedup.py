"""Whole-corpus deduplication as one composite Beam transform: exact + MinHash-LSH near duplicates.

Steps (each a Beam shuffle; no step ever holds the corpus in one process):

1. **Signatures** — documents are batched (`BatchElements`) and a `MinHasher` computes every batch's
   signatures in one pass (numba kernels when installed, else vectorised numpy; same values).  Each document gets a *node key*
   `[score prefix] id \\x1f exact-hash`, whose string order is the keep order (lowest id, or highest
   score then lowest id), so "keep the smallest node of a cluster" implements the keep rule.
2. **Exact** — group by the 128-bit hash of the normalised text; every member links to the group's
   smallest node, and only that node goes on to LSH.
3. **LSH** — every representative emits one (band key → node) element per band; `GroupByKey` forms
   the buckets.  A bucket of k nodes yields its candidate pairs: all pairs when k ≤ 32 and
   verification is on, else a star from the smallest node (k − 1 pairs).
4. **Verify** (`verify: exact`, the default, or `signature`; `none` skips it) — candidate pairs
   meet the two documents' verification data through a `CoGroupByKey` on node and a `GroupByKey` on
   the pair, and pairs below the threshold are dropped.  `exact` carries each document's distinct
   shingle hashes (4 bytes per distinct shingle) and computes the true Jaccard of the pair;
   `signature` carries the signature (num_perm × 4 bytes) and uses its estimate, whose standard
   deviation (±0.035 at J = 0.8 with 128 permutations) lets pairs just below the threshold in and
   some just above it out.
5. **Connected components** — alternating *large-star* and *small-star* rounds (Kiveris et al.,
   "Connected Components in MapReduce and Beyond", 2014), each one `GroupByKey` over the edges,
   unrolled `cc_rounds` times.  They turn every component into a star around its smallest node in
   O(log² n) rounds (a handful in practice: duplicate clusters have small diameters).  If a
   component is not a star after the last round (counter `dsdata.dedup/cc_unconverged_nodes`), its
   nodes without a smaller neighbour are all kept: the result is conservative (fewer removals),
   never a lost document.
6. **Decide** — nodes are grouped by their component label (the smallest node) for the cluster size,
   then joined back to their documents (`CoGroupByKey` on node): the label node is kept, the others
   are rejected as `exact_duplicate` (same normalised text as the kept one) or `near_duplicate`.

Memory: per worker, one signature batch (`batch_size` × num_perm × 4 bytes plus the batch's text),
and per key one group — an exact-duplicate group, a band bucket, a node's neighbourhood in the
component rounds or a cluster's member list — all O(cluster size) node keys (~40 bytes each), so
a worker needs memory proportional to the largest duplicate cluster, not to the corpus.  Shuffled
volume grows linearly with the corpus: per document one exact record, `bands` bucket entries
(~50 bytes each), its verification data (above) and the document itself once
for the final join; edges exist only for duplicates.  On the in-process DirectRunner the runner
process itself holds those shuffles, so its memory grows with the corpus (see docs/dedup.md for
measured peaks); distributed runners spill them to disk.
"""
from __future__ import annotations

import logging
import struct
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from dsdata.dedup.lsh import band_keys
from dsdata.dedup.minhash import MinHasher, exact_hash, fold
from dsdata.document import Document, Rejected, metadata_json

log = logging.getLogger("dsdata")

KEPT = "kept"
REJECTED = "rejected"
_RECORDS = "records"
_SIGNATURES = "signatures"
_SEP = "\x1f"
_HASH_HEX = 16  # node keys carry the first 8 bytes of the exact hash, as hex
_SCORE_HEX = 16
# Buckets up to this size contribute all their pairs to verification (so one chance collision in a
# bucket cannot hide a true pair behind a failed star edge); larger ones contribute a star.
_ALL_PAIRS_LIMIT = 32


def _descending_score_prefix(score: float | None) -> str:
    """16 hex digits whose string order is descending score order (missing scores last)."""
    if score is None or score != score:  # None or NaN
        return "f" * _SCORE_HEX
    (bits,) = struct.unpack(">Q", struct.pack(">d", float(score)))
    ascending = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
    return format(0xFFFFFFFFFFFFFFFF - ascending, "016x")


def _score_of(doc: Document, field: str) -> float | None:
    value = doc.annotations.get(field, doc.metadata.get(field))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def node_key(doc: Document, digest: bytes, score_field: str | None) -> str:
    """The document's node key; string order = keep order."""
    prefix = _descending_score_prefix(_score_of(doc, score_field)) if score_field else ""
    return f"{prefix}{doc.id}{_SEP}{digest[: _HASH_HEX // 2].hex()}"


def _doc_fields(doc: Document) -> tuple:
    """A Document as a tuple of primitives: Beam's fast coder encodes these natively, whereas a
    dataclass falls back to pickling — the difference is most of the cost of the final join."""
    return doc.id, doc.text, doc.metadata, doc.annotations, doc.derived_from


def node_id(node: str, prefix_len: int) -> str:
    return node[prefix_len: -(_HASH_HEX + 1)]


def _node_hash(node: str) -> str:
    return node[-_HASH_HEX:]


class _SignatureDoFn(beam.DoFn):
    """Batch of documents → (node, doc), exact records and (when verifying) verification data."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg

    def setup(self):
        c = self.cfg
        self.hasher = MinHasher(c["num_perm"], c["ngram"], c["char_ngram"], c["seed"])
        self.no_shingles = Metrics.counter("dsdata.dedup", "docs_without_shingles")

    def process(self, batch: list[Document]):
        c = self.cfg
        docs = list(batch)
        sigs = has = keys = shingled = distinct = None
        folded = [fold(d.text) for d in docs]
        if c["near"]:
            shingled = self.hasher.shingle([d.text for d in docs], folded)
            sigs, has = self.hasher.signatures_from_shingles(shingled)
            keys = band_keys(sigs, c["bands"], c["rows"])
            if c["verify"] == "exact":
                distinct = self.hasher.distinct_top32(shingled)
        for i, doc in enumerate(docs):
            digest = exact_hash(doc.text, folded[i])
            node = node_key(doc, digest, c["score_field"])
            yield node, _doc_fields(doc)
            bands = None
            if c["near"] and has[i]:
                bands = keys[i].tobytes()
                if c["verify"] == "signature":
                    yield beam.pvalue.TaggedOutput(_SIGNATURES, (node, sigs[i].tobytes()))
                elif c["verify"] == "exact":
                    # Top 32 bits of each distinct shingle hash: a chance collision inside one
                    # pair (p ≈ n²/2^33) moves its Jaccard by 1/n at most.
                    yield beam.pvalue.TaggedOutput(_SIGNATURES, (node, distinct[i].tobytes()))
            elif c["near"]:
                self.no_shingles.inc()
            # Without exact dedup every node is its own group: key it by the node itself.
            group = digest if c["exact"] else node.encode("utf-8")
            yield beam.pvalue.TaggedOutput(_RECORDS, (group, (node, bands)))


class _ExactGroups(beam.DoFn):
    """One exact-hash group → edges member → representative; the representative goes on to LSH."""

    def process(self, item):
        _, members = item
        rep, rep_bands = None, None
        for node, bands in members:
            if rep is None or node < rep:
                rep, rep_bands = node, bands
        seen = {rep}
        for node, _ in members:
            if node not in seen:
                seen.add(node)
                yield beam.pvalue.TaggedOutput("edges", (node, rep))
        if rep_bands is not None:
            yield rep, rep_bands


def _band_items(item):
    node, bands = item
    for key in np.frombuffer(bands, dtype=np.uint64).tolist():
        yield key, node


class _BucketPairs(beam.DoFn):
    def __init__(self, all_pairs: bool):
        self.all_pairs = all_pairs

    def setup(self):
        self.buckets = Metrics.counter("dsdata.dedup", "buckets_with_candidates")
        self.largest = Metrics.distribution("dsdata.dedup", "bucket_size")

    def process(self, item):
        _, nodes = item
        members = sorted(set(nodes))
        if len(members) < 2:
            return
        self.buckets.inc()
        self.largest.update(len(members))
        if self.all_pairs and len(members) <= _ALL_PAIRS_LIMIT:
            for i, a in enumerate(members):
                for b in members[i + 1:]:
                    yield a, b
        else:
            anchor = members[0]
            for b in members[1:]:
                yield anchor, b


def _pair_refs(pair):
    yield pair[0], pair
    yield pair[1], pair


def _signature_to_pairs(item):
    _, grouped = item
    sigs = list(grouped[_SIGNATURES])
    if not sigs:
        return
    for pair in grouped["pairs"]:
        yield pair, sigs[0]


def pair_similarity(a: bytes, b: bytes, mode: str) -> float:
    """Jaccard of a pair from its verification data: exact (distinct shingle hashes) or estimated."""
    x, y = np.frombuffer(a, dtype=np.uint32), np.frombuffer(b, dtype=np.uint32)
    if mode == "signature":
        return float(np.mean(x == y))
    inter = len(np.intersect1d(x, y, assume_unique=True))
    union = len(x) + len(y) - inter
    return inter / union if union else 1.0


class _VerifyPair(beam.DoFn):
    def __init__(self, threshold: float, mode: str):
        self.threshold, self.mode = threshold, mode

    def setup(self):
        self.kept = Metrics.counter("dsdata.dedup", "pairs_verified")
        self.dropped = Metrics.counter("dsdata.dedup", "pairs_below_threshold")

    def process(self, item):
        pair, sigs = item
        sigs = list(sigs)
        if len(sigs) < 2:
            return
        if pair_similarity(sigs[0], sigs[1], self.mode) >= self.threshold:
            self.kept.inc()
            yield pair
        else:
            self.dropped.inc()


def _both_directions(edge):
    a, b = edge
    yield a, b
    yield b, a


def _large_star(item):
    """Link every strictly larger neighbour of u to the smallest node of u's neighbourhood."""
    u, neighbours = item
    neigh = set(neighbours)
    m = min(min(neigh), u)
    for v in neigh:
        if v > u:
            yield v, m


def _to_larger_endpoint(edge):
    a, b = edge
    if a != b:
        yield (a, b) if a > b else (b, a)


def _small_star(item):
    """Link u and its smaller neighbours to the smallest of them."""
    u, smaller = item
    neigh = set(smaller)
    m = min(neigh)
    for v in neigh | {u}:
        if v != m:
            yield v, m


class _Labels(beam.DoFn):
    """Node → component label (its smallest neighbour or itself), checking star convergence."""

    def setup(self):
        self.unconverged = Metrics.counter("dsdata.dedup", "cc_unconverged_nodes")

    def process(self, item):
        u, neighbours = item
        neigh = set(neighbours)
        m = min(min(neigh), u)
        if m < u and len(neigh) > 1:
            self.unconverged.inc()
        yield u, m


class ConnectedComponents(beam.PTransform):
    """PCollection of undirected edges (a, b) → (node, label) for every node on an edge, where
    label is the component's smallest node (after `rounds` large-star/small-star rounds)."""

    def __init__(self, rounds: int):
        super().__init__()
        self.rounds = rounds

    def expand(self, edges):
        for r in range(self.rounds):
            edges = (
                edges
                | f"LargeStarKeys{r}" >> beam.FlatMap(_both_directions)
                | f"LargeStarGroup{r}" >> beam.GroupByKey()
                | f"LargeStar{r}" >> beam.FlatMap(_large_star)
                | f"SmallStarKeys{r}" >> beam.FlatMap(_to_larger_endpoint)
                | f"SmallStarGroup{r}" >> beam.GroupByKey()
                | f"SmallStar{r}" >> beam.FlatMap(_small_star)
            )
        return (
            edges
            | "LabelKeys" >> beam.FlatMap(_both_directions)
            | "LabelGroup" >> beam.GroupByKey()
            | "Label" >> beam.ParDo(_Labels())
        )


def _cluster_sizes(item):
    label, members = item
    members = set(members)
    members.add(label)
    for node in members:
        yield node, (label, len(members))


class _Decide(beam.DoFn):
    """Join a node's documents with its cluster decision: keep the label node, reject the rest."""

    def __init__(self, stage_name: str, prefix_len: int):
        self.stage_name, self.prefix_len = stage_name, prefix_len

    def setup(self):
        self.ns = f"dsdata.{self.stage_name}"
        self.n_in = Metrics.counter(self.ns, "in")
        self.n_kept = Metrics.counter(self.ns, "kept")
        self.n_exact = Metrics.counter(self.ns, "rejected.exact_duplicate")
        self.n_near = Metrics.counter(self.ns, "rejected.near_duplicate")

    def _reject(self, doc: Document, reason: str, detail: str):
        (self.n_exact if reason == "exact_duplicate" else self.n_near).inc()
        return beam.pvalue.TaggedOutput(REJECTED, Rejected(doc, self.stage_name, reason, detail))

    def process(self, item):
        node, grouped = item
        docs = [Document(*fields) for fields in grouped["docs"]]
        if not docs:
            return
        # Several documents can share a node key only with the same id and the same text; the
        # order among them is made deterministic so reruns keep the same one.
        docs.sort(key=lambda d: (metadata_json(d.metadata), metadata_json(d.annotations)))
        decisions = list(grouped["decision"])
        label, size = decisions[0] if decisions else (node, 1)
        size += len(docs) - 1
        kept_id = node_id(label, self.prefix_len)
        for i, doc in enumerate(docs):
            self.n_in.inc()
            doc.annotations["dup_cluster"] = kept_id
            doc.annotations["dup_cluster_size"] = size
            if i == 0 and label == node:
                self.n_kept.inc()
                yield doc
            elif i > 0 or _node_hash(node) == _node_hash(label):
                yield self._reject(doc, "exact_duplicate", f"same normalised text as kept document '{kept_id}'")
            else:
                yield self._reject(
                    doc, "near_duplicate", f"near-duplicate cluster of {size} kept as document '{kept_id}'"
                )


class DedupTransform(beam.PTransform):
    """PCollection[Document] → {"kept": …, "rejected": …}: exact + MinHash-LSH near deduplication.

    cfg keys: num_perm, ngram, char_ngram, seed, bands, rows, threshold, verify, exact, near,
    score_field (None = keep the lowest id), cc_rounds, batch_size, stage_name.
    """

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.cfg = dict(cfg)

    def expand(self, docs):
        c = self.cfg
        prefix_len = _SCORE_HEX if c["score_field"] else 0
        out = (
            docs
            | "Batch" >> beam.BatchElements(min_batch_size=min(16, c["batch_size"]), max_batch_size=c["batch_size"])
            | "Signatures" >> beam.ParDo(_SignatureDoFn(c)).with_outputs(_RECORDS, _SIGNATURES, main="docs")
        )
        exact = (
            out[_RECORDS]
            | "ExactGroup" >> beam.GroupByKey()
            | "ExactPick" >> beam.ParDo(_ExactGroups()).with_outputs("edges", main="reps")
        )
        edge_sets = [exact["edges"]]
        if c["near"]:
            pairs = (
                exact["reps"]
                | "BandItems" >> beam.FlatMap(_band_items)
                | "Buckets" >> beam.GroupByKey()
                | "BucketPairs" >> beam.ParDo(_BucketPairs(all_pairs=c["verify"] != "none"))
                | "DistinctPairs" >> beam.Distinct()
            )
            if c["verify"] != "none":
                refs = pairs | "PairRefs" >> beam.FlatMap(_pair_refs)
                pairs = (
                    {_SIGNATURES: out[_SIGNATURES], "pairs": refs}
                    | "JoinSignatures" >> beam.CoGroupByKey()
                    | "SignatureToPairs" >> beam.FlatMap(_signature_to_pairs)
                    | "PairGroup" >> beam.GroupByKey()
                    | "Verify" >> beam.ParDo(_VerifyPair(c["threshold"], c["verify"]))
                )
            edge_sets.append(pairs)
        edges = edge_sets | "AllEdges" >> beam.Flatten()
        if c["near"]:
            labels = edges | "Components" >> ConnectedComponents(c["cc_rounds"])
        else:
            # Exact links already form stars around each group's smallest node.
            labels = edges | "StarLabels" >> beam.FlatMap(lambda e: [e, (e[1], e[1])])
        decisions = (
            labels
            | "ByLabel" >> beam.Map(lambda nl: (nl[1], nl[0]))
            | "ClusterGroup" >> beam.GroupByKey()
            | "ClusterSizes" >> beam.FlatMap(_cluster_sizes)
        )
        decided = (
            {"docs": out["docs"], "decision": decisions}
            | "JoinDocs" >> beam.CoGroupByKey()
            | "Decide" >> beam.ParDo(_Decide(c["stage_name"], prefix_len)).with_outputs(REJECTED, main=KEPT)
        )
        return {KEPT: decided[KEPT], REJECTED: decided[REJECTED]}

