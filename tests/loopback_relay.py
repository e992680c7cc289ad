"""Make services on this machine's loopback reachable inside another network namespace, on the same
address: a TCP relay listening on 127.0.0.1:PORT inside the namespace, connecting each connection to
127.0.0.1:PORT where the relay was started.

    python -m dsdata.beam.engines.loopback_relay --netns /proc/PID/ns/net --port 8333 [--port …]

Why: the local Flink cluster (local_flink.py) runs in a network namespace whose only interface is
loopback, so its SDK workers cannot reach a server on the host's 127.0.0.1 — an S3 server (the tests'
SeaweedFS, a MinIO) that a recipe reads from and writes to.  With the relay the endpoint URL is the
same inside and outside (`--s3_endpoint_url=http://127.0.0.1:8333` for the launcher, the job server
and every worker) and nothing listens anywhere but on loopback: inside the namespace on 127.0.0.1,
outside not at all (the relay only connects).

The listening sockets are made inside the namespace (setns(2) on /proc/PID/ns/net; root or
CAP_SYS_ADMIN, as the namespace itself needs) before any thread starts, then the relay returns to its
own namespace: a socket stays in the namespace it was made in.  Prints one line when listening.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000
_CHUNK = 1 << 16


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def listen_in(netns: str, ports: list[int]) -> list[socket.socket]:
    """Sockets listening on 127.0.0.1:port inside the network namespace `netns` (a /proc/PID/ns/net
    path); the calling thread is back in its own namespace on return."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            return [socket.create_server(("127.0.0.1", port), backlog=128) for port in ports]
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)  # the other side sees the end of this direction
        except OSError:
            pass


def _serve(conn: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port))
    except OSError:
        conn.close()  # nothing listens on the host's side: the client sees the connection closed
        return
    back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
    back.start()
    _pump(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


def _accept(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve, args=(conn, port), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsdata.beam.engines.loopback_relay",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--netns", required=True, help="the namespace to listen in: /proc/PID/ns/net")
    parser.add_argument("--port", type=int, action="append", required=True, help="a loopback port (repeatable)")
    args = parser.parse_args(argv)
    try:
        listeners = listen_in(args.netns, args.port)
    except OSError as exc:
        print(f"loopback_relay: error: cannot listen in {args.netns}: {exc}", file=sys.stderr)
        return 2
    for listener in listeners[1:]:
        threading.Thread(target=_accept, args=(listener,), daemon=True).start()
    print(f"relaying 127.0.0.1:{','.join(map(str, args.port))} into {args.netns}", flush=True)
    _accept(listeners[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
