"""A real Flink session cluster on this machine, reachable from nowhere else: JobManager, N TaskManagers
and dsdata's worker pool, all inside a network namespace whose only interface is loopback.

    python tests/local_flink.py --taskmanagers 2        # prints how to submit to it; Ctrl-C stops it

Test tooling, not part of the installed package.  The tests (tests/test_engines.py) and
benchmarks/million.py start it to run recipes on a cluster that
works like a real one: separate JobManager and TaskManager JVMs started by Flink's own scripts from the
distribution `.ci/engines-setup` assembles, one slot per TaskManager, and the Python SDK harness run as
real worker processes by the worker pool (--environment_type=EXTERNAL).

Why a network namespace: Flink binds where its configuration says (127.0.0.1 here), but Beam's parts do
not all allow it — the job server listens on every interface whatever --job-host says, and each
TaskManager opens Beam's gRPC control/data/state servers on every interface.  Inside `unshare -n`
nothing has another interface to listen on.  Creating one needs root (or CAP_SYS_ADMIN); without it
LocalFlinkCluster raises ClusterError and callers skip or stop with that line.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from dsdata.beam.engines import artifacts

# Inside the namespace every port is free: fixed ones keep the configuration and the docs simple.
REST_PORT = 8081
RPC_PORT = 6123
WORKER_POOL_PORT = 50000
# Small JVMs: CI machines are shared.  Flink's own scripts derive every memory component from these.
JOBMANAGER_PROCESS_SIZE = "768m"
TASKMANAGER_PROCESS_SIZE = "2112m"
# Managed memory is what Flink's batch sorters (every GroupByKey and combine) share in a slot, by
# operator: pretrain.yaml's job has dozens of them, and a sorter cannot take a record larger than
# its buffer.  With 64 MB the 1M-document run failed in the difficulty stage ("Cannot write record
# to fresh sort buffer. Record too large": a language's partial quantile accumulator is a single
# record of ~1 MB and more).  The heap is unchanged: the 448 MB added to the process are all managed.
TASKMANAGER_MANAGED_SIZE = "512m"
# Direct memory for Beam's gRPC data and state channels (its vendored Netty): with Flink's default of
# none, a 100k-document pretrain run ended in "OutOfMemoryError: Direct buffer memory".
TASKMANAGER_TASK_OFF_HEAP_SIZE = "384m"
# pretrain.yaml's job has dozens of shuffle edges: Flink's 64 MB minimum of network buffers is too few.
TASKMANAGER_NETWORK_SIZE = "160m"
JOB_SERVER_PORT = 8099
# The job server only translates and submits (the TaskManagers run the job): a small heap.
JOB_SERVER_HEAP = "-Xmx768m"
# How long a TaskManager keeps an idle SDK worker (and the models it loaded) for the job's next task.
# Beam honours it only when its classes come from Flink's own class loader (see _write_lib).
ENVIRONMENT_CACHE_MS = 60_000


class ClusterError(RuntimeError):
    """The local cluster cannot be started here (no namespace, no distribution, did not come up): one line."""


def flink_home() -> Path | None:
    """$FLINK_HOME, else the distribution .ci/engines-setup assembles in the engines cache."""
    home = os.environ.get("FLINK_HOME") or os.path.join(artifacts.engines_cache_dir(), "flink", "pyflink")
    return Path(home) if os.path.isfile(os.path.join(home, "bin", "taskmanager.sh")) else None


def netns_refusal() -> str | None:
    """Why a loopback-only network namespace cannot be made here, or None when it can."""
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -n refused: {probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else probe.returncode}"
    return None


def _flat(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flat(value, name + "."))
        else:
            flat[name] = value
    return flat


def _proc_net_listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket in pid's network namespace (/proc/PID/net/tcp{,6})."""
    found = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            family = socket.AF_INET if width == 8 else socket.AF_INET6
            found.append((socket.inet_ntop(family, raw), int(hex_port, 16)))
    return found


