"""The names of every Beam pipeline option this installation understands, so that `dsdata run` can
tell a mistyped dsdata flag (`--ouput=DIR`) from a Beam option that passes through (`--runner=…`).

Beam's own parser ignores an option it does not know.  The known set: the flags every
`PipelineOptions` subclass adds, after the runner rows' option modules are imported.
"""
from __future__ import annotations

import argparse
import functools
import importlib


def _all_subclasses(cls: type) -> list[type]:
    found, stack = [], [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


@functools.lru_cache(maxsize=2)
def beam_option_names(with_runner_modules: bool = True) -> dict[str, bool]:
    """Every long option (`--name`) some PipelineOptions subclass declares → whether it takes a value;
    with the runner rows' `options_modules` imported first where installed (Dataflow's, the interactive
    runner's: heavy, and the latter loads pandas), or with the modules already loaded only."""
    import logging

    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    from dsdata.runners import RUNNERS

    quiet = logging.getLogger().level
    for module in (m for runner in RUNNERS for m in runner.options_modules if with_runner_modules):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a runner whose extra is missing (or broken) declares nothing here
            continue
    logging.getLogger().setLevel(quiet)
    names: dict[str, bool] = {}
    for cls in [PipelineOptions, *_all_subclasses(PipelineOptions)]:
        add = cls.__dict__.get("_add_argparse_args")
        if add is None:
            continue
        parser = _BeamArgumentParser(allow_abbrev=False, conflict_handler="resolve", add_help=False)
        try:
            add.__get__(None, cls)(parser)
        except Exception:  # noqa: BLE001 - a third-party subclass with a broken declaration adds nothing
            continue
        for action in parser._actions:  # noqa: SLF001 - argparse exposes its actions only so
            names.update((opt, action.nargs != 0) for opt in action.option_strings if opt.startswith("--"))
    return names


def unknown_flag_message(flag: str, own_flags: list[str]) -> str | None:
    """None when `flag` is one of `own_flags` (or an unambiguous abbreviation) or a Beam option; else
    the one-line error, suggesting the closest known flag."""
    import difflib

    name = flag.split("=", 1)[0]
    if name in own_flags or len([f for f in own_flags if f.startswith(name)]) == 1:
        return None
    beam = beam_option_names(False)  # the runner rows' modules only for a flag Beam's own lack
    if name not in beam:
        beam = beam_option_names()
    if name in beam:
        if beam[name] and "=" not in flag:
            # Beam would take the next word as its value, but dsdata's parser takes it for the recipe.
            return f"Beam option {name} takes its value after '=': {name}=VALUE"
        return None
    # A dsdata flag is the likelier intent: suggest among them first, then among Beam's options.
    close = (difflib.get_close_matches(name, own_flags, n=1, cutoff=0.6)
             or difflib.get_close_matches(name, sorted(beam), n=1, cutoff=0.75))
    hint = f"; did you mean {close[0]}?" if close else " (see dsdata run --help; Beam options are passed as --name=value)"
    return f"unknown option {name}{hint}"


def long_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long flags of an argparse parser (`--output`, `--input`, …)."""
    return [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]  # noqa: SLF001
