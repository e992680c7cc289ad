"""`dsdata` command line: run recipes, list stages, and the tools of each capability."""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import os
import sys
import warnings

from dsdata.collector import collect_young_less

from dsdata.core.names import shown_path
from dsdata.api import RunError, execute, filter_library_noise, one_line_errors, prepare_run
from dsdata.commands.run import run_parser
from dsdata.io.object_storage import object_storage_beam_args

SUBCOMMANDS = {  # each module has main(argv)
    "classifier": ("dsdata.commands.classifier", "train and evaluate relevance classifiers"),
    "lm": ("dsdata.commands.lm", "train n-gram language models for difficulty grading"),
    "tokenizer": ("dsdata.commands.tokenizer", "train a byte-level BPE tokenizer"),
    "shards": ("dsdata.commands.shards", "inspect, verify and export training shards for other trainers"),
    "shm": ("dsdata.commands.shm", "publish shards to shared memory (/dev/shm)"),
    "report": ("dsdata.commands.report", "rebuild OUT/report.html from a run's output directory"),
    "doctor": ("dsdata.commands.doctor", "check this environment (fastText, models, Beam, torch, extras)"),
}


class UserError(Exception):
    """An error the user can fix; printed as one line, exit status 2."""


class CommandInterrupted(Exception):
    """A command stopped by SIGINT/SIGTERM after cleaning up: one line, exit 128 + the signal."""

    def __init__(self, state, message: str):
        super().__init__(message)
        self.state = state


def one_line(exc: BaseException | str) -> str:
    """An error's text as the one line dsdata prints: line breaks folded, non-UTF-8 bytes as `\\xNN`."""
    text = " ".join(str(exc).split())
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that stands for no byte: Python's own escape
        return text


def _collect_after_startup() -> None:
    """In the command's own process only: freeze the million objects start-up made, so full
    collections never walk them, and switch the collector back on (docs/throughput.md)."""
    if _collect_after_startup.pending:
        _collect_after_startup.pending = False
        gc.freeze()
        collect_young_less()
        gc.enable()


_collect_after_startup.pending = False


class _OWN_PROCESS:  # noqa: N801 - a flag: main() runs as the process's own command (not called from Python)
    active = False


def _refuse_unknown_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A `--flag` neither dsdata's nor Beam's is a typo (`--ouput=DIR` or `--ouput DIR`): one line."""
    from dsdata.beam.known_options import long_flags, unknown_flag_message

    own = long_flags(parser)
    takes_value = {opt for action in parser._actions if action.nargs != 0  # noqa: SLF001
                   for opt in action.option_strings}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            break
        if arg.startswith("--") and len(arg) > 2:
            message = unknown_flag_message(arg, own)
            if message:
                raise UserError(message)
            name = arg.split("=", 1)[0]
            matches = [f for f in own if f == name] or [f for f in own if f.startswith(name)]
            if "=" not in arg and len(matches) == 1 and matches[0] in takes_value:
                i += 1  # its value, which may itself begin with --
        i += 1


def _execute_stoppable(prepared, beam_args: list[str], progress: str) -> dict:
    """execute(); a SIGINT/SIGTERM marks OUT incomplete and ends the command in one line."""
    from dsdata.beam.pipeline import RESUME_HINT, mark_incomplete
    from dsdata.stop_signals import stop_on_signals

    output = prepared.output
    # a --limit trial commits nothing, a remote OUT has no atomic rename to commit with
    resumable = prepared.recipe.limit is None and "://" not in output
    with stop_on_signals() as stop:
        try:
            stats = execute(prepared, beam_args, progress=progress)
        except BaseException:
            if stop.signum is None:
                raise
        if stop.signum is not None:
            mark_incomplete(output, f"the run was stopped by {stop.name}", resumable=resumable)
            raise CommandInterrupted(stop, f"stopped by {stop.name}: workers stopped, lock released; "
                                           f"{shown_path(output)} is incomplete (see {shown_path(output)}/INCOMPLETE)"
                                           + (f"; {RESUME_HINT}" if resumable else ""))
    return stats


def cmd_run(argv: list[str]) -> int:
    """`dsdata run`: the checks and the run of dsdata.run() (dsdata/api.py), with the command's lines."""
    parser = run_parser()
    _refuse_unknown_flags(parser, argv)
    args, beam_args = parser.parse_known_args(argv)
    beam_args = object_storage_beam_args(args) + beam_args  # Beam's S3Options: forwarded to every worker
    from dsdata.core.display import resolve_mode

    if not args.quiet:
        logging.getLogger("dsdata").setLevel(logging.INFO)
    with one_line_errors():
        prepared = prepare_run(args.recipe, args.input, args.output, args.format, args.set, beam_args,
                               max_errors=args.max_errors, quiet=args.quiet, limit=args.limit,
                               resume=args.resume)
        for line in prepared.notes:
            print(f"dsdata: {line}", file=sys.stderr)
        recipe, output = prepared.recipe, prepared.output
        if not args.quiet:
            print(f"dsdata: running {shown_path(recipe.path)} ({' → '.join(s.name for s in recipe.stages) or 'no stages'}) "
                  f"on {len(recipe.inputs)} input path(s) → {shown_path(output)}", file=sys.stderr)
        _say_what_is_replaced(output, recipe)
        _collect_after_startup()
        stats = _execute_stoppable(prepared, _quiet_sdk_workers(beam_args, recipe.beam_args, dsdata_info=not args.quiet),
                                   progress=resolve_mode(args.progress, quiet=args.quiet))
    if not args.quiet:
        rej = ", ".join(f"{s}: {sum(r.values())}" for s, r in stats["rejected"].items()) or "none"
        print(f"dsdata: input {stats['input']}, kept {stats['kept']}, augmented {stats['augmented']}, "
              f"rejected {stats['rejected_total']} ({rej}) in {stats['seconds']} s; ledger ok",
              file=sys.stderr)
        report = os.path.join(output, "report.html")
        if "://" not in output and os.path.isfile(report):
            print(f"dsdata: report: {shown_path(report)} (open it in a browser)", file=sys.stderr)
    print(json.dumps({k: stats[k] for k in ("input", "kept", "augmented", "rejected_total", "seconds")}))
    return 0


