"""spark-submit entrypoint: the pipeline, Kafka -> bronze -> silver -> gold, exactly once.

    spark-submit --master local[*] jobs/pipeline.py --definition pipelines/sensors.yaml \
        --root /data/sensors --available-now
    python jobs/pipeline.py --definition pipelines/sensors.yaml --root /data/sensors \
        --available-now --remote sc://127.0.0.1:15002

An available-now run can run on a long-lived Spark Connect server (``--remote``)
instead of a JVM of its own: its ``foreachBatch`` sinks then run in a Python
process of the server's, on the server's machine, which must see the root (the
platform's server runs beside it). A continuous run owns its JVM (its resources,
rescaling, the supervisor), so it has no ``--remote``.

A run a rescale starts before it stops the job gets ``--await-handover <the
rescale's run id>``: it starts its session (and the executors' Python workers),
then waits for the rescale to hand the stopped job over before it reads or
writes a table (:meth:`streamlake.pipeline.control.JobControl.await_handover`).
Any other run that takes the job lock while such a handover is pending (the
rescale stopped the job for its own run) leaves the job alone, having touched
nothing, and exits with status 3
(:meth:`streamlake.pipeline.control.JobControl.claim`).

Usually started by ``streamlake pipeline run``, a named job (``streamlake job
run``) or the Airflow DAGs. Exit status: 0 on success or a requested stop, 2 for
a platform error (bad option or definition, a definition change that would make
existing tables wrong, unknown topic, data loss, offset or position gap, change
commit upstream, a handover refused or not given in time), 3 for a run that left
the job to another operation's handover, 1 for anything else.
"""

from __future__ import annotations

import argparse
import sys
import time

from streamlake import logs
from streamlake.errors import StreamLakeError
from streamlake.pipeline.control import HandoverPending, JobControl
from streamlake.pipeline.config import add_pipeline_arguments, config_from_args
from streamlake.pipeline.definition_check import check_definition
from streamlake.pipeline.driver import describe_failure, platform_error, run_stages
from streamlake.spark.session import get_spark

# How long a run a rescale started waits for the rescale's handover: its savepoint may wait up to
# 180 s for the job and be retried once after 30 s (the rescale DAG), which then refuses the
# handover when it fails; this only bounds a rescale that neither hands over nor fails.
HANDOVER_TIMEOUT_S = 900.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pipeline", description=__doc__.split("\n")[0])
    add_pipeline_arguments(parser)
    parser.add_argument("--remote", help="sc://host:port: an available-now run on this Spark Connect server "
                                          "(no JVM of its own)")
    parser.add_argument("--await-handover", metavar="OPERATION",
                        help="start the session, then wait until the operation of this id (a rescale's run id) "
                             "hands the stopped job over, before touching any table; exit status 2 if it fails "
                             f"or does not within {HANDOVER_TIMEOUT_S:g} s")
    args = parser.parse_args(argv)
    logs.configure()
    try:
        cfg = config_from_args(args)
    except StreamLakeError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    if args.remote and not cfg.available_now:
        print("ERROR: --remote runs an available-now run only: a continuous run owns its JVM", file=sys.stderr)
        return 2
    control = JobControl(cfg.control_dir)
    spark = get_spark(f"pipeline:{cfg.query_name}", remote=args.remote)
    # Imported once the session is up: the SparkContext asks a cluster for its executors first,
    # whose JVMs start while this imports pyarrow and the Kafka client (0.4 s idle, about twice
    # that on a busy machine: a rescale's catch-up waits for its new executors).
    from streamlake.pipeline.ingest import begin_warm_up

    print(f"pipeline: {cfg.describe()}", flush=True)
    try:
        if cfg.definition is not None:  # before the warm-up: a refused definition starts no Python worker
            check_definition(cfg.definition, spark=spark)
        if not args.await_handover:  # a rescale stopped the job for its own run meanwhile: leave before the
            control.check_no_handover_pending()  # warm-up (run_stages checks again once it holds the job lock)
        begin_warm_up(spark, cfg.bronze_config())  # the executors' Python starts while the driver sets up
        if args.await_handover:  # started while the operation stops the job: nothing is read or written before
            waiting = time.monotonic()
            control.await_handover(args.await_handover, HANDOVER_TIMEOUT_S, report=lambda line: print(line, flush=True))
            print(f"pipeline: {args.await_handover} handed the job over (waited {time.monotonic() - waiting:.1f} s)",
                  flush=True)
        stages = cfg.build_stages()
    except HandoverPending as exc:
        print(f"pipeline: not started: {exc}", flush=True)
        spark.stop()
        return HandoverPending.exit_status
    except StreamLakeError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        control.write_state(last_failure={"at": time.time(), "message": f"{type(exc).__name__}: {exc}"})
        spark.stop()
        return 2
    try:
        summary = run_stages(spark, stages, control, available_now=cfg.available_now,
                             report=lambda line: print(line, flush=True), query_name=cfg.query_name,
                             handover=args.await_handover)
    except HandoverPending as exc:
        print(f"pipeline: not started: {exc}", flush=True)
        return HandoverPending.exit_status
    except Exception as exc:  # noqa: BLE001 - turned into a readable message and an exit status
        message = describe_failure(exc)
        print(f"ERROR: {message}", file=sys.stderr, flush=True)
        control.write_state(last_failure={"at": time.time(), "message": message})
        return 2 if platform_error(message) else 1
    finally:
        spark.stop()
    per_stage = ", ".join(f"{name} {t['rows']} rows in {t['batches']} micro-batches"
                          for name, t in summary["stages"].items())
    print(f"pipeline finished: {per_stage}; {summary['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
