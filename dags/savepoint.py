"""
### savepoint: a pipeline's complete state at a micro-batch boundary

Flink's *savepoint* / *stop-with-savepoint* for Spark + Delta. The job is
brought to micro-batch boundaries (a running job pauses every stage between
batches; an idle one is kept from starting), and a savepoint is written to
`$STREAMLAKE_HOME/savepoints/<id>/`:

* `manifest.json`: id, time, every table's Delta version (bronze, silver,
  quarantine, and each aggregate's gold and late events) with the `txn` state a
  restore resets: the Kafka offsets per partition *as recorded in bronze*, each
  downstream table's position in its upstream, each gold table's watermark; the
  job's settings, its pipeline definition and the code version;
* `checkpoints/`: a copy of every stage's Spark query checkpoint.

The job then resumes (or stops, with *Stop after savepoint*), and **verify**
audits bronze *at the savepoint's version* (its offsets must equal the
manifest's), checks every bronze row once downstream and every gold table
against a recompute, and validates data quality. It runs after the job
resumed, against the pinned version, so the pause lasts only for the copy.

Use the id with the `restore` DAG or `streamlake savepoint restore ID`. The
same from the shell: `streamlake savepoint create --job NAME [--stop]`.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from streamlake.orchestration.dag_parts import MANUAL_OPERATION_DAG, job_param, operation_proven
from streamlake.orchestration.operators import JobVerifyOperator

with DAG(
    dag_id="savepoint",
    description="Savepoint of a pipeline (Delta versions, Kafka offsets, checkpoint copy), then a consistency check",
    doc_md=__doc__,
    tags=["streamlake", "operations", "savepoint"],
    **MANUAL_OPERATION_DAG,
    params={
        "job": job_param(description="The pipeline to savepoint."),
        "stop": Param(False, type="boolean", title="Stop after savepoint",
                      description="Stop the job after the savepoint (Flink's stop-with-savepoint) "
                                  "instead of resuming it."),
        "note": Param(None, type=["null", "string"], title="Note",
                      description="Optional free text kept in the manifest (shown in the Savepoints view)."),
    },
) as dag:

    @task(task_id="take_savepoint")
    def take(params: dict) -> dict:
        """Pause at a micro-batch boundary, copy the checkpoint, record versions and offsets."""
        from streamlake.orchestration.tasks import take_savepoint

        return take_savepoint(params["job"], params["stop"], params.get("note") or "")

    verify = JobVerifyOperator(
        task_id="verify",
        job_name="{{ params.job }}",
        operation="savepoint",
        expected_offsets="{{ ti.xcom_pull(task_ids='take_savepoint')['offsets'] | tojson }}",
        version="{{ ti.xcom_pull(task_ids='take_savepoint')['version'] }}",
        doc_md="Bronze at the savepoint's version holds exactly its offsets; every stage checked; data quality. "
               "Its success proves the savepoint (operation_outcomes).",
        on_success_callback=operation_proven,
    )

    take() >> verify