def _quiet_sdk_workers(beam_args: list[str], recipe_args: list[str], dsdata_info: bool) -> list[str]:
    """Unless the user set them, Beam's SDK workers log at WARN (Flink's job server refuses WARNING),
    their two start-up warnings silenced, dsdata's own progress lines kept."""
    given = {arg.split("=", 1)[0] for arg in [*recipe_args, *beam_args]}
    extra = []
    if "--default_sdk_harness_log_level" not in given:
        extra.append("--default_sdk_harness_log_level=WARN")
    if "--sdk_harness_log_level_overrides" not in given:
        overrides = {"apache_beam.options.pipeline_options": "ERROR", "__main__": "ERROR"}
        if dsdata_info:
            overrides["dsdata"] = "INFO"
        extra.append(f"--sdk_harness_log_level_overrides={json.dumps(overrides)}")
    return beam_args + extra


def _say_what_is_replaced(output: str, recipe) -> None:
    """A run replaces OUT's kept/, rejected/, side outputs, *.json: say so when another recipe wrote them."""
    stats_path = os.path.join(output, "stats.json")
    if "://" in output or not os.path.isfile(stats_path):
        return
    try:
        from dsdata.io.untrusted_files import load_json_file

        previous = load_json_file(stats_path, "stats.json").get("recipe")  # OUT is untrusted: a FIFO, deep JSON
    except (OSError, ValueError, AttributeError):
        return
    if previous and previous != recipe.name:
        from dsdata.stages import registered_side_outputs

        # what the run will remove (beam/pipeline.py _prepare_output)
        sides = registered_side_outputs()
        names = ([f"{s.name}/" for s in sides if s.directory] + [s.name for s in sides if not s.directory]
                 + ["kept/", "rejected/"])
        present = [n for n in names if os.path.exists(os.path.join(output, n.rstrip("/")))]
        print(f"dsdata: {shown_path(output)} holds the outputs of recipe '{previous}' ({', '.join(present + ['stats.json'])}); "
              f"this run of '{recipe.name}' replaces them (pass --output DIR to keep them)", file=sys.stderr)


