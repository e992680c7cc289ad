"""Engine plumbing: what runs a pipeline, and what dsdata changes in Beam to run it well.

    options.py      the runner a user names: checked against dsdata/runners.py's registry
    dask_runner.py  dsdata's runner on a dask.distributed cluster (`--runner=dask`)
    artifacts.py    where the non-Python engine artifacts live: Prism's binary, Flink's job-server jar
    harness_noise.py  no tracebacks from Beam's SDK harness for the streams a runner closes at a job's end
    worker_pool.py  the worker pool TaskManagers ask for SDK workers (--environment_type=EXTERNAL)
    local_flink.py  a real Flink cluster on this machine in a loopback-only network namespace (tests, benchmark)
    loopback_relay.py  a host loopback service (an S3 server) reachable inside that namespace at the same address
    speedups.py     Beam patches applied at import (option views, DoFn specs, collections)
    mlimport.py     Beam's RunInference imported without torch/scipy (installed by dsdata/beam/__init__.py)

The runner registry itself (names → class paths, which run in this process) is plain data in
dsdata/runners.py, so the recipe and the CLI read it without importing Beam.
"""


class EngineError(RuntimeError):
    """An engine the user named cannot be used (scheduler unreachable, bad option): one line in the CLI."""
