"""LSH band buckets as arrays: (node, band keys) → a star of candidate links per bucket of ≥ 2 nodes.

A bundle's band keys are split into `GROUP_PARTITIONS` partitions by key and written as blocks of
arrays (keys, node-key lengths, node-key bytes), not as a record per band.  With a spill directory a
block waits in a spill file and only (partition, (file, offset, length)) crosses the runner's
GroupByKey; without one the block itself does.  A partition's blocks are read together and sorted by
key with numpy; only buckets of two or more nodes — a singleton bucket links nothing — are turned
back into node keys.  Memory per worker: one partition's blocks (~12 bytes + a node key per band
record, 1/64 of the corpus's), one bundle's pending blocks (`GROUP_PENDING_BYTES`) in the writer.
"""
from __future__ import annotations

import struct
from time import thread_time
from typing import Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from dsdata.beam.spill import (GROUP_PARTITIONS, GROUP_PENDING_BYTES, RunWriter, SpillFormatError, make_private_dir,
                               read_runs)
from dsdata.beam.transforms import CPU_COUNTER

_HEAD = struct.Struct("<II")  # band records, node-key bytes


def encode_block(keys: np.ndarray, nodes: list[bytes]) -> bytes:
    """One block: header, the keys (u64), each record's node-key length (u32), the node keys' bytes."""
    data = b"".join(nodes)
    lengths = np.fromiter(map(len, nodes), dtype="<u4", count=len(nodes))
    return _HEAD.pack(len(nodes), len(data)) + keys.astype("<u8").tobytes() + lengths.tobytes() + data


def decode_block(block: bytes, where: str) -> tuple[np.ndarray, np.ndarray, bytes]:
    """(keys, node-key lengths, node-key bytes) of a block; SpillFormatError naming `where` if it does
    not decode."""
    if len(block) < _HEAD.size:
        raise SpillFormatError(f"{where}: a bucket block cut short")
    n, size = _HEAD.unpack_from(block)
    arrays = _HEAD.size + 12 * n
    if len(block) != arrays + size:
        raise SpillFormatError(f"{where}: a bucket block's length does not match its header")
    keys = np.frombuffer(block, dtype="<u8", count=n, offset=_HEAD.size)
    lengths = np.frombuffer(block, dtype="<u4", count=n, offset=_HEAD.size + 8 * n)
    if int(lengths.sum(dtype=np.int64)) != size:
        raise SpillFormatError(f"{where}: a bucket block's node keys do not match their lengths")
    return keys, lengths, block[arrays:]


class _Clocked(beam.DoFn):
    """The CPU time of the bucket work (not the file I/O) is the dedup stage's, as verification's is."""

    def __init__(self, spill_dir: str | None, stage_name: str):
        self.spill_dir, self.stage_name = spill_dir, stage_name

    def setup(self):
        if self.spill_dir:
            make_private_dir(self.spill_dir)
        self._cpu_counter = Metrics.counter(f"dsdata.{self.stage_name}", CPU_COUNTER)

    def _count(self, start: float) -> None:
        self._cpu_counter.inc(round((thread_time() - start) * 1e6))


class _Blocks(_Clocked):
    """A bundle's (node, band keys) → (partition, block) elements, or (partition, (file, offset,
    length)) with the blocks in the bundle's spill file."""

    def start_bundle(self):
        self._nodes, self._keys, self._pending, self._out = [], [], 0, []
        self._writer = RunWriter(self.spill_dir, "buckets") if self.spill_dir else None

    def process(self, item):
        node, bands = item
        data = node.encode("utf-8", "surrogatepass")
        self._nodes.append(data)
        self._keys.append(bands)
        self._pending += len(bands) // 8 * (12 + len(data))
        if self._pending >= GROUP_PENDING_BYTES:
            self._flush()
        return ()

    def _flush(self):
        start = thread_time()
        nodes, keys = self._nodes, np.frombuffer(b"".join(self._keys), dtype=np.uint64)
        rows = np.repeat(np.arange(len(nodes)), [len(k) // 8 for k in self._keys])
        partition = keys % np.uint64(GROUP_PARTITIONS)
        order = np.argsort(partition, kind="stable")
        bounds = np.searchsorted(partition[order], np.arange(GROUP_PARTITIONS + 1, dtype=np.uint64)).tolist()
        blocks = []
        for p in range(GROUP_PARTITIONS):
            if bounds[p] < bounds[p + 1]:
                at = order[bounds[p]:bounds[p + 1]]
                blocks.append((p, encode_block(keys[at], [nodes[r] for r in rows[at].tolist()])))
        self._nodes, self._keys, self._pending = [], [], 0
        self._count(start)
        for p, block in blocks:
            if self._writer is None:
                self._out.append((p, block))
            else:
                self._writer.write(p, block)

    def finish_bundle(self):
        if self._nodes:
            self._flush()
        if self._writer is not None:
            self._out.extend(self._writer.close())
        for out in self._out:
            yield GlobalWindows.windowed_value(out)
        self._out = []


class _Stars(_Clocked):
    """One partition's blocks → (smallest node, node) for every other node of each bucket of ≥ 2."""

    def process(self, item):
        _, entries = item
        blocks = list(read_runs(self.spill_dir, entries)) if self.spill_dir else [(b, "a bucket block") for b in entries]
        start = thread_time()
        decoded = [decode_block(block, where) for block, where in blocks]
        keys = np.concatenate([d[0] for d in decoded])
        lengths = np.concatenate([d[1] for d in decoded]).astype(np.int64)
        data = b"".join(d[2] for d in decoded)
        del blocks, decoded
        starts = np.cumsum(lengths) - lengths
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        run_start = np.concatenate(([0], cuts))
        run_end = np.concatenate((cuts, [len(ordered)]))
        links = []
        for s, e in zip(run_start.tolist(), run_end.tolist()):
            if e - s < 2:
                continue
            members = sorted({data[a:a + n].decode("utf-8", "surrogatepass")
                              for a, n in zip(starts[order[s:e]].tolist(), lengths[order[s:e]].tolist())})
            links.extend((members[0], b) for b in members[1:])
        self._count(start)
        return links


class BandBuckets(beam.PTransform):
    """PCollection[(node, band keys as u64 bytes)] → PCollection[(a bucket's smallest node, another
    node of it)]; the blocks wait in `spill_dir` when given."""

    def __init__(self, spill_dir: str | None, stage_name: str = "dedup"):
        super().__init__()
        self.spill_dir, self.stage_name = spill_dir, stage_name

    def expand(self, reps):
        # Declared: the int key gets VarIntCoder, and Beam does not infer from process()'s bytecode.
        kind = Tuple[int, Tuple[str, int, int]] if self.spill_dir else Tuple[int, bytes]
        return (reps
                | "Blocks" >> beam.ParDo(_Blocks(self.spill_dir, self.stage_name)).with_output_types(kind)
                | "ByPartition" >> beam.GroupByKey()
                | "Stars" >> beam.ParDo(_Stars(self.spill_dir, self.stage_name)))
