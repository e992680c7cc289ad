"""Inputs and outputs on object storage (s3://), against a real S3-compatible server on 127.0.0.1
(the `s3_server` fixture: SeaweedFS's weed, tests/object_store.py), through Beam's S3 file system
with the endpoint and credential flags a user passes."""
from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from object_store import assert_same_run_outputs, bucket_files, local_files, parquet_rows

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "pipelines" / "samples"


def _dsdata(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


def test_s3_server_listens_on_loopback_only(s3_server):
    listening = s3_server.listening()
    assert listening, "the server listens nowhere?"
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
    assert int(s3_server.endpoint.rsplit(":", 1)[1]) in {port for _, port in listening}


@pytest.mark.slow
def test_pretrain_on_s3_writes_every_output_as_a_local_run_does(s3_server, tmp_path):
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="in.jsonl", Body=(SAMPLES / "docs.jsonl").read_bytes())
    # What an earlier run into the same prefix left: the run replaces it, nothing stale survives.
    stale = {"out/kept/part-00003-of-00009.parquet": b"old", "out/stats.json": b"{}",
             "out/shards/shard-old-00000-of-00001.arrow": b"old", "out/shards/manifest.json": b"{}",
             "out/.spill/dedup/x.docs.spill": b"old"}
    for key, body in stale.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    local_in = tmp_path / "in.jsonl"
    local_in.write_bytes((SAMPLES / "docs.jsonl").read_bytes())
    common = ["run", "pipelines/pretrain.yaml", "--set", "shards.shard_size=3000", "--quiet"]

    local = _dsdata(*common, "--input", str(local_in), "--output", str(tmp_path / "out"))
    assert local.returncode == 0, local.stderr[-3000:]
    remote = _dsdata(*common, "--input", f"s3://{bucket}/in.jsonl", "--output", f"s3://{bucket}/out",
                     *s3_server.beam_args())
    assert remote.returncode == 0, remote.stderr[-3000:]

    here = local_files(tmp_path / "out")
    there = bucket_files(s3_server, bucket, "out/")
    assert_same_run_outputs(here, there, s3_server.secret_key)
    stats = json.loads(there["stats.json"])
    assert stats["input"] == 178 and stats["kept"] > 100


def _reader_inputs(root: Path) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    lines = [json.dumps({"id": f"d{i}", "text": f"line {i} " + "word " * (i % 13)}) for i in range(400)]
    (root / "big.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "small.jsonl.gz").write_bytes(gzip.compress(b'{"id": "g", "text": "gzipped"}\n'))
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(120)], "text": [f"parquet row {i}" for i in range(120)]}),
                   root / "rows.parquet", row_group_size=10)
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    for i in range(3):
        headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.0")
        payload = f"<html><body><p>warc page {i} héllo</p></body></html>".encode()
        writer.write_record(writer.create_warc_record(f"http://w{i}.example/", "response",
                                                      payload=io.BytesIO(payload), http_headers=headers))
    (root / "crawl.warc.gz").write_bytes(buf.getvalue())
    (root / "page.html").write_bytes((SAMPLES / "html" / sorted(os.listdir(SAMPLES / "html"))[0]).read_bytes())


def _read_all(patterns: list[str], beam_args: list[str], out: Path) -> list[tuple]:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dsdata.beam.transforms import KEPT, REJECTED, ReadDocuments

    def key(result):
        doc = getattr(result, "doc", result)
        return json.dumps([os.path.basename(doc.id), doc.text, getattr(result, "reason", None)])

    # range_bytes=500: the JSONL and Parquet files are read in byte ranges / runs of row groups.
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        read = p | ReadDocuments(patterns, spread_documents=True, range_bytes=500)
        ((read[KEPT], read[REJECTED]) | beam.Flatten() | beam.Map(key) | beam.io.WriteToText(str(out)))
    return sorted(json.loads(line) for f in out.parent.glob(out.name + "*") for line in f.read_text().splitlines())


