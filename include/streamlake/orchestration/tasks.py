"""Task functions of the DAGs: thin wrappers over the platform with Airflow-friendly
inputs (params) and outputs (small JSON-able dicts for XCom)."""

from __future__ import annotations

import logging
import statistics
import time
from typing import NoReturn

log = logging.getLogger(__name__)


def run_context(extra: dict | None = None) -> dict:
    """dag_id / run_id / task_id of the running task, for the results tables."""
    try:
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        info = {"dag_id": ctx["dag"].dag_id, "run_id": ctx["run_id"], "task_id": ctx["task"].task_id}
    except Exception:  # noqa: BLE001 - outside a task (CLI, tests)
        info = {}
    return {**info, **(extra or {})}


def supervise_continuous(job_name: str, spark_conn_id: str, strategy: dict, settings: dict | None = None,
                         handover: str | None = None, resumes: str | None = None) -> dict:
    """Keep the job running with a processing-time trigger; restart it by ``strategy``.

    ``settings``: see :func:`resumed_job`; ``handover``: the id of the rescale that started this
    run, which the driver waits for (:func:`~streamlake.operations.runner.job_args`). Returns when the
    job is stopped on request; raises GaveUp (failing the task and the DAG run) with the
    strategy's reason when it stops restarting. When its driver leaves the job to another
    operation's handover (a rescale stopped the job for a run of its own), the task is skipped,
    saying why, or fails when the run completes an operation (``resumes``: restore, rescale).
    """
    from streamlake.pipeline.control import HandoverPending
    from streamlake.operations.runner import run_supervised, submit_with_airflow_hook
    from streamlake.operations.supervisor import RestartStrategy

    from streamlake.orchestration.hooks import job_store_environment

    job = resumed_job(job_name, settings)
    try:
        result = run_supervised(job, RestartStrategy(**strategy),
                                submit_with_airflow_hook(job, spark_conn_id, job_store_environment(job, log), handover))
    except HandoverPending as exc:
        leave_the_job(exc, "continuous", resumes, log)
    for i, cause in enumerate(result.causes, 1):
        log.info("restart %d cause: %s", i, cause)
    return {"runs": result.runs, "restarts": result.restarts, "causes": result.causes}


def leave_the_job(reason: Exception, run: str, resumes: str | None, logger) -> NoReturn:
    """End the task of a run that found the job in other hands (``reason``: a supervisor keeps it
    running, or another operation is handing it over to a run of its own): skipped, saying why,
    for a ``run`` ("scheduled", "continuous") of the schedule or a user; failed when the run
    completes an operation (``resumes``: restore, rescale), which must not pass for done.

    Raises AirflowSkipException, or AirflowException when ``resumes``."""
    from airflow.providers.common.compat.sdk import AirflowException, AirflowSkipException

    if resumes:
        raise AirflowException(f"this run completes a {resumes} but {reason}: deal with that, then clear "
                               "this task") from None
    message = f"this {run} run has nothing to do: {reason}"
    logger.info("%s", message)  # Airflow logs a skip without its message
    raise AirflowSkipException(message) from None


def resumed_job(job_name: str, settings: dict | None):
    """The job a run starts: its spec, on ``settings`` where given (the run a rescale starts
    before it stops the job: the spec gets them only when the rescale hands the job over)."""
    from streamlake.operations.jobs import load_job

    job = load_job(job_name)
    if settings:
        job = job.rescaled(settings)
        log.info("job %s on the settings of the rescale that started this run: %s", job_name, settings)
    return job


def take_savepoint(job_name: str, stop: bool, note: str = "") -> dict:
    """Savepoint at a micro-batch boundary; the job resumes (or stops if ``stop``)."""
    from streamlake.operations.jobs import load_job
    from streamlake.delta.records import record_operation
    from streamlake.operations.savepoints import create_savepoint
    from streamlake.orchestration.hooks import store_credentials

    job = load_job(job_name)
    with store_credentials(job, log):
        manifest = create_savepoint(job, stop=stop, note=note)
    record_operation("savepoint", job_name, {"savepoint": manifest.id, "stopped": stop,
                                             "versions": manifest.versions(), "watermarks": manifest.watermarks,
                                             "offsets": manifest.kafka_offsets, **run_context()})
    log.info("savepoint %s: table versions %s, offsets %s, watermark %s", manifest.id, manifest.versions(),
             manifest.kafka_offsets, manifest.watermarks)
    return {"id": manifest.id, "job": manifest.job, "offsets": manifest.kafka_offsets,
            "version": manifest.table("bronze").version, "versions": manifest.versions(),
            "job_was_running": manifest.job_was_running, "mode": job_mode(job_name)}


