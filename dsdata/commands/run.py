"""`dsdata run`'s flags: the parser the command line reads them with, and from which the Python API
learns the flag names it suggests for a typo."""
from __future__ import annotations

import argparse

from dsdata.io.object_storage import add_object_storage_flags

DEFAULT_RECIPE = "pipelines/pretrain.yaml"


def run_parser() -> argparse.ArgumentParser:
    from dsdata.io.readers import FORMATS  # the one registry of input formats

    parser = argparse.ArgumentParser(
        prog="dsdata run",
        description="Run a pipeline recipe. Unknown --flags are Beam pipeline options "
        "(--runner, --direct_num_workers, --direct_running_mode, Dataflow/Flink options) and pass through "
        "(runners: docs/engines.md).",
    )
    parser.add_argument("recipe", nargs="?", default=None, help=f"recipe YAML (default: {DEFAULT_RECIPE})")
    parser.add_argument("--input", action="append", default=None, metavar="GLOB",
                        help="input file or glob (local, gs://, s3://; repeatable); replaces the recipe's inputs")
    parser.add_argument("--output", default=None, metavar="DIR", help="output directory (default: the recipe's, ./out)")
    parser.add_argument("--format", default=None, choices=["auto", *FORMATS],
                        help="input format (default: from the recipe, else from file names: .txt/.md are text, "
                        "one document per file; .csv/.tsv are csv, a header row then one record per row)")
    parser.add_argument("--limit", default=None, type=positive_int, metavar="N",
                        help="read only the first N records (input files in path order, records in file order; "
                        "the same N on every runner) to try a recipe on part of a corpus; the ledger counts those N")
    parser.add_argument("--set", action="append", default=[], metavar="STAGE.PARAM=VALUE",
                        help="override a recipe parameter (repeatable), e.g. --set lang.min_score=0.6")
    parser.add_argument("--max-errors", default=None, metavar="N|P%",
                        help="records whose processing may raise before the run fails: a count (25) or a share "
                        "of the input (0.5%%); such records are rejected with reason 'error' and the run goes "
                        "on (default: 0.1%%). A missing model or module always stops the run")
    parser.add_argument("--resume", action="store_true",
                        help="continue a killed or failed run into the same --output: the input files (or byte "
                        "ranges) whose per-document stages it committed are not read again; the whole-corpus "
                        "stages run over everything. Refused (exit 3) when the recipe, its --set values or the "
                        "input files changed; with nothing to resume, a fresh run (docs/resume.md)")
    parser.add_argument("--quiet", action="store_true", help="print only the final JSON stats line")
    parser.add_argument("--progress", default="auto", choices=["auto", "bar", "lines", "off"],
                        help="live progress every 10 s on long runs: a bar on a terminal (auto), "
                        "lines (logs), or off; --quiet turns it off")
    add_object_storage_flags(parser)
    return parser


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {value!r}")
    return n
