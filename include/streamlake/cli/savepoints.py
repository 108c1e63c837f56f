"""``streamlake savepoint``: create, list, show, dispose, restore."""

from __future__ import annotations

import sys

from streamlake.cli.common import print_json


def cmd_savepoint(args) -> int:
    from streamlake.operations import savepoints

    if args.action == "create":
        from streamlake.operations.jobs import load_job

        from streamlake.operations.jobs import DEMO_JOB

        manifest = savepoints.create_savepoint(load_job(args.job or DEMO_JOB), stop=args.stop, note=args.note or "")
        print(manifest.id)
        print(f"savepoint {manifest.id} of job {manifest.job}: table versions {manifest.versions()}, "
              f"offsets {manifest.kafka_offsets}, watermark {manifest.watermark_ms}"
              f"{'; job stopped' if args.stop else ''}", file=sys.stderr)
    elif args.action == "list":
        print_json([{"id": m.id, "job": m.job, "created_at": m.created_at,
                     "versions": m.versions(), "offsets": m.kafka_offsets, "watermark_ms": m.watermark_ms}
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
    sp.add_argument("id", nargs="?", help="savepoint id (show, dispose, restore)")
    sp.add_argument("--job", default=None, help="job (create: default the demo job; list: filter)")
    sp.add_argument("--stop", action="store_true", help="create: stop the job after the savepoint")
    sp.add_argument("--note")
    sp.set_defaults(func=cmd_savepoint)
