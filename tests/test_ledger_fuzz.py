"""Fuzzing broken inputs: every record is kept or rejected with a reason, never lost."""
import gzip
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsdata.beam.pipeline import run_recipe
from dsdata.document import Rejected
from dsdata.io.readers import read_local
from dsdata.recipe import load_recipe

good = st.builds(lambda t, i: json.dumps({"id": f"g{i}", "text": t}, ensure_ascii=False).encode(),
                 st.text(min_size=1, max_size=80).filter(str.strip), st.integers(0, 10**6))
broken_json = st.binary(min_size=1, max_size=40).map(lambda b: b"{" + b.replace(b"\n", b" "))
bad_utf8 = st.binary(min_size=1, max_size=20).map(lambda b: b'{"text": "' + b"\xff" + b.replace(b"\n", b"") + b'"}')
no_text = st.dictionaries(st.sampled_from(["id", "title", "body"]), st.text(max_size=10)).map(lambda d: json.dumps(d).encode())
not_object = st.one_of(st.integers(), st.lists(st.integers(), max_size=3), st.text(max_size=5)).map(lambda v: json.dumps(v).encode())
line = st.one_of(good, broken_json, bad_utf8, no_text, not_object)
lines = st.lists(line, min_size=0, max_size=40)


def _records(ls):
    return sum(1 for ln in ls if ln.strip())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ls=lines)
def test_reader_accounts_for_every_line(tmp_path_factory, ls):
    path = tmp_path_factory.mktemp("f") / "in.jsonl"
    path.write_bytes(b"\n".join(ls) + b"\n")
    results = read_local(str(path))
    if len(results) == 1 and getattr(results[0], "reason", "") == "binary_file":
        return  # a mostly-control-byte file is one rejected row for the whole file
    assert len(results) == _records(ls)
    for r in results:
        if isinstance(r, Rejected):
            assert r.stage == "read" and r.reason


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ls=lines, cut=st.floats(0.05, 0.95))
def test_truncated_gzip_never_loses_silently(tmp_path_factory, ls, cut):
    data = gzip.compress(b"\n".join(ls) + b"\n")
    path = tmp_path_factory.mktemp("g") / "in.jsonl.gz"
    path.write_bytes(data[: max(1, int(len(data) * cut))])
    results = read_local(str(path))
    truncated = [r for r in results if isinstance(r, Rejected) and r.reason == "truncated_compression"]
    # Either the whole stream survived (cut inside the gzip trailer) or the damage is one rejected row.
    assert len(truncated) <= 1
    readable = len(results) - len(truncated)
    assert readable <= _records(ls)
    if not truncated:
        assert readable == _records(ls)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ls=st.lists(line, min_size=1, max_size=30))
def test_pipeline_ledger_under_broken_input(tmp_path_factory, ls):
    tmp = tmp_path_factory.mktemp("p")
    (tmp / "in.jsonl").write_bytes(b"\n".join(ls) + b"\n")
    (tmp / "recipe.yaml").write_text("input: {paths: [in.jsonl]}\nstages:\n  - rules: {}\n", encoding="utf-8")
    stats = run_recipe(load_recipe(str(tmp / "recipe.yaml")), str(tmp / "out"))
    binary = stats["rejected"].get("read", {}).get("binary_file", 0)
    assert stats["input"] == (1 if binary else _records(ls))
    assert stats["input"] == stats["kept"] + stats["rejected_total"]


name_bytes = st.binary(min_size=1, max_size=30).map(lambda b: b.replace(b"/", b"_").replace(b"\0", b"_")).filter(
    lambda b: b not in (b".", b".."))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(name_bytes, min_size=1, max_size=5, unique=True), out_name=name_bytes)
def test_pipeline_ledger_with_any_file_names_and_any_out_name(tmp_path_factory, names, out_name):
    """Input files and OUT named by any bytes the OS allows (not UTF-8, control characters,
    backslashes): a real run reads every file not hidden, its rows name each file so that
    recovered_path gives it back, and every output lands in OUT (issue 35)."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    import dsdata
    from dsdata.core.names import recovered_path

    tmp = os.fsencode(str(tmp_path_factory.mktemp("n")))
    folder = tmp + b"/in"
    os.mkdir(folder)
    for i, name in enumerate(names):
        with open(folder + b"/" + name + b".jsonl", "wb") as fh:
            fh.write(json.dumps({"text": f"record {i}"}).encode() + b"\n{broken\n")
    visible = {folder + b"/" + n + b".jsonl" for n in names if not n.startswith(b".")}
    if not visible:
        return
    out = tmp + b"/" + out_name
    stats = dsdata.run(inputs=os.fsdecode(folder), output=os.fsdecode(out), overrides=None,
                       recipe=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           "pipelines", "langid.yaml"))
    assert stats["ledger_ok"] and stats["input"] == 2 * len(visible), stats
    rows = []
    for sub in (b"kept", b"rejected"):
        for part in sorted(os.listdir(out + b"/" + sub)):
            rows += pq.read_table(pa.OSFile(out + b"/" + sub + b"/" + part)).to_pylist()
    assert len(rows) == stats["input"]
    files = {os.fsencode(recovered_path(r["id"].rsplit(":", 1)[0])) for r in rows}
    assert files == visible
    assert json.loads(open(out + b"/stats.json", "rb").read())["ledger_ok"]
