"""Checks of the runner a user names on the command line, against dsdata/runners.py's registry.

Here the row's class is imported, so a missing extra or a class that is not a PipelineRunner is one
line before anything runs.
"""
from __future__ import annotations

import importlib

from dsdata.runners import BeamOptionError, RUNNERS, find_runner


def check_runner(name: str) -> None:
    """Raise BeamOptionError unless `name` is a registered runner (whose module imports here) or an
    importable PipelineRunner class."""
    runner = find_runner(name)
    if runner is not None:
        module_name = runner.class_path.rpartition(".")[0]
        try:
            importlib.import_module(module_name)
        except ImportError as exc:
            if runner.class_path.startswith("dsdata."):
                raise BeamOptionError(f"--runner={name} needs dsdata's '{runner.extra}' extra, which is not "
                                      f"installed ({exc}); pip install 'dsdata[{runner.extra}]'") from None
            raise BeamOptionError(f"--runner={name} needs a Beam extra that is not installed ({exc}); "
                                  "e.g. pip install 'apache-beam[gcp]' or 'apache-beam[interactive]'") from None
        return
    names = ", ".join(r.name for r in RUNNERS)
    if "." not in name:
        raise BeamOptionError(f"unknown --runner '{name}' (runners: {names}; or a full class path "
                              "package.module.RunnerClass)")
    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BeamOptionError(f"--runner '{name}': cannot import {module_name} ({exc})") from None
    runner_class = getattr(module, attr, None)
    from apache_beam.runners.runner import PipelineRunner

    if not (isinstance(runner_class, type) and issubclass(runner_class, PipelineRunner)):
        raise BeamOptionError(f"--runner '{name}': {attr} in {module_name} is not a Beam PipelineRunner class")


def last_option(args: list[str], name: str) -> str | None:
    """The value of the last --NAME=VALUE in a list of Beam arguments (Beam uses the last)."""
    found = None
    for arg in args:
        if arg.startswith(f"--{name}="):
            found = arg.split("=", 1)[1]
    return found
