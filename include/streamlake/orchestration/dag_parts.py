"""Pieces several DAGs share: settings of the manual operation DAGs, the "start the
job continuously again if it ran so" tail of rescale and the "run the job from the
restored state" tail of restore."""

from __future__ import annotations

import datetime as dt

START_DATE = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

# Manual-only operation DAGs (savepoint, restore, rescale): unpaused, so a UI
# trigger runs at once; one retry (each step is safe to repeat).
MANUAL_OPERATION_DAG = {
    "schedule": None,
    "start_date": START_DATE,
    "catchup": False,
    "is_paused_upon_creation": False,
    "default_args": {"owner": "streamlake", "retries": 1, "retry_delay": dt.timedelta(seconds=30)},
}


def continue_if_continuous(state, job: str, spark_conn_id: str):
    """Tasks that trigger a continuous ``streaming_ingest`` run when ``state`` (an
    XCom dict with ``mode`` and ``job_was_running``) says the job ran continuously
    before the operation stopped it. Returns the first task."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
    from airflow.sdk import task

    @task.short_circuit(task_id="was_continuous", ignore_downstream_trigger_rules=False)
    def was_continuous(state: dict) -> bool:
        """Only a job that ran continuously before the operation is started continuously again."""
        return state["mode"] == "continuous" and state["job_was_running"]

    trigger = TriggerDagRunOperator(
        task_id="continue_continuous",
        trigger_dag_id="streaming_ingest",
        conf={"mode": "continuous", "job": job, "spark_conn_id": spark_conn_id},
        wait_for_completion=False,
    )
    first = was_continuous(state)
    first >> trigger
    return first


def resume_from_restored_state(state, job: str, spark_conn_id: str):
    """Tasks that start the job from the state a restore put in place (Flink's ``run -s``):
    a ``streaming_ingest`` run, continuous if the job ran continuously before the
    restore, otherwise available-now (it catches up with what Kafka holds and runs every
    check and data quality after it). The run is not waited for: the restore is done
    once its state is proven and the job started; the run's id is ``restored__`` plus
    the restore's run id, so the UI and the REST API find it. Returns the first task."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
    from airflow.sdk import task

    @task(task_id="resume_settings")
    def resume_settings(state: dict, job: str, spark_conn_id: str) -> dict:
        """The resumed run's params: the job's mode before the restore, the chosen master."""
        continuous = state["mode"] == "continuous" and state["job_was_running"]
        return {"job": job, "mode": "continuous" if continuous else "scheduled", "spark_conn_id": spark_conn_id}

    settings = resume_settings(state, job, spark_conn_id)
    settings >> TriggerDagRunOperator(
        task_id="resume",
        trigger_dag_id="streaming_ingest",
        trigger_run_id="restored__{{ run_id }}",
        conf=settings,
        wait_for_completion=False,
        doc_md="Start the job from the restored state: a streaming_ingest run (checks and quality after it).",
    )
    return settings
