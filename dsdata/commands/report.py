"""`dsdata report OUT`: (re)build OUT/report.html from a finished run's outputs (local, s3://, gs://)."""
from __future__ import annotations

import os
import sys

from dsdata.commands import CommandParser
from dsdata.io.object_storage import add_object_storage_flags, object_storage_beam_args


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="dsdata report", description="Rebuild OUT/report.html (funnel, rejection "
                           "reasons with examples, histograms, recipe as run) from a run's output directory.")
    parser.add_argument("output", help="the run's output directory (holds stats.json, kept/, rejected/); "
                        "local, s3://BUCKET/PREFIX or gs://…")
    add_object_storage_flags(parser)
    args = parser.parse_args(argv)
    from dsdata.core.names import is_remote, recovered_path, shown_path
    from dsdata.report.page import is_run_output, write_report

    if is_remote(args.output):
        import dsdata.beam.run_files  # noqa: F401 - registers Beam's FileSystems for gs://, s3://, hdfs://
        from dsdata.beam.location import storage_error, use_object_storage

        use_object_storage([args.output], object_storage_beam_args(args))  # an unreachable endpoint: one line
        try:
            finished = is_run_output(args.output)
        except Exception as exc:  # noqa: BLE001 - refused credentials, a missing bucket: one line
            print(f"dsdata: error: cannot read {args.output}: {storage_error(exc)}", file=sys.stderr)
            return 2
    else:
        if not os.path.exists(args.output) and os.path.isdir(recovered_path(args.output)):
            # OUT as dsdata's lines show it (`dsdata report out-\xff`, pasted from a run's last line).
            args.output = recovered_path(args.output)
        finished = is_run_output(args.output)
    shown = shown_path(args.output)
    if not finished:
        print(f"dsdata: error: {shown} has no stats.json; pass the output directory of a 'dsdata run'",
              file=sys.stderr)
        return 2
    try:
        path = write_report(args.output)
    except Exception as exc:  # noqa: BLE001 - a damaged output directory: one line, not a traceback
        print(f"dsdata: error: could not build the report of {shown}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(shown_path(path))
    return 0
