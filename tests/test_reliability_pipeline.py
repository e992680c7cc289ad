"""Hostile records through real Beam runs of pretrain.yaml's model-free per-document stages
(clean → lang → rules): the run finishes, the ledger is exact, and every marked input record is in
OUT/kept or OUT/rejected exactly once."""
import json

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsdata.beam.pipeline import run_recipe
from dsdata.recipe import load_recipe

STAGES = "stages:\n  - clean: {}\n  - lang: {keep: []}\n  - rules: {min_words: 1}\n"
N_PIPELINE = 4


def _run(tmp, data: bytes):
    (tmp / "in.jsonl").write_bytes(data)
    (tmp / "r.yaml").write_text("input: {paths: [in.jsonl]}\n" + STAGES, encoding="utf-8")
    stats = run_recipe(load_recipe(str(tmp / "r.yaml")), str(tmp / "out"))
    rows = [r for sub in ("kept", "rejected") for f in sorted((tmp / "out" / sub).glob("*.parquet"))
            for r in pq.read_table(f).to_pylist()]
    assert stats["ledger_ok"] and stats["input"] == len(rows)
    return stats, [r["id"] for r in rows]


def _record(mid, text):
    return json.dumps({"id": mid, "text": text}).encode()  # ensure_ascii: lone surrogates stay escapes


def test_surrogates_deep_json_bom_and_control_bytes_do_not_stop_the_run(tmp_path):
    lines = [
        b"\xef\xbb\xbf" + _record("m0", "The first record follows a byte-order mark and reads normally."),
        bytes(range(1, 9)) * 50,
        _record("m1", "A lone surrogate \ud800 sits in this English sentence about rivers."),
        _record("m2", "\udfff\ud800\udbff"),
        b'{"id": "m3", "text": "deep", "m": ' + b"[" * 20000 + b"]" * 20000 + b"}",
        _record("m4", "An ordinary sentence that every stage should be happy to keep around."),
    ]
    stats, ids = _run(tmp_path, b"\n".join(lines) + b"\n")
    for mid in ("m0", "m1", "m2", "m4"):
        assert ids.count(mid) == 1, mid
    # Lines that are not JSON records (control bytes, JSON nested 20,000 deep) are rejected under
    # their PATH:LINE ids: their own ids were never read.
    assert sum(i.endswith(("in.jsonl:2", "in.jsonl:5")) for i in ids) == 2
    assert stats["input"] == 6 and stats["rejected"]["read"] == {"bad_json": 2}


texts = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(max_codepoint=0x2FFF),
                max_size=60)


@settings(max_examples=N_PIPELINE, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.one_of(st.tuples(st.just("rec"), texts), st.tuples(st.just("junk"), st.binary(max_size=40))),
                      min_size=1, max_size=25))
def test_fuzzed_records_all_come_out(tmp_path_factory, items):
    lines, markers = [], []
    for k, (kind, value) in enumerate(items):
        if kind == "rec":
            markers.append(f"m{k}")
            lines.append(_record(f"m{k}", value))
        else:
            lines.append(value.replace(b"\n", b" "))
    _, ids = _run(tmp_path_factory.mktemp("p"), b"\n".join(lines) + b"\n")
    for mid in markers:
        assert ids.count(mid) == 1, mid
