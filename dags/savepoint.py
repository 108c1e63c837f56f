"""
### savepoint: the job's complete state at a micro-batch boundary

Flink's *savepoint* / *stop-with-savepoint* for Spark + Delta. The job is
brought to micro-batch boundaries (a running job pauses every stage between
batches; an idle one is kept from starting), and a savepoint is written to
`$STREAMLAKE_HOME/savepoints/<id>/`:

* `manifest.json`: id, time, every table's Delta version (bronze, silver,
  quarantine, gold, late_events) with the `txn` state a restore resets: the
  Kafka offsets per partition *as recorded in bronze*, each downstream table's
  position in its upstream, gold's watermark; the job config and the code
  version;
* `checkpoints/`: a copy of every stage's Spark query checkpoint.

The job then resumes (or stops, with `stop=true`), and **verify** audits bronze
*at the savepoint's version* (its offsets must equal the manifest's), checks
every bronze row once downstream and gold against a recompute, and validates
data quality. It runs after the job resumed, against the pinned version, so the
pause lasts only for the copy.

Use the id with the `restore` DAG or `streamlake savepoint restore ID`. The
same from the shell: `streamlake savepoint create --job NAME [--stop]`.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from streamlake.operations.jobs import DEMO_JOB
from streamlake.orchestration.dag_parts import MANUAL_OPERATION_DAG
from streamlake.orchestration.operators import JobVerifyOperator

with DAG(
    dag_id="savepoint",
    description="Savepoint of a job (Delta versions, Kafka offsets, checkpoint copy), then a consistency check",
    doc_md=__doc__,
    tags=["streamlake", "operations", "savepoint"],
    **MANUAL_OPERATION_DAG,
    params={
        "job": Param(DEMO_JOB, type="string", title="Job", description="Name of the job to savepoint."),
        "stop": Param(False, type="boolean", title="Stop after savepoint",
                      description="Stop the job after the savepoint (Flink's stop-with-savepoint) "
                                  "instead of resuming it."),
        "note": Param("", type="string", title="Note", description="Free text kept in the manifest."),
    },
) as dag:

    @task(task_id="take_savepoint")
    def take(params: dict) -> dict:
        """Pause at a micro-batch boundary, copy the checkpoint, record versions and offsets."""
        from streamlake.orchestration.tasks import take_savepoint

        return take_savepoint(params["job"], params["stop"], params["note"])

    verify = JobVerifyOperator(
        task_id="verify",
        job_name="{{ params.job }}",
        operation="savepoint",
        expected_offsets="{{ ti.xcom_pull(task_ids='take_savepoint')['offsets'] | tojson }}",
        version="{{ ti.xcom_pull(task_ids='take_savepoint')['version'] }}",
        doc_md="Bronze at the savepoint's version holds exactly its offsets; every stage checked; data quality.",
    )

    take() >> verify
