"""``streamlake ingest`` (the bronze ingest job), ``audit`` and ``vacuum``."""

from __future__ import annotations

import signal
import subprocess
import sys

from streamlake.cli.common import kafka_options, print_json
from streamlake import procs


def ingest_command(cfg, master: str, conf: dict | None = None) -> list[str]:
    from streamlake.pipeline.ingest import config_to_args
    from streamlake.spark.session import spark_submit_command

    return spark_submit_command("ingest_bronze.py", config_to_args(cfg), master=master, conf=conf,
                                name=f"ingest_bronze:{cfg.query_name}")


def run_job_foreground(cmd: list[str], control, env: dict | None = None) -> int:
    """Run a spark-submit job in its own process group; Ctrl-C/SIGTERM ask it (through
    its JobControl ``control``) to stop at a micro-batch boundary (second signal: kill
    it). Returns its exit status."""
    from streamlake.spark.session import job_environment

    proc = subprocess.Popen(cmd, env=job_environment(env), start_new_session=True)
    signals = {"count": 0}

    def on_signal(signum, _frame):
        signals["count"] += 1
        if signals["count"] == 1:
            print("\nstopping at the next micro-batch boundary (again to kill)...", file=sys.stderr)
            control.request_stop()
        else:
            procs.kill_tree(proc.pid, proc.pid, timeout=5)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        procs.kill_tree(proc.pid, proc.pid, timeout=5)  # leftovers of a killed driver
    if code < 0:
        print(f"ingest job killed by signal {-code}", file=sys.stderr)
        return 128 - code
    return code


def cmd_ingest(args) -> int:
    from streamlake.pipeline.control import JobControl
    from streamlake.pipeline.ingest import config_from_args, secret_environment
    from streamlake.storage.location import require_safe_commits

    cfg = config_from_args(args)
    require_safe_commits(cfg.storage())  # refused here, before a JVM starts
    return run_job_foreground(ingest_command(cfg, args.master), JobControl.for_checkpoint(cfg.checkpoint),
                              env=secret_environment(cfg))


def cmd_audit(args) -> int:
    from streamlake.operations.audit import audit_offsets
    from streamlake.storage.location import storage_options

    topics = [t.strip() for t in args.topic.split(",") if t.strip()]
    report = audit_offsets(args.table, topics, kafka_options(args.kafka_option), version=args.version,
                           storage=storage_options(args.table, args.storage_option))
    print_json(report.to_dict() if args.verbose else {
        k: v for k, v in report.to_dict().items() if k != "partitions"
    } | {"violations": [p for p in report.to_dict()["partitions"] if not p["exactly_once"]]})
    print(report.summary(), file=sys.stderr)
    return 0 if report.exactly_once else 3


def cmd_vacuum(args) -> int:
    from streamlake.delta.table import vacuum_table
    from streamlake.storage.location import require_safe_commits, storage_options

    storage = storage_options(args.table, args.storage_option)
    if not args.dry_run:
        require_safe_commits(storage)  # a vacuum commits to the table's log
    files = vacuum_table(args.table, retention_hours=args.retention_hours, dry_run=args.dry_run,
                         storage_options=storage.for_delta())
    print_json({"table": args.table, "dry_run": args.dry_run, "files": files})
    print(f"{'would delete' if args.dry_run else 'deleted'} {len(files)} files", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    from streamlake.pipeline.ingest import add_ingest_arguments

    i = sub.add_parser("ingest", help="run the bronze ingest job (spark-submit)")
    add_ingest_arguments(i)
    i.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    i.set_defaults(func=cmd_ingest)

    a = sub.add_parser("audit", help="check that the table holds its Kafka range exactly once")
    a.add_argument("--topic", required=True, help="topic(s), comma-separated")
    a.add_argument("--table", required=True)
    a.add_argument("--version", type=int, help="audit this Delta version (default latest)")
    a.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="storage option of an object-store --table (repeatable; AWS_* variables are read too)")
    a.set_defaults(func=cmd_audit)

    v = sub.add_parser("vacuum", help="delete files no snapshot references (aborted commit attempts, old files)")
    v.add_argument("--table", required=True)
    v.add_argument("--retention-hours", type=int, default=168,
                   help="keep files referenced in the last N hours (default 168); 0 only when no writer runs")
    v.add_argument("--dry-run", action="store_true", help="list, do not delete")
    v.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="storage option of an object-store --table (repeatable; AWS_* variables are read too)")
    v.set_defaults(func=cmd_vacuum)
