"""Pieces several DAGs share: settings of the manual operation DAGs and the
"start the job continuously again if it ran so" tail of restore and rescale."""

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
