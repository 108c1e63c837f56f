"""``streamlake check``: prove a job's tables (recorded), or the history of checks.

For a pipeline (a job with a definition) the check is the proof the DAGs run
after every operation, without the quality validation: bronze against Kafka,
every bronze row once in silver, quarantine or the dropped duplicates, every
gold table against a recompute from silver (``jobs/verify.py --no-quality``:
a client of the platform's Spark Connect server when it runs, else one
spark-submit). ``--kafka-only`` (and every bronze-only job) runs the Kafka
audit alone, without Spark. Incremental by default: from the newest proof of
the job's table, only what the Delta log shows changed since is audited (see
:mod:`streamlake.operations.consistency`). ``--full`` audits every row against
Kafka; ``--list`` shows past checks, ``--proofs`` the verified ranges they
recorded.
"""

from __future__ import annotations

import sys

from streamlake.cli.common import (add_job_arguments, add_remote_argument, connect_or_submit_command, print_json,
                                   resolve_job)


def cmd_check(args) -> int:
    from streamlake.operations.consistency import check_consistency, recent_checks

    if args.list or args.proofs:
        name = resolve_job(args).name if (args.job or args.root) else None
        if args.list:
            print_json(recent_checks(args.limit, name))
        else:
            from streamlake.operations.ledger import recent_proofs

            print_json(recent_proofs(args.limit, name))
        return 0
    job = resolve_job(args)
    if job.definition is None or args.kafka_only or args.full or args.version is not None:
        result = check_consistency(job, args.operation, version=args.version, full=args.full)
        print_json(result.to_dict())
        print(result.summary, file=sys.stderr)
        if not result.passed:
            return 3
        if job.definition is None or args.kafka_only:
            return 0
    from streamlake.cli.ingest import run_job_foreground

    verify_args = ["--job", job.name, "--operation", args.operation, "--no-quality"]
    cmd = connect_or_submit_command("verify.py", verify_args, args.remote, master=args.master or job.master or
                                    "local[*]", name=f"check:{job.name}", root=job.root)
    return run_job_foreground(cmd, job.control)


def add_parsers(sub) -> None:
    c = sub.add_parser("check", help="prove a job's tables: bronze against Kafka, every row once downstream, gold "
                                     "against a recompute (recorded); or --list past checks")
    add_job_arguments(c, required=False)
    c.add_argument("--operation", default="manual", help="operation name recorded with the checks")
    c.add_argument("--kafka-only", action="store_true", help="only bronze against Kafka (no Spark)")
    c.add_argument("--full", action="store_true",
                   help="audit every bronze row against Kafka (default: only what changed since the last proof)")
    c.add_argument("--version", type=int, help="check bronze at this Delta version (default latest)")
    c.add_argument("--list", action="store_true", help="past checks, newest first")
    add_remote_argument(c, "the checks")
    c.add_argument("--proofs", action="store_true", help="verified ranges recorded by passing checks, newest first")
    c.add_argument("--limit", type=int, default=20)
    c.add_argument("--master", help="Spark master for the pipeline checks (default: the job's)")
    c.set_defaults(func=cmd_check)
