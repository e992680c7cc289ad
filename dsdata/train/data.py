"""Zero-copy training data: a torch IterableDataset over a shard directory (disk or /dev/shm) whose
windows view the shards' memory mappings; docs/shards.md ("Loader") is the reference.
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import torch

from dsdata.io.outfiles import buffer_sha256
from dsdata.shards.format import ShardError, check_shard_buffer, manifest_vocab_size, read_manifest, resolve_shard_path
from dsdata.train.curriculum import CurriculumSampler, CurriculumSchedule, schedule_from_spec

_STATE_FORMAT = "dsdata-loader"
_ALL = "all"
# Shuffled batched mode gathers this many bytes of windows at a time (whole batches, at least one):
# enough to amortise a gather's fixed cost; a chunk stays alive while any of its batches does.
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class _ShardInfo:
    index: int
    path: str
    bucket: str
    tokens: int
    bytes: int
    sha256: str
    windows: int


class _OpenShard:
    """One memory-mapped shard: its token stream as a tensor viewing the mapping."""

    def __init__(self, info: _ShardInfo, dtype: np.dtype, token_column: str, verify: bool,
                 vocab_size: int | None = None):
        self.info = info
        mapped = pa.memory_map(os.fsencode(info.path), "r")
        # One buffer over the whole mapping; everything below is a zero-copy slice of it.
        self.buffer = mapped.read_buffer()
        if self.buffer.size != info.bytes:
            raise ShardError(f"{info.path}: {self.buffer.size} bytes, the manifest says {info.bytes}")
        if verify:
            actual = buffer_sha256(self.buffer)
            if actual != info.sha256:
                raise ShardError(f"{info.path}: sha256 {actual} does not match the manifest's {info.sha256} "
                                 "(corrupt shard; re-copy it or rerun the pipeline)")
        else:
            # Fault the pages in now (on the prefetch thread) rather than during training.
            np.frombuffer(self.buffer, dtype=np.uint8)[::4096].sum()
        values = check_shard_buffer(info.path, self.buffer, token_column, dtype, info.tokens, vocab_size)
        with warnings.catch_warnings():
            # The mapping is read-only; torch warns that it cannot mark tensors read-only.
            warnings.simplefilter("ignore", UserWarning)
            self.tokens = torch.from_numpy(values)
        self.region = (info.path, self.buffer.address, self.buffer.size)
        self._matrix: torch.Tensor | None = None
        self._rows: np.ndarray | None = None

    # `seq_len` is always the dataset's, the one `info.windows` was counted for.
    def window_matrix(self, seq_len: int) -> torch.Tensor:
        """All windows as a [windows, seq_len + 1] strided view (rows overlap by one token) for in-order
        slices; gathers use `window_rows` (indexing an overlapping strided view is far slower)."""
        if self._matrix is None:
            self._matrix = torch.as_strided(self.tokens, (self.info.windows, seq_len + 1), (seq_len, 1))
        return self._matrix

    def window_rows(self, seq_len: int) -> np.ndarray:
        """All windows of the shard as a 1-D numpy array of opaque (void) items of seq_len + 1 tokens each,
        viewing the mapping: a gather `rows[index]` copies each window in one memcpy, not token by token."""
        if self._rows is None:
            values = self.tokens.numpy()
            item = np.dtype((np.void, (seq_len + 1) * values.itemsize))
            self._rows = np.ndarray((self.info.windows,), dtype=item, buffer=values,
                                    strides=(seq_len * values.itemsize,))
        return self._rows


class ShardDataset(torch.utils.data.IterableDataset):
    """Token windows of `seq_len + 1` ids from a shard directory, zero-copy; docs/shards.md ("Loader")
    describes the options.  curriculum: None (plain epochs), a CurriculumSchedule, or a spec for
    `schedule_from_spec` (total_steps: needed only by a `linear` spec given as warmup_fraction).
    """

    def __init__(self, path: str, seq_len: int, *, rank: int = 0, world_size: int = 1, seed: int = 0,
                 verify: bool = True, curriculum: CurriculumSchedule | Mapping[str, Any] | None = None,
                 prefetch: bool = True, shuffle: bool = True, total_steps: int | None = None,
                 batch_size: int | None = None, endless: bool = False, max_mapped_shards: int = 64):
        super().__init__()
        if int(seq_len) < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.path, self.seq_len = str(path), int(seq_len)
        self.rank, self.world_size, self.seed = int(rank), int(world_size), int(seed)
        self.verify, self.prefetch, self.shuffle = bool(verify), bool(prefetch), bool(shuffle)
        if batch_size is not None and int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        self.batch_size = None if batch_size is None else int(batch_size)
        self.endless = bool(endless)
        if int(max_mapped_shards) < 1:
            raise ValueError(f"max_mapped_shards must be >= 1, got {max_mapped_shards}")
        self.max_mapped_shards = int(max_mapped_shards)
        manifest = read_manifest(self.path)
        with open(os.path.join(self.path, "manifest.json"), "rb") as fh:
            self.manifest_sha256 = hashlib.sha256(fh.read()).hexdigest()
        self.manifest = manifest
        self.dtype = np.dtype(manifest["dtype"])
        self.token_column = manifest.get("token_column", "tokens")
        self.shards: list[_ShardInfo] = []
        for i, entry in enumerate(manifest["shards"]):
            shard_path = resolve_shard_path(self.path, entry["file"])
            if not os.path.isfile(shard_path):
                raise ShardError(f"{shard_path}: shard named in {self.path}/manifest.json is missing")
            size = os.path.getsize(shard_path)
            if size != entry["bytes"]:
                raise ShardError(f"{shard_path}: {size} bytes, the manifest says {entry['bytes']} (truncated or replaced)")
            tokens = int(entry["tokens"])
            windows = (tokens - 1) // self.seq_len if tokens > self.seq_len else 0
            self.shards.append(_ShardInfo(i, shard_path, str(entry.get("difficulty") or "medium"),
                                          tokens, int(entry["bytes"]), str(entry["sha256"]), windows))
        buckets = manifest.get("buckets") or {}
        natural = {b: float(c.get("tokens", 0)) for b, c in buckets.items() if isinstance(c, Mapping)}
        natural = {b: v / sum(natural.values()) for b, v in natural.items()} if sum(natural.values()) > 0 else None
        self.schedule = schedule_from_spec(curriculum, total_steps, natural)
        if self.schedule is None:
            self.groups = {_ALL: [s.index for s in self.shards]}
        else:
            grouped: dict[str, list[int]] = {}
            for shard in self.shards:
                grouped.setdefault(shard.bucket, []).append(shard.index)
            self.groups = dict(sorted(grouped.items()))
        self._state: dict[str, Any] = {"step": 0, "groups": {g: [0, 0, 0] for g in self.groups}, "sampler": None,
                                       "consumers": None}
        self._runtime: dict[str, Any] | None = None

    def set_step(self, step: int) -> None:
        """The training step the next windows are for (drives the curriculum weights)."""
        self._state["step"] = int(step)

    def state_dict(self) -> dict[str, Any]:
        runtime = self._runtime
        sampler = runtime["sampler"].state_dict() if runtime and runtime.get("sampler") else self._state["sampler"]
        return {
            "format": _STATE_FORMAT, "version": 1, "manifest_sha256": self.manifest_sha256,
            "seq_len": self.seq_len, "seed": self.seed, "rank": self.rank, "world_size": self.world_size,
            "shuffle": self.shuffle, "curriculum": self.schedule.describe() if self.schedule else None,
            "batch_size": self.batch_size,
            "consumers": self._state["consumers"], "step": self._state["step"],
            "groups": {g: list(pos) for g, pos in self._state["groups"].items()}, "sampler": sampler,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != _STATE_FORMAT:
            raise ValueError("not a ShardDataset state (format must be 'dsdata-loader')")
        mine = self.state_dict()
        for key in ("manifest_sha256", "seq_len", "seed", "rank", "world_size", "shuffle", "curriculum", "batch_size"):
            if state.get(key) != mine[key]:
                raise ValueError(f"loader state was saved with {key}={state.get(key)!r}, this dataset has "
                                 f"{mine[key]!r}; resume with the same shards and settings")
        if set(state["groups"]) != set(self.groups):
            raise ValueError(f"loader state has groups {sorted(state['groups'])}, this dataset {sorted(self.groups)}")
        self._state = {"step": int(state["step"]), "groups": {g: [int(v) for v in pos] for g, pos in state["groups"].items()},
                       "sampler": state.get("sampler"), "consumers": state.get("consumers")}
        self.close()

    def close(self) -> None:
        """Stop the prefetch thread (after the shard it is reading) and forget the open shards; an
        iteration after this starts them again."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None and runtime["executor"] is not None:
            runtime["executor"].shutdown(wait=True, cancel_futures=True)

    def mapped_regions(self) -> list[tuple[str, int, int]]:
        """(path, address, size) of the shard mappings currently open in this process."""
        if not self._runtime:
            return []
        return [shard.region for shard in self._runtime["open"].values()]

    def windows_per_epoch(self, num_workers: int = 1) -> int:
        """Windows one consumer gets per epoch (without a curriculum)."""
        n = self.world_size * max(1, num_workers)
        return sum((s.windows - s.windows % n) // n for s in self.shards)

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get the plan and position, never threads or mappings.
        state = dict(self.__dict__)
        state["_runtime"] = None
        return state

    def _start(self) -> dict[str, Any]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        consumer, n_consumers = self.rank * workers + worker, self.world_size * workers
        saved = self._state["consumers"]
        if saved is not None and saved != [consumer, n_consumers]:
            raise ValueError(f"loader state belongs to consumer {saved[0]} of {saved[1]}, this is consumer "
                             f"{consumer} of {n_consumers}: resume with the same world size and num_workers")
        self._state["consumers"] = [consumer, n_consumers]
        runtime = self._runtime
        if runtime is None:
            sampler = None
            if self.schedule is not None:
                sampler = CurriculumSampler(self.schedule, seed=self.seed * 1_000_003 + consumer)
                if self._state["sampler"] is not None:
                    sampler.load_state_dict(self._state["sampler"])
            runtime = self._runtime = {
                "consumer": consumer, "n": n_consumers, "sampler": sampler,
                "open": collections.OrderedDict(), "pending": {}, "starts": {}, "orders": {}, "verified": set(),
                "executor": concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shard-prefetch")
                if self.prefetch else None,
            }
        return runtime

    def __iter__(self) -> Iterator[torch.Tensor]:
        runtime = self._start()
        if self.schedule is None:
            if self._mine(_ALL) == 0:
                raise ValueError(self._too_small())
            if self.batch_size is not None:
                self._skip_finished_epoch(_ALL)
                yield from self._batches(_ALL, endless=self.endless)
                return
            while True:
                self._skip_finished_epoch(_ALL)
                yield from self._epoch_windows(_ALL)
                if not self.endless:
                    return
        available = [g for g in self.groups if self._mine(g) > 0]
        if not available:
            raise ValueError(self._too_small())
        sampler, state = runtime["sampler"], self._state
        if self.batch_size is None:
            while True:
                yield self._next_window(sampler.choose(state["step"], available))
        while True:
            # One bucket draw per row; rows are grouped by bucket inside the batch.
            counts = collections.Counter(sampler.choose(state["step"], available) for _ in range(self.batch_size))
            pieces = []
            for group in available:
                if counts[group]:
                    pieces += self._take(group, counts[group], wrap=True)
            yield pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _take(self, group: str, count: int, wrap: bool) -> list[torch.Tensor]:
        """Up to `count` next windows of `group` as [k, seq_len + 1] blocks (views when contiguous)."""
        pos = self._state["groups"][group]
        pieces: list[torch.Tensor] = []
        while count > 0:
            found = self._next_shard(group, wrap)
            if found is None:
                break
            shard, opened = found
            chosen = self._window_index(shard, pos[0])[pos[2]:pos[2] + count]
            if self.shuffle:  # one gather (copy) per piece
                rows = opened.window_rows(self.seq_len)[chosen]
                pieces.append(torch.from_numpy(rows.view(self.dtype).reshape(len(chosen), self.seq_len + 1)))
            else:
                as_torch = opened.window_matrix(self.seq_len)
                pieces.append(as_torch[int(chosen[0]):int(chosen[-1]) + 1:self._runtime["n"]])
            pos[2] += len(chosen)
            count -= len(chosen)
        return pieces

    def _batches(self, group: str, endless: bool) -> Iterator[torch.Tensor]:
        """The rest of the current epoch of `group` as batches; a short last batch ends the epoch
        (with `endless`, epochs follow each other and every batch is full).  Shuffled batches inside one
        shard are gathered ~_CHUNK_BYTES at once; others go through `_take` (the same windows)."""
        pos = self._state["groups"][group]  # [epoch, shard position in the epoch's order, window position]
        size, first_epoch = self.batch_size, pos[0]
        from_numpy = torch.from_numpy
        while endless or pos[0] == first_epoch:
            epoch = pos[0]
            order = self._shard_order(group, epoch)
            if self.shuffle and pos[1] < len(order):
                shard = order[pos[1]]
                index = self._window_index(shard, epoch)
                last_start = len(index) - size  # the last position whose batch ends inside this shard
                if pos[2] <= last_start:
                    opened = self._open(shard)
                    if pos[2] == 0:
                        self._prefetch(self._following(group, order, pos))
                    start = pos[2]
                    rows, dtype, span = opened.window_rows(self.seq_len), self.dtype, self.seq_len + 1
                    per_chunk = max(1, _CHUNK_BYTES // (size * span * dtype.itemsize))
                    while start <= last_start:
                        # A fresh array per chunk, so a batch handed out is never overwritten.
                        count = min(per_chunk, (last_start - start) // size + 1)
                        chunk = from_numpy(rows[index[start:start + count * size]].view(dtype)
                                           .reshape(count * size, span))
                        for batch in chunk.split(size):
                            start += size
                            pos[2] = start  # before the yield: state_dict() counts batches handed out
                            yield batch
            # In order, or across a shard; at an epoch's end, into the next epoch (endless) or a short batch.
            pieces = self._take(group, size, wrap=endless)
            if not pieces:
                return
            yield pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _epoch_windows(self, group: str) -> Iterator[torch.Tensor]:
        """The rest of the current epoch of `group`; the hot loop, kept to a slice and a yield per window."""
        pos = self._state["groups"][group]  # [epoch, shard position in the epoch's order, window position]
        span = self.seq_len + 1
        while (found := self._next_shard(group, wrap=False)) is not None:
            shard, opened = found
            starts, tokens = self._window_starts(shard, pos[0]), opened.tokens
            while pos[2] < len(starts):
                start = starts[pos[2]]
                pos[2] += 1
                yield tokens[start:start + span]

    def _too_small(self) -> str:
        return (f"{self.path}: no windows of {self.seq_len + 1} tokens for {self._runtime['n']} consumer(s); "
                "use a smaller seq_len, fewer ranks/workers, or more data")

    def _mine(self, group: str) -> int:
        n = self._runtime["n"]
        return sum(self.shards[i].windows // n for i in self.groups[group])

    def _shard_order(self, group: str, epoch: int) -> list[int]:
        cache = self._runtime["orders"]
        order = cache.get((group, epoch))
        if order is None:
            shards = self.groups[group]
            if self.shuffle:
                group_index = list(self.groups).index(group)
                perm = np.random.default_rng([self.seed, epoch, group_index, 0]).permutation(len(shards))
                order = [shards[i] for i in perm]
            else:
                order = list(shards)
            if len(cache) > 4 * len(self.groups):
                cache.clear()
            cache[(group, epoch)] = order
        return order

    def _window_index(self, shard: int, epoch: int) -> np.ndarray:
        """This consumer's windows of `shard` in `epoch`, in order (window k starts at k * seq_len)."""
        runtime = self._runtime
        key = ("index", shard, epoch)
        index = runtime["starts"].get(key)
        if index is None:
            n, consumer = runtime["n"], runtime["consumer"]
            count = self.shards[shard].windows
            usable = count - count % n
            order = (np.random.default_rng([self.seed, epoch, shard, 1]).permutation(count)[:usable]
                     if self.shuffle else np.arange(usable))
            index = np.ascontiguousarray(order[consumer::n], dtype=np.int64)
            if len(runtime["starts"]) > 8 * len(self.groups):
                runtime["starts"].clear()
            runtime["starts"][key] = index
        return index

    def _window_starts(self, shard: int, epoch: int) -> list[int]:
        runtime = self._runtime
        key = ("starts", shard, epoch)
        starts = runtime["starts"].get(key)
        if starts is None:
            # A Python list: indexing it in the hot loop is cheaper than numpy scalars.
            starts = (self._window_index(shard, epoch) * self.seq_len).tolist()
            runtime["starts"][key] = starts
        return starts

    def _following(self, group: str, order: list[int], pos: list[int]) -> int:
        """The shard after the current one (the next epoch's first at the end of an epoch)."""
        return order[pos[1] + 1] if pos[1] + 1 < len(order) else self._shard_order(group, pos[0] + 1)[0]

    def _skip_finished_epoch(self, group: str) -> None:
        """A state saved right after an epoch's last window resumes at the next epoch's start."""
        pos = self._state["groups"][group]
        order = self._shard_order(group, pos[0])
        n = self._runtime["n"]
        while pos[1] < len(order) and pos[2] >= self.shards[order[pos[1]]].windows // n:
            pos[1], pos[2] = pos[1] + 1, 0
        if pos[1] >= len(order):
            pos[0], pos[1], pos[2] = pos[0] + 1, 0, 0

    def _next_window(self, group: str) -> torch.Tensor:
        """One window of `group`, cycling through its epochs (curriculum mode)."""
        pos = self._state["groups"][group]
        shard, opened = self._next_shard(group, wrap=True)
        start = self._window_starts(shard, pos[0])[pos[2]]
        pos[2] += 1
        return opened.tokens[start:start + self.seq_len + 1]

    def _next_shard(self, group: str, wrap: bool) -> tuple[int, _OpenShard] | None:
        """Move `group`'s position past finished shards (and, with `wrap`, finished epochs) to the
        shard holding its next window: (shard, its mapping), the next shard prefetched when this one
        starts.  None at an epoch's end without `wrap` (the position then points at the next epoch)."""
        pos = self._state["groups"][group]
        while True:
            order = self._shard_order(group, pos[0])
            if pos[1] >= len(order):
                pos[0], pos[1], pos[2] = pos[0] + 1, 0, 0
                if not wrap:
                    return None
                continue
            shard = order[pos[1]]
            if pos[2] >= len(self._window_index(shard, pos[0])):
                pos[1], pos[2] = pos[1] + 1, 0
                continue
            opened = self._open(shard)
            if pos[2] == 0:
                self._prefetch(self._following(group, order, pos))
            return shard, opened

    def _load(self, shard: int) -> _OpenShard:
        info = self.shards[shard]
        # Hash a file once per process: later epochs re-map it without re-reading every byte,
        # unless the file was replaced (another inode, size or mtime).
        st = os.stat(info.path)
        identity = (info.path, st.st_ino, st.st_size, st.st_mtime_ns)
        verified = self._runtime["verified"]
        opened = _OpenShard(info, self.dtype, self.token_column, self.verify and identity not in verified,
                            manifest_vocab_size(self.manifest))
        verified.add(identity)
        return opened

    def _prefetch(self, shard: int) -> None:
        runtime = self._runtime
        if runtime["executor"] is None or shard in runtime["open"] or shard in runtime["pending"]:
            return
        runtime["pending"][shard] = runtime["executor"].submit(self._load, shard)

    def _open(self, shard: int) -> _OpenShard:
        runtime = self._runtime
        opened = runtime["open"].get(shard)
        if opened is not None:
            runtime["open"].move_to_end(shard)
            return opened
        future = runtime["pending"].pop(shard, None)
        opened = future.result() if future is not None else self._load(shard)
        runtime["open"][shard] = opened
        # Up to max_mapped_shards stay mapped, never fewer than the current + next shard per group;
        # tensors already handed out keep their own mapping alive through their buffer reference.
        while len(runtime["open"]) > max(self.max_mapped_shards, 2 * len(self.groups) + 1):
            runtime["open"].popitem(last=False)
        return opened