def restore(savepoint_id: str | None, job_name: str | None = None) -> dict:
    """Restore tables, offsets and checkpoint of a savepoint (the job is stopped first):
    ``savepoint_id``, or the newest savepoint of ``job_name``. Raises SavepointError when
    there is none."""
    from streamlake.delta.records import record_operation
    from streamlake.operations.jobs import load_job
    from streamlake.operations.savepoints import SavepointError, list_savepoints, load_savepoint, restore_savepoint
    from streamlake.orchestration.hooks import store_credentials

    if not savepoint_id:
        newest = list_savepoints(job_name)
        if not newest:
            raise SavepointError(f"job {job_name} has no savepoint to restore: take one with the savepoint DAG "
                                 "(or `streamlake savepoint create --job NAME`)")
        savepoint_id = newest[0].id
        log.info("restoring the newest savepoint of %s: %s", job_name, savepoint_id)
    job = load_savepoint(savepoint_id).job
    mode = job_mode(job)
    with store_credentials(load_job(job), log):
        result = restore_savepoint(savepoint_id)
    record_operation("restore", result["job"], {**result, **run_context()})
    return {**result, "mode": mode}


def job_mode(job_name: str) -> str | None:
    """How the job last ran: "continuous", "available-now", or None if never."""
    from streamlake.operations.jobs import load_job

    return load_job(job_name).control.read_state().get("mode")


def apply_rescale(job_name: str, settings: dict) -> dict:
    """Write the rescale ``settings`` (:data:`~streamlake.operations.jobs.RESCALE_SETTINGS`; an
    empty one keeps the job's) into the job spec; returns the settings before and after."""
    from streamlake.operations.jobs import RESCALE_SETTINGS, load_job, save_job

    before = load_job(job_name)
    after = save_job(before.rescaled(settings))
    return {"before": {k: before.to_dict()[k] for k in RESCALE_SETTINGS},
            "after": {k: after.to_dict()[k] for k in RESCALE_SETTINGS}}


def check_rescale_fits(job_name: str, settings: dict) -> None:
    """Before a rescale stops the job: raises AirflowFailException (a task that fails without
    retrying: wrong settings are not a passing failure) when its ``settings`` cannot run, so the
    job keeps running on its old ones. Inconsistent cores (more per executor than in total) are
    refused by :meth:`~streamlake.operations.jobs.JobSpec.rescaled`; on this platform's
    cluster, executors of more cores than any alive worker offers would never start
    (:func:`~streamlake.platform.spark_cluster.executor_does_not_fit`). A cluster this platform
    did not start is not inspected."""
    from airflow.providers.common.compat.sdk import AirflowFailException

    from streamlake.errors import InvalidOptionError
    from streamlake.operations.jobs import load_job
    from streamlake.orchestration.hooks import connection_master
    from streamlake.platform.spark_cluster import executor_does_not_fit

    refused = f"rescale of job {job_name} refused before the stop, the job keeps running"
    try:
        job = load_job(job_name).rescaled(settings)
    except InvalidOptionError as exc:
        raise AirflowFailException(f"{refused}: {exc}") from None
    if not job.executor_cores or not job.spark_conn_id:
        return
    try:
        master = connection_master(job.spark_conn_id)
    except Exception:  # noqa: BLE001 - no such connection: the run's spark-submit says so in full
        return
    reason = executor_does_not_fit(master, job.executor_cores)
    if reason:
        raise AirflowFailException(f"{refused}: {reason}; choose fewer cores per executor")


def announce_handover(job_name: str, operation: str) -> None:
    """The operation ``operation`` (its run id) is about to stop the job for the run it started:
    until that run takes the job, every other run that would start it leaves it alone
    (:meth:`~streamlake.pipeline.control.JobControl.announce_handover`): nothing runs the job
    on its old settings after the stop."""
    from streamlake.operations.jobs import load_job

    load_job(job_name).control.announce_handover(operation)
    log.info("%s will hand job %s over to the run it started: other runs leave the job alone", operation, job_name)


def hand_over(job_name: str, operation: str, **info) -> None:
    """The operation ``operation`` (its run id) is done with the stopped job: the run it started
    before the stop (waiting in :meth:`~streamlake.pipeline.control.JobControl.await_handover`)
    may start the job."""
    from streamlake.operations.jobs import load_job

    load_job(job_name).control.hand_over(operation, **info)
    log.info("%s handed job %s over to the run it started", operation, job_name)


def refuse_handover(context) -> None:
    """``on_failure_callback`` of the tasks before an operation's handover: the run it started
    before the stop ends at once, with this task's failure as the reason, instead of waiting for
    a handover that will not come."""
    from streamlake.operations.jobs import load_job

    job, run_id, task_id = context["params"]["job"], context["run_id"], context["task_instance"].task_id
    reason = f"its task {task_id} failed: {context.get('exception')}"
    load_job(job).control.refuse_handover(run_id, reason)
    log.info("job %s: the run started by %s will not start the job (%s)", job, run_id, reason)


def progress_mark(job_name: str) -> int:
    """Number of progress lines the job has written so far (to measure what follows)."""
    from streamlake.operations.jobs import load_job

    path = load_job(job_name).control.progress_file
    return len(path.read_text().splitlines()) if path.exists() else 0


