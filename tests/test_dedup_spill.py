"""Dedup parks documents in spill files (dsdata/beam/spill.py) while only keys and decisions shuffle:
the format round-trips what a packed Document holds and runs no code, and a run with `spill: true`
(the default) decides every document exactly as `spill: false` does — clusters, duplicate records
split across workers' files, and a document whose metadata the format cannot carry."""
import datetime as dt
import json
import os
import random
import stat
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.document import Document, pack_document, unpack_document
from dsdata.beam import spill
from dsdata.recipe import load_recipe

MP2 = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


# --- the format ------------------------------------------------------------------------------------

VALUES = [
    None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**200, -(3**90), 0.0, -0.0, 1.5e-300, float("inf"),
    "", "plain", "汉字 and \ud800 lone surrogate", b"", b"\x00\xff" * 50, [], (), {}, [1, (2, [3, {"a": None}])],
    {"k": [1.0, "x"], 3: b"y", (1, 2): {"nested": True}, None: False},
    dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
    dt.datetime(2020, 1, 1, 5, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
    dt.date(1, 1, 1), dt.time(12, 30, 1, 5), Decimal("-1.2345678901234567890123"), Decimal("NaN"),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_values_round_trip_with_their_types(value):
    back = spill.decode(spill.encode(value))
    assert repr(back) == repr(value) and type(back) is type(value)


def test_random_nested_values_round_trip():
    rnd = random.Random(5)

    def make(depth: int):
        kind = rnd.randrange(8 if depth < 4 else 5)
        if kind == 0:
            return rnd.randint(-2**70, 2**70)
        if kind == 1:
            return rnd.random() * 10 ** rnd.randint(-20, 20)
        if kind == 2:
            return "".join(chr(rnd.choice([rnd.randint(32, 126), rnd.randint(0x4E00, 0x9FFF)])) for _ in range(rnd.randint(0, 20)))
        if kind == 3:
            return bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 20)))
        if kind == 4:
            return rnd.choice([None, True, False])
        if kind == 5:
            return [make(depth + 1) for _ in range(rnd.randint(0, 4))]
        if kind == 6:
            return tuple(make(depth + 1) for _ in range(rnd.randint(0, 4)))
        return {f"k{i}": make(depth + 1) for i in range(rnd.randint(0, 4))}

    for _ in range(300):
        value = make(0)
        assert spill.decode(spill.encode(value)) == value


def test_a_packed_document_round_trips():
    doc = Document("d1", "text " * 200, {"url": "http://x", "n": 3}, {"lang": "en", "lang_score": 0.93}, "parent")
    back = unpack_document(spill.decode(spill.encode(("node", pack_document(doc))))[1])
    assert back == doc


@pytest.mark.parametrize("value", [
    {1, 2}, object(), dt.timedelta(seconds=1), pytest, complex(1, 2),
    dt.datetime(2020, 1, 1, fold=1),
])
def test_other_types_are_unspillable_not_approximated(value):
    with pytest.raises(spill.Unspillable):
        spill.encode({"x": [value]})


def test_damaged_records_are_refused_and_nothing_is_unpickled(tmp_path):
    good = spill.encode(("n", (1, "x")))
    for bad in (good[:-1], good + b"N", b"\xc1", b"\xdb\xff\xff\xff\xff", b"c" + good, b""):
        with pytest.raises(spill.SpillFormatError):
            spill.decode(bad)
    nested = spill.encode(("d", ("id", b"\x00z", {"n": [1, 2.5, None, True]}, {"t": dt.date(2020, 1, 2)}, None)))
    for cut in range(len(nested)):  # cut inside a tag, a length, a number, a text or a container
        with pytest.raises(spill.SpillFormatError):
            spill.decode(nested[:cut])
    # A pickle payload is just an unknown tag: decoding never reaches pickle.
    import pickle

    with pytest.raises(spill.SpillFormatError):
        spill.decode(pickle.dumps(os.system))
    # A file cut inside a record is one clear error naming the file.
    path = tmp_path / "cut.spill"
    writer = spill.SpillWriter(str(tmp_path))
    writer.write(("a", 1))
    writer.write(("b", "x" * 100))
    writer.close()
    data = Path(writer.path).read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(spill.SpillFormatError, match="cut.spill"):
        list(spill.read_spill(str(path)))
    assert list(spill.read_spill(writer.path)) == [("a", 1), ("b", "x" * 100)]


