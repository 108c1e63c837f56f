"""Operators for named jobs, built on the Apache Spark provider."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


class JobRunOperator(SparkSubmitOperator):
    """Run a job's pipeline once with available-now triggers, via spark-submit.

    Every stage (bronze ingest, silver, gold, as the job defines) catches up
    with what Kafka holds when the run starts, then the run ends.

    Everything spark-submit needs (application, arguments, Spark properties for
    the job's resources, environment) comes from the job spec
    (:mod:`streamlake.operations.jobs`) when the task runs, so a rescale or an edited spec
    takes effect at the next run. ``job_name`` and ``spark_conn_id`` are
    templated: DAG params choose the job and the master (``spark_default`` is
    ``local[*]``, ``spark_cluster`` the standalone cluster). Fails when
    spark-submit fails (the ingest job's exit status).
    """

    template_fields = (*SparkSubmitOperator.template_fields, "job_name", "spark_conn_id")
    ui_color = "#e4f0e8"

    def __init__(self, *, job_name: str, spark_conn_id: str = "spark_default", **kwargs: Any) -> None:
        kwargs.setdefault("name", "streamlake-pipeline")
        super().__init__(application="(set from the job spec at run time)", conn_id=spark_conn_id, **kwargs)
        self.job_name = job_name
        self.spark_conn_id = spark_conn_id

    def execute(self, context) -> None:
        from streamlake.operations.jobs import load_job
        from streamlake.operations.runner import application, job_args, spark_conf, spark_env

        job = load_job(self.job_name)
        self.application = application()
        self.application_args = job_args(job, continuous=False)
        self.conf = spark_conf(job)
        self.env_vars = spark_env()
        self.name = f"streamlake:{job.name}"
        self._conn_id = self.spark_conn_id
        self._hook = None
        self.log.info("job %s: %s -> %s under %s via connection %s, resources %s", job.name, ",".join(job.topics),
                      " -> ".join(job.stages), job.root, self.spark_conn_id, job.spark_conf() or "defaults")
        super().execute(context)


class JobBackfillOperator(SparkSubmitOperator):
    """Backfill a job's gold from its pending late events via spark-submit (``jobs/backfill.py``).

    ``window`` is the templated XCom dict of the range task: ``start``/``end``
    (ISO-8601 or None for all pending), ``dry_run`` and ``run_id``. The job restates
    the windows, proves gold equals a recompute from silver, records the checks, and
    writes its summary to :func:`result_path` for the next task. Fails when the
    proof fails (exit status 3) or the backfill cannot run.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "job_name", "spark_conn_id", "window")
    ui_color = "#f3ead7"

    def __init__(self, *, job_name: str, window: Any, spark_conn_id: str = "spark_default", **kwargs: Any) -> None:
        kwargs.setdefault("name", "streamlake-backfill")
        super().__init__(application="(set at run time)", conn_id=spark_conn_id, **kwargs)
        self.job_name = job_name
        self.window = window
        self.spark_conn_id = spark_conn_id

    def execute(self, context) -> None:
        import json

        from streamlake.operations.jobs import load_job
        from streamlake.operations.runner import spark_conf, spark_env
        from streamlake.orchestration.tasks import backfill_result_path, run_context
        from streamlake.spark.session import job_path

        job = load_job(self.job_name)
        window = self.window if isinstance(self.window, dict) else json.loads(self.window)
        args = ["--job", job.name, "--run-id", window["run_id"], "--result", str(backfill_result_path(window["run_id"])),
                "--context", json.dumps(run_context())]
        args += ["--from", window["start"]] if window.get("start") else []
        args += ["--to", window["end"]] if window.get("end") else []
        args += ["--dry-run"] if window.get("dry_run") else []
        self.application = job_path("backfill.py")
        self.application_args = args
        self.conf = spark_conf(job)
        self.env_vars = spark_env()
        self.name = f"streamlake-backfill:{job.name}"
        self._conn_id = self.spark_conn_id
        self._hook = None
        self.log.info("backfill %s of job %s: event time [%s, %s)%s", window["run_id"], job.name,
                      window.get("start") or "-inf", window.get("end") or "+inf",
                      " (dry run)" if window.get("dry_run") else "")
        super().execute(context)
