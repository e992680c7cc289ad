"""ShardDataset: zero-copy windows, disjoint rank × worker split, deterministic shuffle, exact resume,
curriculum sampling."""
import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shard_sets import ShardSetWriter
from dsdata.train.curriculum import (CurriculumSampler, FixedSchedule, LinearSchedule, TableSchedule,
                                     natural_weights, schedule_from_spec)
from dsdata.train.data import ShardDataset

SEQ = 16


def _counting_set(directory, n_docs=24, doc_len=50, shard_size=300, buckets=("medium",)):
    """Shards whose token values are 1, 2, 3, ... in write order (uint32): a window's first token
    says exactly where it came from."""
    writer = ShardSetWriter(str(directory), dtype=np.dtype(np.uint32), shard_size=shard_size)
    next_value = 1
    for i in range(n_docs):
        tokens = np.arange(next_value, next_value + doc_len, dtype=np.uint32)
        next_value += doc_len
        writer.add(f"d{i:03d}", tokens, buckets[i % len(buckets)])
    return writer.close()


def _interrupted_at(make, cut: int, total: int) -> list:
    """`total` batches from a dataset made by `make` (one iter()), checkpointed (through JSON) after `cut`
    of them and resumed in a fresh dataset for the rest."""
    ds = make()
    it = iter(ds)
    taken = [next(it).clone() for _ in range(cut)]
    state = json.loads(json.dumps(ds.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    it = iter(resumed)
    return taken + [next(it) for _ in range(total - cut)]


def test_zero_copy_window_points_into_the_shard_mapping(tmp_path):
    _counting_set(tmp_path / "s")
    ds = ShardDataset(str(tmp_path / "s"), SEQ, shuffle=False)
    window = next(iter(ds))
    assert window.shape == (SEQ + 1,) and window.dtype == torch.uint32
    start, end = window.data_ptr(), window.data_ptr() + window.numel() * window.element_size()
    # Independent of the loader's own bookkeeping: the kernel's list of this process' mappings.
    mapped = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 6 and parts[5].startswith(str(tmp_path / "s")) and parts[5].endswith(".arrow"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                mapped.append((lo, hi, parts[5]))
    assert any(lo <= start and end <= hi for lo, hi, _ in mapped), (hex(start), mapped)
    assert any(addr <= start < addr + size for _, addr, size in ds.mapped_regions())
    assert window.tolist() == list(range(1, SEQ + 2))


def test_windows_pack_documents_and_overlap_by_one_token(tmp_path):
    manifest = _counting_set(tmp_path / "s")
    windows = [w.numpy().copy() for w in ShardDataset(str(tmp_path / "s"), SEQ, shuffle=False)]
    first_shard_tokens = manifest["shards"][0]["tokens"]
    per_shard = (first_shard_tokens - 1) // SEQ
    assert len(windows) == sum((s["tokens"] - 1) // SEQ for s in manifest["shards"])
    # Inside a shard: consecutive windows continue the stream, across document boundaries.
    for a, b in zip(windows[: per_shard - 1], windows[1:per_shard]):
        assert a[-1] == b[0] and b[0] + SEQ == b[-1]


def _consume(rank, world_size, num_workers, directory, seed=3):
    ds = ShardDataset(str(directory), SEQ, rank=rank, world_size=world_size, seed=seed)
    loader = DataLoader(ds, batch_size=4, num_workers=num_workers)
    return [int(row[0]) for batch in loader for row in batch]


@pytest.mark.slow
def test_two_ranks_two_workers_disjoint_and_complete(tmp_path):
    manifest = _counting_set(tmp_path / "s", n_docs=40)
    starts = {r: _consume(r, 2, 2, tmp_path / "s") for r in (0, 1)}
    everything = starts[0] + starts[1]
    assert len(everything) == len(set(everything)), "a window went to two consumers"
    assert len(starts[0]) == len(starts[1]), "ranks must yield the same number of windows (DDP)"
    # Complete: every window of every shard except the < 4 per shard cut to deal evenly.
    offset = 1
    possible = set()
    expected_count = 0
    for shard in manifest["shards"]:
        n = (shard["tokens"] - 1) // SEQ
        possible |= {offset + k * SEQ for k in range(n)}
        expected_count += n - n % 4
        offset += shard["tokens"]
    assert set(everything) <= possible
    assert len(everything) == expected_count
    per_consumer = ShardDataset(str(tmp_path / "s"), SEQ, rank=0, world_size=2).windows_per_epoch(num_workers=2)
    assert len(starts[0]) == 2 * per_consumer


def test_shuffle_is_deterministic_by_seed_and_epoch(tmp_path):
    _counting_set(tmp_path / "s")
    ds = ShardDataset(str(tmp_path / "s"), SEQ, seed=7)
    epoch0 = [int(w[0]) for w in ds]
    epoch1 = [int(w[0]) for w in ds]
    again = ShardDataset(str(tmp_path / "s"), SEQ, seed=7)
    assert [int(w[0]) for w in again] == epoch0
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    other_seed = [int(w[0]) for w in ShardDataset(str(tmp_path / "s"), SEQ, seed=8)]
    assert other_seed != epoch0 and sorted(other_seed) == sorted(epoch0)
    unshuffled = [int(w[0]) for w in ShardDataset(str(tmp_path / "s"), SEQ, shuffle=False)]
    assert unshuffled == sorted(unshuffled)


def _steps(ds, loader_iter_box, first_step, n_steps):
    """Batches for steps first_step.., re-iterating at epoch ends like a step-based trainer."""
    out = []
    for step in range(first_step, first_step + n_steps):
        ds.set_step(step)
        try:
            batch = next(loader_iter_box[0])
        except StopIteration:
            loader_iter_box[0] = iter(loader_iter_box[1])
            batch = next(loader_iter_box[0])
        out.append(batch.clone())
    return out


LINEAR = {"schedule": "linear", "warmup_steps": 12, "start": {"easy": 0.8, "medium": 0.1, "hard": 0.1}}


@pytest.mark.parametrize("curriculum,batched", [(None, False), (LINEAR, False), (None, True), (LINEAR, True)])
def test_resume_mid_epoch_gives_the_same_next_batches(tmp_path, curriculum, batched):
    _counting_set(tmp_path / "s", n_docs=30, buckets=("easy", "medium", "hard"))
    path = str(tmp_path / "s")

    def fresh():
        if batched:  # the dataset batches itself (the fast path)
            ds = ShardDataset(path, SEQ, seed=11, curriculum=curriculum, batch_size=3)
            loader = DataLoader(ds, batch_size=None)
        else:
            ds = ShardDataset(path, SEQ, seed=11, curriculum=curriculum)
            loader = DataLoader(ds, batch_size=3)
        return ds, [iter(loader), loader]

    ds, box = fresh()
    per_epoch = ds.windows_per_epoch() // 3
    first = _steps(ds, box, 0, per_epoch // 2)
    state = json.loads(json.dumps(ds.state_dict()))  # it must survive a JSON checkpoint
    torch.save(state, tmp_path / "state.pt")
    uninterrupted = _steps(ds, box, len(first), 2 * per_epoch)  # crosses epoch boundaries

    ds2, box2 = fresh()
    ds2.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    resumed = _steps(ds2, box2, len(first), 2 * per_epoch)
    assert len(resumed) == len(uninterrupted)
    for a, b in zip(uninterrupted, resumed):
        assert torch.equal(a, b)
    # A run without the restored state would differ (the check above can fail).
    ds3, box3 = fresh()
    assert not all(torch.equal(a, b) for a, b in zip(uninterrupted, _steps(ds3, box3, len(first), 2 * per_epoch)))


@pytest.mark.parametrize("shuffle,batch_size", [(True, 5), (True, 7), (False, 5), (False, 7)])
def test_batched_mode_yields_the_same_windows_as_window_mode(tmp_path, shuffle, batch_size):
    _counting_set(tmp_path / "s", n_docs=40)
    path = str(tmp_path / "s")
    for rank in (0, 1):
        windows = torch.stack(list(ShardDataset(path, SEQ, seed=4, shuffle=shuffle, rank=rank, world_size=2)))
        ds = ShardDataset(path, SEQ, seed=4, shuffle=shuffle, rank=rank, world_size=2, batch_size=batch_size)
        for _ in range(2):  # two epochs, each ending with its own (maybe short) batch
            batches = list(ds)
            assert all(b.shape[1] == SEQ + 1 for b in batches)
            assert all(b.shape[0] == batch_size for b in batches[:-1])
            assert sum(b.shape[0] for b in batches) == len(windows)
        if not shuffle:
            assert torch.equal(torch.cat(batches), windows)
        else:
            assert torch.equal(torch.cat(list(ShardDataset(path, SEQ, seed=4, rank=rank, world_size=2,
                                                           batch_size=batch_size))), windows)
    if not shuffle:
        # In order, a batch inside one shard is a strided view of the mapping itself.
        ds = ShardDataset(path, SEQ, shuffle=False, batch_size=4)
        first = next(iter(ds))
        assert any(addr <= first.data_ptr() < addr + size for _, addr, size in ds.mapped_regions())


@pytest.mark.parametrize("shuffle", [True, False])
def test_batched_mode_resumes_exactly_after_any_batch(tmp_path, shuffle):
    # 5 does not divide the shards' window counts: batches cross shard boundaries (the slow path)
    # as well as lying within one shard (the fast path); resume from a state taken after each.
    _counting_set(tmp_path / "s", n_docs=40)
    path = str(tmp_path / "s")

    def make():
        return ShardDataset(path, SEQ, seed=6, shuffle=shuffle, rank=1, world_size=2, batch_size=5)

    reference = make()
    epochs = [[b.clone() for b in reference] for _ in range(2)]
    assert len(epochs[0]) > 3
    flat = epochs[0] + epochs[1]
    for cut in range(len(epochs[0]) + 1):
        ds = make()
        it = iter(ds)
        taken = [next(it).clone() for _ in range(cut)]
        state = json.loads(json.dumps(ds.state_dict()))
        resumed = make()
        resumed.load_state_dict(state)
        rest = list(resumed)
        if cut == len(epochs[0]):  # nothing left of epoch 0: iter() starts epoch 1
            rest_expected = epochs[1]
        else:
            rest_expected = epochs[0][cut:]
        assert len(taken + rest) == len(flat[:cut] + rest_expected)
        assert all(torch.equal(a, b) for a, b in zip(taken + rest, flat[:cut] + rest_expected))


def test_shuffled_batches_are_views_of_fresh_chunks_and_resume_inside_a_chunk(tmp_path, monkeypatch):
    import dsdata.train.data as data

    # Chunks of 3 batches (2 windows of 17 uint32 tokens each) in shards of ~60 windows: several chunks
    # per shard, so the cuts below fall inside chunks, at chunk edges, at shard edges and at the epoch end.
    monkeypatch.setattr(data, "_CHUNK_BYTES", 3 * 2 * (SEQ + 1) * 4)
    _counting_set(tmp_path / "s", n_docs=40, shard_size=1000)
    path = str(tmp_path / "s")

    def make():
        return ShardDataset(path, SEQ, seed=8, batch_size=2, endless=True)

    per_epoch = make().windows_per_epoch()
    total = per_epoch // 2 + 5  # past the first epoch end
    it = iter(make())
    held = [next(it) for _ in range(total)]  # not cloned: later gathers must not overwrite them
    storage = [b.untyped_storage().data_ptr() for b in held]
    assert storage[0] == storage[1] == storage[2] != storage[3] == storage[4] == storage[5], "one gather per 3 batches"
    window_ds = ShardDataset(path, SEQ, seed=8)
    stream = torch.cat([torch.stack(list(window_ds)) for _ in range(2)])
    assert torch.equal(torch.cat(held), stream[:2 * total])
    for cut in range(total):
        assert torch.equal(torch.cat(_interrupted_at(make, cut, total)), stream[:2 * total]), cut


@pytest.mark.parametrize("dtype,large", [(np.uint16, 65535), (np.uint32, 4_000_000_000)])
def test_token_ids_on_widens_shard_batches_on_the_device_or_else_on_the_host(monkeypatch, dtype, large):
    from dsdata.train import distributed

    values = np.array([[0, 1, large, 7], [3, large, 2, 9], [large, 5, 6, 1], [4, 4, 0, large]], dtype=dtype)
    batch = torch.from_numpy(values)
    expected = values.astype(np.int64).tolist()
    monkeypatch.setattr(distributed, "_HOST_WIDENED", set())
    # What the layouts do with a shard-dtype batch: slice a rank's rows, split, cat (pipeline), move, widen.
    micro = list(batch[1:3].split(1))
    for rows, part in zip(expected[1:3], micro):
        got = distributed.token_ids_on("cpu", part)
        assert got.dtype == torch.int64 and got.tolist() == [rows]
    assert distributed.token_ids_on(torch.device("cpu"), torch.cat(micro)).tolist() == expected[1:3]
    assert not distributed._HOST_WIDENED
    # A device without copies of the shell dtype (simulated: CPU has them): widened on the host, warned once.
    real_to = torch.Tensor.to

    def no_shell_dtype_copies(self, *args, **kwargs):
        if self.dtype in (torch.uint16, torch.uint32) and any(isinstance(a, (str, torch.device)) for a in args):
            raise RuntimeError(f'"copy_" not implemented for {self.dtype}')
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", no_shell_dtype_copies)
    with pytest.raises(RuntimeError):
        batch.to("cpu")
    with pytest.warns(RuntimeWarning, match="on the host"):
        got = distributed.token_ids_on("cpu", batch)
    assert got.dtype == torch.int64 and got.tolist() == expected
    assert distributed._HOST_WIDENED == {("cpu", batch.dtype)}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert distributed.token_ids_on("cpu", batch[2:]).tolist() == expected[2:]
    int64 = torch.tensor(expected)
    assert distributed.token_ids_on("cpu", int64) is int64  # already int64 on the device: untouched


def test_resume_right_after_an_epoch_ends(tmp_path):
    _counting_set(tmp_path / "s")
    ds = ShardDataset(str(tmp_path / "s"), SEQ, seed=1)
    it = iter(ds)
    for _ in range(ds.windows_per_epoch()):
        next(it)
    state = ds.state_dict()
    # A new iter() with nothing left of epoch 0 starts epoch 1.
    expected_next_epoch = [int(w[0]) for w in ds]
    assert len(expected_next_epoch) == ds.windows_per_epoch()
    ds2 = ShardDataset(str(tmp_path / "s"), SEQ, seed=1)
    ds2.load_state_dict(state)
    assert [int(w[0]) for w in ds2] == expected_next_epoch


def test_state_from_another_setting_is_refused(tmp_path):
    _counting_set(tmp_path / "s")
    state = ShardDataset(str(tmp_path / "s"), SEQ, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        ShardDataset(str(tmp_path / "s"), SEQ, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="seq_len"):
        ShardDataset(str(tmp_path / "s"), SEQ * 2, seed=1).load_state_dict(state)


def test_curriculum_follows_the_weights(tmp_path):
    manifest = _counting_set(tmp_path / "s", n_docs=30, buckets=("easy", "medium", "hard"))
    buckets = ("easy", "medium", "hard")
    bucket_of_value = {v: buckets[((v - 1) // 50) % 3] for v in range(1, 30 * 50 + 1)}  # doc i: values of doc i
    assert {s["difficulty"] for s in manifest["shards"]} == set(buckets)
    only_hard = ShardDataset(str(tmp_path / "s"), SEQ, curriculum=FixedSchedule({"hard": 1.0}))
    it = iter(only_hard)
    assert {bucket_of_value[int(next(it)[0])] for _ in range(50)} == {"hard"}
    # Linear easy → hard: at step 0 all easy, after the warm-up all hard.
    ds = ShardDataset(str(tmp_path / "s"), SEQ, curriculum=LinearSchedule({"easy": 1}, {"hard": 1}, warmup_steps=10))
    it = iter(ds)
    ds.set_step(0)
    assert {bucket_of_value[int(next(it)[0])] for _ in range(30)} == {"easy"}
    ds.set_step(10)
    assert {bucket_of_value[int(next(it)[0])] for _ in range(30)} == {"hard"}


def test_schedules_and_natural_weights(tmp_path):
    linear = LinearSchedule({"easy": 0.6, "medium": 0.3, "hard": 0.1}, {"easy": 0.2, "medium": 0.3, "hard": 0.5}, 100)
    assert linear.weights(0)["easy"] == pytest.approx(0.6)
    assert linear.weights(50)["hard"] == pytest.approx(0.3)
    assert linear.weights(1000)["hard"] == pytest.approx(0.5)
    table = TableSchedule([(0, {"easy": 1.0}), (10, {"hard": 1.0})])
    assert table.weights(5) == pytest.approx({"easy": 0.5, "hard": 0.5})
    assert table.weights(-1) == {"easy": 1.0} and table.weights(99) == {"hard": 1.0}
    spec = schedule_from_spec({"schedule": "linear", "warmup_fraction": 0.25}, total_steps=200,
                              natural={"easy": 0.5, "medium": 0.25, "hard": 0.25})
    assert spec.warmup_steps == 50 and spec.end == {"easy": 0.5, "medium": 0.25, "hard": 0.25}
    (tmp_path / "stats.json").write_text(json.dumps({"difficulty": {"buckets": {"easy": 10, "medium": 30, "hard": 60}}}))
    assert natural_weights(str(tmp_path / "stats.json")) == pytest.approx({"easy": 0.1, "medium": 0.3, "hard": 0.6})
    manifest = _counting_set(tmp_path / "s", buckets=("easy", "hard"))
    assert set(natural_weights(str(tmp_path / "s"))) == {"easy", "hard"}
    with pytest.raises(ValueError, match="weight"):
        FixedSchedule({"easy": -1})
    sampler = CurriculumSampler(FixedSchedule({"easy": 1, "hard": 1}), seed=5)
    state = sampler.state_dict()
    draws = [sampler.choose(0, ["easy", "hard"]) for _ in range(20)]
    sampler.load_state_dict(state)
    assert [sampler.choose(0, ["easy", "hard"]) for _ in range(20)] == draws
    assert manifest["buckets"]["easy"]["shards"] >= 1


def test_too_small_for_seq_len_is_a_clear_error(tmp_path):
    _counting_set(tmp_path / "s", n_docs=2, doc_len=5)
    with pytest.raises(ValueError, match="no windows"):
        next(iter(ShardDataset(str(tmp_path / "s"), 64)))


@pytest.mark.parametrize("shuffle", [True, False])
def test_endless_batches_are_the_window_stream_cut_into_full_batches(tmp_path, shuffle):
    # 7 divides neither a shard's nor an epoch's window count: batches cross shard and epoch ends.
    _counting_set(tmp_path / "s", n_docs=40)
    path = str(tmp_path / "s")
    window_ds = ShardDataset(path, SEQ, seed=4, shuffle=shuffle, rank=1, world_size=2)
    epochs = [torch.stack(list(window_ds)) for _ in range(3)]
    per_epoch = len(epochs[0])
    assert per_epoch % 7 != 0
    stream = torch.cat(epochs)
    assert not torch.equal(epochs[0], epochs[1]) or not shuffle
    ds = ShardDataset(path, SEQ, seed=4, shuffle=shuffle, rank=1, world_size=2, batch_size=7, endless=True)
    it = iter(ds)
    batches = [next(it).clone() for _ in range(len(stream) // 7)]
    assert all(b.shape == (7, SEQ + 1) for b in batches)
    assert torch.equal(torch.cat(batches), stream[:len(batches) * 7])
    # Per-window endless mode: the same stream from one iter().
    endless_windows = ShardDataset(path, SEQ, seed=4, shuffle=shuffle, rank=1, world_size=2, endless=True)
    it = iter(endless_windows)
    assert torch.equal(torch.stack([next(it) for _ in range(len(stream))]), stream)


def test_endless_batches_resume_exactly_across_an_epoch_end(tmp_path):
    _counting_set(tmp_path / "s", n_docs=40)
    path = str(tmp_path / "s")

    def make():
        return ShardDataset(path, SEQ, seed=9, batch_size=7, endless=True)

    per_epoch = make().windows_per_epoch()
    assert per_epoch % 7 != 0
    total = 2 * per_epoch // 7 + 3  # two epochs and a bit
    it = iter(reference := make())
    expected = [next(it).clone() for _ in range(total)]
    # Every cut around the first epoch end (the batch that crosses it, the ones before and after)
    # and one deep into the second epoch.
    crossing = per_epoch // 7
    for cut in [crossing - 1, crossing, crossing + 1, crossing + 2, total - 3]:
        assert all(torch.equal(a, b) for a, b in zip(_interrupted_at(make, cut, total), expected)), cut
    assert reference.state_dict()["groups"]["all"][0] == 2  # the reference ran into epoch 2 (epochs 0, 1 done)


def _shard_batches(path, seed=5, curriculum=None, batch_size=4):
    from dsdata.train.batches import ShardBatches
    from dsdata.train.config import DataConfig

    return ShardBatches(DataConfig(path=path, seed=seed, curriculum=curriculum or {}), SEQ, total_steps=40,
                        batch_size=batch_size)


@pytest.mark.parametrize("curriculum", [None, LINEAR])
def test_trainer_batches_resume_exactly_and_under_another_batch_size(tmp_path, curriculum):
    _counting_set(tmp_path / "s", n_docs=30, buckets=("easy", "medium", "hard"))
    path = str(tmp_path / "s")
    reference = _shard_batches(path, curriculum=curriculum)
    per_epoch = reference.dataset.windows_per_epoch()
    steps = 2 * per_epoch // 4 + 2  # past two epoch ends (without a curriculum)
    expected = [reference.next_batch(step) for step in range(steps)]
    # In the shard's dtype: the layout widens to int64 on the device (distributed.token_ids_on).
    assert all(b.dtype == torch.uint32 and b.shape == (4, SEQ + 1) for b in expected)
    if curriculum is None:  # the per-window stream, rolled over epochs, cut into steps of 4
        window_ds = ShardDataset(path, SEQ, seed=5)
        stream = torch.cat([torch.stack(list(window_ds)) for _ in range(3)])
        assert torch.equal(torch.cat(expected), stream[:steps * 4])
    for cut in (0, per_epoch // 4, steps - 1):
        first = _shard_batches(path, curriculum=curriculum)
        for step in range(cut):
            first.next_batch(step)
        state = json.loads(json.dumps(first.state_dict()))
        resumed = _shard_batches(path, curriculum=curriculum)
        resumed.load_state_dict(state)  # before the first step, as the trainer does
        assert all(torch.equal(resumed.next_batch(step), expected[step]) for step in range(cut, steps)), cut
    # The position counts windows: resuming 8 steps of 4 under batches of 2 continues the same stream
    # (for a curriculum, two batches of 2 drawn at step s hold the windows of step s's batch of 4,
    # in another order: rows are grouped by bucket inside a batch).
    first = _shard_batches(path, curriculum=curriculum)
    for step in range(8):
        first.next_batch(step)
    halved = _shard_batches(path, curriculum=curriculum, batch_size=2)
    halved.load_state_dict(first.state_dict())
    pairs = [torch.cat([halved.next_batch(8 + i), halved.next_batch(8 + i)]) for i in range(4)]
    for got, want in zip(pairs, expected[8:12]):
        if curriculum is None:
            assert torch.equal(got, want)
        else:
            assert sorted(got[:, 0].tolist()) == sorted(want[:, 0].tolist())
    assert not torch.equal(torch.cat(pairs), torch.cat(expected[:4]))


def test_trainer_batches_resume_a_per_window_state(tmp_path):
    # A checkpoint of the per-window trainer (dataset batch_size None) resumes on the same windows.
    _counting_set(tmp_path / "s", n_docs=30)
    path = str(tmp_path / "s")
    windows = ShardDataset(path, SEQ, seed=5)
    it = iter(windows)
    for _ in range(13):
        next(it)
    state = json.loads(json.dumps(windows.state_dict()))
    assert state["batch_size"] is None
    expected = torch.stack([next(it) for _ in range(6)])
    batches = _shard_batches(path, batch_size=3)
    batches.load_state_dict(state)
    assert torch.equal(torch.cat([batches.next_batch(0), batches.next_batch(1)]), expected)


def test_shards_stay_mapped_across_epochs_up_to_max_mapped_shards(tmp_path):
    """Later epochs reuse the mappings of the first (no re-mapping, no page faults again), and no
    more than max_mapped_shards are open at once (but always the current + next one)."""
    _counting_set(tmp_path / "s", n_docs=40, shard_size=300)
    n_shards = len(ShardDataset(str(tmp_path / "s"), SEQ).shards)
    assert n_shards >= 6
    ds = ShardDataset(str(tmp_path / "s"), SEQ, seed=3, batch_size=4)
    list(ds)
    first = {path: addr for path, addr, _ in ds.mapped_regions()}
    assert len(first) == n_shards
    list(ds)  # epoch 2
    assert {path: addr for path, addr, _ in ds.mapped_regions()} == first

    small = ShardDataset(str(tmp_path / "s"), SEQ, seed=3, batch_size=4, max_mapped_shards=2)
    seen_open = []
    for _ in small:
        seen_open.append(len(small.mapped_regions()))
    assert max(seen_open) == 3  # the floor: 2 per bucket (current + next) + 1
    with pytest.raises(ValueError, match="max_mapped_shards"):
        ShardDataset(str(tmp_path / "s"), SEQ, max_mapped_shards=0)
