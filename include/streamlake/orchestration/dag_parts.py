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


def resumed_run_conf(state: dict, spark_conn_id: str, after: str) -> dict:
    """The conf of the run that starts the job again after the operation ``after``
    (``restore`` or ``rescale``): continuous if the job ran continuously before it, otherwise
    scheduled (available-now); the job and ``mode``/``job_was_running`` come from ``state``,
    the operation's XCom."""
    from streamlake.orchestration.pipeline_dags import RESUMES_CONF_KEY

    continuous = state["mode"] == "continuous" and state["job_was_running"]
    return {"job": state["job"], "mode": "continuous" if continuous else "scheduled", "spark_conn_id": spark_conn_id,
            RESUMES_CONF_KEY: after}


# What the operation DAGs' templates may call (the resumed run's conf, rendered in the
# trigger task itself: no task of its own between the operation and the job's start).
OPERATION_MACROS = {"resumed_run_conf": resumed_run_conf}


def resumed_run_prefix(after: str) -> str:
    """The prefix of the id of the run that starts the job after the operation ``after``
    (``restore`` or ``rescale``): ``restored__`` / ``rescaled__``, then the operation's run id."""
    return f"{after}d__"


def resume_job(state, after: str):
    """The task that starts the job again after the operation ``after`` (``restore`` or
    ``rescale``) stopped it and put its state or settings in place, as Flink's ``run -s``
    does: a run of the job's ``ingest_<job>`` DAG with :func:`resumed_run_conf` (continuous
    if the job ran continuously before, otherwise available-now: it catches up with what
    Kafka holds). Its conf names the operation (``resumes``), so its checks and quality
    results are recorded under it (and after a rescale it records the throughput on the new
    resources). The run is not waited for: the operation is done once the job is started;
    the run's id is ``restored__`` / ``rescaled__`` plus the operation's run id, so the UI and
    the REST API find it. ``state`` is the operation task's XCom (a dict with ``job``,
    ``mode`` and ``job_was_running``); the master is the DAG's ``spark_conn_id`` param. The
    DAG must render templates as native objects and have :data:`OPERATION_MACROS`."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

    pulled = f"ti.xcom_pull(task_ids='{state.operator.task_id}')"
    return TriggerDagRunOperator(
        task_id="resume",
        trigger_dag_id=f"ingest_{{{{ {pulled}['job'] }}}}",
        trigger_run_id=resumed_run_prefix(after) + "{{ run_id }}",
        conf=f"{{{{ resumed_run_conf({pulled}, params.spark_conn_id, '{after}') }}}}",
        wait_for_completion=False,
        doc_md=f"Start the job after the {after}: a run of its ingest DAG (checks and quality after it).",
    )