def test_every_reader_reads_s3_inputs_in_ranges_as_local_files(s3_server, tmp_path):
    from dsdata.beam.transforms import all_cuttable

    src = tmp_path / "src"
    src.mkdir()
    _reader_inputs(src)
    bucket = s3_server.new_bucket()
    for path in src.iterdir():
        s3_server.client().put_object(Bucket=bucket, Key=f"in/{path.name}", Body=path.read_bytes())
    globs = ["*.jsonl", "*.jsonl.gz", "*.parquet", "*.warc.gz", "*.html"]
    local = _read_all([str(src / g) for g in globs], [], tmp_path / "local")
    remote_patterns = [f"s3://{bucket}/in/{g}" for g in globs]
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions(s3_server.beam_args()))
    # Cut into ranges on S3 too (not read whole because the launcher could not list them).
    assert all_cuttable(remote_patterns[:1] + remote_patterns[2:3], range_bytes=500)
    remote = _read_all(remote_patterns, s3_server.beam_args(), tmp_path / "remote")
    assert remote == local
    assert len(local) == 400 + 1 + 120 + 3 + 1
    assert sum(1 for row in remote if "warc page" in row[1]) == 3


def test_missing_bucket_or_input_is_one_line_before_anything_runs(s3_server, tmp_path):
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="in.jsonl", Body=b'{"id": "a", "text": "hello"}\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ninput:\n  paths: []\nstages:\n  - rules: {}\n", encoding="utf-8")

    missing_input = _dsdata("run", str(recipe), "--input", f"s3://{bucket}/nothing-*.jsonl",
                            "--output", f"s3://{bucket}/out", *s3_server.beam_args())
    assert missing_input.returncode != 0
    assert f"no files match input 's3://{bucket}/nothing-*.jsonl'" in missing_input.stderr
    assert "Traceback" not in missing_input.stderr

    # (SeaweedFS creates a bucket on the first write by an admin identity: there this run succeeds.)
    no_bucket = _dsdata("run", str(recipe), "--input", f"s3://{bucket}/in.jsonl",
                        "--output", "s3://dsdata-no-such-bucket/out", *s3_server.beam_args())
    if s3_server.kind == "seaweedfs":
        no_bucket = _dsdata("run", str(recipe), "--input", f"s3://{bucket}/in.jsonl", "--output",
                            f"s3://{bucket}-x/out", *[a if not a.startswith("--s3_access_key_id") else
                                                      "--s3_access_key_id=nobody" for a in s3_server.beam_args()])
        assert no_bucket.returncode != 0 and "cannot list input" in no_bucket.stderr, no_bucket.stderr
        no_bucket = None
    if no_bucket is not None:
        assert no_bucket.returncode != 0
        lines = [line for line in no_bucket.stderr.splitlines() if line.startswith("dsdata")]
        assert any("--output s3://dsdata-no-such-bucket/out is not writable" in line for line in lines), no_bucket.stderr
        assert "Traceback" not in no_bucket.stderr
    assert s3_server.keys(bucket, "out/") == []  # nothing was written by either

    bad_key = [a if not a.startswith("--s3_secret_access_key") else "--s3_secret_access_key=wrong"
               for a in s3_server.beam_args()]
    refused = _dsdata("run", str(recipe), "--input", f"s3://{bucket}/in.jsonl", "--output", f"s3://{bucket}/out",
                      *bad_key)
    if s3_server.kind == "seaweedfs":  # moto's server accepts any credentials
        assert refused.returncode != 0
        assert f"cannot list input 's3://{bucket}/in.jsonl'" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        assert s3_server.keys(bucket, "out/") == []


def test_small_run_on_s3_ledger_andparquet_rows(s3_server, tmp_path):
    """A recipe without whole-corpus stages: kept/rejected rows and stats.json in the bucket."""
    bucket = s3_server.new_bucket()
    real = [json.loads(line) for line in (SAMPLES / "docs.jsonl").read_text(encoding="utf-8").splitlines()[:40]]
    docs = [{"id": d["id"], "text": d["text"]} for d in real] + [{"id": f"tiny{i}", "text": "x"} for i in range(10)]
    s3_server.client().put_object(Bucket=bucket, Key="in/docs.jsonl",
                                  Body="\n".join(json.dumps(d) for d in docs).encode() + b"\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ninput:\n  paths: []\nstages:\n  - rules: {min_words: 3}\n", encoding="utf-8")
    done = _dsdata("run", str(recipe), "--input", f"s3://{bucket}/in/*.jsonl", "--output", f"s3://{bucket}/out/",
                   "--quiet", *s3_server.beam_args())
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(s3_server.read(bucket, "out/stats.json"))
    assert stats["ledger_ok"] and stats["input"] == 50 and stats["kept"] + stats["rejected_total"] == 50
    kept = [r[0] for k in s3_server.keys(bucket, "out/kept/") for r in parquet_rows(s3_server.read(bucket, k), ["id"])]
    rejected = [r for k in s3_server.keys(bucket, "out/rejected/")
                for r in parquet_rows(s3_server.read(bucket, k), ["id", "reason"])]
    assert len(kept) == stats["kept"] > 0 and len(rejected) == stats["rejected_total"]
    assert sorted(kept + [r[0] for r in rejected]) == sorted(d["id"] for d in docs)
    assert {d["id"] for d in docs if d["text"] == "x"} <= {doc_id for doc_id, _ in rejected}
    assert not [k for k in s3_server.keys(bucket, "out/") if "/." in k]  # no temporary or spill object left


