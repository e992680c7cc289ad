"""Beam's SDK harness, hung up on by its runner: no tracebacks for the streams a runner closes.

When a portable runner is done with a job it closes the harness's gRPC streams, whose threads then
die with a gRPC traceback before a successful run's `ledger ok`: `CANCELLED`, or `UNKNOWN` with
"Application error processing RPC" (grpc-java's answer when the job server's handler of the stream
throws as the job is torn down).  Only those are dropped, in the logger's records and those threads'
uncaught exceptions (and Beam's "Waiting for grpc channel to be ready" while a Java job server starts,
and a worker's "apitools not found"); anything else prints as before.
"""
from __future__ import annotations

import logging
import threading

_DATA_PLANE_LOGGER = "apache_beam.runners.worker.data_plane"
# The harness threads that read one gRPC stream each (apache_beam/runners/worker/*.py).
_STREAM_THREADS = ("read_grpc_client_inputs", "run_worker_", "read_state", "read_log_control_messages")
# Root-logger lines Beam writes on its own: (the writing file's path ends, the message starts).
_ROOT_NOISE = (("subprocess_server.py", "Waiting for grpc channel to be ready"),
               ("clients/bigquery/__init__.py", "apitools not found"))  # a worker's import of BigQuery IO


def _hung_up(exc: BaseException | None) -> bool:
    """Whether `exc` is a gRPC call the other side cancelled."""
    try:
        import grpc
    except ImportError:
        return False
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if not (isinstance(exc, grpc.RpcError) and callable(code)):
        return False
    status = code()
    return status == grpc.StatusCode.CANCELLED or (
        status == grpc.StatusCode.UNKNOWN and callable(details) and details() == "Application error processing RPC")


class _HungUpRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and _hung_up(record.exc_info[1]))


class _ChannelWaits(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(record.pathname.endswith(path) and str(record.msg).startswith(text) for path, text in _ROOT_NOISE)


def _quiet_excepthook(previous):
    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else ""
        if name.startswith(_STREAM_THREADS) and _hung_up(args.exc_value):
            return
        previous(args)

    hook.dsdata_hung_up = True
    return hook


def install() -> None:
    """Install the filters (idempotent: dsdata/beam/__init__.py calls it in every launcher and worker)."""
    data_plane = logging.getLogger(_DATA_PLANE_LOGGER)
    if not any(isinstance(f, _HungUpRecords) for f in data_plane.filters):
        data_plane.addFilter(_HungUpRecords())
    root = logging.getLogger()  # Beam logs the channel wait with logging.log(), on the root logger
    if not any(isinstance(f, _ChannelWaits) for f in root.filters):
        root.addFilter(_ChannelWaits())
    if not getattr(threading.excepthook, "dsdata_hung_up", False):
        threading.excepthook = _quiet_excepthook(threading.excepthook)
