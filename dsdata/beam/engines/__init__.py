"""Engine plumbing: what runs a pipeline, and what dsdata changes in Beam to run it well.

    options.py      the runner a user names: checked against dsdata/runners.py's registry
    artifacts.py    where Flink's job-server jar lives (the cache .ci/engines-setup fills)
    harness_noise.py  no tracebacks from Beam's SDK harness for the streams a runner closes at a job's end
    lean_worker.py  SDK workers started without pandas (Beam's worker main, after mlimport)
    worker_pool.py  the worker pool TaskManagers ask for SDK workers (--environment_type=EXTERNAL)
    speedups.py     Beam patches applied at import (option views, DoFn specs, collections)
    mlimport.py     Beam imported without what dsdata never uses, stand-ins for what it uses late (installed by dsdata/beam/__init__.py)

The runner registry itself is plain data in dsdata/runners.py.  The local Flink test cluster is
test tooling (tests/local_flink.py, tests/loopback_relay.py).
"""


class EngineError(RuntimeError):
    """An engine the user named cannot be used (scheduler unreachable, bad option): one line in the CLI."""
