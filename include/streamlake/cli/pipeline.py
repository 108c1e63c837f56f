"""``streamlake pipeline``: check a definition, run a pipeline under one root directory.

    streamlake pipeline validate FILE
    streamlake pipeline run --definition FILE --root DIR|s3://BUCKET/PREFIX
                            [--available-now | --processing-time S] [--storage-option K=V]...
                            [--max-offsets-per-trigger N] [--kafka-option K=V]... [--name NAME]
                            [--master URL | --remote sc://HOST:PORT]

``validate`` exits 0 with a one-screen summary of what the definition makes
(tables, quarantine reasons, aggregates), or 2 with a message naming the key
that is wrong; it creates nothing. ``run`` checks the definition (and that it
may replace the one the root's tables were built with, see
:mod:`streamlake.pipeline.evolution`) before anything is created, records the
job (its name in the root, its settings as given) and runs its stages: an
available-now run on the default master goes to the Spark Connect server of
``--remote`` or the platform's running one (no JVM start; stderr says so), like
``check`` and ``backfill``; a continuous run, one with ``--master``, one of a
job with Spark resources of its own, or one no server answers for, is a
spark-submit of its own.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from streamlake.cli.common import add_remote_argument, connect_or_submit_command
from streamlake.cli.ingest import run_job_foreground


def cmd_validate(args) -> int:
    from streamlake.pipeline.definition_check import checked_definition

    definition = checked_definition(args.file)
    print(definition.summary())
    return 0


def cmd_run(args) -> int:
    from streamlake.pipeline.control import JobControl
    from streamlake.operations.jobs import job_for_root, recorded_storage_options, save_job, with_settings
    from streamlake.pipeline.config import config_from_args, config_to_args, secret_environment
    from streamlake.pipeline.evolution import applied_definition, plan_change
    from streamlake.spark.session import spark_submit_command
    from streamlake.storage.location import is_secret, require_safe_commits

    cfg = config_from_args(args)
    if cfg.definition is not None:  # what only Spark finds too, before anything is written
        from streamlake.pipeline.definition_check import check_definition

        check_definition(cfg.definition, remote=args.remote)
    recorded = recorded_storage_options(cfg.root)  # the root's job's options; those given win
    if recorded:
        cfg = replace(cfg, storage_options={**recorded, **cfg.storage_options})
    require_safe_commits(cfg.storage())  # refused here, before anything is created or a JVM starts
    if cfg.definition is not None:
        changes = plan_change(applied_definition(cfg.root), cfg.definition)  # refused: nothing created
        job = job_for_root(cfg.root, definition_file=args.definition, name=args.name)
        job = replace(job, definition_file=cfg.definition.source)
        for change in changes:
            print(f"definition: {change}", file=sys.stderr)
    elif cfg.topics:
        job = job_for_root(cfg.root, topics=list(cfg.topics), name=args.name)
        job = replace(job, topics=list(cfg.topics))
    else:
        job = None  # a topic pattern without a definition: a run, not a recorded job
    if job is not None:
        job = save_job(with_settings(
            job, stages=list(cfg.stages) if args.stages else None, max_offsets_per_trigger=cfg.max_offsets_per_trigger,
            min_partitions=cfg.min_partitions, processing_time_s=cfg.processing_time_s,
            gold_partitions=cfg.gold_partitions, master=args.master, kafka=cfg.kafka or None,
            storage_options={k: v for k, v in cfg.storage_options.items() if not is_secret(k)} or None))
        cfg = replace(cfg, query_name=args.query_name or job.name)
    print(f"pipeline: {cfg.describe()}" + (f" (job {job.name})" if job else ""), file=sys.stderr)
    own_jvm = own_jvm_reason(cfg, args.master, job)
    if args.remote and own_jvm:
        print(f"ERROR: --remote: this run needs a JVM of its own ({own_jvm})", file=sys.stderr)
        return 2
    name = f"pipeline:{cfg.query_name}"
    cmd = spark_submit_command("pipeline.py", config_to_args(cfg), master=args.master or "local[*]", name=name,
                               short_run=cfg.available_now) if own_jvm else \
        connect_or_submit_command("pipeline.py", config_to_args(cfg), args.remote, master="local[*]", name=name,
                                  short_run=True)
    return run_job_foreground(cmd, JobControl(cfg.control_dir), env=secret_environment(cfg))


def own_jvm_reason(cfg, master: str | None, job) -> str | None:
    """Why a run must be a spark-submit of its own rather than a Spark Connect client (None: it
    need not): a continuous run owns its JVM (resources, rescale, supervisor); so do a run on a
    master the user names and the run of a job with Spark resources of its own (as
    JobRunOperator.needs_own_jvm decides for the DAGs)."""
    from streamlake.storage.location import is_object_store

    if not cfg.available_now:
        return "a continuous run"
    if is_object_store(cfg.root):
        return f"a root on an object store ({cfg.root}): its credentials travel in the run's own environment"
    if master:
        return f"--master {master}"
    if job is not None and job.spark_conf():
        return f"the job's Spark resources {job.spark_conf()}"
    return None


def add_parsers(sub) -> None:
    from streamlake.pipeline.config import add_pipeline_arguments

    p = sub.add_parser("pipeline", help="pipelines from definitions: validate a definition file, run a pipeline")
    actions = p.add_subparsers(dest="pipeline_action", required=True)
    validate = actions.add_parser("validate", help="check a definition file; print what it makes (exit 2 if wrong)")
    validate.add_argument("file", help="the definition (YAML), e.g. pipelines/orders.yaml")
    validate.set_defaults(func=cmd_validate)
    run = actions.add_parser("run", help="run bronze -> silver -> gold (spark-submit); tables under --root")
    add_pipeline_arguments(run)
    run.add_argument("--name", help="the job's name (default: the definition's; another root's name gets a suffix)")
    run.add_argument("--master", default=None, help="Spark master URL (default local[*]; a spark-submit of its own)")
    add_remote_argument(run, "an available-now run")
    run.set_defaults(func=cmd_run)
