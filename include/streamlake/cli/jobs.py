"""``streamlake job``: named jobs (define, show, status, run under a restart strategy, stop)."""

from __future__ import annotations

from streamlake.cli.common import print_json


def cmd_job(args) -> int:
    from pathlib import Path

    from streamlake.errors import InvalidOptionError
    from streamlake.operations.jobs import list_jobs, load_job, save_job

    if args.action == "list":
        print_json(list_jobs())
    elif args.action == "show":
        print_json(load_job(args.name).to_dict())
    elif args.action == "define":
        from streamlake.operations.jobs import job_for_root, with_settings
        from streamlake.storage.location import normalize, parse_pairs

        if args.definition:
            from streamlake.pipeline.definition_check import checked_definition

            checked_definition(args.definition)  # a wrong definition: the key and the problem, nothing recorded
        try:
            spec = load_job(args.name)
            if args.root and normalize(args.root) != spec.root:
                raise InvalidOptionError(f"job {args.name} is rooted at {spec.root}; a job keeps its root (define "
                                         "another job for another root)")
        except KeyError:
            from streamlake import config

            root = args.root or str(config.home() / "data" / args.name)
            spec = job_for_root(root, definition_file=args.definition, name=args.name,
                                topics=[t for t in (args.topic or "").split(",") if t] or None)
        changes = {
            "definition_file": str(Path(args.definition).absolute()) if args.definition else None,
            "topics": [t for t in (args.topic or "").split(",") if t] or None,
            "stages": [s for s in (args.stages or "").split(",") if s] or None,
            "max_offsets_per_trigger": args.max_offsets_per_trigger, "min_partitions": args.min_partitions,
            "processing_time_s": args.processing_time, "gold_partitions": args.gold_partitions,
            "master": args.master, "spark_conn_id": args.spark_conn_id,
            "total_executor_cores": args.total_executor_cores, "executor_cores": args.executor_cores,
            "storage_options": {**spec.storage_options, **parse_pairs(args.storage_option)} or None,
            "storage_conn_id": args.storage_conn_id,
        }
        spec = with_settings(spec, **changes)
        if spec.storage_options or args.storage_option:
            from streamlake.storage.location import require_safe_commits, storage_options

            require_safe_commits(storage_options(spec.root, args.storage_option))
        print_json(save_job(spec).to_dict())
    elif args.action == "status":
        job = load_job(args.name)
        print_json({"job": job.name, "running": job.control.is_running(), **job.control.read_state()})
    elif args.action == "stop":
        control = load_job(args.name).control
        if not control.is_running():
            print(f"job {args.name} is not running")
            return 0
        control.request_stop()
        control.wait_stopped(args.timeout)
        print(f"job {args.name} stopped at a micro-batch boundary")
    elif args.action == "run":
        from streamlake.operations.runner import run_supervised, submit_with_subprocess
        from streamlake.operations.supervisor import RestartStrategy

        job = load_job(args.name)
        strategy = RestartStrategy(args.restart_strategy, attempts=args.restart_attempts,
                                   delay_s=args.restart_delay, max_failures=args.max_failures,
                                   interval_s=args.failure_interval)
        result = run_supervised(job, strategy, submit_with_subprocess(job, args.master or job.master or "local[*]"))
        print_json(result.__dict__)
    return 0


def add_parsers(sub) -> None:
    from streamlake.operations.jobs import DEMO_JOB

    j = sub.add_parser("job", help="named jobs: list, show, define (--definition FILE), status, run (supervised), "
                                   "stop")
    j.add_argument("action", choices=["list", "show", "define", "status", "run", "stop"])
    j.add_argument("name", nargs="?", default=DEMO_JOB)
    j.add_argument("--definition", metavar="FILE", help="define: the pipeline definition (YAML) the job runs")
    j.add_argument("--topic", help="define, bronze-only jobs (no definition): topic(s), comma-separated")
    j.add_argument("--root", help="define: directory of the job's tables and checkpoints")
    j.add_argument("--stages", help="define: bronze | bronze,silver | bronze,silver,gold")
    j.add_argument("--max-offsets-per-trigger", type=int)
    j.add_argument("--min-partitions", type=int)
    j.add_argument("--processing-time", type=float, help="define: trigger interval when continuous")
    j.add_argument("--gold-partitions", type=int, help="define: parallelism of gold's aggregation")
    j.add_argument("--master", help="Spark master for `run` (default: the job's)")
    j.add_argument("--spark-conn-id", help="define: Airflow connection of the Spark master")
    j.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="define, a root on an object store: a storage option recorded with the job (endpoint, "
                        "region, conditional_put=etag; never a secret: those stay in the environment or the "
                        "Airflow connection)")
    j.add_argument("--storage-conn-id", help="define, a root on an object store: the Airflow connection (type aws) "
                                             "with its credentials and endpoint for the DAGs (default aws_default)")
    j.add_argument("--total-executor-cores", type=int)
    j.add_argument("--executor-cores", type=int)
    j.add_argument("--restart-strategy", default="fixed-delay", choices=["fixed-delay", "failure-rate", "none"])
    j.add_argument("--restart-attempts", type=int, default=3)
    j.add_argument("--restart-delay", type=float, default=10.0)
    j.add_argument("--max-failures", type=int, default=3)
    j.add_argument("--failure-interval", type=float, default=300.0)
    j.add_argument("--timeout", type=float, default=120.0, help="stop: seconds to wait")
    j.set_defaults(func=cmd_job)
