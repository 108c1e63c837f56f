"""
### streaming_ingest: the pipeline, Kafka -> bronze -> silver -> gold, exactly once

The job's stages (`streamlake job show NAME`), each a Spark streaming query
chained through Delta tables:

* **bronze**: Kafka records as they arrived; every record once, Kafka offsets
  committed in the same Delta commit as the data;
* **silver**: typed, validated events (`event_id`, `sensor_id`, `event_time`,
  `temperature` + lineage), duplicates removed; every record that is not a
  valid event goes to **quarantine** with a reason code and message;
* **gold**: per sensor and event-time window (tumbling 1 minute by default):
  count, min, max, exact sum and average. A watermark (max event time minus
  the allowed lateness, 30 s by default) decides lateness; an event whose
  window has closed is kept in **late_events** (never dropped) until the
  `backfill_late_data` DAG restates its windows.

Two modes, chosen by the `mode` param:

* **scheduled** (what the schedule runs): every stage with the *available-now*
  trigger, one after the other, through the Spark provider's `spark-submit`,
  on the master of the `spark_conn_id` connection (`spark_default` =
  `local[*]`, `spark_cluster` = the standalone cluster of `streamlake spark
  start`). Everything Kafka holds at start flows through to gold, then the run
  stops. The schedule interval is
  `STREAMLAKE_INGEST_EVERY_MINUTES` (default 5), read when the DAG is parsed:
  Airflow params cannot change a schedule.
* **continuous** (trigger manually): a supervisor keeps the processing-time
  queries running and restarts it after a failure by the restart strategy in the params
  (`fixed-delay`, `failure-rate` or `none`, as in Flink). Every restart is
  logged with its cause; when the strategy gives up, the run fails with the
  reason. The run ends successfully when the job is stopped on request
  (`streamlake job stop NAME`, or the `savepoint` DAG with `stop=true`).

Either way, **verify** follows (spark-submit `jobs/verify.py`): bronze against
Kafka (missing / duplicated / extra / mismatched records, incremental from the
last proof), every bronze row once downstream (silver + quarantine + dropped
duplicates), gold against a recompute from silver, and Great Expectations on
the rows the run added. Results go to the `consistency_checks` and
`quality_results` tables (StreamLake menu); a failed check or a critical
expectation fails the run with the details in the log. The tables are Airflow
Assets: the Assets view shows what feeds what.

A run started by the `restore` or `rescale` DAG (id `restored__…` /
`rescaled__…`, param `resumes`) completes that operation: its checks are
recorded under it, and after a rescale **rescale_throughput** records the
rows/s on the new resources next to the throughput before.

Only one run at a time (`max_active_runs=1`): scheduled runs wait while a
continuous run is active. Logic lives in `include/streamlake/`.
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG, Param, TriggerRule, task

from streamlake.operations.jobs import DEMO_JOB
from streamlake.orchestration.assets import stage_outputs, topic_assets
from streamlake.orchestration.dag_parts import START_DATE
from streamlake.orchestration.operators import JobRunOperator, JobVerifyOperator

TABLES = stage_outputs(DEMO_JOB)
TOPICS = topic_assets(DEMO_JOB)

EVERY_MINUTES = int(os.environ.get("STREAMLAKE_INGEST_EVERY_MINUTES", "5"))

with DAG(
    dag_id="streaming_ingest",
    description="Kafka -> bronze -> silver -> gold exactly once: scheduled available-now runs or a supervised "
                "continuous job",
    doc_md=__doc__,
    schedule=dt.timedelta(minutes=EVERY_MINUTES),
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    tags=["streamlake", "ingest", "pipeline", "exactly-once"],
    default_args={"owner": "streamlake", "retries": 2, "retry_delay": dt.timedelta(minutes=1)},
    params={
        "job": Param(DEMO_JOB, type="string", title="Job",
                     description="Name of the job: its topics, table and checkpoint (`streamlake job show NAME`)."),
        "mode": Param("scheduled", type="string", enum=["scheduled", "continuous"], title="Mode",
                      description="scheduled: one available-now run, then stop. continuous: a supervised "
                                  "processing-time query that runs until stopped."),
        "spark_conn_id": Param("spark_default", type="string", title="Spark connection",
                               description="Airflow connection of the Spark master: spark_default (local[*]) or "
                                           "spark_cluster (spark://127.0.0.1:7077)."),
        "restart_strategy": Param("fixed-delay", type="string", enum=["fixed-delay", "failure-rate", "none"],
                                  title="Restart strategy (continuous)",
                                  description="fixed-delay: up to N restarts in a row; failure-rate: restart while "
                                              "failures per interval stay under the maximum; none: never restart."),
        "restart_attempts": Param(3, type="integer", minimum=0, title="fixed-delay: attempts",
                                  description="Restarts in a row before giving up (fixed-delay)."),
        "restart_delay_seconds": Param(10, type="number", minimum=0, title="Restart delay (s)",
                                       description="Wait before each restart (fixed-delay and failure-rate)."),
        "max_failures_per_interval": Param(3, type="integer", minimum=0, title="failure-rate: max failures",
                                           description="Most failures allowed within the interval (failure-rate)."),
        "failure_interval_seconds": Param(300, type="number", exclusiveMinimum=0,
                                          title="failure-rate: interval (s)",
                                          description="Window in which failures are counted (failure-rate)."),
        "resumes": Param("", type="string", enum=["", "restore", "rescale"], title="Resumes after",
                         description="Set by the restore and rescale DAGs when they start the job: the operation "
                                     "this run completes. Its checks are recorded under it, and after a rescale "
                                     "it records the throughput on the new resources. Empty for ordinary runs."),
    },
) as dag:

    @task.branch(task_id="choose_mode")
    def choose_mode(params: dict) -> str:
        """Scheduled -> one available-now spark-submit; continuous -> the supervisor."""
        return "ingest_available_now" if params["mode"] == "scheduled" else "supervise_continuous"

    ingest = JobRunOperator(
        task_id="ingest_available_now",
        job_name="{{ params.job }}",
        spark_conn_id="{{ params.spark_conn_id }}",
        doc_md="The job's stages, available-now, one after the other, via the Spark provider's spark-submit.",
        inlets=TOPICS,
        outlets=TABLES,
    )

    @task(task_id="supervise_continuous", retries=0, inlets=TOPICS, outlets=TABLES)
    def supervise(params: dict) -> dict:
        """Run the processing-time job under the restart strategy; retries are the strategy's job."""
        from streamlake.orchestration.tasks import supervise_continuous

        return supervise_continuous(params["job"], params["spark_conn_id"], {
            "kind": params["restart_strategy"],
            "attempts": params["restart_attempts"],
            "delay_s": params["restart_delay_seconds"],
            "max_failures": params["max_failures_per_interval"],
            "interval_s": params["failure_interval_seconds"],
        })

    verify = JobVerifyOperator(
        task_id="verify",
        job_name="{{ params.job }}",
        spark_conn_id="{{ params.spark_conn_id }}",
        operation="{{ params.resumes or 'ingest-' ~ params.mode }}",
        trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
        doc_md="Checks (bronze vs Kafka, every bronze row once downstream, gold vs recompute) and data quality.",
    )

    @task.run_if(lambda context: context["params"]["resumes"] == "rescale",
                 skip_message="not resuming a rescale")
    @task(task_id="rescale_throughput")
    def rescale_throughput(params: dict) -> dict:
        """After a rescale: rows/s on the new resources, recorded next to the throughput before."""
        from streamlake.orchestration.tasks import measure_rescale

        return measure_rescale(params["job"])

    choose_mode() >> [ingest, supervise()] >> verify >> rescale_throughput()