def test_a_grouping_run_whose_records_are_damaged_is_refused_naming_its_file(tmp_path):
    """The spilled grouping decodes each record where it lies in its run: a length that does not
    match the record, or bytes that are no record, are one SpillFormatError naming the file."""
    records = [spill.encode((key, value)) for key, value in ((7, "a"), (-3, "b"), (7, "c"))]
    run = b"".join(spill._LEN.pack(len(r)) + r for r in records)
    group = spill._GroupRuns(str(tmp_path), None)
    (tmp_path / "good.group.spill").write_bytes(run)
    assert dict(group.process((0, [("good.group.spill", 0, len(run), 0)]))) == {7: ["a", "c"], -3: ["b"]}
    joined = spill._GroupRuns(str(tmp_path), ["x", "y"]).process((0, [("good.group.spill", 0, len(run), 1)]))
    assert dict(joined) == {7: {"x": [], "y": ["a", "c"]}, -3: {"x": [], "y": ["b"]}}
    first = len(records[0])
    for name, damaged in (("long.group.spill", spill._LEN.pack(first + 1) + run[4:]),  # claims a byte more
                          ("short.group.spill", spill._LEN.pack(first - 1) + run[4:]),
                          ("noise.group.spill", spill._LEN.pack(first) + b"Z" * first + run[4 + first:])):
        (tmp_path / name).write_bytes(damaged)
        with pytest.raises(spill.SpillFormatError, match=name):
            list(group.process((0, [(name, 0, len(damaged), 0)])))


def test_band_buckets_link_every_bucket_of_two_or_more_as_plain_grouping_does(tmp_path):
    """BandBuckets (dsdata/beam/dedup/buckets.py) in a real pipeline, blocks spilled and inline, small
    flushes so that a partition's blocks come from several writes: the same links as grouping every
    (band key, node) record in Python; node keys with CJK characters come back as they went in."""
    import numpy as np
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from dsdata.beam.dedup import buckets

    rnd = random.Random(5)
    shared = [rnd.getrandbits(64) for _ in range(40)]  # keys drawn from a small pool collide often
    reps = []
    for i in range(500):
        keys = [rnd.choice(shared) if rnd.random() < 0.1 else rnd.getrandbits(64) for _ in range(9)]
        reps.append((f"doc-{i:04d} 汉字\x1f{i:x}", np.array(keys, dtype=np.uint64).tobytes()))
    grouped: dict[int, set] = {}
    for node, bands in reps:
        for key in np.frombuffer(bands, dtype=np.uint64).tolist():
            grouped.setdefault(key, set()).add(node)
    expected = set()
    for nodes in grouped.values():
        members = sorted(nodes)
        expected.update((members[0], b) for b in members[1:])
    assert expected
    monkey = pytest.MonkeyPatch()
    monkey.setattr(buckets, "GROUP_PENDING_BYTES", 4000)
    try:
        for spill_dir in (str(tmp_path / "spill"), None):
            with beam.Pipeline() as p:
                links = p | beam.Create(reps) | buckets.BandBuckets(spill_dir) | beam.Distinct()
                assert_that(links, equal_to(sorted(expected)))
    finally:
        monkey.undo()
    assert list((tmp_path / "spill").glob("*.buckets.spill"))


