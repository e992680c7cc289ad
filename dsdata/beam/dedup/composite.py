"""Whole-corpus deduplication as one composite Beam transform: exact + MinHash-LSH near duplicates
(the steps, verification, spilling and memory bounds: docs/dedup.md).

A document's node key `[score prefix] id \x1f exact-hash` sorts in keep order: a cluster keeps its
smallest node.  With a spill directory (`spill: true`, the default) documents and the groupings with
a record per document wait in spill files under RUN_DIR/.spill (reachable from every worker);
decisions are routed to the files, each read once.
"""
from __future__ import annotations

import dataclasses
import logging
import struct
import uuid
from itertools import islice
from time import thread_time
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dsdata.beam.errors import retry_one_at_a_time, passes_through
from dsdata.beam.transforms import ANY_OUTPUT, CPU_COUNTER, StageCounters, full_batches
from dsdata.dedup.lsh import band_keys
from dsdata.dedup.minhash import MinHasher, exact_hash, fold
from dsdata.document import Document, Rejected, metadata_json, pack_document, unpack_document
from dsdata.stages.dedup import DedupConfig
from dsdata.beam.dedup.buckets import BandBuckets
from dsdata.beam.park import FlattenParked, parked_sibling
from dsdata.beam.spill import (SpilledGroupByKey, SpillWriter, Unspillable, make_private_dir, read_spill,
                             spill_directory, spill_name)
from dsdata.beam.spill import encode as spill_encode

log = logging.getLogger("dsdata")

KEPT = "kept"
REJECTED = "rejected"
_RECORDS = "records"
_SIGNATURES = "signatures"
_WHERE = "where"
_FILES = "files"
_REGROUP = "regroup"
_SEP = "\x1f"
_HASH_HEX = 16  # node keys carry the first 8 bytes of the exact hash, as hex
_SCORE_HEX = 16
# Buckets up to this size contribute all their pairs to verification (so one chance collision in a
# bucket cannot hide a true pair behind a failed star edge); larger ones contribute a star.
_ALL_PAIRS_LIMIT = 256


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


def _node_hash(node: str) -> str:
    return node[-_HASH_HEX:]


