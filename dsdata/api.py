"""dsdata's Python API (README.md): `dsdata.run()` runs a recipe with the checks and outputs of
`dsdata run`, through the same `prepare_run` (every check, OUT made) and `execute` (OUT's lock, the
Beam run).  Every problem is one `RunError`: the line `dsdata run` prints and its exit status.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from dsdata.commands.run import DEFAULT_RECIPE


class RunError(Exception):
    """A run that could not start or did not succeed; `str(exc)` is one line saying why.  exit_code:
    2 when nothing ran, 1 when the run started and failed, 3 when `--resume` was refused."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def problem_classes() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(errors found before a run starts, errors of a run that started): what becomes a RunError."""
    from dsdata.beam.engines import EngineError
    from dsdata.beam.errors import RunFailed
    from dsdata.runners import BeamOptionError
    from dsdata.io.inputs import InputPathError
    from dsdata.io.object_storage import ObjectStorageError
    from dsdata.io.outlock import OutputDirError
    from dsdata.io.readers import InputFormatError
    from dsdata.recipe import RecipeError
    from dsdata.stages import StageConfigError

    before = (RecipeError, StageConfigError, InputFormatError, InputPathError, FileNotFoundError,
              BeamOptionError, OutputDirError, EngineError, ObjectStorageError)
    return before, (RunFailed,)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """dsdata's own exceptions re-raised as RunError; the run's first Beam import, made quietly."""
    quiet_library_imports()
    from dsdata.beam.pipeline import LedgerError

    from dsdata.io.resume import RESUME_REFUSED_EXIT, ResumeRefused

    before, during = problem_classes()
    try:
        yield
    except RunError:
        raise
    except ResumeRefused as exc:
        raise RunError(str(exc), RESUME_REFUSED_EXIT) from exc
    except before as exc:
        raise RunError(str(exc), 2) from exc
    except during + (LedgerError,) as exc:
        raise RunError(str(exc), 1) from exc


# (module, text) of import-time warnings no run needs: Beam's GCP clients miss Google's apitools
QUIET_IMPORT_WARNINGS = (("apache_beam.io.gcp.internal.clients.bigquery", "apitools not found"),)


def _known_import_noise(record: logging.LogRecord) -> bool:
    """False for a record of QUIET_IMPORT_WARNINGS (a filter of the root logger, which they use)."""
    path = record.pathname.replace(os.sep, "/")
    return not any(path.endswith(module.replace(".", "/") + "/__init__.py") and record.getMessage().startswith(text)
                   for module, text in QUIET_IMPORT_WARNINGS)


def filter_library_noise() -> None:
    """QUIET_IMPORT_WARNINGS filtered at the root logger, which logs them (once per process)."""
    root = logging.getLogger()
    if _known_import_noise not in root.filters:
        root.addFilter(_known_import_noise)


def quiet_library_imports() -> None:
    """Import QUIET_IMPORT_WARNINGS' modules quietly, without configuring the caller's logging."""
    import importlib

    filter_library_noise()
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        for module, _ in QUIET_IMPORT_WARNINGS:
            with contextlib.suppress(Exception):
                importlib.import_module(module)
    finally:
        root.removeHandler(guard)


def default_recipe() -> str:
    if os.path.isfile(DEFAULT_RECIPE):
        return DEFAULT_RECIPE
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), DEFAULT_RECIPE)


@dataclass
class PreparedRun:
    """A recipe with every check made and OUT created: what `execute` runs."""

    recipe: Any  # dsdata.recipe.Recipe
    output: str
    budget: Any  # dsdata.beam.errors.ErrorBudget
    notes: list[str] = field(default_factory=list)  # lines about inputs left out, for the caller to print
    resume: bool = False  # continue a killed or failed run into OUT (dsdata/beam/resume.py)