class LocalFlinkCluster:
    """JobManager + `taskmanagers` TaskManagers (`slots` each) + worker pool in a loopback-only namespace.

    Use as a context manager; every process it started (and any process left in its namespace, such as
    a job server a launcher started there) is stopped on exit, also when starting failed half-way."""

    def __init__(self, work_dir: str | os.PathLike, taskmanagers: int = 2, slots: int = 1, home: Path | None = None,
                 beam_jar: str | None = None):
        self.work_dir = Path(work_dir)
        self.beam_jar = beam_jar if beam_jar is not None else artifacts.flink_job_server_jar()
        self.taskmanagers = taskmanagers
        self.slots = slots
        self.home = home or flink_home()
        self.master = f"127.0.0.1:{REST_PORT}"
        self.worker_pool = f"127.0.0.1:{WORKER_POOL_PORT}"
        self._java_opts = ""
        self._holder: subprocess.Popen | None = None
        self._procs: list[subprocess.Popen] = []
        self._netns: str | None = None  # e.g. "net:[4026532xxx]": still names it after the holder is gone
        self._relayed: set[int] = set()  # host loopback ports reachable inside (relay_host_ports)

    # --- starting -------------------------------------------------------------------------------------

    def __enter__(self) -> "LocalFlinkCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 240) -> None:
        if self.home is None:
            raise ClusterError(f"no Flink distribution: run .ci/engines-setup (apache-flink "
                               f"{artifacts.FLINK_DIST_VERSION} from PyPI) or set FLINK_HOME")
        if shutil.which("java") is None:
            raise ClusterError("java not found: Flink is a Java program")
        refusal = netns_refusal()
        if refusal:
            raise ClusterError(f"cannot make a loopback-only network namespace: {refusal}")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "log").mkdir(exist_ok=True)
        (self.work_dir / "tmp").mkdir(exist_ok=True)  # io.tmp.dirs: working directories, spill files
        conf = self._write_conf()
        # The namespace lives as long as this process does; everything else joins it with nsenter.
        self._holder = subprocess.Popen(["unshare", "-n", "sh", "-c", "ip link set lo up && exec sleep infinity"],
                                        start_new_session=True)
        deadline = time.time() + 10
        while "UP" not in self._lo_state():
            if time.time() > deadline or self._holder.poll() is not None:
                raise ClusterError("the network namespace's loopback interface did not come up")
            time.sleep(0.05)
        self._netns = os.readlink(f"/proc/{self._holder.pid}/ns/net")
        env = dict(os.environ, FLINK_CONF_DIR=str(conf), FLINK_LOG_DIR=str(self.work_dir / "log"),
                   FLINK_LIB_DIR=str(self._write_lib()))
        self._spawn("jobmanager", [str(self.home / "bin" / "jobmanager.sh"), "start-foreground"], env)
        for i in range(self.taskmanagers):
            self._spawn(f"taskmanager-{i}", [str(self.home / "bin" / "taskmanager.sh"), "start-foreground",
                                             f"-Dtaskmanager.resource-id=tm-{i}"], env)
        self._start_worker_pool()
        self._wait_for_taskmanagers(timeout)

    def _write_conf(self) -> Path:
        import yaml

        conf = self.work_dir / "conf"
        conf.mkdir(exist_ok=True)
        with open(self.home / "conf" / "config.yaml", encoding="utf-8") as fh:
            settings = _flat(yaml.safe_load(fh) or {})  # keeps env.java.opts.all: Java 17's --add-opens
        self._java_opts = str(settings.get("env.java.opts.all", ""))
        settings.update({
            "jobmanager.rpc.address": "127.0.0.1", "jobmanager.rpc.port": RPC_PORT,
            "jobmanager.bind-host": "127.0.0.1", "rest.address": "127.0.0.1", "rest.bind-address": "127.0.0.1",
            "rest.port": REST_PORT, "blob.server.port": "0",
            "taskmanager.host": "127.0.0.1", "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.rpc.port": "0", "taskmanager.data.port": 0,
            "taskmanager.numberOfTaskSlots": self.slots,
            "jobmanager.memory.process.size": JOBMANAGER_PROCESS_SIZE,
            "taskmanager.memory.process.size": TASKMANAGER_PROCESS_SIZE,
            "taskmanager.memory.managed.size": TASKMANAGER_MANAGED_SIZE,
            "taskmanager.memory.task.off-heap.size": TASKMANAGER_TASK_OFF_HEAP_SIZE,
            "taskmanager.memory.network.min": TASKMANAGER_NETWORK_SIZE,
            "taskmanager.memory.network.max": TASKMANAGER_NETWORK_SIZE,
            "parallelism.default": self.taskmanagers * self.slots,
            # A failed job fails the test or run at once instead of restarting for minutes.
            "restart-strategy.type": "none",
            # Everything the processes write goes under the work directory, not /tmp: the scripts'
            # pid files (shared by every cluster on the machine otherwise), the web uploads, and the
            # working directories (TMP/tm_<resource id>, with the sort and shuffle spill files),
            # which a TaskManager with a fixed resource id keeps after it stops, for local recovery
            # this cluster does not use: 21 GB of them had piled up in /tmp after a few 1M runs.
            "io.tmp.dirs": str(self.work_dir / "tmp"),
            "env.pid.dir": str(self.work_dir),
            "web.tmpdir": str(self.work_dir / "tmp" / "web"),
        })
        if self.beam_jar:
            # Every class the job's jar carries (Beam and its shaded joda, grpc, …) from the one copy in lib/:
            # a Beam class from the parent loader meeting a joda class from the job's loader fails.
            settings["classloader.resolve-order"] = "parent-first"
        (conf / "config.yaml").write_text(yaml.safe_dump(settings, default_flow_style=False), encoding="utf-8")
        shutil.copy(self.home / "conf" / "log4j-console.properties", conf / "log4j-console.properties")
        return conf

    def _write_lib(self) -> Path:
        """The cluster's lib/: the distribution's jars plus Beam's job-server jar (links to both).

        Beam closes a job's SDK workers as soon as no task of the job runs on the TaskManager unless its
        own classes were loaded by Flink's class loader (FlinkExecutableStageContextFactory releases
        "synchronously" for classes from a job's user-code class loader).  In a batch job every stage
        is a new task, so each stage forked fresh workers that loaded every model again (18 workers
        per pretrain.yaml run on 2 TaskManagers).  With the jar here, `classloader.resolve-order: parent-first`
        and --environment_cache_millis, a worker lives from stage to stage."""
        lib = self.work_dir / "lib"
        shutil.rmtree(lib, ignore_errors=True)
        lib.mkdir()
        for jar in sorted((self.home / "lib").glob("*.jar")):
            os.symlink(jar, lib / jar.name)
        if self.beam_jar:
            os.symlink(os.path.abspath(self.beam_jar), lib / os.path.basename(self.beam_jar))
        return lib

    def _spawn(self, name: str, argv: list[str], env: dict, in_namespace: bool = True, **kwargs) -> subprocess.Popen:
        log = open(self.work_dir / "log" / f"{name}.out", "wb")
        try:
            proc = subprocess.Popen(self.nsenter(argv) if in_namespace else argv, env=env, cwd=self.work_dir,
                                    stdin=subprocess.DEVNULL, stdout=kwargs.pop("stdout", log), stderr=log,
                                    start_new_session=True, **kwargs)
        finally:
            log.close()
        self._procs.append(proc)
        return proc

    def _spawn_python_module(self, name: str, module: str, args: list[str], in_namespace: bool = True) -> str:
        """`python -P -m module args` (this checkout's dsdata and this folder's tools first on its path:
        it imports this dsdata, whatever the working directory holds); returns the first line it prints,
        its sign of life."""
        here = Path(__file__).resolve().parent
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here.parent), str(here),
                                                                         os.environ.get("PYTHONPATH")])))
        proc = self._spawn(name, [sys.executable, "-P", "-m", module, *args], env, in_namespace, stdout=subprocess.PIPE)
        line = proc.stdout.readline()
        proc.stdout.close()
        if not line:
            raise ClusterError(f"{name} did not start: see {self.work_dir / 'log' / (name + '.out')}")
        return line.decode(errors="replace").strip()

    def _start_worker_pool(self) -> None:
        self._spawn_python_module("worker-pool", "dsdata.beam.engines.worker_pool",
                                  ["--host", "127.0.0.1", "--port", str(WORKER_POOL_PORT),
                                   "--work-dir", str(self.work_dir / "pool")])

    def relay_host_ports(self, ports: list[int]) -> None:
        """Make services on the host's loopback (an S3 server the recipe reads and writes) reachable inside
        the namespace at the same 127.0.0.1:PORT, for the launcher, the job server and every SDK worker
        (loopback_relay.py: it listens on 127.0.0.1 inside the namespace and only connects outside)."""
        ports = [port for port in dict.fromkeys(ports) if port not in self._relayed]
        if ports:
            self._spawn_python_module(f"relay-{'-'.join(map(str, ports))}", "loopback_relay",
                                      ["--netns", f"/proc/{self._holder.pid}/ns/net",
                                       *[f"--port={port}" for port in ports]], in_namespace=False)
            self._relayed.update(ports)

    def _wait_for_taskmanagers(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if len(self.rest("/taskmanagers").get("taskmanagers", [])) >= self.taskmanagers:
                    return
            except ClusterError:
                pass
            dead = [p.args for p in self._procs if p.poll() is not None]
            if dead or time.time() > deadline:
                why = f"a process exited ({dead[0][-2:]})" if dead else f"not within {timeout:.0f} s"
                raise ClusterError(f"Flink's JobManager and {self.taskmanagers} TaskManagers did not come up: "
                                   f"{why}; logs in {self.work_dir / 'log'}")
            time.sleep(1)

    # --- using it ------------------------------------------------------------------------------------

    def nsenter(self, argv: list[str]) -> list[str]:
        """argv run inside the cluster's network namespace."""
        return ["nsenter", f"--net=/proc/{self._holder.pid}/ns/net", "--"] + list(argv)

    def rest(self, path: str):
        """GET the JobManager's REST API (inside the namespace) and decode its JSON."""
        code = ("import sys, urllib.request; opener = urllib.request.build_opener(urllib.request.ProxyHandler({})); "
                "sys.stdout.write(opener.open(sys.argv[1], timeout=10).read().decode())")
        proc = subprocess.run(self.nsenter([sys.executable, "-c", code, f"http://{self.master}{path}"]),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"GET {path}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
        return json.loads(proc.stdout)

    def dsdata_run_args(self, job_server_jar: str) -> list[str]:
        """`dsdata run` options that submit to this cluster through FlinkRunner (the launcher must run
        inside the namespace: see nsenter)."""
        return ["--runner=FlinkRunner", f"--flink_master={self.master}", f"--flink_job_server_jar={job_server_jar}",
                f"--flink_version={artifacts.FLINK_VERSION}", *self._job_args()]

    def _job_args(self) -> list[str]:
        """What every submission to this cluster says, whichever runner submits it."""
        return [f"--parallelism={self.taskmanagers * self.slots}",
                "--environment_type=EXTERNAL", f"--environment_config={self.worker_pool}",
                f"--environment_cache_millis={ENVIRONMENT_CACHE_MS}",
                # The job's state/message streams get this as a gRPC deadline (apache/beam#35867).
                "--job_server_timeout=86400"]

    def job_server_env(self) -> dict:
        """The environment for a launcher or job server: Java 17's --add-opens (Flink's own list) and a
        small heap, through JDK_JAVA_OPTIONS (FlinkRunner starts `java -jar` itself)."""
        return dict(os.environ, JDK_JAVA_OPTIONS=f"{JOB_SERVER_HEAP} {self._java_opts}".strip())

    def start_job_server(self, job_server_jar: str, timeout: float = 120) -> str:
        """A long-running job server for PortableRunner (--job_endpoint), started once per cluster; returns
        its endpoint."""
        endpoint = f"127.0.0.1:{JOB_SERVER_PORT}"
        if any(port == JOB_SERVER_PORT for _, port in self.listening()):
            return endpoint
        self._spawn("job-server", ["java", "-jar", job_server_jar, f"--flink-master={self.master}",
                                   "--job-host=127.0.0.1", f"--job-port={JOB_SERVER_PORT}", "--artifact-port=0",
                                   "--expansion-port=0", f"--artifacts-dir={self.work_dir / 'artifacts'}"],
                    self.job_server_env())
        deadline = time.time() + timeout
        while not any(port == JOB_SERVER_PORT for _, port in self.listening()):
            if time.time() > deadline or self._procs[-1].poll() is not None:
                raise ClusterError(f"the job server did not listen on {endpoint}: see {self.work_dir / 'log' / 'job-server.out'}")
            time.sleep(0.5)
        return endpoint

    def portable_run_args(self, job_endpoint: str) -> list[str]:
        """`dsdata run` options that submit to this cluster through PortableRunner and a job server."""
        return ["--runner=PortableRunner", f"--job_endpoint={job_endpoint}", *self._job_args()]

    def listening(self) -> list[tuple[str, int]]:
        """Every listening TCP socket in the namespace."""
        return _proc_net_listeners(self._holder.pid)

    def interfaces(self) -> list[str]:
        lines = Path(f"/proc/{self._holder.pid}/net/dev").read_text().splitlines()[2:]
        return sorted(line.split(":", 1)[0].strip() for line in lines)

    def _lo_state(self) -> str:
        if self._holder is None or self._holder.poll() is not None:
            return ""
        proc = subprocess.run(["nsenter", f"--net=/proc/{self._holder.pid}/ns/net", "--", "ip", "-o", "link", "show", "lo"],
                              capture_output=True, text=True)
        return proc.stdout

    def namespace_pids(self) -> list[int]:
        """Every process in the cluster's network namespace except the one holding it."""
        ns = self._netns
        if ns is None:
            return []
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self._holder.pid:
                try:
                    if os.readlink(f"/proc/{entry}/ns/net") == ns:
                        pids.append(int(entry))
                except OSError:
                    continue
        return pids

    # --- stopping -------------------------------------------------------------------------------------

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)  # its own session: the script and its java
                except ProcessLookupError:
                    pass
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Whatever else joined the namespace (a launcher's job server, a worker): stopped by PID.
        for _ in range(2):
            leftovers = self.namespace_pids()
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if leftovers:
                time.sleep(0.5)
        if self._holder is not None and self._holder.poll() is None:
            self._holder.kill()
            self._holder.wait()
        shutil.rmtree(self.work_dir / "tmp", ignore_errors=True)  # spill files, blobs (_write_conf)
        self._procs.clear()
        self._relayed.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/local_flink.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--taskmanagers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=1, help="task slots per TaskManager")
    parser.add_argument("--work-dir", default=None, help="configuration, logs and worker directories (default: a temp dir)")
    parser.add_argument("--relay-port", type=int, action="append", default=[], metavar="PORT",
                        help="a service on this machine's 127.0.0.1:PORT (an S3 server) the cluster may reach at the "
                        "same address (repeatable)")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="dsdata-flink-")
    try:
        with LocalFlinkCluster(work_dir, args.taskmanagers, args.slots) as cluster:
            cluster.relay_host_ports(args.relay_port)
            jar = artifacts.flink_job_server_jar() or "JOB_SERVER_JAR"
            print(f"Flink is up: {args.taskmanagers} TaskManagers, REST {cluster.master} in the namespace of pid "
                  f"{cluster._holder.pid}; logs in {work_dir}/log.  Submit with:\n  "
                  + " ".join(cluster.nsenter(["dsdata", "run", "RECIPE", "--output", "OUT"] + cluster.dsdata_run_args(jar))),
                  flush=True)
            stop = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            stop.wait()
    except ClusterError as exc:
        print(f"local_flink: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