class _SignatureDoFn(StageCounters, beam.DoFn):
    """Batch of documents → (node, doc), exact records and (when verifying) verification data.  A
    document that raises alone is rejected (reason `error`) and takes no part in deduplication."""

    def __init__(self, cfg: DedupConfig):
        self.cfg = cfg

    def setup(self):
        c = self.cfg
        self._init_counters(c.stage_name)
        self.hasher = MinHasher(c.num_perm, c.ngram, c.char_ngram, c.seed)
        self.no_shingles = Metrics.counter("dsdata.dedup", "docs_without_shingles")
        self.spilled = Metrics.counter("dsdata.dedup", "docs_spilled")
        self._bundle, self._writer = None, None  # this bundle's id and docs file
        if c.spill_dir:
            make_private_dir(c.spill_dir)

    def finish_bundle(self):
        super().finish_bundle()  # the stage's CPU time (StageCounters)
        # The bundle's spill file is complete before any reader runs (readers wait for shuffles).
        if self._writer is not None:
            self.spilled.inc(self._writer.records)
            self._writer.close()
        self._bundle, self._writer = None, None

    def _park(self, item: "_Park") -> list:
        """The document's outputs: its verification data, and either the document itself (shuffled) or,
        with a spill directory, a `where` record (node → (bundle, in its file?)) after spilling it."""
        node, fields, verification = item
        out = [] if verification is None else [beam.pvalue.TaggedOutput(_SIGNATURES, (node, verification))]
        try:
            record = spill_encode([node, fields]) if self.cfg.spill_dir else None
        except Unspillable:
            record = None
        if record is None:
            out.append((node, fields))
        else:
            if self._writer is None:  # every docs file is read once, decisions or not
                self._bundle = uuid.uuid4().hex  # random: a retried bundle writes new files
                self._writer = SpillWriter(self.cfg.spill_dir, spill_name(self._bundle, "docs"))
                self._new_bundles.append(self._bundle)
            self._writer.write_encoded(record)
        if self.cfg.spill_dir:
            out.append(beam.pvalue.TaggedOutput(_WHERE, (node, [self._bundle, record is not None])))
        return out

    def process(self, batch: list[Document]):
        docs = list(batch)
        start = self._clock_start()
        declared = self.cfg.environment_errors
        outputs = retry_one_at_a_time(self.cfg.stage_name, docs, self._outputs,
                                      lambda doc, exc: self._rejected_alone(doc, exc, declared), declared)
        self._new_bundles = []
        emitted = []
        for item in outputs:
            if type(item) is _Park:
                emitted.extend(self._park(item))  # spilling is the stage's work: inside its clock
            else:
                emitted.append(item)
        self._clock_stop(start)
        yield from emitted
        for bundle in self._new_bundles:
            yield beam.pvalue.TaggedOutput(_FILES, bundle)

    def _rejected_alone(self, doc: Document, exc: BaseException, declared) -> Any:
        self._in.inc()
        return self._route(self._error(doc, exc, declared))

    def _outputs(self, docs: list[Document]) -> list:
        """Every output of the batch, built before any is emitted so a failure emits nothing."""
        c = self.cfg
        out: list = []
        sigs = has = keys = shingled = distinct = None
        folded = [fold(d.text) for d in docs]
        if c.near:
            shingled = self.hasher.shingle([d.text for d in docs], folded)
            sigs, has = self.hasher.signatures_from_shingles(shingled)
            keys = band_keys(sigs, c.bands, c.rows)
            if c.verify == "exact":
                distinct = self.hasher.distinct_top32(shingled)
        no_shingles = 0
        for i, doc in enumerate(docs):
            digest = exact_hash(doc.text, folded[i])
            node = node_key(doc, digest, c.score_field)
            bands = verification = None
            if c.near and has[i]:
                bands = keys[i].tobytes()
                if c.verify == "signature":
                    verification = [bands, sigs[i].tobytes()]
                elif c.verify == "exact":
                    # Top 32 bits of each distinct shingle hash: a chance collision inside one
                    # pair (p ≈ n²/2^33) moves its Jaccard by 1/n at most.
                    verification = [bands, distinct[i].tobytes()]
            elif c.near:
                no_shingles += 1
            # Without exact dedup every node is its own group: key it by the node itself.
            group = digest if c.exact else node.encode("utf-8")
            out.append(beam.pvalue.TaggedOutput(_RECORDS, (group, [node, bands])))
            # Primitives (pack_document), which Beam's fast coder encodes natively; parked (_park)
            # once the whole batch has succeeded.  Values that may wait in spill files are lists: a
            # native MessagePack array (a tuple is an extension type, ~2x the encoding time).
            out.append(_Park(node, pack_document(doc), verification))
        if no_shingles:
            self.no_shingles.inc(no_shingles)
        return out


class _Park(NamedTuple):
    """A document waiting for its decision (internal to _SignatureDoFn.process)."""

    node: str
    fields: list
    verification: list | None  # [band keys, verification data] of a document with shingles


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


def _to_component(item):
    """(node, {label, data}) → (candidate component label, (node, band keys, verification data))."""
    node, grouped = item
    labels, data = list(grouped["label"]), list(grouped["data"])
    if labels and data:
        bands, payload = data[0]
        yield labels[0], [node, bands, payload]


def _similarity(x: np.ndarray, y: np.ndarray, mode: str) -> float:
    """Jaccard of a pair from its verification data: exact (distinct shingle hashes) or estimated."""
    if mode == "signature":
        return float(np.mean(x == y))
    inter = len(np.intersect1d(x, y, assume_unique=True))
    union = len(x) + len(y) - inter
    return inter / union if union else 1.0


