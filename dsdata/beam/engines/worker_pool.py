"""A Beam worker pool for EXTERNAL environments: starts one Python SDK worker process per request.

A portable runner started with `--environment_type=EXTERNAL --environment_config=HOST:PORT` asks
this service to StartWorker / StopWorker.  Unlike Beam's stock pool, workers are keyed by (gRPC
peer, worker id) (worker ids are unique only per TaskManager), run in safe-path mode (-P) in a
private working directory, get the job's options from the provision service, and log to a file.
Start the pool as `python -P -m dsdata.beam.engines.worker_pool`; nothing is staged, so its
environment must have dsdata installed (docs/engines.md).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from concurrent import futures

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc
from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc
from google.protobuf import json_format, text_format

from dsdata.beam.engines import lean_worker

_LOGGER = logging.getLogger(__name__)

# How long a worker gets to leave after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 10
# How long the runner's provision service gets to answer.
PROVISION_TIMEOUT_SECONDS = 60


class WorkerPool(beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolServicer):
    """Starts and stops SDK worker processes, keyed by (caller, worker id)."""

    def __init__(self, work_dir: str):
        self._work_dir = work_dir
        self._lock = threading.Lock()
        self._workers: dict[tuple[str, str], subprocess.Popen] = {}
        self._started = 0

    # --- the gRPC service ------------------------------------------------------------------------------

    def StartWorker(self, request: beam_fn_api_pb2.StartWorkerRequest, context) -> beam_fn_api_pb2.StartWorkerResponse:
        key = (context.peer(), request.worker_id)
        try:
            self._reap()
            with self._lock:
                if key in self._workers:
                    return beam_fn_api_pb2.StartWorkerResponse(
                        error=f"worker {request.worker_id!r} of {key[0]} is already running")
                self._started += 1
                number = self._started
            proc = self._spawn(request, number)
            with self._lock:
                self._workers[key] = proc
            _LOGGER.info("started worker %s for %s: pid %d", request.worker_id, key[0], proc.pid)
            return beam_fn_api_pb2.StartWorkerResponse()
        except Exception:  # noqa: BLE001 - the runner shows the error to the user
            return beam_fn_api_pb2.StartWorkerResponse(error=traceback.format_exc())

    def StopWorker(self, request: beam_fn_api_pb2.StopWorkerRequest, context) -> beam_fn_api_pb2.StopWorkerResponse:
        with self._lock:
            proc = self._workers.pop((context.peer(), request.worker_id), None)
        if proc is not None:
            _LOGGER.info("stopping worker %s for %s: pid %d", request.worker_id, context.peer(), proc.pid)
            _stop(proc)
        # Nothing of this caller's under that id (it exited, or the runner reconnected from another
        # port): stopping some other caller's worker of the same id is exactly what must not happen.
        return beam_fn_api_pb2.StopWorkerResponse()

    # --- processes -------------------------------------------------------------------------------------

    def _spawn(self, request: beam_fn_api_pb2.StartWorkerRequest, number: int) -> subprocess.Popen:
        info = self._provision_info(request)
        worker_dir = os.path.join(self._work_dir, f"worker-{number}")
        os.makedirs(worker_dir)
        env = dict(os.environ)
        env.update({
            # Safe-path mode, inherited by anything the worker itself starts.
            "PYTHONSAFEPATH": "1",
            "WORKER_ID": request.worker_id,
            "SEMI_PERSISTENT_DIRECTORY": worker_dir,
            "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options) if info else "{}",
            "CONTROL_API_SERVICE_DESCRIPTOR": text_format.MessageToString(request.control_endpoint),
            "RUNNER_CAPABILITIES": " ".join(info.runner_capabilities) if info else "",
        })
        logging_endpoint = request.logging_endpoint if request.logging_endpoint.url else (
            info.logging_endpoint if info else None)
        if logging_endpoint is not None and logging_endpoint.url:
            env["LOGGING_API_SERVICE_DESCRIPTOR"] = text_format.MessageToString(logging_endpoint)
        else:
            env.pop("LOGGING_API_SERVICE_DESCRIPTOR", None)
        if info is not None and info.status_endpoint.url:
            env["STATUS_API_SERVICE_DESCRIPTOR"] = text_format.MessageToString(info.status_endpoint)
        with open(os.path.join(self._work_dir, f"worker-{number}.log"), "wb") as log:
            return subprocess.Popen([sys.executable, "-P", "-m", lean_worker.__name__],
                                    cwd=worker_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, close_fds=True)

    @staticmethod
    def _provision_info(request: beam_fn_api_pb2.StartWorkerRequest) -> beam_provision_api_pb2.ProvisionInfo | None:
        """The job's options from the runner's provision service, as Beam's container boot reads them."""
        if not request.provision_endpoint.url:
            return None
        with grpc.insecure_channel(request.provision_endpoint.url) as channel:
            stub = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
            response = stub.GetProvisionInfo(beam_provision_api_pb2.GetProvisionInfoRequest(),
                                             metadata=[("worker_id", request.worker_id)],
                                             timeout=PROVISION_TIMEOUT_SECONDS)
        return response.info

    def _reap(self) -> None:
        """Forget workers that have exited (a worker leaves by itself when its runner closes control)."""
        with self._lock:
            for key in [k for k, p in self._workers.items() if p.poll() is not None]:
                del self._workers[key]

    def close(self) -> None:
        with self._lock:
            procs = list(self._workers.values())
            self._workers.clear()
        for proc in procs:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve(host: str = "127.0.0.1", port: int = 0, work_dir: str | None = None) -> tuple[str, grpc.Server, WorkerPool]:
    """Start the pool's gRPC server on host:port (0: a free port); returns ("host:port", server, pool)."""
    pool = WorkerPool(work_dir or tempfile.mkdtemp(prefix="dsdata-worker-pool-"))
    # Runners keep the connection open for the whole job without sending data: allow their pings.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                         options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)])
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    server.start()
    return f"{host}:{bound}", server, pool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -P -m dsdata.beam.engines.worker_pool",
        description="Beam worker pool for --environment_type=EXTERNAL: one SDK worker process per request, "
                    "keyed by (caller, worker id).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50000, help="port to listen on; 0 picks a free one (default 50000)")
    parser.add_argument("--work-dir", default=None, help="where workers' directories and logs go (default: a new temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="worker_pool: %(message)s")
    try:
        address, server, pool = serve(args.host, args.port, args.work_dir)
    except (OSError, RuntimeError) as exc:
        print(f"worker_pool: error: {exc}", file=sys.stderr)
        return 2
    # One line a supervisor can read the address from (with --port 0).
    print(json.dumps({"listening": address, "work_dir": pool._work_dir}), flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop(grace=None)
    pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
