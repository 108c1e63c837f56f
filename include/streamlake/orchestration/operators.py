"""Operators for named jobs, built on the Apache Spark provider.

Each submits one of the platform's Spark applications (``jobs/*.py``) for a
named job. Everything spark-submit needs (application, arguments, Spark
properties for the job's resources, environment) comes from the job spec
(:mod:`streamlake.operations.jobs`) when the task runs, so a rescale or an
edited spec takes effect at the next run. ``job_name`` and ``spark_conn_id``
are templated: DAG params choose the job and the master (``spark_default`` is
``local[*]``, ``spark_cluster`` the standalone cluster). A task fails when its
application fails (its exit status).

A job rooted on an object store (``s3://...``) gets the credentials and endpoint
of its storage connection (an Airflow connection of type ``aws``;
:mod:`streamlake.orchestration.hooks`) in its process's environment, never on its
command line. Its proofs and backfills go to the Spark Connect server only
where the ``spark_connect`` connection declares that the server holds that very
connection's credentials (extra ``storage_conn_id``,
:mod:`streamlake.platform.spark_connect`); else each is a spark-submit of its own.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException

# The pool of the tasks that start a JVM (a pipeline run): ``streamlake platform``
# sets it to a pool with a slot per core (streamlake.platform.airflow.SPARK_POOL), so a
# 2-core machine never starts more Spark applications than it has cores; elsewhere Airflow's
# default_pool. Verify and backfill run outside it: they are clients of the long-lived Spark
# Connect server. A pipeline run stays in it where it runs on that server too: it is the heavy work.
SPARK_POOL_ENV = "STREAMLAKE_SPARK_POOL"


class ApplicationFailed(AirflowException):
    """A job's application (``jobs/*.py``) ended with a non-zero ``exit_status``, as a
    spark-submit of its own or a Spark Connect client."""

    def __init__(self, message: str, exit_status: int | None):
        super().__init__(message)
        self.exit_status = exit_status


class _JobSubmitOperator(SparkSubmitOperator):
    """spark-submit of ``jobs/<application>`` for a named job; subclasses give the arguments."""

    job_application = ""
    starts_a_jvm = True  # runs in the Spark pool (SPARK_POOL_ENV)
    short_run = False  # one short run of the application (its JVM stops JIT at C1: spark.session.SHORT_RUN_JVM)
    template_fields = (*SparkSubmitOperator.template_fields, "job_name", "spark_conn_id")

    def __init__(self, *, job_name: str, spark_conn_id: str = "spark_default", **kwargs: Any) -> None:
        kwargs.setdefault("name", f"streamlake-{self.job_application.removesuffix('.py')}")
        if self.starts_a_jvm:
            kwargs.setdefault("pool", os.environ.get(SPARK_POOL_ENV) or "default_pool")
        super().__init__(application="(set from the job spec at run time)", conn_id=spark_conn_id, **kwargs)
        self.job_name = job_name
        self.spark_conn_id = spark_conn_id

    def job_arguments(self, job) -> list[str]:
        """The job's command-line arguments; every operator built on this base says which."""
        raise NotImplementedError(f"{type(self).__name__} does not say which arguments {self.job_application} gets")

    def job_spec(self):
        """The job this task runs, as its spec says now (a subclass may adjust it)."""
        from streamlake.operations.jobs import load_job

        return load_job(self.job_name)

    def execute(self, context) -> None:
        from streamlake.operations.runner import spark_conf, spark_env
        from streamlake.orchestration.hooks import connection_master, job_store_environment
        from streamlake.spark.interpreter import spark_python
        from streamlake.spark.session import job_path

        job = self.job_spec()
        self.application = job_path(self.job_application)
        self.application_args = self.job_arguments(job)
        self.conf = spark_conf(job, self.job_application, short_run=self.short_run)
        self.env_vars = {**spark_env(), **job_store_environment(job, self.log)}
        try:
            master = connection_master(self.spark_conn_id)
        except Exception:  # noqa: BLE001 - no such connection: spark-submit fails and says so in full
            master = None
        python = spark_python(master)
        if python != self.conf["spark.pyspark.python"]:
            self.log.info("Spark's Python processes: forked by the platform's fork server (%s)", python)
            self.conf["spark.pyspark.python"] = self.env_vars["PYSPARK_PYTHON"] = python
        self.name = f"streamlake-{self.job_application.removesuffix('.py')}:{job.name}"
        self._conn_id = self.spark_conn_id
        self._hook = None
        self.log.info("%s of job %s (%s under %s) via connection %s, resources %s", self.job_application, job.name,
                      " -> ".join(job.run_stages), job.root, self.spark_conn_id, job.spark_conf() or "defaults")
        try:
            super().execute(context)
        except AirflowException as exc:
            from streamlake.operations.runner import submit_exit_status

            status = submit_exit_status(exc)
            if status is None:
                raise
            raise ApplicationFailed(str(exc), status) from exc


