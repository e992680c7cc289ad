"""dsdata's worker pool (dsdata/beam/engines/worker_pool.py) for Beam's EXTERNAL environments, with real processes.

A real Beam pipeline (the FnApiRunner with an EXTERNAL environment) gets its work done by a worker the
pool starts; two callers asking for the same worker id get two workers, and one caller's StopWorker
leaves the other's running — Beam's stock pool, given the same requests, kills the other's worker.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

REPO = Path(__file__).resolve().parents[1]
psutil = pytest.importorskip("psutil")


def _start_pool(cwd: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-P", "-m", "dsdata.beam.engines.worker_pool", "--port", "0",
                             "--work-dir", str(cwd / "pool")], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    (cwd / "pool").mkdir(exist_ok=True)
    line = proc.stdout.readline()
    assert line, "the worker pool printed no address"
    return proc, json.loads(line)["listening"]


def _stop_pool(proc: subprocess.Popen) -> None:
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)] if proc.poll() is None else []
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in children:
        if psutil.pid_exists(pid):
            os.kill(pid, 9)


def test_pipeline_runs_in_pool_workers_that_ignore_the_pools_working_directory(tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms import environments

    # The pool is started from a folder holding another `dsdata` package (as when started from a
    # checkout's parent): its workers must import the pool's own dsdata, never that one.
    decoy = tmp_path / "decoy"
    (decoy / "dsdata").mkdir(parents=True)
    (decoy / "dsdata" / "__init__.py").write_text("raise ImportError('the decoy dsdata was imported')\n")
    pool, address = _start_pool(decoy)
    out = tmp_path / "out"
    try:
        def where(x):
            import dsdata
            return json.dumps({"x": x, "pid": os.getpid(), "ppid": os.getppid(), "dsdata": dsdata.__file__,
                               "cwd": os.getcwd(), "path": sys.path})

        options = PipelineOptions(["--default_sdk_harness_log_level=WARN"])
        runner = FnApiRunner(default_environment=environments.ExternalEnvironment(address))
        with beam.Pipeline(runner=runner, options=options) as p:
            (p | beam.Create(list(range(5))) | beam.Map(where)
             | beam.io.WriteToText(str(out / "where"), shard_name_template=""))
        seen = [json.loads(line) for line in (out / "where").read_text().splitlines()]
    finally:
        _stop_pool(pool)
    assert sorted(s["x"] for s in seen) == list(range(5))
    for s in seen:
        assert s["pid"] != os.getpid() and s["ppid"] == pool.pid  # a worker process of the pool
        assert s["dsdata"] == str(REPO / "dsdata" / "__init__.py")
        assert str(decoy) not in s["path"] and "" not in s["path"]
        assert Path(s["cwd"]).parent == tmp_path / "decoy" / "pool"  # its own directory
    # The worker left when the runner closed its control stream; nothing of the pool is left either.
    assert pool.returncode == 0


def _silent_endpoint() -> socket.socket:
    """A TCP listener that never answers: a worker told to use it as its control endpoint waits there."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def _start_worker(channel: grpc.Channel, worker_id: str, control: str) -> None:
    from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc, endpoints_pb2

    stub = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel)
    response = stub.StartWorker(beam_fn_api_pb2.StartWorkerRequest(
        worker_id=worker_id, control_endpoint=endpoints_pb2.ApiServiceDescriptor(url=control)), timeout=60)
    assert response.error == ""


def _stop_worker(channel: grpc.Channel, worker_id: str) -> None:
    from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc

    stub = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel)
    assert stub.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id=worker_id), timeout=60).error == ""


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def _two_callers_same_id(address: str, workers_of) -> tuple[bool, bool]:
    """Callers A and B (two connections, as two TaskManagers) each start worker "1-1", then A stops
    its "1-1".  Returns whether (A's worker, B's worker) are still running."""
    control = _silent_endpoint()
    url = "%s:%d" % control.getsockname()
    try:
        # Each its own connection (in one process, gRPC would share one between the two channels).
        local = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(address, local) as a, grpc.insecure_channel(address, local) as b:
            _start_worker(a, "1-1", url)
            pid_a = set(workers_of())
            _start_worker(b, "1-1", url)
            pid_b = set(workers_of()) - pid_a
            assert len(pid_a) == 1 and len(pid_b) == 1, "each caller's request started one process"
            _stop_worker(a, "1-1")
            time.sleep(1)
            alive = (_alive(pid_a.pop()), _alive(pid_b.pop()))
            _stop_worker(b, "1-1")
            return alive
    finally:
        control.close()


def _worker_children(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children() if c.status() != psutil.STATUS_ZOMBIE]


def test_one_callers_stop_leaves_another_callers_worker_of_the_same_id(tmp_path):
    pool, address = _start_pool(tmp_path)
    try:
        a_alive, b_alive = _two_callers_same_id(address, lambda: _worker_children(pool.pid))
        assert not a_alive, "A's StopWorker did not stop A's worker"
        assert b_alive, "A's StopWorker stopped B's worker"
        assert _worker_children(pool.pid) == []  # B's stop stopped B's
    finally:
        _stop_pool(pool)


def test_beams_stock_pool_kills_the_other_callers_worker():
    """Why dsdata has its own pool: the same requests against Beam's stock pool (process mode)."""
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

    # The stock pool forks its workers from this process: count only children it did not have before
    # (in a full run, earlier tests may have left processes of their own under pytest).
    before = set(_worker_children(os.getpid()))
    address, server = BeamFnExternalWorkerPoolServicer.start(use_process=True, port=0)
    try:
        a_alive, b_alive = _two_callers_same_id(address, lambda: [p for p in _worker_children(os.getpid())
                                                                  if p not in before])
        assert not b_alive, "Beam's stock pool no longer mixes callers up: dsdata's own pool may be unneeded"
    finally:
        server.stop(None)
        for pid in set(_worker_children(os.getpid())) - before:
            os.kill(pid, 9)