def prepare_run(recipe_path: str | None = None, inputs: Iterable[str] | None = None, output: str | None = None,
                input_format: str | None = None, overrides: Iterable[str] = (), beam_args: Iterable[str] = (),
                max_errors: str | int | None = None, quiet: bool = False, limit: int | None = None,
                resume: bool = False) -> PreparedRun:
    """The recipe with `inputs`, `input_format`, `overrides` ("STAGE.PARAM=VALUE") and `limit` applied
    and every check made before anything is written (resume: not with `limit`, nor into a remote OUT)."""
    from dsdata.beam.errors import ErrorBudget
    from dsdata.io.inputs import input_notes, resolve_recipe_inputs
    from dsdata.io.outlock import check_output_dir
    from dsdata.recipe import INPUT_FORMATS, load_recipe, recipe_output

    try:
        budget = ErrorBudget.parse(None if max_errors is None else str(max_errors))
    except ValueError as exc:
        raise RunError(str(exc)) from None
    recipe = load_recipe(recipe_path or default_recipe(), list(overrides))
    given = None if inputs is None else [inputs] if isinstance(inputs, str) else list(inputs)
    if given is not None:
        recipe.inputs = [p if "://" in p else os.path.abspath(p) for p in given]
    if input_format:
        recipe.input_format = input_format
    if limit is not None:  # only the first `limit` records are read (transforms.ReadFirstDoFn)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise RunError(f"limit must be a positive whole number, got {limit!r}")
        recipe.limit = limit
    if resume and limit is not None:
        raise RunError("--resume cannot be combined with --limit: a --limit run is a trial that commits nothing "
                       "to resume")
    if recipe.input_format not in INPUT_FORMATS:  # --set input.format=... is only checked here
        raise RunError(f"input format '{recipe.input_format}' is not one of {', '.join(INPUT_FORMATS)}")
    output = output or recipe_output(recipe)  # a given output may point anywhere; a recipe's may not leave ./
    if resume and "://" in output:
        raise RunError(f"--resume needs a local output directory; {output} is remote (object stores have no "
                       "atomic rename to commit work with)")
    check_preflight(recipe)
    check_beam_args(list(recipe.beam_args) + list(beam_args))
    remote_inputs = [p for p in recipe.inputs if "://" in p]
    if remote_inputs or "://" in output:
        # s3://, gs:// through Beam's file systems and the run's options: listed and probed now
        from dsdata.beam import location
        from dsdata.beam.pipeline import pipeline_options

        location.use_object_storage(remote_inputs + ([output] if "://" in output else []),
                                    pipeline_options(list(recipe.beam_args) + list(beam_args)))
        listed = location.check_remote_inputs(remote_inputs)
        recipe.inputs = [q for p in recipe.inputs
                         for q in ([glob.escape(o) for o in listed[p]] if p in listed else [p])]
    expanded = resolve_recipe_inputs(recipe, confined=given is None, output=output)
    if "://" in output:
        output = location.check_remote_output(output)
    else:
        output = check_output_dir(output)
    notes = []
    if expanded.skipped and not quiet:
        names = ", ".join(os.path.basename(p) for p in expanded.skipped[:3]) + (", …" if len(expanded.skipped) > 3 else "")
        notes.append(f"{len(expanded.skipped)} file(s) in the input director(ies) have no known format in their "
                     f"name and are not read ({names}); pass --format FMT to read them")
    notes.extend(input_notes(expanded, quiet=quiet))
    return PreparedRun(recipe, output, budget, notes, resume=resume)


def execute(prepared: PreparedRun, beam_args: Iterable[str] = (), progress: str = "off") -> dict[str, Any]:
    """Run a prepared recipe under OUT's lock; its stats (OUT/stats.json plus `seconds`)."""
    from dsdata.beam.pipeline import run_recipe
    from dsdata.io.outlock import output_lock
    from dsdata.io.storage_errors import storage_failure

    full = None
    with output_lock(prepared.output) if "://" not in prepared.output else contextlib.nullcontext():
        try:
            return run_recipe(prepared.recipe, prepared.output, list(beam_args), max_errors=prepared.budget,
                              progress=progress, resume=prepared.resume)
        except Exception as exc:
            full = storage_failure(exc)
            if full is None or not _outs(full, exc, prepared.output):
                raise  # not OUT's (a stage's own file elsewhere): its own line, OUT's files kept
        # outside the handler: the failed run's frames (open part files) are gone
        raise _storage_failed(full, prepared.output)


def _outs(failure, exc: BaseException, output: str) -> bool:
    """Whether a full or read-only disk is OUT's: the failed write's path is under OUT, or, its path
    unknown, dsdata's own writers raised it (not a stage's code: beam/errors.py names the stage)."""
    from dsdata.beam.errors import find_environment_error

    if failure.path is not None:
        return failure.inside(output)
    return find_environment_error(exc) is None


def _storage_failed(failure, output: str) -> Exception:
    """A full or read-only disk under OUT: partial outputs removed, OUT/INCOMPLETE says why (exit 1)."""
    import gc

    from dsdata.beam.errors import RunFailed
    from dsdata.beam.pipeline import mark_incomplete
    from dsdata.core.names import shown_path

    gc.collect()  # the failed run's writers, and the space their open files hold, are let go
    line = failure.describe(where=output)
    with contextlib.suppress(OSError):
        mark_incomplete(output, line, discard=True)
    return RunFailed(f"{line}; the run's partial outputs were removed from {shown_path(output)}")


