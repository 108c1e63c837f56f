"""
### restore: put a job back to a savepoint and resume it from there

Flink's `run -s <savepoint>`. Steps:

1. **restore**: stop the job if it runs; roll every table of the savepoint
   (bronze, silver, quarantine, gold, late_events) back to its Delta version
   *as a new commit* (history is kept) that also resets its `txn` state to the
   savepoint's, atomically: Kafka offsets for bronze, the upstream position
   for the others, the watermark for gold; put the savepoint's checkpoint
   copies of every stage in place.
2. **verify_restored**: bronze matches Kafka up to the savepoint (audit clean,
   offsets equal the manifest's), every bronze row is once downstream, gold
   equals a recompute from silver, data quality of the restored rows.
3. **resume**: the job runs from the savepoint's state (available-now, on
   `spark_conn_id`): everything that arrived since flows through every stage.
4. **verify_resumed**: after the new data, every check and data quality again.
5. **continue_continuous**: if the job was running continuously before the
   restore, a continuous `streaming_ingest` run is triggered to keep it running.

The form lists the existing savepoint ids (newest first); the list is refreshed
when the DAG is re-parsed. Shell: `streamlake savepoint restore ID`.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from streamlake.config import savepoint_ids
from streamlake.orchestration.dag_parts import MANUAL_OPERATION_DAG, continue_if_continuous
from streamlake.orchestration.operators import JobRunOperator, JobVerifyOperator

SAVEPOINTS = savepoint_ids()

with DAG(
    dag_id="restore",
    description="Restore a job's tables, offsets and checkpoint from a savepoint, resume, and prove consistency",
    doc_md=__doc__,
    tags=["streamlake", "operations", "savepoint"],
    **MANUAL_OPERATION_DAG,
    render_template_as_native_obj=True,
    params={
        "savepoint_id": Param(SAVEPOINTS[0] if SAVEPOINTS else "", type="string", title="Savepoint",
                              **({"enum": SAVEPOINTS} if SAVEPOINTS else {}),
                              description="Savepoint to restore (`streamlake savepoint list`); newest first."),
        "spark_conn_id": Param("spark_default", type="string", title="Spark connection",
                               description="Where the resumed job runs: spark_default (local[*]) or spark_cluster."),
    },
) as dag:

    @task(task_id="restore")
    def restore(params: dict) -> dict:
        """Stop the job, restore tables (as new commits, offsets reset) and the checkpoint."""
        from streamlake.orchestration.tasks import restore

        return restore(params["savepoint_id"])

    restored = restore()
    job = "{{ ti.xcom_pull(task_ids='restore')['job'] }}"
    check_restored = JobVerifyOperator(
        task_id="verify_restored",
        job_name=job,
        operation="restore",
        expected_offsets="{{ ti.xcom_pull(task_ids='restore')['offsets'] | tojson }}",
        doc_md="Bronze equals the savepoint (audit clean, offsets the manifest's); every stage checked.",
    )

    resume = JobRunOperator(
        task_id="resume",
        job_name=job,
        spark_conn_id="{{ params.spark_conn_id }}",
        doc_md="Run the pipeline from the savepoint's state up to what Kafka holds now (available-now).",
    )

    check_resumed = JobVerifyOperator(
        task_id="verify_resumed",
        job_name=job,
        operation="restore-resumed",
        doc_md="After the new data: every check and data quality again.",
    )

    restored >> check_restored >> resume >> check_resumed >> continue_if_continuous(
        restored, job=job, spark_conn_id="{{ params.spark_conn_id }}")