@ANY_OUTPUT
class _VerifyComponent(beam.DoFn):
    """One candidate component → (node, cluster label) for every node of a verified cluster of ≥ 2:
    its buckets rebuilt, candidate pairs verified with a union-find that skips connected pairs."""

    def __init__(self, threshold: float, mode: str, stage_name: str = "dedup"):
        self.threshold, self.mode, self.stage_name = threshold, mode, stage_name

    def setup(self):
        self._cpu_counter = Metrics.counter(f"dsdata.{self.stage_name}", CPU_COUNTER)
        self._cpu = 0.0
        self.kept = Metrics.counter("dsdata.dedup", "pairs_verified")
        self.dropped = Metrics.counter("dsdata.dedup", "pairs_below_threshold")
        self.sizes = Metrics.distribution("dsdata.dedup", "candidate_component_size")

    def finish_bundle(self):
        if self._cpu:
            self._cpu_counter.inc(round(self._cpu * 1e6))
            self._cpu = 0.0

    def process(self, item):
        start = thread_time()
        labels = self._verify(item)
        self._cpu += thread_time() - start
        yield from labels

    def _verify(self, item) -> list[tuple[str, str]]:
        _, members = item
        members = sorted(members, key=lambda m: m[0])
        n = len(members)
        self.sizes.update(n)
        if n < 2:
            return []
        nodes = [m[0] for m in members]
        data = [np.frombuffer(m[2], dtype=np.uint32) for m in members]
        buckets: dict[int, list[int]] = {}
        for i, m in enumerate(members):
            for key in np.frombuffer(m[1], dtype=np.uint64).tolist():
                buckets.setdefault(key, []).append(i)
        roots, verified, dropped = _verified_roots(data, buckets, self.threshold, self.mode)
        self.kept.inc(verified)
        self.dropped.inc(dropped)
        counts: dict[int, int] = {}
        for r in roots:
            counts[r] = counts.get(r, 0) + 1
        return [(nodes[i], nodes[r]) for i, r in enumerate(roots) if counts[r] > 1]


def _verified_roots(data: list[np.ndarray], buckets: dict[int, list[int]], threshold: float,
                    mode: str) -> tuple[list[int], int, int]:
    """Union-find over the candidate pairs that share a bucket and pass the similarity check:
    (each member's root, the smallest index of its set; pairs verified; pairs dropped)."""
    n = len(data)
    sizes = [len(d) for d in data]
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    exact = mode == "exact"
    verified = dropped = 0
    for bucket in buckets.values():
        k = len(bucket)
        if k < 2:
            continue
        if k <= _ALL_PAIRS_LIMIT:
            pairs = ((bucket[i], b) for i in range(k) for b in bucket[i + 1:])
        else:
            pairs = ((bucket[0], b) for b in bucket[1:])
        for a, b in pairs:
            ra, rb = find(a), find(b)
            if ra == rb:
                continue
            small, large = sorted((sizes[a], sizes[b]))
            if exact and (large == 0 or small < threshold * large):
                dropped += 1
                continue
            if _similarity(data[a], data[b], mode) >= threshold:
                verified += 1
                # The smaller index becomes the root: roots are their sets' smallest nodes.
                parent[max(ra, rb)] = min(ra, rb)
            else:
                dropped += 1
    return [find(i) for i in range(n)], verified, dropped


def _merge_exact(item):
    """(representative, {near label, exact members}) → (node, label) for the representative and its
    exact duplicates: an exact duplicate belongs to whatever cluster its representative is in."""
    rep, grouped = item
    near, members = list(grouped["near"]), list(grouped["members"])
    if not near and not members:
        return
    label = near[0] if near else rep
    yield rep, label
    for member in members:
        yield member, label


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
        yield node, [label, len(members)]


