"""``streamlake savepoint``: create, list, show, dispose, restore."""

from __future__ import annotations

import sys

from streamlake.cli.common import print_json


def cmd_savepoint(args) -> int:
    from streamlake.operations import savepoints

    if args.storage_option:  # for a savepoint URI or target on an object store: endpoint, region...
        from streamlake.storage.location import parse_pairs, remember_options

        for uri in (args.id, args.target):
            if uri and "://" in uri:
                remember_options(uri, parse_pairs(args.storage_option))

    if args.action == "create":
        from streamlake.operations.jobs import load_job

        from streamlake.operations.jobs import DEMO_JOB

        manifest = savepoints.create_savepoint(load_job(args.job or DEMO_JOB), stop=args.stop, note=args.note or "",
                                               target=args.target)
        print(manifest.id)
        if manifest.location:
            print(f"savepoint {manifest.id} is at {manifest.location}", file=sys.stderr)
        print(f"savepoint {manifest.id} of job {manifest.job}: table versions {manifest.versions()}, "
              f"offsets {manifest.kafka_offsets}, watermarks {manifest.watermarks}"
              f"{'; job stopped' if args.stop else ''}", file=sys.stderr)
    elif args.action == "list":
        print_json([{"id": m.id, "job": m.job, "created_at": m.created_at, "versions": m.versions(),
                     "offsets": m.kafka_offsets, "watermarks": m.watermarks, "location": m.uri}
                    for m in savepoints.list_savepoints(args.job)])
    elif args.action == "show":
        print_json(savepoints.load_savepoint(args.id).to_dict())
    elif args.action == "dispose":
        savepoints.dispose_savepoint(args.id)
        print(f"savepoint {args.id} disposed")
    elif args.action == "restore":
        result = savepoints.restore_savepoint(args.id)
        print_json(result)
        print(f"restored; start the job again (`streamlake job run {result['job']}` or the "
              f"ingest_{result['job']} DAG)", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    sp = sub.add_parser("savepoint", help="savepoints: create, list, show, dispose, restore")
    sp.add_argument("action", choices=["create", "list", "show", "dispose", "restore"])
    sp.add_argument("id", nargs="?", help="savepoint id (show, dispose, restore), or a savepoint's folder URI "
                                          "(s3://.../_savepoints/sp-...: one this machine has no trace of)")
    sp.add_argument("--job", default=None, help="job (create: default the demo job; list: filter)")
    sp.add_argument("--stop", action="store_true", help="create: stop the job after the savepoint")
    sp.add_argument("--note")
    sp.add_argument("--target", help="create: the folder URI to keep it under (default: <root>/_savepoints for a "
                                     "root on an object store, else $STREAMLAKE_HOME/savepoints)")
    sp.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a storage option of the savepoint's URI or target (endpoint, region; credentials "
                         "from the environment)")
    sp.set_defaults(func=cmd_savepoint)
