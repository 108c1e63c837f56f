"""Pieces several DAGs share: settings of the manual operation DAGs and the "start the
job again" tail of restore and rescale."""

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


def job_param(title: str = "Pipeline", description: str = "The pipeline (job) to operate on."):
    """The ``job`` param of the operation DAGs: a drop-down of the defined jobs (every
    definition in the pipelines directory and every `streamlake job define`), refreshed
    when the DAG files are parsed."""
    from airflow.sdk import Param

    from streamlake.operations.jobs import DEMO_JOB, list_jobs

    jobs = list_jobs() or [DEMO_JOB]
    return Param(DEMO_JOB if DEMO_JOB in jobs else jobs[0], type="string", enum=jobs, title=title,
                 description=description)


def resume_job(state, job: str, spark_conn_id: str, after: str):
    """Tasks that start the job again after the operation ``after`` (``restore`` or
    ``rescale``) stopped it and put its state or settings in place, as Flink's ``run -s``
    does: a run of the job's ``ingest_<job>`` DAG, continuous if the job ran continuously
    before, otherwise available-now (it catches up with what Kafka holds). Its conf names
    the operation (``resumes``), so its checks and quality results are recorded under it
    (and after a rescale it records the throughput on the new resources). The run is not
    waited for: the operation is done once the job is started; the run's id is
    ``restored__`` / ``rescaled__`` plus the operation's run id, so the UI and the REST
    API find it. ``state`` is an XCom dict with ``mode`` and ``job_was_running``.
    Returns the first task."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
    from airflow.sdk import task

    from streamlake.orchestration.pipeline_dags import RESUMES_CONF_KEY

    @task(task_id="resume_settings")
    def resume_settings(state: dict, job: str, spark_conn_id: str) -> dict:
        """The resumed run's conf: the job's mode before the operation, the chosen master."""
        continuous = state["mode"] == "continuous" and state["job_was_running"]
        return {"job": job, "mode": "continuous" if continuous else "scheduled", "spark_conn_id": spark_conn_id,
                RESUMES_CONF_KEY: after}

    settings = resume_settings(state, job, spark_conn_id)
    settings >> TriggerDagRunOperator(
        task_id="resume",
        trigger_dag_id="ingest_{{ ti.xcom_pull(task_ids='resume_settings')['job'] }}",
        trigger_run_id=f"{after}d__{{{{ run_id }}}}",
        conf=settings,
        wait_for_completion=False,
        doc_md=f"Start the job after the {after}: a run of its ingest DAG (checks and quality after it).",
    )
    return settings
