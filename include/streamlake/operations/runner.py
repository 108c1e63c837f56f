"""Running a named job with spark-submit: settings, processes, supervised runs.

One place for what every launcher needs (the CLI, Airflow's SparkSubmitOperator
and the continuous-mode supervisor): the application, its arguments, the Spark
properties for the job's resources and the environment the driver and Python
workers need.
"""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import time
from typing import Callable

import psutil

from streamlake import config
from streamlake.pipeline.control import HandoverPending
from streamlake.operations.jobs import JobSpec
from streamlake.pipeline.config import config_to_args
from streamlake.spark.interpreter import python_executable
from streamlake.spark.session import job_defaults, job_environment, job_path, spark_defaults
from streamlake.operations.supervisor import JobFailed, RestartStrategy, SupervisionResult, supervise

log = logging.getLogger(__name__)

PIPELINE_APPLICATION = "pipeline.py"
AVAILABLE_NOW_WAIT_S = 3600.0  # how long a supervisor waits for scheduled runs of its job to end


def application() -> str:
    return job_path(PIPELINE_APPLICATION)


def job_args(job: JobSpec, continuous: bool, await_handover: str | None = None) -> list[str]:
    """spark-submit arguments of ``jobs/pipeline.py`` for the job (available-now unless
    ``continuous``); with ``await_handover`` (an operation's id) the driver starts its session
    but touches no table before that operation hands the job over
    (:meth:`~streamlake.pipeline.control.JobControl.await_handover`)."""
    return [*config_to_args(job.pipeline_config(continuous)), *(["--await-handover", await_handover]
                                                                 if await_handover else [])]


def spark_conf(job: JobSpec, application: str = PIPELINE_APPLICATION, short_run: bool = False) -> dict[str, str]:
    """Spark properties of ``jobs/<application>`` for the job: platform and application defaults
    (:func:`~streamlake.spark.session.job_defaults`; ``short_run``: one available-now run), the
    job's resources, this interpreter for executors on any cluster."""
    return {**spark_defaults(), **job_defaults(application, short_run), **job.spark_conf(),
            "spark.pyspark.python": python_executable(), "spark.pyspark.driver.python": python_executable()}


def spark_env() -> dict[str, str]:
    """Environment variables the job needs on top of the launcher's own."""
    env = job_environment()
    keys = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PATH", config.ENV_BOOTSTRAP, config.ENV_HOME, "JAVA_HOME")
    return {k: env[k] for k in keys if env.get(k)}


def job_processes(job: JobSpec) -> list[psutil.Process]:
    """Every process of a running instance of the job (spark-submit JVM, Python driver)."""
    marker = job.root
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if any(part.endswith(PIPELINE_APPLICATION) for part in cmd) and marker in cmd:
            found.append(proc)
    return found


def kill_job(job: JobSpec, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to every process of the job and its children, those the fork server forked
    for it among them (SIGKILL: like a lost node)."""
    from streamlake.procs import forked_below

    procs = job_processes(job)
    family = {p.pid: p for p in procs}
    for proc in procs:
        try:
            family.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    family.update({p.pid: p for p in forked_below(list(family))})
    for proc in family.values():
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    return len(family)


def failure_cause(job: JobSpec, exit_code: int | None, since: float) -> str:
    """A readable cause: the job's own error message if it wrote one, else the exit status."""
    failure = job.control.read_state().get("last_failure") or {}
    if exit_code is not None and exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}"
    if exit_code in (128 + signal.SIGKILL, 128 + signal.SIGTERM):
        return f"killed by {signal.Signals(exit_code - 128).name}"
    if failure.get("at", 0) >= since and failure.get("message"):
        return f"exit code {exit_code}: {failure['message']}"
    return f"exit code {exit_code}"


