"""
### rescale: change a job's parallelism without changing its results

Flink's stop-with-savepoint, then `run -s <savepoint> -p <new parallelism>`.
Steps:

1. **throughput_before**: median rows/s of the job's last micro-batches, read from
   its progress log beside step 2 (it waits for nothing).
2. **savepoint_and_stop**: savepoint at a micro-batch boundary, job stopped.
3. **apply_settings**: the job spec gets the new resources: total executor
   cores (`spark.cores.max`), cores per executor, input splits
   (`minPartitions`: Kafka ranges split across tasks), `maxOffsetsPerTrigger`,
   the number of partitions of gold's aggregations, and the Spark connection
   to run on. Every later start of the job uses them.
4. **record**, beside step 5: the rescale (settings before and after, savepoint,
   throughput before) goes to the `operations` table.
5. **resume**: the job starts from the savepoint with the new settings: a run
   of its `ingest_<pipeline>` DAG with id `rescaled__<this run's id>` (continuous if
   the job ran continuously, otherwise available-now: every stage catches up
   on what arrived meanwhile). That run's **verify** proves the rescale lost
   and duplicated nothing (bronze against Kafka across the savepoint, every
   bronze row once downstream, gold equal to a recompute from silver, data
   quality of the new rows; recorded under the operation `rescale`), and its
   **rescale_throughput** records the rows/s on the new resources next to the
   throughput before. As with Flink, the rescale is done when the job is
   started on its new resources; the catch-up is the job's own run, next to
   it in the UI.

No stage keeps its state in Spark: bronze's is its offsets, silver's its
position and its own table, each aggregate's its gold table and watermark
(Delta `txn`). Spark 4.2 cannot change a stateful checkpoint's state
partitions, but there is no such state here, so gold's parallelism can change
and the results stay identical (sums are exact decimals).

Works on `local[*]` and on the standalone cluster (`streamlake spark start`,
connection `spark_cluster`), e.g. from one worker's cores to two.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from streamlake.orchestration.dag_parts import MANUAL_OPERATION_DAG, OPERATION_MACROS, job_param, resume_job

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
        "executor_cores": Param(1, type=["null", "integer"], minimum=1, title="Cores per executor",
                                description="spark.executor.cores: cores of each executor (executors = total / this)."),
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

    @task(task_id="record")
    def record(params: dict, settings: dict, savepoint: dict, before: dict) -> dict:
        """The rescale, with the throughput before, into the operations table."""
        from streamlake.orchestration.tasks import record_rescale

        return record_rescale(params["job"], settings, savepoint, before)

    measured = before()
    sp = savepoint_and_stop()
    settings = apply_settings(savepoint=sp)
    record(settings=settings, savepoint=sp, before=measured)
    settings >> resume_job(sp, after="rescale")  # the job starts while the rescale is recorded
