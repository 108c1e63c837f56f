"""``streamlake backfill``: apply pending late events to gold, prove it, print what was restated."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from streamlake.cli.common import print_json


def cmd_backfill(args) -> int:
    from dataclasses import replace

    from streamlake.cli.ingest import run_job_foreground
    from streamlake.operations.control import JobControl
    from streamlake.operations.jobs import JobSpec, load_job, save_job
    from streamlake.spark.session import spark_submit_command

    if args.job:
        job = load_job(args.job)
    else:  # a pipeline run with `streamlake pipeline run --root DIR`: adopt it as a job of that name
        root = Path(args.root).absolute()
        name = args.name or f"root-{root.name}"
        try:
            job = load_job(name)
        except KeyError:
            from streamlake.pipeline.bronze import ingested_topics

            job = JobSpec(name=name, topics=ingested_topics(str(root / "bronze")), root=str(root))
        if Path(job.root) != root:
            raise SystemExit(f"job {name} is rooted at {job.root}, not {root}; pass --name")
        job = save_job(replace(job, root=str(root)))
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = ["--job", job.name, "--result", str(result)]
        cmd += ["--from", args.start] if args.start else []
        cmd += ["--to", args.end] if args.end else []
        cmd += ["--dry-run"] if args.dry_run else []
        code = run_job_foreground(spark_submit_command("backfill.py", cmd, master=args.master or job.master,
                                                       name=f"backfill:{job.name}"), JobControl(job.control_dir))
        summary = json.loads(result.read_text()) if result.exists() else {}
    if args.json:
        print_json(summary)
    elif summary:
        print(summary.get("summary") or summary.get("error"))
        for window in summary.get("window_list", []):
            print(f"  {window}")
        if summary.get("windows", 0) > len(summary.get("window_list", [])):
            print(f"  ... and {summary['windows'] - len(summary['window_list'])} more")
        for check in summary.get("checks", []):
            print(f"check {check['check_id']}: {check['verdict']}: {check['summary']}")
    if code and not summary:
        print(f"backfill failed (exit {code}); see the output above", file=sys.stderr)
    return code


def add_parsers(sub) -> None:
    b = sub.add_parser("backfill", help="apply pending late events to gold, prove the result, print what was restated")
    where = b.add_mutually_exclusive_group(required=True)
    where.add_argument("--job", help="the named job to backfill")
    where.add_argument("--root", help="the root of a `streamlake pipeline run` (its tables)")
    b.add_argument("--name", help="with --root: the job name to record it under (default root-<dirname>)")
    b.add_argument("--from", dest="start", help="event time from, ISO-8601 (UTC unless it has an offset)")
    b.add_argument("--to", dest="end", help="event time to, exclusive; without --from/--to: every pending late event")
    b.add_argument("--dry-run", action="store_true", help="list the windows and late events, change nothing")
    b.add_argument("--master", help="Spark master (default: the job's)")
    b.add_argument("--json", action="store_true", help="print the whole result as JSON")
    b.set_defaults(func=cmd_backfill)
