"""Which Beam pipeline options a recipe may carry, and checks of the runner a user names.

A recipe is a file people share.  Beam options can make a runner execute commands
(`environment_type: beam:env:harness_subprocess_python:v1` with an `environment_config` command,
a `PROCESS` environment's `command`, a `sdk_location`/`setup_file`/`extra_packages` installed on
workers, a container image, a job endpoint or job-server jar that is started): whoever writes the
recipe would run code on the machine of whoever runs it.  So a recipe's `beam:` section takes only
the options below — which runner and how many workers/threads — with scalar values; every other
option is the user's own choice, given on the command line.

Nor may a recipe choose a runner or a running mode that starts processes: Prism runs a binary
(downloaded to Beam's cache, where anything could have been put), Flink and Spark a job-server jar
with `java`, Beam's DirectRunner tries Prism first, dask starts a local cluster, and
`multi_processing` starts worker processes.  A recipe's `runner` is one of the in-process runners
(DirectRunner, FnApiRunner, BundleBasedDirectRunner; the first two mean dsdata's default, Beam's
FnApiRunner in this process) and its `direct_running_mode` is `in_memory`; the others are given on
the command line.
"""
from __future__ import annotations

import importlib
from typing import Any

# Runner choice and tuning: none of these names a program, a file, an image, a package or an endpoint.
RECIPE_ALLOWED = frozenset({
    "runner",
    "direct_num_workers", "direct_running_mode",
    "num_workers", "max_num_workers", "autoscaling_algorithm", "machine_type", "worker_machine_type",
    "disk_size_gb", "number_of_worker_harness_threads",
    "parallelism", "max_parallelism",
    "streaming",
})
DIRECT_RUNNING_MODES = ("in_memory", "multi_threading", "multi_processing")
# Beam's FnApiRunner in this process: dsdata's default runner.
IN_PROCESS_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
# The runners a recipe may name (lower case) → the class path it runs on; none starts a process.
RECIPE_RUNNERS = {
    "direct": IN_PROCESS_RUNNER, "directrunner": IN_PROCESS_RUNNER, "fnapirunner": IN_PROCESS_RUNNER,
    "bundlebaseddirectrunner": "apache_beam.runners.direct.direct_runner.BundleBasedDirectRunner",
}


class BeamOptionError(ValueError):
    """A Beam option a recipe may not carry, or a runner that does not exist; one line."""


# dsdata's own runners, by the names users type (Beam's DaskRunner loses outputs on a real cluster:
# `dask` means dsdata's fixed one, docs/engines.md).
DSDATA_RUNNERS = {
    "dask": "dsdata.beam.dask_runner.DistributedDaskRunner",
    "daskrunner": "dsdata.beam.dask_runner.DistributedDaskRunner",
}


def runner_class_path(name: str) -> str:
    """The class path Beam should load for --runner=NAME: dsdata's runner for its aliases, else NAME."""
    return DSDATA_RUNNERS.get(name.lower(), name)


def _known_runner_map() -> dict[str, str]:
    from apache_beam.options.pipeline_options import StandardOptions

    known = {path.rsplit(".", 1)[-1].lower(): path for path in StandardOptions.ALL_KNOWN_RUNNERS}
    return {**known, **DSDATA_RUNNERS}


def _is_known_name(name: str) -> bool:
    known = _known_runner_map()
    return name.lower() in known or name.lower() + "runner" in known


def recipe_beam_args(cfg: Any, recipe_path: str) -> list[str]:
    """A recipe's `beam:` mapping → `--name=value` arguments, refusing options outside RECIPE_ALLOWED."""
    if cfg is None:
        return []
    if not isinstance(cfg, dict):
        raise BeamOptionError(f"{recipe_path}: 'beam' must be a mapping of pipeline options")
    args = []
    for key, value in cfg.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name not in RECIPE_ALLOWED:
            raise BeamOptionError(
                f"{recipe_path}: beam option '{name}' may not be set in a recipe (a shared file may only "
                f"choose the runner and its tuning: {', '.join(sorted(RECIPE_ALLOWED))}); "
                f"pass --{name}=... on the command line"
            )
        if not isinstance(value, (str, int, float, bool)) or (isinstance(value, str) and "\n" in value):
            raise BeamOptionError(f"{recipe_path}: beam option '{name}' must be a single scalar value")
        if name == "runner":
            if not _is_known_name(str(value)):
                # A dotted class path imports that module: the user's choice, on the command line.
                raise BeamOptionError(
                    f"{recipe_path}: runner '{value}' is not one of Beam's runners by name; "
                    "a runner class path is given on the command line (--runner=package.module.Class)"
                )
            if str(value).lower() not in RECIPE_RUNNERS:
                raise BeamOptionError(
                    f"{recipe_path}: runner '{value}' starts programs (a job server, a cluster or workers), "
                    "which a shared recipe may not do; a recipe may name DirectRunner, FnApiRunner or "
                    f"BundleBasedDirectRunner: pass --runner={value} on the command line"
                )
            value = RECIPE_RUNNERS[str(value).lower()]
        if name == "direct_running_mode" and value not in DIRECT_RUNNING_MODES:
            raise BeamOptionError(f"{recipe_path}: direct_running_mode must be one of {', '.join(DIRECT_RUNNING_MODES)}")
        if name == "direct_running_mode" and value != "in_memory":
            raise BeamOptionError(
                f"{recipe_path}: direct_running_mode '{value}' starts worker processes, which a shared recipe "
                f"may not do; pass --direct_running_mode={value} on the command line"
            )
        args.append(f"--{name}={str(value).lower() if isinstance(value, bool) else value}")
    return args


def check_runner(name: str) -> None:
    """Raise BeamOptionError unless `name` is one of Beam's runners (whose module imports here) or an
    importable PipelineRunner class."""
    known = _known_runner_map()
    path = known.get(name.lower()) or known.get(name.lower() + "runner")
    if path is not None:
        module_name = path.rpartition(".")[0]
        try:
            importlib.import_module(module_name)
        except ImportError as exc:
            if path in DSDATA_RUNNERS.values():
                raise BeamOptionError(f"--runner={name} needs dsdata's 'dist' extra, which is not installed "
                                      f"({exc}); pip install 'dsdata[dist]'") from None
            raise BeamOptionError(f"--runner={name} needs a Beam extra that is not installed ({exc}); "
                                  "e.g. pip install 'apache-beam[gcp]' or 'apache-beam[interactive]'") from None
        return
    from apache_beam.options.pipeline_options import StandardOptions

    names = ", ".join(StandardOptions.KNOWN_RUNNER_NAMES)
    if "." not in name:
        raise BeamOptionError(f"unknown --runner '{name}' (Beam's runners: {names}; or a full class path "
                              "package.module.RunnerClass)")
    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BeamOptionError(f"--runner '{name}': cannot import {module_name} ({exc})") from None
    runner = getattr(module, attr, None)
    from apache_beam.runners.runner import PipelineRunner

    if not (isinstance(runner, type) and issubclass(runner, PipelineRunner)):
        raise BeamOptionError(f"--runner '{name}': {attr} in {module_name} is not a Beam PipelineRunner class")


def last_option(args: list[str], name: str) -> str | None:
    """The value of the last --NAME=VALUE in a list of Beam arguments (Beam uses the last)."""
    found = None
    for arg in args:
        if arg.startswith(f"--{name}="):
            found = arg.split("=", 1)[1]
    return found
