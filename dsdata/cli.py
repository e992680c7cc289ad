"""`dsdata` command line: run recipes, list stages, and the tools of each capability."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys

DEFAULT_RECIPE = os.path.join("pipelines", "pretrain.yaml")

# Sub-commands implemented in their own modules (dsdata/commands/NAME.py, each with main(argv)).
SUBCOMMANDS = {
    "classifier": ("dsdata.commands.classifier", "train and evaluate relevance classifiers"),
    "lm": ("dsdata.commands.lm", "train n-gram language models for difficulty grading"),
    "tokenizer": ("dsdata.commands.tokenizer", "train a byte-level BPE tokenizer"),
    "shards": ("dsdata.commands.shards", "inspect and verify training shards"),
    "shm": ("dsdata.commands.shm", "publish shards to shared memory (/dev/shm)"),
}


class UserError(Exception):
    """An error the user can fix; printed as one line, exit status 2."""


def _default_recipe() -> str:
    if os.path.isfile(DEFAULT_RECIPE):
        return DEFAULT_RECIPE
    # Installed elsewhere than the checkout: fall back to the recipe next to the package source.
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), DEFAULT_RECIPE)
    return here


def cmd_run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dsdata run",
        description="Run a pipeline recipe. Unknown --flags are Beam pipeline options "
        "(--runner, --direct_num_workers, --direct_running_mode, Dataflow/Flink options) and pass through; "
        "--runner=dask runs on a dask.distributed cluster (--dask_client_address=HOST:PORT, see docs/engines.md).",
    )
    parser.add_argument("recipe", nargs="?", default=None, help=f"recipe YAML (default: {DEFAULT_RECIPE})")
    parser.add_argument("--input", action="append", default=None, metavar="GLOB",
                        help="input file or glob (local, gs://, s3://; repeatable); replaces the recipe's inputs")
    parser.add_argument("--output", default=None, metavar="DIR", help="output directory (default: the recipe's, ./out)")
    parser.add_argument("--format", default=None, choices=["auto", "jsonl", "parquet", "html", "warc"],
                        help="input format (default: from the recipe, else from file names)")
    parser.add_argument("--set", action="append", default=[], metavar="STAGE.PARAM=VALUE",
                        help="override a recipe parameter (repeatable), e.g. --set lang.min_score=0.6")
    parser.add_argument("--quiet", action="store_true", help="print only the final JSON stats line")
    args, beam_args = parser.parse_known_args(argv)
    bad = [a for a in beam_args if not a.startswith("--")]
    if bad:
        raise UserError(f"unexpected argument(s) {' '.join(bad)}; Beam options must look like --name=value")

    from dsdata.beam.pipeline import run_recipe
    from dsdata.recipe import load_recipe

    if not args.quiet:
        logging.getLogger("dsdata").setLevel(logging.INFO)

    recipe = load_recipe(args.recipe or _default_recipe(), args.set)
    if args.input:
        recipe.inputs = [p if "://" in p else os.path.abspath(p) for p in args.input]
    if args.format:
        recipe.input_format = args.format
    output = args.output or recipe.output
    _check_inputs(recipe.inputs, recipe.path)
    if not args.quiet:
        print(f"dsdata: running {recipe.path} ({' → '.join(s.name for s in recipe.stages) or 'no stages'}) "
              f"on {len(recipe.inputs)} input pattern(s) → {output}", file=sys.stderr)
    stats = run_recipe(recipe, output, beam_args)
    if not args.quiet:
        rej = ", ".join(f"{s}: {sum(r.values())}" for s, r in stats["rejected"].items()) or "none"
        print(f"dsdata: input {stats['input']}, kept {stats['kept']}, augmented {stats['augmented']}, "
              f"rejected {stats['rejected_total']} ({rej}) in {stats['seconds']} s; ledger ok", file=sys.stderr)
    print(json.dumps({k: stats[k] for k in ("input", "kept", "augmented", "rejected_total", "seconds")}))
    return 0


def _check_inputs(patterns: list[str], recipe_path: str) -> None:
    import glob

    if not patterns:
        raise UserError(f"no input: {recipe_path} names no input.paths; pass --input GLOB")
    for pattern in patterns:
        if "://" in pattern:
            continue
        if not glob.glob(pattern):
            raise UserError(f"no files match input '{pattern}'; check the path or pass --input GLOB")


def cmd_stages(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dsdata stages", description="List stages and their parameters.")
    parser.add_argument("name", nargs="?", help="show one stage only")
    args = parser.parse_args(argv)
    from dsdata.stages import REGISTRY, available_stages, stage_class

    names = [args.name] if args.name else [n for n in REGISTRY if n in available_stages()]
    for name in names:
        cls = stage_class(name)
        print(f"{name}: {cls.description}")
        for key, spec in cls.params.items():
            print(f"    {key} = {spec.default!r}\n        {spec.help}")
        if cls.annotations:
            cols = ", ".join(f"{k} ({v})" for k, v in cls.annotations.items())
            print(f"    adds columns: {cols}")
        print()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    # Beam's GCP I/O module warns at import time when Google's client libraries are absent, even
    # for runs that never touch GCP; that line only confuses users of local runs.
    logging.getLogger().addFilter(lambda record: "apitools not found" not in record.getMessage())
    commands = {"run": (cmd_run, "run a pipeline recipe (default: pipelines/pretrain.yaml)"),
                "stages": (cmd_stages, "list stages and their parameters")}
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: dsdata COMMAND [ARGS]\n\ncommands:")
        for name, (_, help_) in commands.items():
            print(f"  {name:<11} {help_}")
        for name, (_, help_) in SUBCOMMANDS.items():
            print(f"  {name:<11} {help_}")
        print("\n`dsdata` with no command is `dsdata run` of the default recipe.")
        if not argv:
            return cmd_dispatch(commands, ["run"])
        return 0
    return cmd_dispatch(commands, argv)


def cmd_dispatch(commands, argv: list[str]) -> int:
    from dsdata.beam.engines import EngineError
    from dsdata.io.readers import InputFormatError
    from dsdata.recipe import RecipeError
    from dsdata.stages import StageConfigError

    name, rest = argv[0], argv[1:]
    try:
        if name in commands:
            return commands[name][0](rest)
        if name in SUBCOMMANDS:
            try:
                module = importlib.import_module(SUBCOMMANDS[name][0])
            except ModuleNotFoundError as exc:
                raise UserError(f"'dsdata {name}' needs module {exc.name}, which is not installed "
                                "(pip install -e '.[all]')") from None
            return int(module.main(rest) or 0)
        if name.startswith("-") or name.endswith((".yaml", ".yml")):
            return commands["run"][0](argv)
        raise UserError(f"unknown command '{name}'; see 'dsdata --help'")
    except (UserError, RecipeError, StageConfigError, InputFormatError, EngineError, FileNotFoundError) as exc:
        print(f"dsdata: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
