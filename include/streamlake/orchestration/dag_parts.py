"""Pieces several DAGs share: settings of the manual operation DAGs, the "start the
job again" tail of restore and rescale, the conf keys of the run it starts, and the callbacks
that record how each operation ended."""

from __future__ import annotations

import datetime as dt
import logging

log = logging.getLogger(__name__)

START_DATE = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
RESUMES_CONF_KEY = "resumes"  # set by restore and rescale when they start the job: the operation it completes
# Set by a rescale, which starts the job's run before it stops the job: the settings the run uses,
# and the rescale's run id, whose handover the run's driver waits for before it touches a table.
SETTINGS_CONF_KEY = "settings"
HANDOVER_CONF_KEY = "handover"
# Set by a rescale in the run it starts: the rescale's trigger time (its run proves it).
TRIGGERED_AT_CONF_KEY = "operation_triggered_at"


# -- how each operation ended (streamlake.operations.outcomes) -------------------------------------
#
# ``operation_failed`` is the ``on_failure_callback`` of the tasks of savepoint, restore, rescale
# and backfill_<pipeline>, and of the job's tasks in the run a rescale started (ingest_<pipeline>
# with ``resumes: rescale``): Airflow calls it when a task failed for good, its retries spent.
# ``operation_proven`` is the ``on_success_callback`` of each operation's proof (that module's
# docstring says which task). In any other run both do nothing. The trigger time is the
# operation run's (triggered_at); a rescale passes its own to the run that proves it
# (TRIGGERED_AT_CONF_KEY), which records the outcome under the rescale's run id (its handover).
# A callback never fails its task: a recording that fails is logged.


def _utc(value) -> dt.datetime:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return dt.datetime.fromtimestamp(value.timestamp(), tz=dt.timezone.utc)


def triggered_at(run) -> dt.datetime:
    """When the DAG run ``run`` was triggered: a manual run's ``run_after`` (the click, the REST
    call); a scheduled or backfill run's start (its ``run_after`` is the end of its data
    interval, which may be long past when the platform was down)."""
    if str(getattr(run.run_type, "value", run.run_type)) == "manual" or run.start_date is None:
        return _utc(run.run_after)
    return _utc(run.start_date)


def operation_run(context) -> tuple[str, str, str, dt.datetime] | None:
    """(operation, job, run id, triggered at) of the operation the task's run belongs to, or
    None when the run is no operation's."""
    dag_id = context["dag"].dag_id
    run = context["dag_run"]
    conf = run.conf or {}
    params = context.get("params") or {}
    if dag_id in ("savepoint", "rescale"):
        return dag_id, params["job"], run.run_id, triggered_at(run)
    if dag_id == "restore":
        restored = context["ti"].xcom_pull(task_ids="restore") or {}
        return "restore", restored.get("job") or params["job"], run.run_id, triggered_at(run)
    if dag_id.startswith("backfill_"):
        return "backfill", dag_id.removeprefix("backfill_"), run.run_id, triggered_at(run)
    if dag_id.startswith("ingest_") and conf.get(RESUMES_CONF_KEY) == "rescale":
        return ("rescale", dag_id.removeprefix("ingest_"), conf.get(HANDOVER_CONF_KEY) or run.run_id,
                _utc(conf.get(TRIGGERED_AT_CONF_KEY) or triggered_at(run)))
    return None


def _record_outcome(context, outcome: str) -> None:
    from streamlake.operations.outcomes import record_outcome

    try:
        found = operation_run(context)
        if found is None:
            return
        operation, job, run_id, triggered = found
        error = context.get("exception")
        # the task's end as Airflow records it (set before the callbacks run): the callback itself
        # can come much later, e.g. 48 s when Airflow's SQLite database stalled its state update
        ended = getattr(context.get("ti"), "end_date", None)
        row = record_outcome(operation, job, run_id, triggered, outcome, context["task"].task_id,
                             error=f"{type(error).__name__}: {error}" if error else None,
                             finished_at=_utc(ended) if ended else None)
        log.info("the %s of job %s (run %s): %s, %.1f s after its trigger", operation, job, run_id, outcome,
                 row["duration_s"])
    except Exception:  # noqa: BLE001 - see above
        log.exception("recording how this run's operation ended (%s) failed", outcome)


def operation_failed(context) -> None:
    """``on_failure_callback``: record the operation's run as failed at this task."""
    _record_outcome(context, "failed")


def operation_proven(context) -> None:
    """``on_success_callback`` of an operation's proof: record the run as proven."""
    _record_outcome(context, "proven")


# Manual-only operation DAGs (savepoint, restore, rescale): unpaused, so a UI
# trigger runs at once; one retry (each step is safe to repeat); a task failed for good fails
# the operation (operation_failed).
MANUAL_OPERATION_DAG = {
    "schedule": None,
    "start_date": START_DATE,
    "catchup": False,
    "is_paused_upon_creation": False,
    "default_args": {"owner": "streamlake", "retries": 1, "retry_delay": dt.timedelta(seconds=30),
                     "on_failure_callback": operation_failed},
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
                     handover: str | None = None, triggered_at=None) -> dict:
    """The conf of the run that starts the job again after the operation ``after``
    (``restore`` or ``rescale``): continuous if the job ran continuously before it, otherwise
    scheduled (available-now); the job and ``mode``/``job_was_running`` come from ``state``
    (the operation's XCom, or :func:`current_state`). A run started before the operation
    stops the job also gets the operation's ``settings`` and the ``handover`` it waits for
    (:func:`resume_job_before_stop`), and the operation's trigger time ``triggered_at`` (a
    datetime: the run that proves the operation records it, :func:`operation_run`)."""
    continuous = state["mode"] == "continuous" and state["job_was_running"]
    conf = {"job": state["job"], "mode": "continuous" if continuous else "scheduled", "spark_conn_id": spark_conn_id,
            RESUMES_CONF_KEY: after}
    if settings is not None:
        conf[SETTINGS_CONF_KEY] = settings
    if handover is not None:
        conf[HANDOVER_CONF_KEY] = handover
    if triggered_at is not None:
        conf[TRIGGERED_AT_CONF_KEY] = _utc(triggered_at).isoformat()
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


def _trigger_resumed_run(after: str, job: str, conf: str, doc_md: str, proves: bool):
    """The ``resume`` task: a run of ``ingest_<job>`` (``job`` and ``conf``: templates); the
    operation's proof when ``proves`` (a restore's: it follows ``verify_restored``)."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

    return TriggerDagRunOperator(
        task_id="resume",
        trigger_dag_id=f"ingest_{{{{ {job} }}}}",
        trigger_run_id=resumed_run_prefix(after) + "{{ run_id }}",
        conf=conf,
        wait_for_completion=False,
        doc_md=doc_md,
        **({"on_success_callback": operation_proven} if proves else {}),
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
        f"rescale_settings(params), run_id, dag_run.run_after) }}}}",
        f"Start the job's run for the {after} at once, on the new settings: its driver starts while the "
        f"savepoint is taken and waits for the {after} to hand the stopped job over (checks and quality after it; "
        f"its verify proves the {after}).", proves=False)


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
        f"Start the job after the {after}: a run of its ingest DAG (checks and quality after it). "
        f"The {after} is done, proven, once this task has started the job.", proves=True)
