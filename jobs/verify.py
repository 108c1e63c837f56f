"""spark-submit entrypoint: every check and the data-quality validation after an operation.

    spark-submit jobs/verify.py --job sensors --operation restore [--expected-offsets JSON] [--version V]
        [--no-quality | --quality-only]

Run by the DAGs after ingest, savepoint, restore, rescale (and backfill runs its
own); the logic is :func:`streamlake.operations.verify.verify_job`. Exit status:
0 everything passed (warnings allowed), 3 a check or a critical expectation
failed (recorded, named in the output), 2 a platform error, 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys

from streamlake import logs
from streamlake.operations.jobs import load_job
from streamlake.operations.verify import verify_job
from streamlake.spark.session import get_spark


def main(argv: list[str] | None = None) -> int:
    from streamlake.errors import StreamLakeError
    from streamlake.operations.consistency import ConsistencyError
    from streamlake.quality.validate import QualityError

    parser = argparse.ArgumentParser(prog="verify", description=__doc__.split("\n")[0])
    parser.add_argument("--job", required=True)
    parser.add_argument("--operation", required=True, help="what was done: ingest-scheduled, savepoint, restore, ...")
    parser.add_argument("--expected-offsets", help="JSON offsets bronze must hold (after a restore: the savepoint's)")
    parser.add_argument("--version", type=int, help="check bronze at this version (a savepoint's)")
    parser.add_argument("--context", default="{}", help="JSON recorded with the results (DAG run ids)")
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--no-quality", action="store_true", help="checks only, no Great Expectations validation")
    part.add_argument("--quality-only", action="store_true",
                      help="the Great Expectations validation only, no checks (the ingest DAG's quality task)")
    parser.add_argument("--job-running", action="store_true", help="the job runs: check freshness too")
    parser.add_argument("--remote", help="sc://host:port: run on this Spark Connect server (no JVM of its own)")
    args = parser.parse_args(argv)
    logs.configure()
    spark = get_spark(f"verify:{args.job}", remote=args.remote)
    try:
        summary = verify_job(spark, load_job(args.job), args.operation, context=json.loads(args.context),
                             expected_offsets=json.loads(args.expected_offsets) if args.expected_offsets else None,
                             bronze_version=args.version, checks=not args.quality_only, quality=not args.no_quality,
                             job_running=args.job_running)
    except (ConsistencyError, QualityError) as exc:
        print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 3
    except StreamLakeError as exc:
        print(f"ERROR: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    else:
        if args.remote:  # the job's tables by SQL name on the platform's server, new ones included
            from streamlake.operations.sql_catalog import register_tables

            try:
                register_tables(spark, [load_job(args.job)])
            except Exception as exc:  # noqa: BLE001 - names are a convenience, never the proof's verdict
                print(f"warning: the job's tables got no SQL names: {' '.join(str(exc).split())[:300]}",
                      file=sys.stderr, flush=True)
    finally:
        spark.stop()
    for check in summary["checks"]:
        print(f"{check['verdict']} {check['kind']} in {check['seconds']} s: {check['summary']}", flush=True)
    for q in summary.get("quality", []):
        print(f"quality {q['table']} {q['versions']}: {q['status']} ({q['rows']} rows)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