@ANY_OUTPUT
class _Decide(StageCounters, beam.DoFn):
    """Join a node's documents with its cluster decision: keep the label node, reject the rest."""

    def __init__(self, stage_name: str, prefix_len: int):
        self.stage_name, self.prefix_len = stage_name, prefix_len

    def setup(self):
        self._init_counters(self.stage_name)

    def process(self, item):
        node, grouped = item
        docs = [unpack_document(fields) for fields in grouped["docs"]]
        yield from self._emit(node, docs, list(grouped["decision"]))

    def _emit(self, node: str, docs: list[Document], decisions: list):
        start = self._clock_start()
        try:
            outputs = self._decide(node, docs, decisions)
        except BaseException as exc:  # noqa: BLE001 - the node's documents are rejected, not the run
            if passes_through(exc):  # a stop, not the record's fault; a native panic is
                raise
            outputs = [self._error(doc, exc) for doc in docs]
        self._clock_stop(start)
        for result in outputs:
            self._in.inc()
            yield self._route(result)

    def _decide(self, node: str, docs: list[Document], decisions: list) -> list[Document | Rejected]:
        if not docs:
            return []
        # Several documents can share a node key only with the same id and the same text; the
        # order among them is made deterministic so reruns keep the same one.
        if len(docs) > 1:
            docs.sort(key=lambda d: (metadata_json(d.metadata), metadata_json(d.annotations)))
        label, size = decisions[0] if decisions else (node, 1)
        size += len(docs) - 1
        kept_id = label[self.prefix_len: -(_HASH_HEX + 1)]  # the node's document id
        out: list[Document | Rejected] = []
        for i, doc in enumerate(docs):
            doc.annotations["dup_cluster"] = kept_id
            doc.annotations["dup_cluster_size"] = size
            if i == 0 and label == node:
                out.append(doc)
            elif i > 0 or _node_hash(node) == _node_hash(label):
                out.append(Rejected(doc, self.stage_name, "exact_duplicate",
                                    f"same normalised text as kept document '{kept_id}'"))
            else:
                out.append(Rejected(doc, self.stage_name, "near_duplicate",
                                    f"near-duplicate cluster of {size} kept as document '{kept_id}'"))
        return out


def _timed(records, counter, chunk: int = 64):
    """The records of a spill file, the CPU time of reading them added to `counter` (the clock read
    once per `chunk` records)."""
    spent = 0.0
    try:
        while True:
            start = thread_time()
            block = list(islice(records, chunk))
            spent += thread_time() - start
            if not block:
                return
            yield from block
    finally:
        if spent:
            counter.inc(round(spent * 1e6))


def _route_decision(item):
    """(node, {where, decision}) → (bundle, (node, decision)) for a spilled node in a cluster, nothing
    for a spilled singleton (kept by its file's reader).  A node with several documents or one in the
    shuffle: its files hand it back (decision None), its decision goes to the regroup join."""
    node, grouped = item
    wheres, decisions = list(grouped["where"]), list(grouped["decision"])
    decision = decisions[0] if decisions else None
    if len(wheres) == 1 and wheres[0][1]:
        if decision is not None:
            yield wheres[0][0], (node, decision)
        return
    for bundle in {bundle for bundle, in_file in wheres if in_file}:
        yield bundle, (node, None)
    if decision is not None:
        yield beam.pvalue.TaggedOutput(_REGROUP, (node, decision))


class _DecideSpilled(_Decide):
    """One bundle's docs file with the decisions for its nodes → its documents decided, one at a time."""

    def __init__(self, stage_name: str, prefix_len: int, spill_dir: str):
        super().__init__(stage_name, prefix_len)
        self.spill_dir = spill_dir

    def process(self, item):
        bundle, grouped = item
        table = dict(grouped["nodes"])
        records = read_spill(FileSystems.join(self.spill_dir, spill_name(bundle, "docs")))
        for node, fields in _timed(records, self._cpu_counter):
            decision = table.get(node)
            if decision is None and node in table:
                yield beam.pvalue.TaggedOutput(_REGROUP, (node, fields))
                continue
            yield from self._emit(node, [unpack_document(fields)], [decision] if decision else [])


