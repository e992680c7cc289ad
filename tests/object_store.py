"""A real S3-compatible server for the object-storage tests: SeaweedFS's `weed`, started on 127.0.0.1.

`weed` is built by .ci/s3-setup into the engines cache (CACHE/gobin/weed); $DSDATA_WEED names another
binary.  Without one, moto's standalone server (`python -m moto.server`, PyPI's moto[server]) is
started instead: also a separate process answering real HTTP S3 requests (not moto's in-process
patching of the client); without either the tests that use `s3_server` skip, saying why.  The server is a real process
speaking the S3 protocol over HTTP (master, volume, filer and S3 gateway in one `weed server`),
with every port bound to 127.0.0.1, its data in a temporary folder, and one identity from an S3
config file; it is stopped and its folder removed at the end of the session.

Reusable beyond these tests (a Flink-cluster run, a benchmark): `S3Server.beam_args()` are the
Beam options that point a run at it, `S3Server.client()` is a boto3 client for it.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

WEED_START_S = 90


def weed_binary() -> tuple[str | None, str]:
    """(the weed binary, or None and why not)."""
    from dsdata.beam.engines.artifacts import engines_cache_dir

    explicit = os.environ.get("DSDATA_WEED")
    cached = os.path.join(engines_cache_dir(), "gobin", "weed")
    for candidate in (explicit, cached, shutil.which("weed")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate, ""
    log = os.path.join(engines_cache_dir(), "weed-build.log")
    last = ""
    if os.path.isfile(log):
        with open(log, encoding="utf-8", errors="replace") as fh:
            lines = [line.strip() for line in fh if line.strip() and not line.startswith("go: downloading")]
        last = f" (last build log line: {lines[-1]})" if lines else ""
    return None, f"no SeaweedFS `weed` binary at {cached} or on PATH; run .ci/s3-setup{last}"


def _free_port_pair() -> int:
    """A port P with P and P+10000 free on 127.0.0.1 (weed serves gRPC on port + 10000)."""
    for _ in range(200):
        port = random.randint(20000, 40000)
        socks = []
        try:
            for p in (port, port + 10000):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no two free ports on 127.0.0.1")


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen
    data_dir: str
    kind: str
    ports: list[int] = field(default_factory=list)
    region: str = "us-east-1"

    def beam_args(self) -> list[str]:
        """The Beam options (S3Options) that point a run's file system at this server."""
        return [f"--s3_endpoint_url={self.endpoint}", f"--s3_access_key_id={self.access_key}",
                f"--s3_secret_access_key={self.secret_key}", f"--s3_region_name={self.region}"]

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region,
                            config=Config(retries={"max_attempts": 2}, s3={"addressing_style": "path"}))

    def new_bucket(self) -> str:
        name = f"dsdata-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        found = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(found)

    def read(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def listening(self) -> list[tuple[str, int]]:
        """(address, port) of every socket the server's processes listen on."""
        import psutil

        procs = [psutil.Process(self.process.pid)]
        procs += procs[0].children(recursive=True)
        return sorted({(c.laddr.ip, c.laddr.port) for p in procs for c in p.net_connections(kind="inet")
                       if c.status == psutil.CONN_LISTEN})

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def start_weed(binary: str) -> S3Server:
    """`weed server -s3` on 127.0.0.1 with fresh ports, a temporary data folder and one identity."""
    data_dir = tempfile.mkdtemp(prefix="dsdata-weed-")
    access_key, secret_key = f"dsdata{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    config = os.path.join(data_dir, "s3.json")
    with open(config, "w", encoding="utf-8") as fh:
        json.dump({"identities": [{"name": "dsdata-tests",
                                   "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                                   "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}, fh)
    os.makedirs(os.path.join(data_dir, "data"))
    master, volume, filer, s3 = (_free_port_pair() for _ in range(4))
    cmd = [binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={os.path.join(data_dir, 'data')}",
           f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
           "-s3", f"-s3.port={s3}", f"-s3.config={config}", "-master.volumeSizeLimitMB=64",
           # The S3 gateway's Iceberg and Lance catalogs listen on fixed ports unless turned off.
           "-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.max=0", "-metricsPort=0"]
    log = open(os.path.join(data_dir, "weed.log"), "wb")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{s3}", access_key, secret_key, process, data_dir, "seaweedfs",
                      [master, volume, filer, s3])
    return _wait_until_serving(server, os.path.join(data_dir, "weed.log"))


def moto_server_available() -> tuple[bool, str]:
    try:
        import flask  # noqa: F401 - moto[server]'s
        import moto.server  # noqa: F401
    except ImportError as exc:
        return False, f"moto[server] is not installed ({exc})"
    return True, ""


def start_moto() -> S3Server:
    """moto's standalone S3 server on 127.0.0.1 (it accepts any credentials)."""
    data_dir = tempfile.mkdtemp(prefix="dsdata-moto-")
    port = _free_port_pair()
    log = open(os.path.join(data_dir, "moto.log"), "wb")
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{port}", "dsdata", uuid.uuid4().hex, process, data_dir, "moto", [port])
    return _wait_until_serving(server, os.path.join(data_dir, "moto.log"))


def start_s3_server() -> S3Server:
    """SeaweedFS when built, else moto's server; RuntimeError saying why neither can run."""
    binary, why = weed_binary()
    if binary:
        return start_weed(binary)
    available, why_not = moto_server_available()
    if available:
        return start_moto()
    raise RuntimeError(f"{why}; and {why_not}")


def _wait_until_serving(server: S3Server, log_path: str) -> S3Server:
    process = server.process
    deadline = time.monotonic() + WEED_START_S
    last = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            bucket = f"ready-{uuid.uuid4().hex[:8]}"
            client = server.client()
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="probe", Body=b"x")  # a volume is assigned: writes work
            client.delete_object(Bucket=bucket, Key="probe")
            client.delete_bucket(Bucket=bucket)
            return server
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
            time.sleep(0.5)
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        tail = fh.read()[-2000:]
    server.stop()
    raise RuntimeError(f"{server.kind} did not serve S3 within {WEED_START_S} s (last error: {last}); log tail:\n{tail}")


# --- comparing a run's outputs in a bucket with a local run's ------------------------------------------

def local_files(root) -> dict[str, bytes]:
    """Every file under the folder `root` (a pathlib.Path): relative name → bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def bucket_files(server: S3Server, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under `prefix`: name relative to the prefix → bytes."""
    return {key[len(prefix):]: server.read(bucket, key) for key in server.keys(bucket, prefix)}


def parquet_rows(data: bytes, columns: list[str]) -> list[tuple]:
    import io

    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data), columns=columns)
    return sorted(zip(*(table.column(c).to_pylist() for c in columns)))


