"""``streamlake backfill``: apply pending late events to gold, prove it, print what was restated."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from streamlake.cli.common import (add_job_arguments, add_remote_argument, connect_or_submit_command, print_json,
                                   resolve_job)


def cmd_backfill(args) -> int:
    from streamlake.cli.ingest import run_job_foreground
    from streamlake.pipeline.control import JobControl

    job = resolve_job(args)
    definition = job.definition
    if args.aggregate and definition is not None:
        definition.aggregate(args.aggregate)  # an unknown aggregate: a clear error before Spark starts
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = ["--job", job.name, "--result", str(result)]
        cmd += ["--aggregate", args.aggregate] if args.aggregate else []
        cmd += ["--from", args.start] if args.start else []
        cmd += ["--to", args.end] if args.end else []
        cmd += ["--dry-run"] if args.dry_run else []
        code = run_job_foreground(connect_or_submit_command("backfill.py", cmd, args.remote, master=args.master or
                                                            job.master or "local[*]", name=f"backfill:{job.name}",
                                                            root=job.root),
                                  JobControl(job.control_dir))
        summary = json.loads(result.read_text()) if result.exists() else {}
    if args.json:
        print_json(summary)
    elif summary:
        for entry in summary.get("aggregates") or [summary]:
            print(entry.get("summary") or entry.get("error"))
            for window in entry.get("window_list", []):
                print(f"  {window}")
            if entry.get("windows", 0) > len(entry.get("window_list", [])):
                print(f"  ... and {entry['windows'] - len(entry['window_list'])} more")
        for check in summary.get("checks", []):
            print(f"check {check['check_id']}: {check['verdict']}: {check['summary']}")
    if code and not summary:
        print(f"backfill failed (exit {code}); see the output above", file=sys.stderr)
    return code


def add_parsers(sub) -> None:
    b = sub.add_parser("backfill", help="apply pending late events to gold, prove the result, print what was restated")
    add_job_arguments(b)
    b.add_argument("--aggregate", help="only this aggregate's gold table (default: every aggregate)")
    b.add_argument("--from", dest="start", help="event time from, ISO-8601 (UTC unless it has an offset)")
    b.add_argument("--to", dest="end", help="event time to, exclusive; without --from/--to: every pending late event")
    b.add_argument("--dry-run", action="store_true", help="list the windows and late events, change nothing")
    b.add_argument("--master", help="Spark master when it runs as a spark-submit (default: the job's)")
    add_remote_argument(b, "the backfill")
    b.add_argument("--json", action="store_true", help="print the whole result as JSON")
    b.set_defaults(func=cmd_backfill)