class DedupTransform(beam.PTransform):
    """PCollection[Document] → {"kept", "rejected"}; cfg: the stage's DedupConfig."""

    def __init__(self, cfg: DedupConfig):
        super().__init__()
        self.cfg = cfg

    def expand(self, docs):
        c = self.cfg
        out = (
            docs
            | "Batch" >> full_batches(c.batch_size)
            | "Signatures" >> beam.ParDo(_SignatureDoFn(c)).with_outputs(
                _RECORDS, _SIGNATURES, _WHERE, _FILES, REJECTED, main="docs")
        )
        exact = (
            out[_RECORDS]
            | "ExactGroup" >> self._group()
            | "ExactPick" >> beam.ParDo(_ExactGroups()).with_outputs("edges", main="reps")
        )
        if c.near:
            labels = (
                {"near": self._near_labels(exact["reps"], out),
                 "members": exact["edges"] | "ByRepresentative" >> beam.Map(lambda e: (e[1], e[0]))}
                | "JoinExactMembers" >> beam.CoGroupByKey()
                | "MergeExact" >> beam.FlatMap(_merge_exact)
            )
        else:
            # Exact links already form stars around each group's smallest node.
            labels = exact["edges"] | "StarLabels" >> beam.FlatMap(lambda e: [e, (e[1], e[1])])
        decisions = (
            labels
            | "ByLabel" >> beam.Map(lambda nl: (nl[1], nl[0]))
            | "ClusterGroup" >> beam.GroupByKey()
            | "ClusterSizes" >> beam.FlatMap(_cluster_sizes)
        )
        return self._decided(out, decisions)

    def _group(self) -> beam.PTransform:
        """GroupByKey, its records waiting in spill files when there is a spill directory."""
        if self.cfg.spill_dir:
            return SpilledGroupByKey(self.cfg.spill_dir)
        return beam.GroupByKey()

    def _near_labels(self, reps, out):
        """(node, component label) for every exact group's representative: LSH buckets give
        candidate components, which are verified by their documents' similarity unless verify=none."""
        c = self.cfg
        candidate_labels = (
            reps
            | "Buckets" >> BandBuckets(c.spill_dir, c.stage_name)
            | "DistinctCandidates" >> beam.Distinct()
            | "CandidateComponents" >> ConnectedComponents(c.cc_rounds)
        )
        if c.verify == "none":
            return candidate_labels
        members = (
            {"label": candidate_labels, "data": out[_SIGNATURES]}
            | "JoinComponentData" >> (SpilledGroupByKey(c.spill_dir) if c.spill_dir else beam.CoGroupByKey())
            | "ToComponent" >> beam.FlatMap(_to_component)
        )
        return (
            members
            | "ComponentGroup" >> self._group()
            | "VerifyComponent" >> beam.ParDo(_VerifyComponent(c.threshold, c.verify, c.stage_name))
        )

    def _decided(self, out, decisions) -> dict:
        """Each document joined with its cluster's decision: kept, or rejected as a duplicate."""
        c = self.cfg
        prefix_len = _SCORE_HEX if c.score_field else 0
        kept, rejected = [], [out[REJECTED]]
        if c.spill_dir:
            # Documents wait in spill files; only node keys and decisions meet here (see _park).
            routed = (
                {"where": out[_WHERE], "decision": decisions}
                | "JoinWhere" >> SpilledGroupByKey(c.spill_dir)
                | "Route" >> beam.FlatMap(_route_decision).with_outputs(_REGROUP, main="to_files")
            )
            from_files = (
                {"file": out[_FILES] | "FileKeys" >> beam.Map(lambda name: (name, None)),
                 "nodes": routed["to_files"]}
                | "JoinFiles" >> beam.CoGroupByKey()
                | "DecideSpilled" >> beam.ParDo(_DecideSpilled(c.stage_name, prefix_len, c.spill_dir))
                .with_outputs(REJECTED, _REGROUP, main=KEPT)
            )
            kept.append(from_files[KEPT])
            rejected.append(from_files[REJECTED])
            shuffled = (out["docs"], from_files[_REGROUP]) | "RegroupDocs" >> beam.Flatten()
            join = {"docs": shuffled, "decision": routed[_REGROUP]}
        else:
            join = {"docs": out["docs"], "decision": decisions}
        decided = (
            join
            | "JoinDocs" >> beam.CoGroupByKey()
            | "Decide" >> beam.ParDo(_Decide(c.stage_name, prefix_len)).with_outputs(REJECTED, main=KEPT)
        )
        kept.append(decided[KEPT])
        rejected.append(decided[REJECTED])
        # Spilled, the decided documents wait for the next stage in files too (dsdata/beam/park.py).
        parked = c.spill_dir and parked_sibling(c.spill_dir, "decided")
        kept = kept[0] if len(kept) == 1 else tuple(kept) | "AllKept" >> FlattenParked(parked)
        rejected = tuple(rejected) | "AllRejected" >> FlattenParked(parked)
        return {KEPT: kept, REJECTED: rejected}


def composite(stage, context) -> DedupTransform:
    """The document-level transform; spilled under the run directory unless `spill: false`."""
    cfg = stage.transform_config()
    if stage.spill:
        cfg = dataclasses.replace(cfg, spill_dir=spill_directory(context.run_dir, stage.name))
    return DedupTransform(cfg)