def test_run_info_redacts_credential_flags():
    from types import SimpleNamespace

    from dsdata.beam.pipeline import pipeline_options
    from dsdata.beam.run_files import REDACTED, run_info

    options = pipeline_options(["--s3_endpoint_url=http://127.0.0.1:9", "--s3_access_key_id=AKIAEXAMPLE",
                                "--s3_secret_access_key=very-secret", "--s3_session_token=tok"])
    recipe = SimpleNamespace(name="r", path="r.yaml", inputs=["s3://b/in.jsonl"], input_format="auto")
    flags = run_info(recipe, [], options)["pipeline_options"]
    assert flags["s3_endpoint_url"] == "http://127.0.0.1:9"
    assert flags["s3_secret_access_key"] == flags["s3_access_key_id"] == flags["s3_session_token"] == REDACTED
    assert "very-secret" not in json.dumps(flags)


# Keys a user's bucket may hold: every one is an object's name, byte for byte (no glob, no path).
ODD_KEYS = ["plain.jsonl", "back\\slash.jsonl", "with space.jsonl", "st*r.jsonl", "q?.jsonl", "[x].jsonl",
            "x.jsonl", "ünï.jsonl", "pct%20.jsonl", "sub/deeper/nested.jsonl"]


def _put_documents(s3_server, bucket: str, keys: list[str]) -> dict[str, str]:
    """One document per object; {key: its id}."""
    ids = {}
    for i, key in enumerate(keys):
        ids[key] = f"doc{i}"
        body = json.dumps({"id": ids[key], "text": f"Document number {i} is here. It has a few words."}) + "\n"
        s3_server.client().put_object(Bucket=bucket, Key=key, Body=body.encode())
    return ids


def _run_ids(s3_server, bucket: str, out: str) -> tuple[dict, list[tuple]]:
    """stats.json and every (id, reason) row (reason None for kept) of the run that wrote s3://bucket/out/."""
    stats = json.loads(s3_server.read(bucket, f"{out}/stats.json"))
    rows = [(r[0], None) for k in s3_server.keys(bucket, f"{out}/kept/")
            for r in parquet_rows(s3_server.read(bucket, k), ["id"])]
    rows += [tuple(r) for k in s3_server.keys(bucket, f"{out}/rejected/")
             for r in parquet_rows(s3_server.read(bucket, k), ["id", "reason"])]
    return stats, rows


def test_every_object_is_read_whatever_its_key_and_however_deep(s3_server, tmp_path):
    """A folder input is every object under the prefix at any depth (hidden ones left out, as
    locally); a glob's * matches within one level, a backslash included; a key given exactly is
    that object, even when its name holds glob characters."""
    bucket = s3_server.new_bucket()
    ids = _put_documents(s3_server, bucket, [f"in/{k}" for k in ODD_KEYS] + ["in/.hidden.jsonl"])
    s3_server.client().put_object(Bucket=bucket, Key="in/", Body=b"")  # a console's folder placeholder
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ninput:\n  paths: []\nstages:\n  - rules: {min_words: 1}\n", encoding="utf-8")
    # A server may store a key under another name (SeaweedFS files a backslash as a folder separator:
    # `back\\slash.jsonl` is listed as `back/slash.jsonl`); a one-level glob matches what it lists.
    listed = set(s3_server.keys(bucket, "in/"))
    one_level = [k for k in ODD_KEYS if "/" not in k and f"in/{k}" in listed]
    for n, (given, keys) in enumerate([
            ("in/", ODD_KEYS), ("in/*.jsonl", one_level),
            ("in/[x].jsonl", ["[x].jsonl"]), ("in/sub/**", ["sub/deeper/nested.jsonl"])]):
        done = _dsdata("run", str(recipe), "--input", f"s3://{bucket}/{given}", "--output", f"s3://{bucket}/out{n}",
                       "--quiet", *s3_server.beam_args())
        assert done.returncode == 0, (given, done.stderr[-3000:])
        stats, rows = _run_ids(s3_server, bucket, f"out{n}")
        assert sorted(doc_id for doc_id, _ in rows) == sorted(ids[f"in/{k}"] for k in keys), given
        assert stats["input"] == len(keys) and stats["ledger_ok"], given