def test_a_damaged_bucket_block_is_refused_naming_its_file(tmp_path):
    import numpy as np

    from dsdata.beam.dedup import buckets

    block = buckets.encode_block(np.array([5, 5, 9], dtype=np.uint64), [b"a", "汉".encode(), b"c"])
    keys, lengths, data = buckets.decode_block(block, "x")
    assert keys.tolist() == [5, 5, 9] and lengths.tolist() == [1, 3, 1] and bytes(data) == "a汉c".encode()
    stars = buckets._Stars(str(tmp_path), "dedup")
    stars.setup()
    (tmp_path / "good.buckets.spill").write_bytes(block)
    assert stars.process((0, [("good.buckets.spill", 0, len(block))])) == [("a", "汉")]
    lying = bytearray(block)
    lying[-9] = 2  # the last node-key length that does not add up to the bytes there
    for name, damaged in (("cut.buckets.spill", block[:-2]), ("lying.buckets.spill", bytes(lying)),
                          ("tiny.buckets.spill", block[:3])):
        (tmp_path / name).write_bytes(damaged)
        with pytest.raises(spill.SpillFormatError, match=name):
            stars.process((0, [(name, 0, len(damaged))]))


def test_the_spill_directory_is_private(tmp_path):
    target = tmp_path / "run" / spill.SPILL_DIR / "dedup"
    spill.make_private_dir(str(target))
    for d in (target, target.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    spill.remove_spill(str(tmp_path / "run"))
    assert not target.parent.exists()


# --- runs: spill on == spill off -------------------------------------------------------------------

def _words(rnd: random.Random, n: int) -> list[str]:
    return ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 9))) for _ in range(n)]


def _corpus(rnd: random.Random) -> list[dict]:
    docs = []
    for c in range(12):
        base = _words(rnd, 300)
        for k in range(rnd.randint(1, 4)):  # near copies: a few words changed
            words = list(base)
            for p in rnd.sample(range(300), 4 * k):
                words[p] = f"edit{c}x{k}"
            docs.append({"id": f"c{c:02d}-{k}", "text": " ".join(words), "src": f"s{c % 3}"})
    exact = " ".join(_words(rnd, 250))
    docs += [{"id": "ex-b", "text": exact, "src": "s1"}, {"id": "ex-a", "text": exact.upper(), "src": "s2"}]
    docs += [{"id": f"solo{i}", "text": " ".join(_words(rnd, 120)), "src": "s0"} for i in range(30)]
    return docs


