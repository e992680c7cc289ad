"""`dsdata shards verify|info DIR`: check a shard set's checksums; summarise it.
`dsdata shards export --format megatron|mds|hf SRC DST`: write it for other trainers (dsdata/shards/export/).
DIR and SRC may be on object storage (s3://BUCKET/out, gs://…; the S3 flags as for `dsdata run`): the
set is copied to a temporary folder first (dsdata/beam/remote_shards.py)."""
from __future__ import annotations

import contextlib
import json
import sys

from dsdata.commands import CommandParser
from dsdata.shards.export.formats import format_names, formats_help
from dsdata.io.object_storage import add_object_storage_flags, object_storage_beam_args
from dsdata.shards.tokenizer import verify_shard_set
from dsdata.shards.format import ShardError, locate_shard_dir, read_manifest
from dsdata.core.names import shown_path


def cmd_verify(args) -> int:
    manifest, problems = verify_shard_set(args.dir)
    for problem in problems:
        print(f"dsdata: bad shard: {args.show(problem)}", file=sys.stderr)
    if problems:
        print(f"dsdata: {len(problems)} of {len(manifest['shards'])} shard(s) in {args.show(shown_path(args.dir))} failed "
              "verification", file=sys.stderr)
        return 1
    totals = manifest.get("totals", {})
    print(f"ok: {len(manifest['shards'])} shards, {totals.get('docs', '?')} documents, "
          f"{totals.get('tokens', '?')} tokens in {args.show(shown_path(args.dir))}; every sha256 matches")
    return 0


def cmd_info(args) -> int:
    manifest = read_manifest(args.dir)
    if args.json:
        print(json.dumps({k: v for k, v in manifest.items() if k != "shards"} | {"files": len(manifest["shards"])}))
        return 0
    totals = manifest.get("totals", {})
    tok = manifest.get("tokenizer") or {}
    print(f"{args.show(shown_path(args.dir))}: {totals.get('shards')} shards, {totals.get('docs')} documents, {totals.get('tokens')} tokens, "
          f"dtype {manifest['dtype']}")
    print(f"tokenizer: {tok.get('path')} (vocab {tok.get('vocab_size')}, eos {tok.get('eos_token')}={tok.get('eos_id')}, "
          f"sha256 {str(tok.get('sha256'))[:12]}…)")
    for bucket, counts in (manifest.get("buckets") or {}).items():
        print(f"  {bucket:<8} {counts.get('shards', 0):>5} shards {counts['docs']:>9} docs {counts['tokens']:>12} tokens")
    if args.files:
        for shard in manifest["shards"]:
            print(f"  {shard['file']}\t{shard['docs']} docs\t{shard['tokens']} tokens\t{shard['bytes']} bytes\t{shard['sha256'][:16]}")
    return 0


def cmd_export(args) -> int:
    from dsdata.shards.export import export_shards

    formats = [f for value in args.format for f in value.split(",") if f]
    results = export_shards(args.dir, args.dst, formats, args.source)
    for name, summary in results.items():
        buckets = summary["buckets"]
        print(f"{name}: {sum(b['documents'] for b in buckets.values())} documents, "
              f"{sum(b['tokens'] for b in buckets.values())} tokens in {len(buckets)} bucket(s) → {summary['path']}")
    return 0


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="dsdata shards", description="Inspect, verify and export training shards.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_verify = sub.add_parser("verify", help="check every shard against the manifest's sha256; exit 1 naming bad files")
    p_verify.add_argument("dir", help="a `dsdata run` output directory (e.g. out) or its shards/ folder")
    p_info = sub.add_parser("info", help="summarise a shard set")
    p_info.add_argument("dir", help="a `dsdata run` output directory (e.g. out) or its shards/ folder")
    p_info.add_argument("--files", action="store_true", help="list every shard")
    p_info.add_argument("--json", action="store_true", help="print the manifest without the shard list as JSON")
    p_export = sub.add_parser("export", help="write the shards for another trainer: " + formats_help())
    p_export.add_argument("--format", action="append", required=True, metavar="FORMAT",
                          help=", ".join(format_names()) + "; repeat or comma-separate for several")
    p_export.add_argument("--source", default=None, help="the source column's value (default: the shard "
                          "set's folder name, or its run directory's for RUN/shards)")
    p_export.add_argument("dir", metavar="SRC", help="a `dsdata run` output directory (e.g. out) or its shards/ folder")
    p_export.add_argument("dst", metavar="DST", help="output folder: one sub-folder per format (DST/megatron, …)")
    for sub_parser in (p_verify, p_info, p_export):
        add_object_storage_flags(sub_parser)
    args = parser.parse_args(argv)
    from dsdata.shards.export import ExportError

    try:
        if args.command == "export" and "://" in args.dst:
            raise ExportError(f"DST {args.dst} is remote: the export writes a local folder (copy it up afterwards)")
        with located(args.dir, object_storage_beam_args(args), with_files=args.command != "info") as (local, show, name):
            args.dir, args.show = local, show
            if args.command == "export":
                args.source = args.source or name
                return cmd_export(args)
            return cmd_verify(args) if args.command == "verify" else cmd_info(args)
    except (ShardError, ExportError) as exc:
        print(f"dsdata: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the export's folder cannot be written (permissions, disk full, a file in the way)
        if args.command != "export":
            raise
        print(f"dsdata: error: cannot write the export under {args.dst}: {exc}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def located(path: str, storage_args: list[str], with_files: bool = True):
    """(the shard folder to read, a function naming the user's files in a line, the set's name or
    None) of `path` (a set or a run's shards/); a remote set is copied to a temporary folder first
    (only its manifest when not `with_files`)."""
    if "://" not in path:
        yield locate_shard_dir(path), lambda text: text, None
        return
    from dsdata.beam.location import use_object_storage
    from dsdata.beam.remote_shards import local_shard_set, shown
    from dsdata.shards.export.source import shard_set_name

    use_object_storage([path], storage_args)  # an unreachable endpoint, no credentials: one line
    with local_shard_set(path, with_files) as (local, remote):
        show = lambda text: shown(text, local, remote)  # noqa: E731
        try:
            yield local, show, shard_set_name(remote.split("://", 1)[1])
        except Exception as exc:
            # A one-line error about the copy (a corrupt shard, a bad manifest) names the remote file.
            if len(exc.args) == 1 and isinstance(exc.args[0], str):
                exc.args = (show(exc.args[0]),)
            raise
