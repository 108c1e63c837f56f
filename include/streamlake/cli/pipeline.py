"""``streamlake pipeline run``: bronze -> silver -> gold on a topic, under one root directory."""

from __future__ import annotations

import sys

from streamlake.cli.ingest import run_job_foreground


def cmd_pipeline(args) -> int:
    from streamlake.operations.control import JobControl
    from streamlake.pipeline.config import config_from_args, config_to_args
    from streamlake.spark.session import spark_submit_command

    cfg = config_from_args(args)
    print(f"pipeline: {cfg.describe()}", file=sys.stderr)
    cmd = spark_submit_command("pipeline.py", config_to_args(cfg), master=args.master, name=f"pipeline:{cfg.query_name}")
    return run_job_foreground(cmd, JobControl(cfg.control_dir))


def add_parsers(sub) -> None:
    from streamlake.pipeline.config import add_pipeline_arguments

    p = sub.add_parser("pipeline", help="the pipeline: Kafka -> bronze -> silver -> gold")
    actions = p.add_subparsers(dest="pipeline_action", required=True)
    run = actions.add_parser("run", help="run bronze -> silver -> gold (spark-submit); tables under --root")
    add_pipeline_arguments(run)
    run.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    run.set_defaults(func=cmd_pipeline)
