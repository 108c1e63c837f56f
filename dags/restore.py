"""
### restore: put a job back to a savepoint and resume it from there

Flink's `run -s <savepoint>`. Steps:

1. **restore**: stop the job if it runs; roll every table of the savepoint
   (bronze, silver, quarantine, each aggregate's gold and late events) back to its Delta version
   *as a new commit* (history is kept) that also resets its `txn` state to the
   savepoint's, atomically: Kafka offsets for bronze, the upstream position
   for the others, the watermark for each gold table; put the savepoint's
   checkpoint copies of every stage in place. An aggregate added after the
   savepoint is moved aside and built again from the restored silver.
2. **verify_restored**: bronze matches Kafka up to the savepoint (audit clean,
   offsets equal the manifest's), every bronze row is once downstream, gold
   equals a recompute from silver, data quality of the restored rows.
3. **resume**: the job starts from the savepoint's state: a run of its
   `ingest_<pipeline>` DAG with id `restored__<this run's id>` (continuous if the job ran
   continuously before the restore, otherwise available-now on
   `spark_conn_id`). Everything that arrived since the savepoint flows through
   every stage, and that run's **verify** checks every stage and the data
   quality of the new rows (recorded under the operation `restore`). As with
   Flink's `run -s`, the restore is done when its state is proven and the job
   started; the catch-up is the job's own run, next to it in the UI.

The form restores the newest savepoint of the chosen pipeline unless a savepoint
id is given (the field suggests the existing ids, newest first; the list is
refreshed when the DAG is re-parsed). Shell: `streamlake savepoint restore ID`.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from streamlake.config import savepoint_ids
from streamlake.orchestration.dag_parts import MANUAL_OPERATION_DAG, OPERATION_MACROS, job_param, resume_job
from streamlake.orchestration.operators import JobVerifyOperator

SAVEPOINTS = savepoint_ids()

with DAG(
    dag_id="restore",
    description="Restore a job's tables, offsets and checkpoint from a savepoint, resume, and prove consistency",
    doc_md=__doc__,
    tags=["streamlake", "operations", "savepoint"],
    **MANUAL_OPERATION_DAG,
    render_template_as_native_obj=True,
    user_defined_macros=OPERATION_MACROS,
    params={
        "job": job_param(description="The pipeline to restore (its newest savepoint, unless an id is given)."),
        "savepoint_id": Param(None, type=["null", "string"], title="Savepoint id",
                              **({"examples": SAVEPOINTS} if SAVEPOINTS else {}),
                              description="Savepoint to restore (`streamlake savepoint list`); empty: the newest "
                                          "savepoint of the pipeline above."),
        "spark_conn_id": Param("spark_default", type="string", enum=["spark_default", "spark_cluster"],
                               title="Spark connection",
                               description="Where the resumed job runs: spark_default (local[*]) or spark_cluster."),
    },
) as dag:

    @task(task_id="restore")
    def restore(params: dict) -> dict:
        """Stop the job, restore tables (as new commits, offsets reset) and the checkpoint."""
        from streamlake.orchestration.tasks import restore

        return restore(params.get("savepoint_id"), params["job"])

    restored = restore()
    job = "{{ ti.xcom_pull(task_ids='restore')['job'] }}"
    check_restored = JobVerifyOperator(
        task_id="verify_restored",
        job_name=job,
        operation="restore",
        expected_offsets="{{ ti.xcom_pull(task_ids='restore')['offsets'] | tojson }}",
        doc_md="Bronze equals the savepoint (audit clean, offsets the manifest's); every stage checked.",
    )

    restored >> check_restored >> resume_job(restored, after="restore")
