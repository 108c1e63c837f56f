"""
### rescale: change a job's parallelism without changing its results

Flink's `modify -p` (savepoint, stop, restart with a new parallelism). Steps:

1. **throughput_before**: median rows/s of the job's last micro-batches.
2. **savepoint_and_stop**: savepoint at a micro-batch boundary, job stopped.
3. **apply_settings**: the job spec gets the new resources: total executor
   cores (`spark.cores.max`), cores per executor, input splits
   (`minPartitions`: Kafka ranges split across tasks), `maxOffsetsPerTrigger`,
   the number of partitions of gold's aggregation, and the Spark connection
   to run on.
4. **restart**: the job restarts from the savepoint with the new settings
   (available-now: every stage catches up on what arrived meanwhile). No
   stage keeps its state in Spark: bronze's is its offsets, silver's its
   position and its own table, gold's the gold table and its watermark (Delta
   `txn`). Spark 4.2 cannot change a stateful checkpoint's state partitions,
   but there is no such state here, so gold's parallelism can change and the
   results stay identical (sums are exact decimals).
5. **throughput_after** and **record**: rows/s after the rescale; both numbers go
   to the `operations` table and the task log.
6. **verify**: after the rescale, every check (bronze exactly once, every
   bronze row once downstream, gold equal to a recompute) and data quality, on
   `spark_default` whatever the job runs on.
7. **continue_continuous**: a job that ran continuously is started again.

Works on `local[*]` and on the standalone cluster (`streamlake spark start`,
connection `spark_cluster`), e.g. from one worker's cores to two.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from streamlake.operations.jobs import DEMO_JOB
from streamlake.orchestration.dag_parts import MANUAL_OPERATION_DAG, continue_if_continuous
from streamlake.orchestration.operators import JobRunOperator, JobVerifyOperator

with DAG(
    dag_id="rescale",
    description="Savepoint, stop, restart a job with new parallelism, record throughput, check consistency",
    doc_md=__doc__,
    tags=["streamlake", "operations", "rescale"],
    **MANUAL_OPERATION_DAG,
    render_template_as_native_obj=True,
    params={
        "job": Param(DEMO_JOB, type="string", title="Job", description="Name of the job to rescale."),
        "spark_conn_id": Param("spark_cluster", type="string", title="Spark connection",
                               description="Master to run on after the rescale: spark_cluster "
                                           "(spark://127.0.0.1:7077) or spark_default (local[*])."),
        "total_executor_cores": Param(2, type=["null", "integer"], minimum=1, title="Total executor cores",
                                      description="spark.cores.max: cores the job may use on the cluster."),
        "executor_cores": Param(1, type=["null", "integer"], minimum=1, title="Cores per executor",
                                description="spark.executor.cores: cores of each executor (executors = total / this)."),
        "min_partitions": Param(None, type=["null", "integer"], minimum=1, title="Input splits",
                                description="minPartitions: split Kafka offset ranges into at least this many tasks "
                                            "(empty: one task per partition)."),
        "max_offsets_per_trigger": Param(None, type=["null", "integer"], minimum=1, title="Max offsets per trigger",
                                         description="Records per micro-batch at most (empty: keep the job's)."),
        "gold_partitions": Param(None, type=["null", "integer"], minimum=1, title="Gold partitions",
                                 description="Shuffle partitions of gold's windowed aggregation, i.e. its "
                                             "parallelism (empty: keep the job's)."),
    },
) as dag:

    @task(task_id="throughput_before")
    def before(params: dict) -> dict:
        """Median rows/s of the job's last micro-batches before the rescale."""
        from streamlake.orchestration.tasks import throughput

        return throughput(params["job"])

    @task(task_id="savepoint_and_stop")
    def savepoint_and_stop(params: dict) -> dict:
        """Stop-with-savepoint at a micro-batch boundary."""
        from streamlake.orchestration.tasks import take_savepoint

        return take_savepoint(params["job"], stop=True, note="rescale")

    @task(task_id="apply_settings")
    def apply_settings(params: dict, savepoint: dict) -> dict:
        """Write the new resources into the job spec (every later start uses them)."""
        from streamlake.orchestration.tasks import apply_rescale, progress_mark

        settings = apply_rescale(params["job"], params["spark_conn_id"], params["total_executor_cores"],
                                 params["executor_cores"], params["min_partitions"], params["max_offsets_per_trigger"],
                                 params.get("gold_partitions"))
        return {**settings, "progress_mark": progress_mark(params["job"])}

    restart = JobRunOperator(
        task_id="restart",
        job_name="{{ params.job }}",
        spark_conn_id="{{ params.spark_conn_id }}",
        doc_md="Restart from the savepoint with the new settings (available-now catch-up).",
    )

    @task(task_id="throughput_after")
    def after(params: dict, settings: dict) -> dict:
        """Median rows/s of the micro-batches run with the new settings."""
        from streamlake.orchestration.tasks import throughput

        return throughput(params["job"], start_line=settings["progress_mark"])

    @task(task_id="record")
    def record(params: dict, settings: dict, savepoint: dict, before: dict, after: dict) -> dict:
        """Throughput before and after, with the settings, into the operations table."""
        from streamlake.orchestration.tasks import record_rescale

        return record_rescale(params["job"], settings, savepoint, before, after)

    check = JobVerifyOperator(
        task_id="verify",
        job_name="{{ params.job }}",
        operation="rescale",
        doc_md="Every check and data quality after the rescale (on spark_default: the checks read only what "
               "changed, a local driver answers sooner than executors on the cluster).",
    )

    measured = before()
    sp = savepoint_and_stop()
    measured >> sp
    settings = apply_settings(savepoint=sp)
    settings >> restart
    measured_after = after(settings=settings)
    restart >> measured_after
    recorded = record(settings=settings, savepoint=sp, before=measured, after=measured_after)
    recorded >> check >> continue_if_continuous(sp, job="{{ params.job }}",
                                                  spark_conn_id="{{ params.spark_conn_id }}")
