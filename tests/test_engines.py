"""The pretrain recipe on real engines — Prism, Flink — gives the default runner's outputs.

"Identical" means: kept and rejected rows (sorted by id), stats.json without its timing, difficulty.json
and every shard file byte for byte.  Everything a test starts binds 127.0.0.1 and is stopped by PID.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from object_store import assert_same_run_outputs, bucket_files, local_files

from dsdata.beam.engines import artifacts as engines
from prism_binary import prism_binary
import local_flink
from local_flink import ClusterError, LocalFlinkCluster
from dsdata.beam.pipeline import run_recipe
from dsdata.cli import main as cli_main
from dsdata.recipe import load_recipe
from run_outputs import assert_same_outputs

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "pipelines" / "pretrain.yaml"


# --- comparing two runs: tests/run_outputs.py ---------------------------------------------------------

@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    """pretrain.yaml on the samples with the default (in-process) runner."""
    out = tmp_path_factory.mktemp("base") / "out"
    stats = run_recipe(load_recipe(str(PRETRAIN)), str(out))
    assert stats["ledger_ok"] and stats["kept"] > 0 and stats["rejected_total"] > 0
    return out


# --- sockets -------------------------------------------------------------------------------------------

def _unmapped(ip: str):
    addr = ipaddress.ip_address(ip)
    # Java listens on IPv6 sockets: 127.0.0.1 shows as ::ffff:127.0.0.1, which is_loopback calls False.
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr


def _is_loopback(ip: str) -> bool:
    return _unmapped(ip).is_loopback


# --- Prism -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_prism_pretrain_identical_to_default_runner(baseline, tmp_path):
    prism = prism_binary()
    if prism is None:
        pytest.skip(f"no Prism binary: run .ci/engines-setup (go install github.com/apache/beam/sdks/v2/go/cmd/"
                    f"prism@v{engines.BEAM_VERSION}) or set DSDATA_PRISM")
    # Prism's job service listens on ":PORT" (every interface; Beam 2.77 has no flag for the host), so
    # the run happens in a network namespace whose only interface is loopback.
    refusal = local_flink.netns_refusal()
    if refusal:
        pytest.skip(f"cannot create a network namespace to keep Prism's ':PORT' listener on loopback: {refusal}")
    out = tmp_path / "prism"
    cmd = (f"ip link set lo up && exec {sys.executable} -m dsdata.cli run {PRETRAIN} --output {out} --quiet "
           f"--runner=PrismRunner --prism_location={prism} --environment_type=LOOPBACK --job_server_timeout=3600")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(["unshare", "-n", "sh", "-c", cmd], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_outputs(baseline, out)


# --- Flink -----------------------------------------------------------------------------------------------

def _flink_jar_or_skip() -> str:
    if shutil.which("java") is None:
        pytest.skip("java not found: the Flink job server is a Java program")
    jar = engines.flink_job_server_jar()
    if jar is None:
        pytest.skip("Flink job-server jar not found: run .ci/engines-setup (it assembles "
                    f"{engines.assembled_flink_job_server_jar()} with mvn) or set DSDATA_FLINK_JOB_SERVER_JAR")
    return jar


def _flink_args(jar: str, master: str) -> list[str]:
    return ["--runner=FlinkRunner", f"--flink_job_server_jar={jar}", f"--flink_master={master}",
            f"--flink_version={engines.FLINK_VERSION}", "--environment_type=LOOPBACK", "--parallelism=2",
            # The job's state/message streams get this as a gRPC deadline (apache/beam#35867).
            "--job_server_timeout=3600"]


def test_flink_runner_without_a_jar_flag_gets_the_assembled_job_server(tmp_path, monkeypatch):
    """Beam would download its published job-server jar, which is not served: a FlinkRunner run for
    this Flink version that names no jar (nor a job endpoint) is given the one engines-setup built."""
    from dsdata.beam.pipeline import pipeline_options

    jar = tmp_path / "job-server.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv("DSDATA_FLINK_JOB_SERVER_JAR", str(jar))

    def given(*args):
        return pipeline_options(["--runner=FlinkRunner", "--flink_master=h:8081", *args]).get_all_options(
            drop_default=True).get("flink_job_server_jar")

    assert given(f"--flink_version={engines.FLINK_VERSION}") == str(jar)
    assert given(f"--flink_version={engines.FLINK_VERSION}", "--flink_job_server_jar=/other.jar") == "/other.jar"
    assert given(f"--flink_version={engines.FLINK_VERSION}", "--job_endpoint=h:8099") is None
    assert given("--flink_version=1.19") is None  # the assembled jar speaks Flink 1.20 only
    assert pipeline_options(["--runner=PrismRunner"]).get_all_options(drop_default=True).get("flink_job_server_jar") is None


@pytest.mark.slow
def test_flink_minicluster_pretrain_identical_to_default_runner_and_prints_no_traceback(baseline, tmp_path):
    """`dsdata run` on Flink's MiniCluster, as a user runs it: the default runner's outputs, and a
    stderr without a traceback (the SDK harness's streams closed at the job's end used to print ~60
    lines of them; dsdata/beam/engines/harness_noise.py)."""
    jar = _flink_jar_or_skip()
    out = tmp_path / "flink-local"
    done = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", str(PRETRAIN), "--output", str(out),
                           "--progress=off", *_flink_args(jar, "[local]")], cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-6000:]
    assert "ledger ok" in done.stderr and "Traceback" not in done.stderr, done.stderr[-6000:]
    assert_same_outputs(baseline, out)


# A runner closing the harness's data stream, as Flink's job server does when a job ends: a real gRPC
# server aborts the stream Beam's own client channel reads, in a process configured as `dsdata run` is.
_HUNG_UP = """import logging, sys, threading
from concurrent import futures
import grpc
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
import dsdata.beam  # noqa: F401 - what every launcher and worker imports
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.runners.worker.data_plane import GrpcClientDataChannel