class _ConnectFirstOperator(_JobSubmitOperator):
    """A job that runs on the long-lived Spark Connect server of ``spark_connect_conn_id``
    (a ``spark_connect`` connection; ``make run`` starts the server and defines
    ``spark_connect_default``) as a thin Python client, no JVM of its own: forked by the
    platform's fork server where one runs (:mod:`streamlake.platform.fork_server`, its
    libraries already imported), else a new interpreter. When that
    connection is not defined or its server does not answer, spark-submit on
    ``spark_conn_id`` as every other job (the log says which). The application must accept
    ``--remote sc://host:port``."""

    starts_a_jvm = False  # a Spark Connect client where the server answers (the fallback is rare)
    template_fields = (*_JobSubmitOperator.template_fields, "spark_connect_conn_id")

    def __init__(self, *, spark_connect_conn_id: str | None = "spark_connect_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spark_connect_conn_id = spark_connect_conn_id

    def _connect_server(self) -> tuple[str, dict] | None:
        """The URL of the server of ``spark_connect_conn_id`` and the connection's extra; None
        when the connection is not defined or its server does not answer (the log says which)."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from streamlake.platform.spark_connect import connect_url

        if not self.spark_connect_conn_id:
            return None
        try:
            hook = SparkConnectHook(self.spark_connect_conn_id)
            configured = hook.get_connection_url()
            extra = hook.get_connection(self.spark_connect_conn_id).extra_dejson
        except Exception as exc:  # noqa: BLE001 (AirflowNotFoundException and friends: no such connection)
            self.log.info("no Spark Connect connection %r (%s): spark-submit", self.spark_connect_conn_id, exc)
            return None
        remote = connect_url(configured)
        if remote is None:
            self.log.info("Spark Connect server of %r (%s) does not answer: spark-submit",
                          self.spark_connect_conn_id, configured)
            return None
        return remote, extra

    def store_not_on_server(self, job, extra: dict) -> str | None:
        """Why a job on an object store cannot run on the server whose connection has ``extra``:
        the server holds no credentials of the job's storage connection (it declares the one
        it holds as ``storage_conn_id``). None for a local root or when it holds them."""
        from streamlake.orchestration.hooks import DEFAULT_STORAGE_CONN_ID
        from streamlake.storage.location import is_object_store

        if not is_object_store(job.root):
            return None
        wanted, held = job.storage_conn_id or DEFAULT_STORAGE_CONN_ID, extra.get("storage_conn_id")
        if held == wanted:
            return None
        return (f"its tables are on {job.root} and the Spark Connect server of {self.spark_connect_conn_id!r} "
                f"holds {'the credentials of ' + repr(held) if held else 'no store credentials'}, not those of "
                f"{wanted!r}: a process of its own with them in its environment")

    def needs_own_jvm(self, job) -> str | None:
        """Why this run must be a spark-submit even where a server answers; None: it need not."""
        return None

    def execute(self, context) -> None:
        from airflow.providers.standard.hooks.subprocess import SubprocessHook

        from streamlake.operations.runner import spark_env
        from streamlake.orchestration.hooks import job_store_environment
        from streamlake.platform.fork_server import run_client
        from streamlake.spark.session import connect_client_args, connect_client_command

        job = self.job_spec()
        reason = self.needs_own_jvm(job)
        if reason:
            self.log.info("%s of job %s: spark-submit, %s", self.job_application, job.name, reason)
            return super().execute(context)
        server = self._connect_server()
        if server is None:
            return super().execute(context)
        remote, extra = server
        reason = self.store_not_on_server(job, extra)
        if reason:
            self.log.info("%s of job %s: spark-submit, %s", self.job_application, job.name, reason)
            return super().execute(context)
        args = connect_client_args(self.job_arguments(job), remote)
        self.log.info("%s of job %s on the Spark Connect server %s (no JVM of its own)", self.job_application,
                      job.name, remote)
        # A job on a store: its client opens the tables (delta-rs) with the credentials the server holds too.
        env = {**os.environ, **spark_env(), **job_store_environment(job, self.log)}
        lines: list[str] = []

        def output(line: str) -> None:
            lines[:] = [line]
            self.log.info("%s", line)

        code = run_client(self.job_application, args, env, write=output)
        if code is not None:
            self.log.info("%s ran as a client forked by the platform's fork server (libraries already imported)",
                          self.job_application)
        else:
            result = SubprocessHook().run_command(
                connect_client_command(self.job_application, self.job_arguments(job), remote), env=env)
            code, lines = result.exit_code, [result.output]
        if code != 0:
            raise ApplicationFailed(f"{self.job_application} of job {job.name} failed "
                                    f"(exit status {code}): {lines[0] if lines else ''}", code)
        return None


class JobRunOperator(_ConnectFirstOperator):
    """Run a job's pipeline once with available-now triggers (``jobs/pipeline.py``): every
    stage (bronze ingest, silver, gold, as the job defines) catches up with what Kafka
    holds when the run starts, then the run ends. On the Spark Connect server when it
    answers, the run's connection names a local master (``spark_default``) and the job has no
    Spark resources of its own, or the run is the catch-up that completes an operation
    (``resumes``: ``restore``/``rescale``); else a spark-submit of its own (:meth:`needs_own_jvm`).

    A run a rescale starts before it stops the job gets the rescale's ``settings`` (a dict, or
    its JSON) and ``handover`` (the rescale's run id): it runs on those settings, and its
    driver starts while the savepoint is taken but waits for the handover before it touches
    a table (:func:`streamlake.operations.runner.job_args`)."""

    job_application = "pipeline.py"
    short_run = True  # available-now
    starts_a_jvm = True  # the heavy work: in the Spark pool on the server too, as in a JVM of its own
    ui_color = "#e4f0e8"
    template_fields = (*_ConnectFirstOperator.template_fields, "resumes", "settings", "handover")

    def __init__(self, *, resumes: str | None = None, settings: dict | str | None = None,
                 handover: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.resumes = resumes
        self.settings = settings
        self.handover = handover

    def execute(self, context) -> None:
        """The run, as a scheduled run of the job (:meth:`~streamlake.pipeline.control.JobControl.scheduled_run`):
        skipped, with the reason, when a supervisor keeps the job running continuously (it keeps
        every stage up to date), or when another operation (a rescale) is handing the stopped job
        over to a run of its own: before the driver starts, or by the driver once it holds the
        job lock (its exit status 3: :class:`~streamlake.pipeline.control.HandoverPending`). A
        run that completes a restore or rescale then fails instead (a continuous run, or another
        rescale, was started after the operation's trigger: deal with it, then clear this task).
        The run of a rescale that refused its handover (it failed before it) fails without
        retrying, with the rescale's reason: the refusal is for good. So does a run whose
        definition file no longer loads, saying why, before anything starts."""
        from streamlake.pipeline.control import HandoverPending, JobSupervised
        from streamlake.orchestration.tasks import leave_the_job
        from streamlake.pipeline.definition import DefinitionError

        job = self.job_spec()
        try:
            job.file_definition()  # what the run would apply: a file that does not load starts nothing
        except DefinitionError as exc:
            raise AirflowFailException(f"the job was not started: its definition file does not load: {exc}. A job "
                                       "running now keeps running on its last good definition; fix the file "
                                       "(`streamlake pipeline validate FILE`), then run again.") from None
        control = job.control
        try:
            with control.scheduled_run():
                if not self.handover:
                    control.check_no_handover_pending()  # before the driver starts; it checks again
                try:
                    return super().execute(context)
                except ApplicationFailed as exc:
                    refusal = control.handover_refusal(self.handover) if self.handover else None
                    if refusal:  # for good: another try would find the same refusal
                        raise AirflowFailException(f"{exc}; {self.handover} refused the handover, so this run did "
                                                   f"not start the job: {refusal}") from None
                    if exc.exit_status != HandoverPending.exit_status or self.handover:
                        raise
                    raise HandoverPending("its driver found another operation handing the stopped job over to a "
                                          "run of its own once it held the job lock (its log above names it)") \
                        from None
        except (JobSupervised, HandoverPending) as exc:
            leave_the_job(exc, "scheduled", self.resumes, self.log)

    def job_spec(self):
        from streamlake.orchestration.tasks import resumed_job

        if getattr(self, "_resumed_job", None) is None:  # once per run of the task: it logs the settings
            settings = json.loads(self.settings) if isinstance(self.settings, str) and self.settings else self.settings
            self._resumed_job = resumed_job(self.job_name, settings or None)
        return self._resumed_job

    def job_arguments(self, job) -> list[str]:
        from streamlake.operations.runner import job_args

        return job_args(job, continuous=False, await_handover=self.handover or None)

    def needs_own_jvm(self, job) -> str | None:
        """A run on a cluster master is an application of its own there; so is the run of a job
        with Spark resources of its own (``make run``'s jobs, a rescaled one): they are its
        dedicated resources, and its bronze fast path (read tasks writing the files) needs a
        session of its own. Measured in the live-platform test (2 cores): two pipelines' runs side by
        side took 147-150 s on the shared server against 121-123 s in JVMs of their own. A job on
        an object store too: only the Kafka read tasks can write its bronze files there (the fast
        path, writer=source), which a Spark Connect session cannot drive.

        Not so the catch-up that completes a restore or rescale (``resumes``) on a local master:
        the job's resources (``spark.cores.max``, ``spark.executor.cores``) have no effect on a
        local master, and the operation is proven only when this run and its verify end, so the
        JVM start is the operation's latency. Measured in ``make bench`` (2 cores, the demo's
        load), a restore's catch-up took 24.3 s as a spark-submit of its own (13,170 records, 10 s
        of it before the first micro-batch) and 12.1 s on the server (8,388 records), the restore
        from its trigger to proven 49.2 s against 31.1 s."""
        from streamlake.orchestration.hooks import connection_master
        from streamlake.storage.location import is_object_store

        if is_object_store(job.root):
            return (f"its bronze is on {job.root}, where only the Kafka read tasks write the files (writer=source): "
                    "a session of its own")

        try:
            master = connection_master(self.spark_conn_id)
        except Exception as exc:  # noqa: BLE001 (no such connection: spark-submit says so in full)
            return f"connection {self.spark_conn_id}: {exc}"
        if not master.startswith("local"):
            return f"the master of {self.spark_conn_id} is {master}, a cluster: an application of its own there"
        if job.spark_conf() and not self.resumes:
            return f"the job has Spark resources of its own ({job.spark_conf()})"
        return None


class JobVerifyOperator(_ConnectFirstOperator):
    """Every check and the data-quality validation after an operation (``jobs/verify.py``,
    :func:`streamlake.operations.verify.verify_job`): bronze against Kafka, every bronze
    row once downstream, gold against a recompute, Great Expectations on the rows the
    operation added. Fails (with the failing checks or expectations in the log) when
    one fails. With ``quality=False`` the checks only (the proof; a
    :class:`JobQualityOperator` after it reports the quality). ``expected_offsets`` (JSON)
    and ``version`` pin bronze's check, e.g. to a savepoint. Runs on the Spark Connect
    server where one answers (see the base class)."""

    job_application = "verify.py"
    template_fields = (*_ConnectFirstOperator.template_fields, "operation", "expected_offsets", "version")
    ui_color = "#e8e4f0"

    def __init__(self, *, operation: str, expected_offsets: str | None = None, version: str | int | None = None,
                 quality: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.operation = operation
        self.expected_offsets = expected_offsets
        self.version = version
        self.quality = quality

    def job_arguments(self, job) -> list[str]:
        from streamlake.orchestration.tasks import run_context

        args = ["--job", job.name, "--operation", str(self.operation), "--context", json.dumps(run_context())]
        if self.expected_offsets not in (None, "", "None"):
            offsets = self.expected_offsets
            args += ["--expected-offsets", offsets if isinstance(offsets, str) else json.dumps(offsets)]
        if self.version not in (None, "", "None"):
            args += ["--version", str(self.version)]
        return args + ([] if self.quality else ["--no-quality"])


class JobQualityOperator(_ConnectFirstOperator):
    """The data-quality validation alone (``jobs/verify.py --quality-only``): Great
    Expectations on the rows each of the job's tables gained since its last validation,
    recorded under ``operation``. Fails when a critical expectation fails (warnings only
    flag the results). Runs on the Spark Connect server where one answers."""

    job_application = "verify.py"
    template_fields = (*_ConnectFirstOperator.template_fields, "operation")
    ui_color = "#e4f0e8"

    def __init__(self, *, operation: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.operation = operation

    def job_arguments(self, job) -> list[str]:
        from streamlake.orchestration.tasks import run_context

        return ["--job", job.name, "--operation", str(self.operation), "--context", json.dumps(run_context()),
                "--quality-only"]


class JobBackfillOperator(_ConnectFirstOperator):
    """Backfill a job's gold from its pending late events (``jobs/backfill.py``), on the Spark
    Connect server where one answers (see the base class).

    ``window`` is the templated XCom dict of the range task: ``start``/``end``
    (ISO-8601 or None for all pending), ``dry_run`` and ``run_id``. The job restates
    the windows, proves gold equals a recompute from silver, records the checks, and
    writes its summary to :func:`~streamlake.orchestration.tasks.backfill_result_path`
    for the next task. Fails when the proof fails or the backfill cannot run.
    """

    job_application = "backfill.py"
    template_fields = (*_ConnectFirstOperator.template_fields, "window")
    ui_color = "#f3ead7"

    def __init__(self, *, window: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.window = window

    def job_arguments(self, job) -> list[str]:
        from streamlake.orchestration.tasks import backfill_result_path, run_context

        window = self.window if isinstance(self.window, dict) else json.loads(self.window)
        self.log.info("backfill %s of job %s: event time [%s, %s)%s", window["run_id"], job.name,
                      window.get("start") or "-inf", window.get("end") or "+inf",
                      " (dry run)" if window.get("dry_run") else "")
        args = ["--job", job.name, "--run-id", window["run_id"], "--result", str(backfill_result_path(window["run_id"])),
                "--context", json.dumps(run_context())]
        args += ["--aggregate", window["aggregate"]] if window.get("aggregate") else []
        args += ["--from", window["start"]] if window.get("start") else []
        args += ["--to", window["end"]] if window.get("end") else []
        return args + (["--dry-run"] if window.get("dry_run") else [])