def test_an_object_deleted_after_listing_is_a_rejected_row(s3_server, tmp_path):
    """The run reads the objects its launch listed: one deleted in between is an `unreadable_file`
    row naming it, counted as input, never a silent gap beside ledger_ok: true."""
    from dsdata.api import execute, prepare_run

    bucket = s3_server.new_bucket()
    ids = _put_documents(s3_server, bucket, [f"in/{k}" for k in ODD_KEYS[:4]])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ninput:\n  paths: []\nstages:\n  - rules: {min_words: 1}\n", encoding="utf-8")
    prepared = prepare_run(str(recipe), [f"s3://{bucket}/in/"], f"s3://{bucket}/out", beam_args=s3_server.beam_args(),
                           quiet=True)
    s3_server.client().delete_object(Bucket=bucket, Key="in/with space.jsonl")
    execute(prepared, s3_server.beam_args())
    stats, rows = _run_ids(s3_server, bucket, "out")
    assert stats["ledger_ok"] and stats["input"] == 4
    gone = [reason for doc_id, reason in rows if "with space.jsonl" in doc_id]
    assert gone == ["unreadable_file"], rows
    assert sorted(doc_id for doc_id, _ in rows if "with space" not in doc_id) == sorted(
        v for k, v in ids.items() if "with space" not in k)


@pytest.mark.slow
@pytest.mark.parametrize("how, remote", [("killed", "inputs"), ("stalled", "inputs"), ("killed", "output")])
def test_a_server_that_goes_away_mid_run_is_one_line_and_no_finished_output(tmp_path, how, remote):
    """The S3 server is killed (connections refused) or stalled (SIGSTOP: connections accepted, never
    answered) after the launch listed the inputs and probed OUT, while the run reads: the run stops
    within tens of seconds (not after Beam's ~9 minutes of retries per call) with one line naming
    the endpoint, exit 1, a local OUT marked incomplete and no stats.json — never `unreadable_file`
    rows per object beside an output that looks complete.  With local inputs and OUT in the
    bucket, the writes fail the same way."""
    import signal

    from object_store import start_s3_server

    try:
        server = start_s3_server()  # its own: this test kills it
    except RuntimeError as exc:
        pytest.skip(str(exc))
    try:
        bucket = server.new_bucket()
        client = server.client()
        (tmp_path / "in").mkdir()
        for i in range(150):
            body = "".join(json.dumps({"id": f"o{i}-{j}", "text": f"Object {i} line {j} has a few words."}) + "\n"
                           for j in range(20))
            if remote == "inputs":
                client.put_object(Bucket=bucket, Key=f"in/part-{i:04d}.jsonl", Body=body.encode())
            else:
                (tmp_path / "in" / f"part-{i:04d}.jsonl").write_text(body, encoding="utf-8")
        recipe = tmp_path / "r.yaml"
        recipe.write_text("name: r\ninput:\n  paths: []\nstages:\n  - rules: {min_words: 1}\n", encoding="utf-8")
        out = tmp_path / "out"
        given = ([f"s3://{bucket}/in/", str(out)] if remote == "inputs" else [str(tmp_path / "in"), f"s3://{bucket}/out"])
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "dsdata.cli", "run", str(recipe), "--input", given[0],
                                 "--output", given[1], *server.beam_args()],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        lines = []
        for line in proc.stderr:  # reading has begun: the first object read is logged
            lines.append(line)
            if "dsdata: read " in line:
                break
        assert proc.poll() is None, "".join(lines)[-3000:]
        if how == "killed":
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=20)
        else:
            os.killpg(server.process.pid, signal.SIGSTOP)
        try:
            _, rest = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("the run did not end within 120 s of the server going away")
        stderr = "".join(lines) + rest
        assert proc.returncode == 1, stderr[-3000:]
        errors = [line for line in stderr.splitlines() if line.startswith("dsdata: error:")]
        assert len(errors) == 1, stderr[-3000:]
        assert server.endpoint in errors[0], errors
        assert "Traceback" not in stderr, stderr[-3000:]
        if remote == "output":
            return  # nothing more can be written there, stats.json included
        assert not (out / "stats.json").exists()
        assert (out / "INCOMPLETE").is_file()
        assert "stopped answering" in (out / "INCOMPLETE").read_text(encoding="utf-8")
    finally:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGCONT)
        server.stop()