def throughput(job_name: str, start_line: int = 0, end_line: int | None = None, last: int = 5) -> dict:
    """Median processed rows/s over the last ``last`` non-empty bronze micro-batches in a
    window of the job's progress log."""
    import json

    from streamlake.operations.jobs import load_job

    path = load_job(job_name).control.progress_file
    lines = path.read_text().splitlines()[start_line:end_line] if path.exists() else []
    batches = [b for b in map(json.loads, lines) if b.get("stage", "bronze") == "bronze"]
    rates = [b["processedRowsPerSecond"] for b in batches if b.get("numInputRows")][-last:]
    return {"batches": len(rates), "rows_per_second": round(statistics.median(rates), 1) if rates else None,
            "rows": sum(b.get("numInputRows", 0) for b in batches)}


def record_rescale(job_name: str, settings: dict, savepoint: dict, before: dict) -> dict:
    """Record a rescale (settings before and after, savepoint, throughput before) in the
    operations table; the job's next run measures the throughput after (:func:`measure_rescale`)."""
    from streamlake.delta.records import record_operation

    details = {"settings": settings, "savepoint": savepoint.get("id"), "throughput_before": before, **run_context()}
    details["operation_id"] = record_operation("rescale", job_name, details)
    log.info("rescale of %s: %s rows/s before (%s -> %s); the job's next run measures the throughput after",
             job_name, before.get("rows_per_second"), settings["before"], settings["after"])
    return details


def measure_rescale(job_name: str, rescale_run_id: str | None = None, wait_s: float = 0.0) -> dict:
    """The throughput after a rescale of the job (the one the ``rescale`` DAG run
    ``rescale_run_id`` recorded, else the latest): median rows/s of the micro-batches run
    since it applied its settings, recorded (``rescale-throughput``) next to the throughput
    before. The rescale DAG records the rescale while the job starts, so its record can
    come after this run's start: it is looked for again every second for up to ``wait_s``.
    Raises LookupError when there is no such rescale by then."""
    import json

    from streamlake.delta.records import record_operation, recent_operations

    deadline = time.monotonic() + wait_s
    while True:
        rescales = [(r["operation_id"], json.loads(r["details"])) for r in recent_operations(1000, job_name)
                    if r["operation"] == "rescale"]
        if rescale_run_id is not None:
            rescales = [(op_id, r) for op_id, r in rescales if r.get("run_id") == rescale_run_id]
        if rescales or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if not rescales:
        raise LookupError(f"job {job_name} has no rescale to measure"
                          + (f" recorded by the rescale run {rescale_run_id}" if rescale_run_id else ""))
    operation_id, rescale = rescales[0]
    after = throughput(job_name, start_line=rescale["settings"]["progress_mark"])
    details = {"rescale": operation_id, "rescale_run_id": rescale.get("run_id"),
               "settings": rescale["settings"], "throughput_before": rescale["throughput_before"],
               "throughput_after": after, **run_context()}
    record_operation("rescale-throughput", job_name, details)
    log.info("rescale of %s (%s): %s rows/s before, %s rows/s after on %s", job_name, rescale.get("run_id"),
             rescale["throughput_before"].get("rows_per_second"), after.get("rows_per_second"),
             rescale["settings"]["after"])
    return details


def backfill_range(params: dict, run_type: str, data_interval_start, data_interval_end, run_id: str) -> dict:
    """The event-time range a ``backfill_<pipeline>`` run restates.

    A manual run (the trigger form) takes the form's range, or every pending late
    event when "all pending" is ticked or no range is given; a scheduled run or one
    of Airflow's own backfills takes its data interval."""
    import re

    manual = str(run_type).lower().endswith("manual")
    if manual:
        all_pending = params.get("all_pending") or not (params.get("start") or params.get("end"))
        start, end = (None, None) if all_pending else (params.get("start"), params.get("end"))
    else:
        start, end = data_interval_start.isoformat(), data_interval_end.isoformat()
    safe = re.sub(r"[^A-Za-z0-9]+", "-", run_id).strip("-")[-60:]
    return {"start": start, "end": end, "dry_run": bool(params.get("dry_run")) and manual, "run_id": f"bf-{safe}",
            "manual": manual, "aggregate": params.get("aggregate") if manual else None}


def backfill_result_path(run_id: str):
    from streamlake import config

    path = config.home() / "backfills"
    path.mkdir(parents=True, exist_ok=True)
    return path / f"{run_id}.json"


def backfill_report(window: dict) -> dict:
    """The summary the backfill job wrote: restated windows per aggregate, late events, checks."""
    import json

    path = backfill_result_path(window["run_id"])
    summary = json.loads(path.read_text())
    for entry in summary.get("aggregates") or [summary]:
        log.info("%s", entry.get("summary") or entry.get("error"))
    for line in summary.get("window_list", []):
        log.info("  window %s", line)
    for check in summary.get("checks", []):
        log.info("check %s: %s", check.get("check_id"), check.get("summary"))
    return {k: v for k, v in summary.items() if k != "checks"} | {
        "checks": [{"check_id": c.get("check_id"), "verdict": c.get("verdict")} for c in summary.get("checks", [])]}
