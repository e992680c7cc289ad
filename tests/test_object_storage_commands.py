"""The commands that take a location besides `dsdata run` — `dsdata report`, `dsdata shards
verify|info|export`, `dsdata shm publish` — on s3:// with the same endpoint and credential flags
(one parser, Beam's S3Options), against a real S3 server (the `s3_server` fixture, tests/object_store.py);
and an S3 endpoint that refuses connections failing every command in one line instead of Beam's
~10 minutes of retries."""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from object_store import local_files

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "pipelines" / "samples"
TOKENIZER = REPO / "pipelines" / "models" / "tokenizer"
# Beam's S3 file system retries a call that got no HTTP answer for ~10 minutes; the commands must
# stop long before this bound (it only keeps a regression from hanging the suite).
HANG_GUARD_S = 180


def _dsdata(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**(env if env is not None else os.environ), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "dsdata.cli", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


# --- the flags -------------------------------------------------------------------------------------------

def test_object_storage_flags_are_beams_s3_options_and_round_trip():
    from apache_beam.options.pipeline_options import PipelineOptions, S3Options

    from dsdata.io.object_storage import add_object_storage_flags, object_storage_beam_args

    beam, ours = argparse.ArgumentParser(), argparse.ArgumentParser()
    S3Options._add_argparse_args(beam)  # noqa: SLF001 - Beam declares its options only there
    add_object_storage_flags(ours)

    def flags(parser):
        return {opt: action.nargs != 0 for action in parser._actions  # noqa: SLF001
                for opt in action.option_strings if opt.startswith("--s3")}

    assert flags(ours) == flags(beam) and len(flags(beam)) >= 8
    args = ours.parse_args(["--s3_endpoint_url", "http://127.0.0.1:9", "--s3_access_key_id=K",
                            "--s3_secret_access_key", "S", "--s3_disable_ssl"])
    back = PipelineOptions(object_storage_beam_args(args)).view_as(S3Options)
    assert (back.s3_endpoint_url, back.s3_access_key_id, back.s3_secret_access_key, back.s3_disable_ssl) == \
        ("http://127.0.0.1:9", "K", "S", True)
    assert back.s3_region_name is None and object_storage_beam_args(ours.parse_args([])) == []


# --- an endpoint nobody listens on ---------------------------------------------------------------------

@pytest.fixture
def refused_endpoint():
    """http://127.0.0.1:PORT where a socket is bound but never listens: every connection is refused,
    and no other process can take the port while the test runs."""
    pytest.importorskip("boto3", reason="boto3 (apache-beam[aws], the s3 extra) is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    local_in = tmp_path / "in.jsonl"
    return {
        "run from s3": ["run", "pipelines/pretrain.yaml", "--input", "s3://dsdata-b/in.jsonl",
                        "--output", str(tmp_path / "out"), "--quiet"],
        "run to s3": ["run", "pipelines/pretrain.yaml", "--input", str(local_in), "--output", "s3://dsdata-b/out",
                      "--quiet"],
        "report": ["report", "s3://dsdata-b/out"],
        "shards verify": ["shards", "verify", "s3://dsdata-b/out"],
        "shards info": ["shards", "info", "s3://dsdata-b/out"],
        "shards export": ["shards", "export", "--format", "megatron", "s3://dsdata-b/out", str(tmp_path / "export")],
        "shm publish": ["shm", "--root", str(tmp_path / "shm"), "publish", "s3://dsdata-b/out", "--name", "d"],
    }


@pytest.mark.parametrize("command", list(_commands(Path("/nonexistent"))))
def test_a_refused_s3_endpoint_is_one_line_naming_it_before_anything_runs(refused_endpoint, tmp_path, command):
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "hello there"}\n', encoding="utf-8")
    argv = _commands(tmp_path)[command] + [f"--s3_endpoint_url={refused_endpoint}", "--s3_access_key_id=k",
                                           "--s3_secret_access_key=s", "--s3_region_name=us-east-1"]
    proc = _dsdata(*argv, timeout=HANG_GUARD_S)
    lines = _error_lines(proc)
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"dsdata: error: cannot reach the S3 endpoint {refused_endpoint}: "), lines[0]
    assert "--s3_endpoint_url" in lines[0]
    assert proc.stdout == ""
    assert not [p.name for p in tmp_path.iterdir() if p.name != "in.jsonl"]  # nothing written