def submit_exit_status(exc: BaseException) -> int | None:
    """The exit status of the application in the error the Spark provider's SparkSubmitHook
    raises when spark-submit fails (its message carries it: "Error code is: N"); None when the
    error says none."""
    found = re.search(r"Error code is: (-?\d+)", str(exc))
    return int(found.group(1)) if found else None


def _reap(job: JobSpec) -> None:
    """Kill what a failed run left behind (a driver whose JVM was killed) and wait for its lock."""
    if kill_job(job):
        time.sleep(1)
    job.control.wait_stopped(60)


def _yielded(job: JobSpec, exit_status: int | None) -> HandoverPending | None:
    """The driver left the job to another operation's handover (its exit status 3, and a handover
    binds the job): what the supervisor raises instead of a failure to restart after."""
    if exit_status != HandoverPending.exit_status:
        return None
    pending = job.control.pending_handover()
    return HandoverPending(f"the driver left the job alone: operation {pending[0] if pending else '(gone since)'} "
                           "stopped it for a run of its own")


def submit_with_airflow_hook(job: JobSpec, conn_id: str, env: dict[str, str] | None = None,
                             await_handover: str | None = None) -> Callable[[], None]:
    """One continuous run of the job through the Spark provider's SparkSubmitHook; ``env``
    (e.g. an object store's credentials) goes to its environment, never its command line;
    ``await_handover``: see :func:`job_args`, until a start has taken the handover (a restart is
    then a start like any other). Raises JobFailed (the supervisor restarts it), or
    HandoverPending when the driver left the job to another operation's handover."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    def run() -> None:
        handover = await_handover if await_handover and not job.control.handover_taken(await_handover) else None
        hook = SparkSubmitHook(conf=spark_conf(job), conn_id=conn_id,
                               application_args=job_args(job, True, handover),
                               env_vars={**spark_env(), **(env or {})}, name=f"streamlake:{job.name}")
        started = time.time()
        try:
            hook.submit(application())
        except Exception as exc:  # noqa: BLE001 - AirflowException carries the exit code in its text
            status = submit_exit_status(exc)
            yielded = _yielded(job, status)
            if yielded:
                raise yielded from None
            cause = failure_cause(job, status, started)
            _reap(job)
            raise JobFailed(cause) from exc

    return run


def submit_with_subprocess(job: JobSpec, master: str) -> Callable[[], None]:
    """One continuous run of the job with spark-submit as a child process (CLI); raises as
    :func:`submit_with_airflow_hook` does."""
    from streamlake.spark.session import spark_submit_command

    def run() -> None:
        cmd = spark_submit_command(PIPELINE_APPLICATION, job_args(job, True), master=master,
                                   conf=spark_conf(job), name=f"streamlake:{job.name}")
        started = time.time()
        code = subprocess.call(cmd, env=job_environment())
        if code != 0:
            yielded = _yielded(job, code)
            if yielded:
                raise yielded
            cause = failure_cause(job, code, started)
            _reap(job)
            raise JobFailed(cause)

    return run


def run_supervised(job: JobSpec, strategy: RestartStrategy, run_once: Callable[[], None]) -> SupervisionResult:
    """Keep the job running under ``strategy`` until it is stopped on request (returns)
    or the strategy gives up (GaveUp). The job is marked supervised meanwhile
    (:meth:`~streamlake.pipeline.control.JobControl.supervising`: a scheduled run leaves it
    alone); scheduled runs of the job in progress are waited for first, up to
    :data:`AVAILABLE_NOW_WAIT_S` (they end by themselves). Raises TimeoutError when they or
    another supervisor do not end in time."""
    control = job.control
    with control.supervising(AVAILABLE_NOW_WAIT_S, report=log.info):
        control.stop_file.unlink(missing_ok=True)
        log.info("supervising %s with restart strategy %s", job.name, strategy.describe())
        try:
            return supervise(run_once, strategy, stop_requested=control.stop_requested)
        finally:
            control.stop_file.unlink(missing_ok=True)