def cmd_stages(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dsdata stages", description="List stages and their parameters.")
    parser.add_argument("name", nargs="?", help="show one stage only")
    args = parser.parse_args(argv)
    from dsdata.stages import REGISTRY, available_stages, custom_stage_problems, custom_stages, stage_class

    names = [args.name] if args.name else [n for n in REGISTRY if n in available_stages()] + custom_stages()
    if not args.name:
        for problem in custom_stage_problems():  # a broken plugin is named, and the others still listed
            print(f"dsdata: warning: {problem}", file=sys.stderr)
    for name in names:
        cls = stage_class(name)
        origin = "" if name in REGISTRY else f"  [from {cls.__module__}]"
        print(f"{name}: {cls.description}{origin}")
        for key, spec in cls.params.items():
            print(f"    {key} = {spec.default!r}  ({spec.describe()})\n        {spec.help}")
        if cls.annotations:
            cols = ", ".join(f"{k} ({v})" for k, v in cls.annotations.items())
            print(f"    adds columns: {cols}")
        print()
    return 0


def _not_reported_in_one_line(record: logging.LogRecord) -> bool:
    """Beam's traceback of a DoFn's exception, dropped for the failures dsdata reports in one line."""
    if not (record.exc_info and record.exc_info[1] is not None and record.name.startswith("apache_beam")):
        return True
    from dsdata.beam.errors import find_environment_error
    from dsdata.io.storage_errors import storage_failure

    exc = record.exc_info[1]
    return storage_failure(exc) is None and find_environment_error(exc) is None


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line (the console script, python -m dsdata.cli)
        _OWN_PROCESS.active = True
        _collect_after_startup.pending = True
        gc.disable()
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # memory back to the OS (docs/memory.md)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    filter_library_noise()  # every command: a library's import-time warning a user has no use for
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_reported_in_one_line)
    warnings.filterwarnings("ignore", message="Possible nested set", category=FutureWarning)  # a name's [: Beam's `[[]`
    commands = {"run": (cmd_run, "run a pipeline recipe (default: pipelines/pretrain.yaml)"),
                "stages": (cmd_stages, "list stages and their parameters")}

    def dispatch() -> int:
        if not argv or argv[0] in ("-h", "--help"):
            print("usage: dsdata COMMAND [ARGS]\n\ncommands:", *(f"  {name:<11} {help_}" for name, (_, help_) in
                  {**commands, **SUBCOMMANDS}.items()), "\n`dsdata` with no command is `dsdata run` of the default recipe.", sep="\n")
            if argv:
                return 0
        return cmd_dispatch(commands, argv or ["run"])
    return _flushed(dispatch)


def _flushed(dispatch) -> int:
    try:
        code = dispatch()
        sys.stdout.flush()  # inside the try: a pipe's buffer is otherwise written at exit
        return code
    except BrokenPipeError:  # `dsdata ... | head`: the reader left; stop quietly, as `cat` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe


def _main_stoppable(module, argv: list[str], name: str) -> int:
    """A sub-command's main(), stopped by SIGINT/SIGTERM as `dsdata run` is: one line and 130/143."""
    from dsdata.stop_signals import Interrupted, stop_on_signals

    # a native call that never checks for signals (the Rust BPE trainer) is ended 5 s after one
    with stop_on_signals(unresponsive=(5.0, f"dsdata: {name} stopped by {{signal}}")) as stop:
        try:
            return int(module.main(argv) or 0)
        except Interrupted:
            pass
    raise CommandInterrupted(stop, f"{name} stopped by {stop.name}")


def cmd_dispatch(commands, argv: list[str]) -> int:
    from dsdata.api import problem_classes

    before, during = problem_classes()
    name, rest = argv[0], argv[1:]
    try:
        if name in commands:
            if name != "run":
                _collect_after_startup()
            return commands[name][0](rest)
        if name in SUBCOMMANDS:
            _collect_after_startup()  # a sub-command may run for hours: it collects from the start
            try:
                module = importlib.import_module(SUBCOMMANDS[name][0])
            except ModuleNotFoundError as exc:
                raise UserError(f"'dsdata {name}' needs module {exc.name}, which is not installed "
                                "(pip install -e '.[all]')") from None
            return _main_stoppable(module, rest, name)
        if name.startswith("-") or name.endswith((".yaml", ".yml")):
            return commands["run"][0](argv)
        raise UserError(f"unknown command '{name}'; see 'dsdata --help'")
    except (RunError, UserError, *before, *during) as exc:  # exit 2 before a run, 1 for one that failed
        print(f"dsdata: error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, RunError) else 1 if isinstance(exc, during) else 2
    except CommandInterrupted as exc:
        from dsdata.stop_signals import stop_child_processes

        stop_child_processes()
        print(f"dsdata: {one_line(exc)}", file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        if _OWN_PROCESS.active:
            # Threads Beam or a runner left behind must not keep the stopped process alive.
            os._exit(exc.state.exit_code)
        return exc.state.exit_code
    except Exception as exc:  # noqa: BLE001 - a full or read-only disk in any command is one line
        from dsdata.io.storage_errors import storage_failure

        failure = storage_failure(exc)
        if failure is None:
            raise
        print(f"dsdata: error: {failure.describe()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
