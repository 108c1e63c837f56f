"""spark-submit entrypoint: restate gold from pending late events, prove it, record it.

    spark-submit jobs/backfill.py --job sensors [--aggregate per_minute]
                                  [--from 2026-11-22T10:00:00Z --to 2026-11-22T11:00:00Z] [--dry-run] [--result F]

Usually started by ``streamlake backfill`` or a ``backfill_<pipeline>`` DAG; the
logic is :func:`streamlake.operations.backfills.backfill_job`. Without a range it
applies every pending late event. Exit status: 0 done (or dry run), 3 the proof
after the backfill or a critical data-quality expectation failed (recorded),
2 a platform error, 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from streamlake import logs
from streamlake.operations.backfills import backfill_job, parse_time
from streamlake.operations.jobs import load_job
from streamlake.spark.session import get_spark


def main(argv: list[str] | None = None) -> int:
    from streamlake.errors import StreamLakeError
    from streamlake.operations.consistency import ConsistencyError
    from streamlake.quality.validate import QualityError

    parser = argparse.ArgumentParser(prog="backfill", description=__doc__.split("\n")[0])
    parser.add_argument("--job", required=True, help="the named job whose gold to backfill")
    parser.add_argument("--aggregate", help="only this aggregate's gold table (default: every aggregate)")
    parser.add_argument("--from", dest="start", help="event time from (ISO-8601, UTC unless it has an offset)")
    parser.add_argument("--to", dest="end", help="event time to, exclusive")
    parser.add_argument("--dry-run", action="store_true", help="list what would be restated, change nothing")
    parser.add_argument("--run-id", help="id of this backfill (default: generated)")
    parser.add_argument("--context", default="{}", help="JSON recorded with the checks (DAG run ids)")
    parser.add_argument("--result", help="write the summary as JSON to this file")
    parser.add_argument("--remote", help="sc://host:port: run on this Spark Connect server (no JVM of its own)")
    args = parser.parse_args(argv)
    logs.configure()
    spark = get_spark(f"backfill:{args.job}", remote=args.remote)
    code = 0
    try:
        summary = backfill_job(spark, load_job(args.job), parse_time(args.start), parse_time(args.end),
                               aggregate=args.aggregate, dry_run=args.dry_run, run_id=args.run_id,
                               context=json.loads(args.context))
    except (ConsistencyError, QualityError) as exc:
        summary, code = {"error": str(exc), "passed": False}, 3
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
    except StreamLakeError as exc:
        summary, code = {"error": f"{type(exc).__name__}: {exc}"}, 2
        print(f"ERROR: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    if args.result:  # the caller (CLI, DAG task) reports it
        Path(args.result).write_text(json.dumps(summary, indent=2, default=str))
    else:
        print(summary.get("summary", summary.get("error")), flush=True)
        for window in summary.get("window_list", []):
            print(f"  window {window}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