def run(recipe: str | os.PathLike | None = None, *, inputs: str | Iterable[str] | None = None,
        output: str | os.PathLike | None = None, overrides: Mapping[str, Any] | Iterable[str] | None = None,
        input_format: str | None = None, max_errors: str | int | None = None,
        beam_args: Iterable[str] = (), progress: str = "off", limit: int | None = None,
        resume: bool = False) -> dict[str, Any]:
    """Run a recipe as `dsdata run` does and return its stats (OUT/stats.json's dict plus `seconds`).

    recipe: default pipelines/pretrain.yaml.  inputs: a path or glob or a list of them, replacing
    the recipe's.  overrides: {"STAGE.PARAM": value} or ["STAGE.PARAM=VALUE", …] as `--set`;
    input_format, max_errors, limit, resume: as `--format`, `--max-errors`, `--limit`, `--resume`.
    beam_args: Beam options (["--direct_num_workers=2"]).  progress: "off", "lines", "bar" or "auto".
    Raises RunError (one line; `exit_code` as the command's) for any problem."""
    from dsdata.core.display import resolve_mode

    with one_line_errors():
        try:  # as `dsdata run --progress` takes it (auto: a bar on a terminal)
            progress = resolve_mode(progress)
        except ValueError as exc:
            raise RunError(str(exc)) from None
        if not isinstance(resume, bool):
            raise RunError(f"resume must be True or False, got {resume!r}")
        prepared = prepare_run(None if recipe is None else os.fspath(recipe), inputs,
                               None if output is None else os.fspath(output), input_format,
                               _override_items(overrides), beam_args, max_errors=max_errors, quiet=True,
                               limit=limit, resume=resume)
        for line in prepared.notes:  # matched paths that are not read (FIFOs, dangling links): also in stats.json
            logging.getLogger("dsdata").warning(line)
        return execute(prepared, beam_args, progress=progress)


def _override_items(overrides: Mapping[str, Any] | Iterable[str] | None) -> list[str]:
    """{"lang.min_score": 0.6, "lang.keep": ["zh", "en"]} → ["lang.min_score=0.6", "lang.keep=[zh, en]"]."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if not isinstance(overrides, Mapping):
        return list(overrides)
    import yaml

    items = []
    for key, value in overrides.items():
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 30).strip()
        items.append(f"{key}={text.removesuffix(chr(10) + '...')}")  # a scalar's document-end line
    return items


# Beam's multi-threaded in-process worker drops elements between fused stages (docs/reliability.md).
UNSAFE_RUNNING_MODES = {
    "multi_threading": "Beam's multi-threaded in-process worker loses records between stages (3 runs in 8 "
                       "on 20,000 documents, sometimes unseen by the ledger); use "
                       "--direct_running_mode=multi_processing or in_memory",
}


def check_beam_args(beam_args: list[str]) -> None:
    """Beam options refused as `dsdata run` refuses its flags: one no Beam options class declares
    (Beam would drop it silently), or one of `dsdata run`'s own flags (a keyword of dsdata.run())."""
    from dsdata.beam.engines.options import check_runner, last_option
    from dsdata.beam.known_options import beam_option_names, unknown_flag_message

    bad = [a for a in beam_args if not a.startswith("--")]
    if bad:
        raise RunError(f"unexpected argument(s) {' '.join(bad)}; Beam options must look like --name=value")
    own = run_flags()
    for arg in beam_args:
        message = unknown_flag_message(arg, own)
        name = arg.split("=", 1)[0]
        if message is None and name not in beam_option_names(False) and name not in beam_option_names():
            message = f"{name} is an option of dsdata run, not of Beam (dsdata.run() takes it as a keyword)"
        if message:
            raise RunError(message)
    runner = last_option(beam_args, "runner")
    if runner is not None:
        check_runner(runner)
    mode = last_option(beam_args, "direct_running_mode")
    if mode in UNSAFE_RUNNING_MODES:
        raise RunError(f"--direct_running_mode={mode} is refused: {UNSAFE_RUNNING_MODES[mode]}")


def check_preflight(recipe) -> None:
    """A stage's `preflight` problem (a broken fastText install, say) stops the run before Beam starts."""
    for stage in recipe.build_stages():
        problem = stage.preflight()
        if problem:
            raise RunError(f"{problem} (details: dsdata doctor)")


def run_flags() -> list[str]:
    """The long flags of `dsdata run` (the closest one is suggested for a typo)."""
    from dsdata.beam.known_options import long_flags
    from dsdata.commands.run import run_parser

    return long_flags(run_parser())
