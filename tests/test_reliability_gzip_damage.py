"""Damage inside one gzip member / zstd frame: the garbage the decoder emits after it (deflate
cannot resynchronise; the CRC fails only at the member's end) is never kept or counted as records.
Real files, real zlib / zstandard; see docs/reliability.md, "Damaged and hostile input"."""
from __future__ import annotations

import gzip
import json
import random

import pytest
import zstandard

from dsdata.document import Document, Rejected
from dsdata.io.readers import jsonl as jsonl_reader
from dsdata.io.readers import read_local

WORDS = "alpha beta gamma delta eps".split()


def _lines(n: int, seed: int = 1, prefix: str = "r") -> list[bytes]:
    rng = random.Random(seed)
    return [json.dumps({"id": f"{prefix}{i}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 200)))})
            .encode() + b"\n" for i in range(n)]


def _zero_middle(blob: bytes, n: int = 50) -> bytes:
    bad = bytearray(blob)
    mid = len(bad) // 2
    bad[mid:mid + n] = bytes(n)
    return bytes(bad)


def _docs(rows):
    return [r for r in rows if isinstance(r, Document)]


def _rejected(rows):
    return [r for r in rows if isinstance(r, Rejected)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_single_member_damage_keeps_a_sound_prefix_and_one_row(tmp_path, seed):
    lines = _lines(3000, seed)
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(_zero_middle(gzip.compress(b"".join(lines))))
    rows = read_local(str(path))
    docs = _docs(rows)
    # Every kept record is exactly an original record, in order, from the file's start: no garbage.
    originals = [json.loads(l) for l in lines]
    assert [(d.id, d.text) for d in docs] == [(o["id"], o["text"]) for o in originals[:len(docs)]]
    # The half before the damage stays (at most the 32 KiB look-behind before the first bad line goes).
    assert len(docs) > 0.4 * len(lines)
    (damage,) = _rejected(rows)
    assert damage.reason == "corrupt_compression"
    assert "part of the loss" in damage.detail and "does not parse" in damage.detail


def test_repro_shape_no_bad_json_rows_from_garbage(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(_zero_middle(gzip.compress(b"".join(_lines(3000)))))
    reasons = [r.reason for r in _rejected(read_local(str(path)))]
    assert reasons == ["corrupt_compression"]


def test_damaged_middle_member_of_three(tmp_path):
    groups = [_lines(1000, 4, "a"), _lines(1000, 5, "b"), _lines(1000, 6, "c")]
    members = [gzip.compress(b"".join(g)) for g in groups]
    members[1] = _zero_middle(members[1])
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(b"".join(members))
    rows = read_local(str(path))
    ids = [d.id for d in _docs(rows)]
    a = [f"a{i}" for i in range(1000)]
    c = [f"c{i}" for i in range(1000)]
    assert ids[:1000] == a and ids[-1000:] == c
    middle = ids[1000:-1000]
    assert middle == [f"b{i}" for i in range(len(middle))] and len(middle) > 100
    (damage,) = _rejected(rows)
    assert damage.reason == "corrupt_compression" and "resumed" in damage.detail


def test_zstd_frame_damage_keeps_only_original_records(tmp_path):
    lines = _lines(3000)
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(_zero_middle(zstandard.ZstdCompressor(write_checksum=True).compress(b"".join(lines))))
    rows = read_local(str(path))
    docs = _docs(rows)
    assert [d.id for d in docs] == [f"r{i}" for i in range(len(docs))] and len(docs) > 300
    assert [r.reason for r in _rejected(rows)] == ["corrupt_compression"]


def _healthy_with_bad_lines(every: int) -> bytes:
    out = []
    for i, line in enumerate(_lines(2000)):
        out.append(line)
        if i % every == min(7, every - 1):
            out.append(b'{"id": "broken ' + str(i).encode() + b'", "text": \n')  # a bad line in a healthy file
        if i % (every * 3) == 11:
            out.append(b'{"id": "nt%d"}\n' % i)
    return b"".join(out)


@pytest.mark.parametrize("codec", ["gz", "zst"])
@pytest.mark.parametrize("every", [2, 500])
def test_undamaged_file_with_bad_lines_gives_the_same_rows_as_plain(tmp_path, monkeypatch, codec, every):
    # A small memory bound makes the held rows spill to the temporary file and come back from it.
    monkeypatch.setattr(jsonl_reader, "_SUSPECT_MEMORY", 4096)
    data = _healthy_with_bad_lines(every)
    plain = tmp_path / "p.jsonl"
    plain.write_bytes(data)
    packed = tmp_path / f"p.jsonl.{codec}"
    packed.write_bytes(gzip.compress(data) if codec == "gz" else zstandard.ZstdCompressor().compress(data))

    def shape(rows):
        return [(type(r).__name__, r.id if isinstance(r, Document) else r.doc.id.rsplit(":", 1)[-1] if
                 r.doc.id.startswith(str(tmp_path)) else r.doc.id,
                 r.text if isinstance(r, Document) else (r.reason, r.detail)) for r in rows]

    expected = shape(read_local(str(plain)))
    assert shape(read_local(str(packed))) == expected
    assert any(t == "Rejected" for t, _, _ in expected)


def test_damage_after_bad_line_in_healthy_part_keeps_it_as_its_row(tmp_path):
    # A bad line well before the damage is released (64 KiB of good lines follow it) and stays a row.
    lines = _lines(3000)
    lines.insert(100, b"not json\n")
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(_zero_middle(gzip.compress(b"".join(lines))))
    rows = read_local(str(path))
    assert [r.reason for r in _rejected(rows)] == ["bad_json", "corrupt_compression"]
    docs = _docs(rows)
    assert [d.id for d in docs] == [f"r{i}" for i in range(len(docs))] and len(docs) > 1000


def test_truncated_member_releases_held_rows(tmp_path):
    lines = _lines(400)
    lines.insert(390, b"not json\n")
    blob = gzip.compress(b"".join(lines))
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(blob[:-40])  # cut in the last deflate bytes: everything decoded is sound
    rows = read_local(str(path))
    reasons = [r.reason for r in _rejected(rows)]
    assert reasons == ["bad_json", "truncated_compression"]
    assert len(_docs(rows)) >= 390


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_output_decoded_before_the_damage_is_not_lost_with_its_feed(tmp_path, seed):
    """zlib raises on a whole 64 KiB feed: what it decodes from that feed's bytes before the damage
    comes out too, exactly the output of feeding the file byte by byte up to the error."""
    import zlib

    from dsdata.io.decompress import Damage, decoded_chunks

    rng = random.Random(seed)
    blob = bytearray(gzip.compress(b"".join(_lines(6000, seed))))
    at = rng.randrange(len(blob) // 3, 2 * len(blob) // 3)
    blob[at:at + 8] = b"\xff" * 8  # an invalid block or distance: zlib raises soon after
    reference, d = [], zlib.decompressobj(16 + zlib.MAX_WBITS)
    for i in range(len(blob)):
        try:
            reference.append(d.decompress(bytes(blob[i:i + 1])))
        except zlib.error:
            break
    else:
        pytest.skip("this damage decodes without an error")
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(bytes(blob))
    with open(path, "rb") as fh:
        chunks = list(decoded_chunks(str(path), fh))
    first_damage = next(i for i, c in enumerate(chunks) if isinstance(c, Damage))
    assert b"".join(chunks[:first_damage]) == b"".join(reference)
