"""``streamlake quality``: data-quality validation of a table from the shell, and its results.

    streamlake quality run --table T (--job NAME | --root DIR [--definition FILE]) [--from-version V] [--to-version W]
    streamlake quality show [--table T] [--json]

``run`` validates the rows that commits ``(V, W]`` of one of a pipeline's tables
(``bronze``, ``silver``, ``quarantine``, ``gold/<aggregate>``,
``late_events/<aggregate>``) added (the whole snapshot when ``--from-version``
is not given; ``W`` defaults to the latest version) with the table's
expectation suite, derived from the pipeline's definition, records the results in
``quality_results`` and rebuilds the Data Docs, exactly as the DAG tasks do.
It prints a summary and exits 1 if a critical expectation failed (0 when only
warnings failed). ``show`` prints the latest result per table and suite.
"""

from __future__ import annotations

from streamlake.cli.common import print_json


def cmd_run(args) -> int:
    from streamlake.cli.common import resolve_job
    from streamlake.delta.table import table_exists
    from streamlake.quality.suites import pipeline_suites
    from streamlake.quality.validate import validate_table
    from streamlake.spark.session import get_spark

    job = resolve_job(args)
    definition = job.definition
    tables = list(pipeline_suites(definition))
    if args.table not in tables:
        raise KeyError(f"job {job.name} has no table {args.table!r} (its tables: {', '.join(tables)})")
    path = job.table_path(args.table)
    if not table_exists(path):
        raise FileNotFoundError(f"no Delta table at {path}: has the pipeline run?")
    spark = get_spark("streamlake-quality", master=args.master, conf={"spark.ui.enabled": "false"})
    report = validate_table(spark, args.table, path, args.from_version, args.to_version, definition=definition,
                            operation=args.operation, context={"source": "cli"}, job_running=args.job_running,
                            max_age_s=args.max_age)
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.summary())
    return 0 if report.passed else 1


def _range(v: dict) -> str:
    if v["to_version"] is None:
        return "-"
    return f"v{v['to_version']} (snapshot)" if v["from_version"] is None else f"(v{v['from_version']}, v{v['to_version']}]"


def cmd_show(args) -> int:
    from streamlake.quality.results import latest

    rows = latest(args.table)
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no quality results recorded yet (streamlake quality run --table T)")
        return 0
    for v in rows:
        print(f"{v['status']:<4}  {v['table_name']:<24} {v['suite']:<40} {v['validated_at']:%Y-%m-%d %H:%M:%S}  "
              f"{v['operation']:<10} {_range(v):<16} {v['rows']:>7} rows  "
              f"{v['passed']}/{v['expectations']} met")
        for r in v["results"]:
            if r["success"]:
                break  # failing first
            detail = f"{r['unexpected_count']} unexpected" if r["unexpected_count"] else f"observed {r['observed_value']}"
            if r["exception"]:
                detail = f"error: {r['exception']}"
            print(f"      {r['severity'].upper():<8} {r['expectation_key']}: {detail}")
        if v.get("dag_id"):
            print(f"      from DAG {v['dag_id']} run {v['dag_run_id']} task {v['task_id']}")
    return 0


def add_parsers(sub) -> None:
    from streamlake.cli.common import add_job_arguments
    from streamlake.quality.suites import DEFAULT_MAX_AGE_S

    q = sub.add_parser("quality", help="data-quality validation (Great Expectations) and its results")
    qsub = q.add_subparsers(dest="quality_command", required=True)

    run = qsub.add_parser("run", help="validate a table's rows (a Delta version range); exit 1 on a critical failure")
    run.add_argument("--table", required=True,
                     help="which table: bronze, silver, quarantine, gold/<aggregate> or late_events/<aggregate>")
    add_job_arguments(run)
    run.add_argument("--from-version", type=int, default=None,
                     help="validate the rows commits after this version added (default: the whole snapshot)")
    run.add_argument("--to-version", type=int, default=None, help="last version of the range (default: latest)")
    run.add_argument("--operation", default="manual", help="operation name recorded with the results")
    run.add_argument("--job-running", action="store_true", help="also check freshness (the job is running)")
    run.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE_S,
                     help="freshness: newest event time at most this many seconds old")
    run.add_argument("--master", default="local[2]", help="Spark master for the validation")
    run.add_argument("--json", action="store_true", help="print the full report as JSON")
    run.set_defaults(func=cmd_run)

    show = qsub.add_parser("show", help="the latest result per table and suite, failing expectations first")
    show.add_argument("--table", default=None)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