def test_no_s3_credentials_is_one_line(refused_endpoint, tmp_path):
    # Without keys boto3 looks in the environment, ~/.aws and the instance metadata service: none here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    proc = _dsdata("report", "s3://dsdata-b/out", "--s3_endpoint_url", refused_endpoint, env=env,
                   timeout=HANG_GUARD_S)
    lines = _error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"dsdata: error: no S3 credentials for {refused_endpoint} "), lines[0]
    assert "--s3_access_key_id" in lines[0]


# --- a finished run in a bucket ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_in_bucket(s3_server, tmp_path_factory):
    """(bucket, the local run): 60 sample documents tokenized into 11 shards, written once to
    s3://BUCKET/run by `dsdata run` and once to a local folder named run."""
    bucket = s3_server.new_bucket()
    docs = "".join((SAMPLES / "docs.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:60])
    s3_server.client().put_object(Bucket=bucket, Key="in.jsonl", Body=docs.encode())
    root = tmp_path_factory.mktemp("shards-run")
    (root / "in.jsonl").write_text(docs, encoding="utf-8")
    recipe = root / "tokens.yaml"
    recipe.write_text("name: tokens\ninput: {paths: []}\nstages:\n  - tokenize: {}\n  - shards: {shard_size: 3000}\n",
                      encoding="utf-8")
    common = ["run", str(recipe), "--quiet", "--set", f"tokenize.tokenizer={TOKENIZER}"]
    local = _dsdata(*common, "--input", str(root / "in.jsonl"), "--output", str(root / "run"))
    assert local.returncode == 0, local.stderr[-3000:]
    remote = _dsdata(*common, "--input", f"s3://{bucket}/in.jsonl", "--output", f"s3://{bucket}/run",
                     *s3_server.beam_args())
    assert remote.returncode == 0, remote.stderr[-3000:]
    return bucket, root / "run"


def test_report_rebuilds_report_html_in_the_bucket(s3_server, run_in_bucket):
    bucket, _ = run_in_bucket
    s3_server.client().delete_object(Bucket=bucket, Key="run/report.html")
    # The flags as `dsdata run` takes them, with their value after a space or an '='.
    endpoint, *rest = s3_server.beam_args()
    done = _dsdata("report", f"s3://{bucket}/run", "--s3_endpoint_url", endpoint.split("=", 1)[1], *rest)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"s3://{bucket}/run/report.html"
    page = s3_server.read(bucket, "run/report.html")
    assert b"<html" in page[:200].lower() and b"tokens" in page

    wrong = [a if not a.startswith("--s3_secret_access_key") else "--s3_secret_access_key=wrong" for a in rest]
    refused = _dsdata("report", f"s3://{bucket}/run", "--s3_endpoint_url", endpoint.split("=", 1)[1], *wrong)
    lines = _error_lines(refused)
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"dsdata: error: cannot read s3://{bucket}/run: "), lines[0]

    missing = _dsdata("report", f"s3://{bucket}/nothing", *s3_server.beam_args())
    assert missing.returncode == 2 and _error_lines(missing) == [
        f"dsdata: error: s3://{bucket}/nothing has no stats.json; pass the output directory of a 'dsdata run'"]


def test_shards_commands_and_shm_publish_read_a_set_in_the_bucket(s3_server, run_in_bucket, tmp_path):
    bucket, local = run_in_bucket
    where = f"s3://{bucket}/run"
    manifest = json.loads((local / "shards" / "manifest.json").read_text(encoding="utf-8"))
    assert len(manifest["shards"]) == 11

    copies = tmp_path / "copies"  # where the commands copy the remote set to
    copies.mkdir()
    env = dict(os.environ, TMPDIR=str(copies))

    verify = _dsdata("shards", "verify", where, *s3_server.beam_args(), env=env)
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.strip() == (f"ok: 11 shards, 60 documents, {manifest['totals']['tokens']} tokens in "
                                     f"{where}/shards; every sha256 matches")

    info = _dsdata("shards", "info", "--json", f"{where}/shards", *s3_server.beam_args())
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout) == {k: v for k, v in manifest.items() if k != "shards"} | {"files": 11}

    # The export of the set in the bucket is the export of the same set on disk, file for file.
    exported = _dsdata("shards", "export", "--format", "megatron", where, str(tmp_path / "from-s3"),
                       *s3_server.beam_args(), env=env)
    assert exported.returncode == 0, exported.stderr
    peer = _dsdata("shards", "export", "--format", "megatron", str(local), str(tmp_path / "from-disk"))
    assert peer.returncode == 0, peer.stderr
    there, here = local_files(tmp_path / "from-s3"), local_files(tmp_path / "from-disk")
    assert sorted(there) == sorted(here) and any(name.endswith(".bin") for name in there)
    assert there == here  # export.json included: the same manifest sha256 and source name ("run")

    root = tmp_path / "shm"
    published = _dsdata("shm", "--root", str(root), "publish", where, "--name", "from-s3", *s3_server.beam_args(),
                        env=env)
    assert published.returncode == 0, published.stderr
    summary = json.loads(published.stdout)
    assert summary["shards"] == 11 and summary["path"] == str(root / "from-s3")
    for shard in manifest["shards"]:
        assert (root / "from-s3" / shard["file"]).read_bytes() == (local / "shards" / shard["file"]).read_bytes()
    listed = _dsdata("shm", "--root", str(root), "list", "--verify", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["ok"] is True, listed.stdout
    assert list(copies.iterdir()) == []  # the local copies are gone


def test_shards_verify_names_bad_objects_in_the_bucket(s3_server, run_in_bucket):
    bucket, local = run_in_bucket
    client = s3_server.client()
    manifest = json.loads((local / "shards" / "manifest.json").read_text(encoding="utf-8"))
    for key in s3_server.keys(bucket, "run/shards/"):  # a copy to damage: the fixture's set stays whole
        client.copy_object(Bucket=bucket, Key="bad/" + key[len("run/"):], CopySource={"Bucket": bucket, "Key": key})
    first, second, third = manifest["shards"][:3]
    data = (local / "shards" / first["file"]).read_bytes()
    client.put_object(Bucket=bucket, Key=f"bad/shards/{first['file']}", Body=data[:-1] + bytes([data[-1] ^ 1]))
    client.delete_object(Bucket=bucket, Key=f"bad/shards/{second['file']}")
    # Far larger than its entry: only one byte past the entry's size is copied.
    client.put_object(Bucket=bucket, Key=f"bad/shards/{third['file']}", Body=b"\0" * (8 << 20))

    verify = _dsdata("shards", "verify", f"s3://{bucket}/bad", *s3_server.beam_args())
    assert verify.returncode == 1, verify.stderr
    lines = _error_lines(verify)
    where = f"s3://{bucket}/bad/shards"
    assert f"dsdata: bad shard: {where}/{first['file']}: sha256 " in verify.stderr
    assert f"dsdata: bad shard: {where}/{second['file']}: shard named in the manifest is missing" in lines
    assert (f"dsdata: bad shard: {where}/{third['file']}: {third['bytes'] + 1} bytes, the manifest says "
            f"{third['bytes']} (truncated or replaced)") in lines
    assert lines[-1] == f"dsdata: 3 of 11 shard(s) in {where} failed verification"
    assert "/tmp" not in verify.stderr  # every line names the bucket's objects, not the local copy

    # A manifest naming a file outside its folder is refused before anything is copied.
    escaping = dict(manifest, shards=[dict(first, file="../run/stats.json")] + manifest["shards"][1:])
    client.put_object(Bucket=bucket, Key="bad/shards/manifest.json", Body=json.dumps(escaping).encode())
    refused = _dsdata("shards", "verify", f"s3://{bucket}/bad", *s3_server.beam_args())
    lines = _error_lines(refused)
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"dsdata: error: {where}/manifest.json: shard path: '../run/stats.json' escapes"), lines

    nothing = _dsdata("shards", "verify", f"s3://{bucket}/nothing", *s3_server.beam_args())
    assert nothing.returncode == 2 and len(_error_lines(nothing)) == 1 and "not a shard set" in nothing.stderr
    assert _dsdata("shards", "export", "--format", "megatron", f"s3://{bucket}/run", f"s3://{bucket}/x",
                   *s3_server.beam_args()).returncode == 2
