"""
### rescale: change a job's parallelism without changing its results

Flink's stop-with-savepoint, then `run -s <savepoint> -p <new parallelism>`, with the new
run started beside the stop, as a blue-green deployment starts the new version beside the
old. Steps:

1. **resume**, first: the job's next run, a run of its `ingest_<pipeline>` DAG with id
   `rescaled__<this run's id>` (continuous if the job runs continuously now, otherwise
   available-now: every stage catches up on what arrived meanwhile), on the new settings.
   Its driver starts its JVM and Spark session on the new resources while steps 2-3 run,
   then waits for this run to hand the stopped job over before it touches a table. A job
   running now is handed over when it has stopped: a run already in progress ends first.
2. **throughput_before**, beside it: median rows/s of the job's last micro-batches, read
   from its progress log (it waits for nothing).
3. **savepoint_and_stop**, once the run of step 1 exists (its mode is the job's before the
   stop): savepoint at a micro-batch boundary, job stopped. It announces the handover first:
   from then until the run of step 1 holds the job, any other run that would start the job
   (a scheduled run of `ingest_<pipeline>` that got its slot first) leaves it alone and is
   skipped, saying why, so nothing runs on the old settings after the stop.
4. **apply_settings**: the job spec gets the new resources: total executor cores
   (`spark.cores.max`), cores per executor, input splits (`minPartitions`: Kafka ranges
   split across tasks), `maxOffsetsPerTrigger`, the number of partitions of gold's
   aggregations, and the Spark connection to run on; every later start of the job uses
   them. Then it **hands the job over** to the run of step 1. If step 3 or 4 fails for good,
   that run is told at once and ends without starting the job.
5. **record**, beside the run: the rescale (settings before and after, savepoint, throughput before) goes
   to the `operations` table.

The run of step 1 completes the rescale: its **verify** proves the rescale lost and
duplicated nothing (bronze against Kafka across the savepoint, every bronze row once
downstream, gold equal to a recompute from silver, data quality of the new rows; recorded
under the operation `rescale`), and its **rescale_throughput** records the rows/s on the new
resources next to the throughput before. As with Flink, the rescale is done when the job is
started on its new resources; the catch-up is the job's own run, next to it in the UI.

No stage keeps its state in Spark: bronze's is its offsets, silver's its position and its
own table, each aggregate's its gold table and watermark (Delta `txn`). Spark 4.2 cannot
change a stateful checkpoint's state partitions, but there is no such state here, so gold's
parallelism can change and the results stay identical (sums are exact decimals).

Works on `local[*]` and on the standalone cluster (`streamlake spark start`, connection
`spark_cluster`), e.g. from one core to two (the form's default: one executor of two cores,
which a worker of `make run`'s cluster offers; settings no worker of the platform's cluster
can host are refused before the stop, and the job keeps running).
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from streamlake.orchestration.dag_parts import (
    MANUAL_OPERATION_DAG,
    OPERATION_MACROS,
    job_param,
    operation_failed,
    resume_job_before_stop,
)
from streamlake.orchestration.tasks import refuse_handover

with DAG(
    dag_id="rescale",
    description="Savepoint, stop, restart a job with new parallelism from the savepoint; its run proves consistency",
    doc_md=__doc__,
    tags=["streamlake", "operations", "rescale"],
    **MANUAL_OPERATION_DAG,
    render_template_as_native_obj=True,
    user_defined_macros=OPERATION_MACROS,
    params={
        "job": job_param(description="The pipeline to rescale."),
        "spark_conn_id": Param("spark_cluster", type="string", enum=["spark_cluster", "spark_default"],
                               title="Spark connection",
                               description="Master to run on after the rescale: spark_cluster "
                                           "(spark://127.0.0.1:7077) or spark_default (local[*])."),
        "total_executor_cores": Param(2, type=["null", "integer"], minimum=1, title="Total executor cores",
                                      description="spark.cores.max: cores the job may use on the cluster."),
        "executor_cores": Param(2, type=["null", "integer"], minimum=1, title="Cores per executor",
                                description="spark.executor.cores: cores of each executor (executors = total / this). "
                                            "Default: one executor of both cores, one JVM to start and warm."),
        "min_partitions": Param(None, type=["null", "integer"], minimum=1, title="Input splits",
                                description="minPartitions: split Kafka offset ranges into at least this many tasks "
                                            "(empty: one task per partition)."),
        "max_offsets_per_trigger": Param(None, type=["null", "integer"], minimum=1, title="Max offsets per trigger",
                                         description="Records per micro-batch at most (empty: keep the job's)."),
        "gold_partitions": Param(None, type=["null", "integer"], minimum=1, title="Gold partitions",
                                 description="Shuffle partitions of gold's windowed aggregations, i.e. their "
                                             "parallelism (empty: keep the job's)."),
    },
) as dag:

    @task(task_id="throughput_before")
    def before(params: dict) -> dict:
        """Median rows/s of the job's last micro-batches before the rescale."""
        from streamlake.orchestration.tasks import throughput

        return throughput(params["job"])

    @task(task_id="savepoint_and_stop", on_failure_callback=[refuse_handover, operation_failed])
    def savepoint_and_stop(params: dict, run_id: str) -> dict:
        """Stop-with-savepoint at a micro-batch boundary, the handover announced first: from then
        on no other run starts the job before the run `resume` started. Settings that cannot run
        are refused before anything stops."""
        from streamlake.orchestration.dag_parts import rescale_settings
        from streamlake.orchestration.tasks import announce_handover, check_rescale_fits, take_savepoint

        check_rescale_fits(params["job"], rescale_settings(params))  # refused here, the job keeps running
        announce_handover(params["job"], run_id)
        return take_savepoint(params["job"], stop=True, note="rescale")

    @task(task_id="apply_settings", on_failure_callback=[refuse_handover, operation_failed])
    def apply_settings(params: dict, savepoint: dict, run_id: str) -> dict:
        """Write the new resources into the job spec (every later start uses them), then hand the
        stopped job over to the run `resume` started."""
        from streamlake.orchestration.dag_parts import rescale_settings
        from streamlake.orchestration.tasks import apply_rescale, hand_over, progress_mark

        settings = apply_rescale(params["job"], rescale_settings(params))
        settings["progress_mark"] = progress_mark(params["job"])  # before the resumed run writes progress
        hand_over(params["job"], run_id, savepoint=savepoint["id"], settings=settings["after"])
        return settings

    @task(task_id="record")
    def record(params: dict, settings: dict, savepoint: dict, before: dict) -> dict:
        """The rescale, with the throughput before, into the operations table."""
        from streamlake.orchestration.tasks import record_rescale

        return record_rescale(params["job"], settings, savepoint, before)

    resume = resume_job_before_stop(after="rescale")  # the job's run starts first and waits for the handover
    measured = before()
    sp = savepoint_and_stop()
    resume >> sp  # the run's mode is read from the job before the stop
    settings = apply_settings(savepoint=sp)
    record(settings=settings, savepoint=sp, before=measured)
