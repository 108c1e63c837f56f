"""``streamlake check``: a consistency check of a job (recorded), or the history of checks."""

from __future__ import annotations

import sys

from streamlake.cli.common import print_json


def cmd_check(args) -> int:
    from streamlake.operations.consistency import check_consistency, recent_checks
    from streamlake.operations.jobs import load_job

    if args.list:
        print_json(recent_checks(args.limit, args.job))
        return 0
    result = check_consistency(load_job(args.job), args.operation)
    print_json(result.to_dict())
    print(result.summary, file=sys.stderr)
    return 0 if result.passed else 3


def add_parsers(sub) -> None:
    c = sub.add_parser("check", help="consistency check of a job's table (recorded), or --list past checks")
    c.add_argument("--job", default="bronze_sensors")
    c.add_argument("--operation", default="manual")
    c.add_argument("--list", action="store_true")
    c.add_argument("--limit", type=int, default=20)
    c.set_defaults(func=cmd_check)
