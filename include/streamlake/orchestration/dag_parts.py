"""Pieces several DAGs share: settings of the manual operation DAGs, the "start the
job again" tail of restore and rescale, and the conf keys of the run it starts."""

from __future__ import annotations

import datetime as dt

START_DATE = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
RESUMES_CONF_KEY = "resumes"  # set by restore and rescale when they start the job: the operation it completes
# Set by a rescale, which starts the job's run before it stops the job: the settings the run uses,
# and the rescale's run id, whose handover the run's driver waits for before it touches a table.
SETTINGS_CONF_KEY = "settings"
HANDOVER_CONF_KEY = "handover"

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


def resumed_run_conf(state: dict, spark_conn_id: str, after: str, settings: dict | None = None,
                     handover: str | None = None) -> dict:
    """The conf of the run that starts the job again after the operation ``after``
    (``restore`` or ``rescale``): continuous if the job ran continuously before it, otherwise
    scheduled (available-now); the job and ``mode``/``job_was_running`` come from ``state``
    (the operation's XCom, or :func:`current_state`). A run started before the operation
    stops the job also gets the operation's ``settings`` and the ``handover`` it waits for
    (:func:`resume_job_before_stop`)."""
    continuous = state["mode"] == "continuous" and state["job_was_running"]
    conf = {"job": state["job"], "mode": "continuous" if continuous else "scheduled", "spark_conn_id": spark_conn_id,
            RESUMES_CONF_KEY: after}
    if settings is not None:
        conf[SETTINGS_CONF_KEY] = settings
    if handover is not None:
        conf[HANDOVER_CONF_KEY] = handover
    return conf


def current_state(job: str) -> dict:
    """The job's state as an operation's XCom gives it (``job``, ``mode``, ``job_was_running``),
    read now: for the run an operation starts before it stops the job. A job whose supervisor
    is between two starts of its driver is running."""
    from streamlake.operations.jobs import load_job

    control = load_job(job).control
    return {"job": job, "mode": control.read_state().get("mode"),
            "job_was_running": control.is_running() or control.is_supervised()}


def rescale_settings(params) -> dict:
    """The rescale settings among a DAG's ``params`` (:data:`~streamlake.operations.jobs.RESCALE_SETTINGS`)."""
    from streamlake.operations.jobs import RESCALE_SETTINGS

    return {k: params.get(k) for k in RESCALE_SETTINGS}


# What the operation DAGs' templates may call (the resumed run's conf, rendered in the
# trigger task itself: no task of its own between the operation and the job's start).
OPERATION_MACROS = {"resumed_run_conf": resumed_run_conf, "current_state": current_state,
                    "rescale_settings": rescale_settings}


def resumed_run_prefix(after: str) -> str:
    """The prefix of the id of the run that starts the job after the operation ``after``
    (``restore`` or ``rescale``): ``restored__`` / ``rescaled__``, then the operation's run id."""
    return f"{after}d__"


def _trigger_resumed_run(after: str, job: str, conf: str, doc_md: str):
    """The ``resume`` task: a run of ``ingest_<job>`` (``job`` and ``conf``: templates)."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

    return TriggerDagRunOperator(
        task_id="resume",
        trigger_dag_id=f"ingest_{{{{ {job} }}}}",
        trigger_run_id=resumed_run_prefix(after) + "{{ run_id }}",
        conf=conf,
        wait_for_completion=False,
        doc_md=doc_md,
    )


def resume_job_before_stop(after: str = "rescale"):
    """The task that starts the job's run for the operation ``after`` (``rescale``) before the
    operation stops the job, as a blue-green deployment starts the new version beside the old:
    a run of its ``ingest_<job>`` DAG, as :func:`resume_job` starts it, on the DAG's rescale
    settings (``settings`` in its conf; :func:`rescale_settings`), whose driver starts its JVM
    and session at once and then waits for the operation to hand the stopped job over
    (``handover``: the operation's run id; :meth:`~streamlake.pipeline.control.JobControl.await_handover`)
    before it touches a table. Its mode follows the job's state at the trigger
    (:func:`current_state`): a job running continuously now is resumed continuously (that run's
    supervisor task waits for the running one's, which ends with the stop). The operation must hand the job
    over (:func:`streamlake.orchestration.tasks.hand_over`) once it is stopped and its settings
    are in place, and refuse (:func:`streamlake.orchestration.tasks.refuse_handover`, the
    ``on_failure_callback`` of every task before that) when it fails. The job is the DAG's
    ``job`` param, the master its ``spark_conn_id``; the DAG must render templates as native
    objects and have :data:`OPERATION_MACROS`."""
    return _trigger_resumed_run(
        after, "params.job",
        f"{{{{ resumed_run_conf(current_state(params.job), params.spark_conn_id, '{after}', "
        f"rescale_settings(params), run_id) }}}}",
        f"Start the job's run for the {after} at once, on the new settings: its driver starts while the "
        f"savepoint is taken and waits for the {after} to hand the stopped job over (checks and quality after it).")


def resume_job(state, after: str):
    """The task that starts the job again after the operation ``after`` (``restore``; a
    rescale starts it before the stop: :func:`resume_job_before_stop`) stopped it and put its
    state in place, as Flink's ``run -s``
    does: a run of the job's ``ingest_<job>`` DAG with :func:`resumed_run_conf` (continuous
    if the job ran continuously before, otherwise available-now: it catches up with what
    Kafka holds). Its conf names the operation (``resumes``), so its checks and quality
    results are recorded under it. The run is not waited for: the operation is done once the job is started;
    the run's id is ``restored__`` / ``rescaled__`` plus the operation's run id, so the UI and
    the REST API find it. ``state`` is the operation task's XCom (a dict with ``job``,
    ``mode`` and ``job_was_running``); the master is the DAG's ``spark_conn_id`` param. The
    DAG must render templates as native objects and have :data:`OPERATION_MACROS`."""
    pulled = f"ti.xcom_pull(task_ids='{state.operator.task_id}')"
    return _trigger_resumed_run(
        after, f"{pulled}['job']", f"{{{{ resumed_run_conf({pulled}, params.spark_conn_id, '{after}') }}}}",
        f"Start the job after the {after}: a run of its ingest DAG (checks and quality after it).")
