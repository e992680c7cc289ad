"""Python SDK workers started lean: Beam's worker main, run after `mlimport` is in place.

Beam starts a worker as `python -m apache_beam.runners.worker.sdk_worker_main`, which imports
`apache_beam` (and with it pandas, ~45 MB per worker) before any dsdata code can run.  The in-process
runner's multi_processing workers (`python -m`, as Beam's own: the launcher's working directory on
their path) and the worker pool's (`python -P -m`, in private directories) run this module instead.
"""
from __future__ import annotations

import runpy
import shlex
import sys

BEAM_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"


def in_process_runner(**kwargs):
    """Beam's FnApiRunner, its multi_processing workers (`direct_running_mode`) started as this module."""
    from apache_beam.portability import python_urns
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    class FnApiRunner(fn_runner.FnApiRunner):
        def run_via_runner_api(self, pipeline_proto, options):
            beam_command = f"{sys.executable} -m {BEAM_WORKER_MAIN}".encode()  # as fn_runner writes it
            for environment in pipeline_proto.components.environments.values():
                if environment.urn == python_urns.SUBPROCESS_SDK and environment.payload == beam_command:
                    environment.payload = shlex.join([sys.executable, "-m", __name__]).encode()
            return super().run_via_runner_api(pipeline_proto, options)

    return FnApiRunner(**kwargs)


if __name__ == "__main__":  # importing dsdata.beam, the package, has installed mlimport
    import logging

    # Lines on stderr as the dsdata command writes them; not the harness's start-up INFO line.  (Beam's
    # import-time "apitools not found" made logging print every record: mlimport keeps it from importing.)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("__main__").setLevel(logging.ERROR)
    runpy.run_module(BEAM_WORKER_MAIN, run_name="__main__", alter_sys=True)
