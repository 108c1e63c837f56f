"""``streamlake check``: a consistency check of a job (recorded), or the history of checks.

Incremental by default: from the newest proof of the job's table, only what the
Delta log shows changed since is audited (see :mod:`streamlake.operations.consistency`).
``--full`` audits every row (and proves it); ``--list`` shows past checks,
``--proofs`` the verified ranges they recorded.
"""

from __future__ import annotations

import sys

from streamlake.cli.common import print_json


def cmd_check(args) -> int:
    from streamlake.operations.consistency import check_consistency, recent_checks
    from streamlake.operations.jobs import load_job

    if args.list:
        print_json(recent_checks(args.limit, args.job))
        return 0
    if args.proofs:
        from streamlake.operations.ledger import recent_proofs

        print_json(recent_proofs(args.limit, args.job))
        return 0
    result = check_consistency(load_job(args.job), args.operation, version=args.version, full=args.full)
    print_json(result.to_dict())
    print(result.summary, file=sys.stderr)
    return 0 if result.passed else 3


def add_parsers(sub) -> None:
    c = sub.add_parser("check", help="consistency check of a job's table (recorded; incremental unless --full), "
                                     "or --list past checks")
    c.add_argument("--job", default="bronze_sensors")
    c.add_argument("--operation", default="manual")
    c.add_argument("--full", action="store_true",
                   help="audit every row against Kafka (default: only what changed since the last proof)")
    c.add_argument("--version", type=int, help="check this Delta version (default latest)")
    c.add_argument("--list", action="store_true", help="past checks, newest first")
    c.add_argument("--proofs", action="store_true", help="verified ranges recorded by passing checks, newest first")
    c.add_argument("--limit", type=int, default=20)
    c.set_defaults(func=cmd_check)