class Data(beam_fn_api_pb2_grpc.BeamFnDataServicer):
    def Data(self, request_iterator, context):
        context.abort(getattr(grpc.StatusCode, sys.argv[1]), sys.argv[2])

server = grpc.server(futures.ThreadPoolExecutor(2))
beam_fn_api_pb2_grpc.add_BeamFnDataServicer_to_server(Data(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
GrpcClientDataChannel(beam_fn_api_pb2_grpc.BeamFnDataStub(grpc.insecure_channel(f"127.0.0.1:{port}")))
for thread in threading.enumerate():
    if thread.name == "read_grpc_client_inputs":
        thread.join(60)
server.stop(None)
print("reader finished")
"""


@pytest.mark.parametrize("status, details, hung_up", [
    ("CANCELLED", "Multiplexer hanging up", True),
    ("UNKNOWN", "Application error processing RPC", True),  # grpc-java: the job server's handler threw
    ("UNKNOWN", "the state cache is corrupt", False),
    ("INTERNAL", "Multiplexer hanging up", False)])
def test_a_harness_stream_the_runner_hangs_up_prints_no_traceback_other_errors_still_do(status, details, hung_up,
                                                                                        tmp_path):
    script = tmp_path / "hung_up.py"
    script.write_text(_HUNG_UP)
    done = subprocess.run([sys.executable, str(script), status, details], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and "reader finished" in done.stdout, done.stderr[-3000:]
    if hung_up:  # the hang-up at a job's end: nothing from the logger, nothing from the thread
        assert "Traceback" not in done.stderr and "Failed to read inputs" not in done.stderr, done.stderr
    else:  # any other status is a real failure and prints as Beam prints it
        assert "Failed to read inputs in the data plane" in done.stderr and f"StatusCode.{status}" in done.stderr


# The real cluster: a JobManager and two one-slot TaskManagers started by Flink's scripts, the SDK harness
# as worker processes of dsdata's worker pool (EXTERNAL), in a network namespace with only loopback.

@pytest.fixture(scope="module")
def flink_cluster(tmp_path_factory):
    jar = _flink_jar_or_skip()
    cluster = LocalFlinkCluster(tmp_path_factory.mktemp("flink"), taskmanagers=2, slots=1)
    try:
        cluster.start()
    except ClusterError as exc:
        cluster.stop()
        pytest.skip(str(exc))
    try:
        yield cluster, jar
    finally:
        cluster.stop()
        assert cluster.namespace_pids() == []
        # The TaskManagers' working directories (spill files, blobs) went with the cluster.
        assert not (cluster.work_dir / "tmp").exists()


class _ListenerSampler:
    """Every listening socket seen in the cluster's namespace while a job runs (the job server's and the
    TaskManagers' Beam gRPC servers exist only then)."""

    def __init__(self, cluster: LocalFlinkCluster):
        self.cluster, self.seen, self._stop = cluster, set(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.seen.update(self.cluster.listening())
            self._stop.wait(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _records_per_taskmanager(cluster: LocalFlinkCluster) -> dict[str, int]:
    """Records read and written by each TaskManager in the last finished job (Flink's REST API)."""
    jobs = [j for j in cluster.rest("/jobs/overview")["jobs"] if j["state"] == "FINISHED"]
    job = max(jobs, key=lambda j: j["start-time"])["jid"]
    records: dict[str, int] = {}
    for vertex in cluster.rest(f"/jobs/{job}")["vertices"]:
        for tm in cluster.rest(f"/jobs/{job}/vertices/{vertex['id']}/taskmanagers")["taskmanagers"]:
            metrics = tm["metrics"]
            records[tm["taskmanager-id"]] = (records.get(tm["taskmanager-id"], 0)
                                             + metrics["read-records"] + metrics["write-records"])
    return records


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["FlinkRunner", "PortableRunner"])
def test_flink_cluster_two_taskmanagers_pretrain_identical_to_default_runner(baseline, flink_cluster, tmp_path, runner):
    cluster, jar = flink_cluster
    if runner == "FlinkRunner":
        # The launcher starts the job server from the jar, inside the namespace with it.
        args = cluster.dsdata_run_args(jar)
    else:
        args = cluster.portable_run_args(cluster.start_job_server(jar))
    out = tmp_path / "flink-cluster"
    # `dsdata run` itself, so its own Beam options (the SDK log level) meet the Java job server.
    env = dict(cluster.job_server_env(), PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    workers_before = len(list((cluster.work_dir / "pool").glob("worker-*.log")))
    with _ListenerSampler(cluster) as sampler:
        proc = subprocess.run(cluster.nsenter([sys.executable, "-m", "dsdata.cli", "run", str(PRETRAIN), "--output",
                                               str(out), "--quiet", *args]),
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_outputs(baseline, out)
    # Both TaskManagers did work, in SDK worker processes the pool started for them.
    records = _records_per_taskmanager(cluster)
    assert sorted(records) == ["tm-0", "tm-1"] and all(n > 0 for n in records.values()), records
    started = len(list((cluster.work_dir / "pool").glob("worker-*.log"))) - workers_before
    # ... and kept them from stage to stage (Beam's jar on the cluster's classpath, environment cache):
    # one worker per TaskManager, where closing them after every stage forked ~18 per run.
    assert 2 <= started <= 2 * cluster.taskmanagers, started
    # Nothing reachable from beyond loopback: the namespace has no other interface; Flink's own
    # listeners are bound to 127.0.0.1; Beam's (job server, the TaskManagers' gRPC servers) cannot be
    # told a host and listen on the wildcard, which here reaches loopback only.
    assert cluster.interfaces() == ["lo"]
    assert sampler.seen, "no listening socket seen during the run"
    assert not [(ip, port) for ip, port in sampler.seen if not (_is_loopback(ip) or ip in ("0.0.0.0", "::"))]
    by_port = {port: str(_unmapped(ip)) for ip, port in sampler.seen}
    assert by_port.get(local_flink.REST_PORT) == "127.0.0.1" and by_port.get(local_flink.RPC_PORT) == "127.0.0.1"
    assert by_port.get(local_flink.WORKER_POOL_PORT) == "127.0.0.1"


_LARGE_RECORD_JOB = """
import sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


class Large(beam.CombineFn):
    # Every partial accumulator is `size` bytes: one record of that size through the combine's sort.
    def __init__(self, size):
        self.size = size

    def create_accumulator(self):
        return b""

    def add_input(self, acc, x):
        return acc or b"x" * self.size

    def merge_accumulators(self, accs):
        return max(accs, key=len)

    def extract_output(self, acc):
        return len(acc)


with beam.Pipeline(options=PipelineOptions(sys.argv[4:])) as p:
    x = p | beam.Create([("k%d" % (i % 2), i) for i in range(4000)])
    for j in range(int(sys.argv[1])):  # as many sorts as pretrain.yaml's job has, sharing the slot's memory
        x = x | "G%d" % j >> beam.GroupByKey() | "F%d" % j >> beam.FlatMap(lambda kv: [(kv[0], v) for v in kv[1]])
    sizes = x | beam.CombinePerKey(Large(int(sys.argv[2]))) | beam.Map(lambda kv: "%s %d" % kv)
    sizes | beam.io.WriteToText(sys.argv[3])
"""


@pytest.mark.slow
def test_flink_cluster_sorts_records_of_megabytes_among_dozens_of_shuffles(flink_cluster, tmp_path):
    """A partial combine's accumulator is one record in a sort (the 1M pretrain run's difficulty
    quantiles: over a megabyte), and the slot's sorters share its managed memory: with 64 MB, 30
    shuffles and a 4 MB record failed 'Record too large'."""
    cluster, jar = flink_cluster
    script = tmp_path / "large_record_job.py"
    script.write_text(_LARGE_RECORD_JOB, "utf-8")
    env = dict(cluster.job_server_env(), PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    args = [a for a in cluster.dsdata_run_args(jar) if a.startswith("--")]
    out = tmp_path / "sizes"
    proc = subprocess.run(cluster.nsenter([sys.executable, str(script), "30", str(4 << 20), str(out), *args]),
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert "Record too large" not in proc.stderr and proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(line for f in tmp_path.glob("sizes*") for line in f.read_text().splitlines())
    assert lines == [f"k0 {4 << 20}", f"k1 {4 << 20}"]
    # The sorts spilled under the cluster's own directory (removed when it stops), not /tmp, where a
    # TaskManager with a fixed resource id leaves its working directory behind.
    assert sorted(p.name for p in (cluster.work_dir / "tmp").glob("tm_*")) == ["tm_tm-0", "tm_tm-1"]


@pytest.mark.slow
def test_flink_cluster_pretrain_on_s3_writes_every_output_as_a_local_run_does(flink_cluster, s3_server, tmp_path):
    """pretrain.yaml reading s3:// and writing every output to s3:// from the two-TaskManager cluster
    (EXTERNAL SDK workers), against the real S3 server: the bucket holds what a local in-process run
    of the same input writes.  The server runs on the host's loopback; the cluster's loopback-only
    namespace reaches it at the same 127.0.0.1:PORT through LocalFlinkCluster.relay_host_ports."""
    cluster, jar = flink_cluster
    bucket = s3_server.new_bucket()
    docs = (REPO / "pipelines" / "samples" / "docs.jsonl").read_bytes()
    s3_server.client().put_object(Bucket=bucket, Key="in/docs.jsonl", Body=docs)
    (tmp_path / "docs.jsonl").write_bytes(docs)
    common = ["run", str(PRETRAIN), "--set", "shards.shard_size=3000", "--quiet"]
    assert cli_main([*common, "--input", str(tmp_path / "docs.jsonl"), "--output", str(tmp_path / "local")]) == 0

    port = int(s3_server.endpoint.rsplit(":", 1)[1])
    cluster.relay_host_ports([port])
    env = dict(cluster.job_server_env(), PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    # The README's Flink command, with the worker pool instead of Docker: no --flink_job_server_jar (dsdata
    # finds the one .ci/engines-setup assembled), the endpoint and credential flags as for any run.
    readme_flags = ["--runner=FlinkRunner", f"--flink_master={cluster.master}", "--flink_version=1.20",
                    "--environment_type=EXTERNAL", f"--environment_config={cluster.worker_pool}",
                    f"--parallelism={cluster.taskmanagers}", "--job_server_timeout=86400"]
    with _ListenerSampler(cluster) as sampler:
        proc = subprocess.run(cluster.nsenter([sys.executable, "-m", "dsdata.cli", *common,
                                               "--input", f"s3://{bucket}/in/*.jsonl", "--output", f"s3://{bucket}/out",
                                               *s3_server.beam_args(), *readme_flags]),
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()  # nothing written beside the launcher

    here, there = local_files(tmp_path / "local"), bucket_files(s3_server, bucket, "out/")
    assert_same_run_outputs(here, there, s3_server.secret_key)
    assert json.loads(there["stats.json"])["input"] == 178
    assert s3_server.keys(bucket, "in/") == ["in/docs.jsonl"]  # the input untouched, nothing else written
    run_options = json.loads(there["run.json"])["pipeline_options"]
    assert run_options["runner"] == "FlinkRunner" and run_options["flink_job_server_jar"] == jar
    # Both TaskManagers read and wrote records of this job.
    records = _records_per_taskmanager(cluster)
    assert sorted(records) == ["tm-0", "tm-1"] and all(n > 0 for n in records.values()), records
    # The S3 endpoint inside the namespace is the relay, on loopback only; the namespace has no other interface.
    assert cluster.interfaces() == ["lo"]
    assert {str(_unmapped(ip)) for ip, p in sampler.seen if p == port} == {"127.0.0.1"}