def assert_same_run_outputs(here: dict[str, bytes], there: dict[str, bytes], secret: str) -> None:
    """`there` (a run's objects, local_files/bucket_files) holds the outputs of the local run `here` and
    nothing else: the same files (kept/ and rejected/ cut into as many Parquet parts as the runner
    chose), stats.json counts, kept and rejected rows, byte-identical shards, manifest and
    difficulty.json; the credential flags are not written beside them."""
    def files(run: dict[str, bytes]) -> list[str]:
        return sorted({"kept/part-*.parquet" if k.startswith("kept/part-") and k.endswith(".parquet") else
                       "rejected/part-*.parquet" if k.startswith("rejected/part-") and k.endswith(".parquet") else k
                       for k in run})

    # Every output is in the bucket, and nothing else: no lock, spill or temporary object, nothing stale.
    assert files(there) == files(here), (f"only in the bucket: {sorted(set(files(there)) - set(files(here)))}; "
                                         f"only in the local run: {sorted(set(files(here)) - set(files(there)))}")
    assert {"stats.json", "report.html", "run.json", "difficulty.json", "shards/manifest.json",
            "kept/part-*.parquet", "rejected/part-*.parquet"} <= set(files(there))
    assert sum(k.startswith("shards/shard-") for k in there) > 3

    stats_here, stats_there = json.loads(here["stats.json"]), json.loads(there["stats.json"])
    assert stats_there["ledger_ok"] is True
    for key in ("input", "kept", "augmented", "rejected", "rejected_total", "stages"):
        assert stats_there[key] == stats_here[key], key
    for sub, columns in (("kept", ["id", "text"]), ("rejected", ["id", "stage", "reason"])):
        rows_here = [r for k, v in here.items() if k.startswith(sub + "/") for r in parquet_rows(v, columns)]
        rows_there = [r for k, v in there.items() if k.startswith(sub + "/") for r in parquet_rows(v, columns)]
        assert sorted(rows_there) == sorted(rows_here), sub
    for name in here:
        if name.startswith("shards/") or name == "difficulty.json":
            assert there[name] == here[name], name
    manifest = json.loads(there["shards/manifest.json"])
    assert manifest["totals"]["docs"] == stats_there["kept"]
    assert b"<html" in there["report.html"][:200].lower()
    for name in ("run.json", "report.html"):
        assert secret.encode() not in there[name], name
    assert json.loads(there["run.json"])["pipeline_options"]["s3_secret_access_key"] == "<redacted>"
