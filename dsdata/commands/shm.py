"""`dsdata shm publish|list|remove`: shard sets in shared memory (/dev/shm/dsdata/NAME)."""
from __future__ import annotations

import json
import sys

from dsdata.commands import CommandParser
from dsdata.commands.shards import located
from dsdata.io.object_storage import add_object_storage_flags, object_storage_beam_args
from dsdata.shards.format import ShardError
from dsdata.shards.shm import ShmError, list_published, publish, remove, shm_root


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="dsdata shm", description="Publish shard sets to shared memory "
                                     "(root: /dev/shm/dsdata or $DSDATA_SHM_ROOT).")
    parser.add_argument("--root", default=None, help="shared-memory root directory (default: %(default)s → "
                        "$DSDATA_SHM_ROOT or /dev/shm/dsdata)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_pub = sub.add_parser("publish", help="copy + verify a shard directory into ROOT/NAME (atomic)")
    p_pub.add_argument("shard_dir", help="a `dsdata run` output directory (e.g. out) or its shards/ folder; "
                       "local or on object storage (s3://BUCKET/out, copied through a temporary folder)")
    p_pub.add_argument("--name", required=True, help="dataset name under the root")
    add_object_storage_flags(p_pub)
    p_list = sub.add_parser("list", help="list published datasets")
    p_list.add_argument("--verify", action="store_true", help="also check every shard's sha256")
    p_list.add_argument("--json", action="store_true", help="print one JSON array")
    p_rm = sub.add_parser("remove", help="remove a published dataset")
    p_rm.add_argument("name")
    args = parser.parse_args(argv)
    try:
        if args.command == "publish":
            with located(args.shard_dir, object_storage_beam_args(args)) as (shard_dir, show, _):
                result = publish(shard_dir, args.name, args.root)
            print(show(json.dumps(result)))
            return 0
        if args.command == "list":
            return _list(args)
        if not remove(args.name, args.root):  # remove: the parser allows no other command
            print(f"dsdata: error: no dataset named '{args.name}' under {shm_root(args.root)}",
                  file=sys.stderr)
            return 1
        print(f"removed {args.name}")
        return 0
    except (ShmError, ShardError) as exc:
        print(f"dsdata: error: {exc}", file=sys.stderr)
        return 2


def _list(args) -> int:
    """`dsdata shm list`: one line per dataset (or one JSON array); exit 1 when any is broken."""
    items = list_published(args.root, verify=args.verify)
    broken = any("error" in i or not i.get("ok", True) for i in items)
    if args.json:
        # stdout is one JSON document only, for scripts; problems are in the items themselves.
        print(json.dumps(items))
        return 1 if broken else 0
    if not items:
        print(f"no datasets published under {shm_root(args.root)}")
    for item in items:
        if "error" in item:
            print(f"{item['name']}\tBROKEN\t{item['error']}")
        else:
            flag = "" if item.get("ok", True) else "\tCORRUPT: " + "; ".join(item["problems"])
            print(f"{item['name']}\t{item['shards']} shards\t{item['tokens']} tokens\t{item['bytes']} bytes\t"
                  f"{item['dtype']}\t{item['path']}{flag}")
    return 1 if broken else 0