def _write_inputs(tmp_path: Path) -> None:
    rnd = random.Random(23)
    docs = _corpus(rnd)
    rnd.shuffle(docs)
    # Same id, same text in two files (and twice in one): one node with several documents, which
    # on two workers lands in two spill files.  They differ only in metadata, which orders them.
    twin = {"id": "twin", "text": " ".join(_words(rnd, 150)), "src": "a"}
    parts = [docs[: len(docs) // 2] + [twin], docs[len(docs) // 2:] + [dict(twin, src="b"), dict(twin, src="c")]]
    for i, part in enumerate(parts):
        (tmp_path / f"in-{i}.jsonl").write_text("\n".join(json.dumps(d) for d in part) + "\n", "utf-8")
    # A Parquet file whose metadata holds a time in a named zone: not in the spill format, so that
    # document travels through the shuffle, and is still deduplicated against the spilled ones.
    zoned = pa.array([dt.datetime(2024, 3, 31, 1, 30)] * 2, pa.timestamp("us")).cast(pa.timestamp("us", tz="Europe/Berlin"))
    table = pa.table({
        "id": ["zoned-copy", "zoned-solo"],
        "text": [next(d["text"] for d in docs if d["id"] == "solo7"), " ".join(_words(rnd, 200))],
        "seen": zoned,
    })
    pq.write_table(table, tmp_path / "in-2.parquet")


def _run(tmp_path: Path, name: str, spill_on: bool, flags: list[str], verify: str = "exact") -> Path:
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(
        "name: t\ninput: {paths: [in-0.jsonl, in-1.jsonl, in-2.parquet]}\n"
        f"stages:\n  - dedup: {{threshold: 0.8, batch_size: 8, verify: {verify}, spill: {str(spill_on).lower()}}}\n",
        "utf-8")
    out = tmp_path / name
    stats = run_recipe(load_recipe(str(recipe)), str(out), flags)
    assert stats["ledger_ok"]
    return out


def _rows(out: Path, kind: str) -> list[dict]:
    rows = [r for f in sorted((out / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _stats(out: Path) -> dict:
    stats = json.loads((out / "stats.json").read_text("utf-8"))
    for key in ("seconds", "stage_time", "stage_time_unavailable"):
        stats.pop(key, None)
    return stats


@pytest.mark.slow
@pytest.mark.parametrize("flags,verify", [([], "exact"), ([], "signature"), ([], "none"), (MP2, "exact")],
                         ids=["in_process", "in_process-signature", "in_process-none", "multi_processing"])
def test_spilled_run_decides_exactly_as_the_shuffled_one(tmp_path, monkeypatch, flags, verify):
    _write_inputs(tmp_path)
    read: list[str] = []
    if not flags:  # in-process: the DoFns run here, so the files they read can be seen
        import dsdata.beam.dedup.composite as dedup

        def counting(path, _real=dedup.read_spill):
            read.append(Path(path).name.split(".", 1)[1])
            return _real(path)

        monkeypatch.setattr(dedup, "read_spill", counting)
    off = _run(tmp_path, "off", False, flags, verify)
    assert not read
    on = _run(tmp_path, "on", True, flags, verify)
    if not flags:
        assert "docs.spill" in read, read
    for kind in ("kept", "rejected"):
        assert _rows(on, kind) == _rows(off, kind), kind
    assert _stats(on) == _stats(off)
    assert not (on / spill.SPILL_DIR).exists(), "spill files are removed when the run ends"
    rejected = {r["id"]: r for r in _rows(on, "rejected")}
    kept = {r["id"] for r in _rows(on, "kept")}
    # The duplicate records: one kept, the others exact duplicates of it; the zoned copy rejected.
    assert "twin" in kept and sum(r["id"] == "twin" for r in _rows(on, "rejected")) == 2
    assert rejected["zoned-copy"]["reason"] == "exact_duplicate" and "zoned-solo" in kept
    assert {r["reason"] for r in rejected.values()} == {"exact_duplicate", "near_duplicate"}


@pytest.mark.slow
def test_a_killed_runs_spill_is_cleared_by_the_next_run(tmp_path):
    _write_inputs(tmp_path)
    stale = tmp_path / "on" / spill.SPILL_DIR / "dedup"
    stale.mkdir(parents=True)
    (stale / "old.spill").write_bytes(b"junk")
    _run(tmp_path, "on", True, [])
    assert not (tmp_path / "on" / spill.SPILL_DIR).exists()


def test_the_spilled_grouping_gives_its_shuffle_a_declared_type_and_groups_every_record(tmp_path):
    """The runs that cross the runner's GroupByKey carry their declared type (an int partition key,
    not a type Beam infers from process()'s bytecode at graph-build time), and the grouping is exact."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to
    from apache_beam.typehints import Tuple

    records = [(f"k{i % 7}", i) for i in range(200)]
    with beam.Pipeline() as p:
        runs = p | beam.Create(records) | beam.ParDo(spill._SpillRuns(str(tmp_path / "spill"), 0))
        assert runs.element_type == Tuple[int, Tuple[str, int, int, int]]
        grouped = (p | "Again" >> beam.Create(records) | spill.SpilledGroupByKey(str(tmp_path / "spill2"))
                   | beam.MapTuple(lambda key, values: (key, sorted(values))))
        expected = [(f"k{k}", [i for i in range(200) if i % 7 == k]) for k in range(7)]
        assert_that(grouped, equal_to(expected))
