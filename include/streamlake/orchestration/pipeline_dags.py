"""The DAGs of one pipeline definition: ``ingest_<name>`` and ``backfill_<name>``.

``dags/pipelines.py`` builds both for every definition in the pipelines
directory, so a pipeline a user describes in one file is scheduled, operable
and documented in the UI without Python. The operation DAGs (``savepoint``,
``restore``, ``rescale``) are shared and take the pipeline as a drop-down.

Every param a person sees in a trigger form works with its default, and every
optional one is optional in the form (``type=["null", ...]``): the Trigger
button is never disabled by a field left alone. What only other DAGs set (the
operation a resumed run completes) travels in the run's ``conf``, not in the
form.
"""

from __future__ import annotations

import datetime as dt
import os

from streamlake.orchestration.dag_parts import (
    HANDOVER_CONF_KEY,
    RESUMES_CONF_KEY,
    SETTINGS_CONF_KEY,
    START_DATE,
    operation_failed,
    operation_proven,
)

INGEST_EVERY_MINUTES = int(os.environ.get("STREAMLAKE_INGEST_EVERY_MINUTES", "5"))
# Two runs at a time, each task one run at a time: a run's job (its ingest or supervisor) starts
# while the run before it still proves itself (verify, quality), so a restore's or rescale's run
# does not queue behind a proof; the job's own tasks never run side by side.
INGEST_ACTIVE_RUNS = 2
ONE_RUN_AT_A_TIME = {"max_active_tis_per_dag": 1}


def ingest_dag_id(pipeline: str) -> str:
    return f"ingest_{pipeline}"


def backfill_dag_id(pipeline: str) -> str:
    return f"backfill_{pipeline}"


def _store_doc(job) -> str:
    """A paragraph for a job whose tables are on an object store: where its tasks get the
    store's credentials (:mod:`streamlake.orchestration.hooks`)."""
    from streamlake.orchestration.hooks import DEFAULT_STORAGE_CONN_ID
    from streamlake.storage.location import is_object_store

    if not is_object_store(job.root):
        return ""
    conn = job.storage_conn_id or DEFAULT_STORAGE_CONN_ID
    return (f"\n**On an object store.** Every task that reads or writes the tables gets the store's credentials "
            f"and endpoint in its process's environment from the Airflow connection `{conn}` (type `aws`). Its "
            f"checks and backfills go to the Spark Connect server only where `spark_connect_default` "
            f"declares that the server holds `{conn}`'s credentials (extra `storage_conn_id`, as `make run "
            f"LAKE=s3` defines it); else each is a spark-submit of its own.\n")


def _tables_doc(definition) -> str:
    lines = ["| table | what it holds |", "|---|---|",
             f"| `bronze` | records of {', '.join(f'`{t}`' for t in definition.topics) or definition.topic_pattern}, "
             "once each, with their Kafka offsets |",
             "| `silver` | " + ", ".join(f"`{f.name}` {f.type}" for f in definition.fields) + ", lineage |",
             "| `quarantine` | every record that is not a valid event; reasons in order: "
             + ", ".join(f"`{r}`" for r in definition.quarantine_reasons()) + " |"]
    for agg in definition.aggregates:
        measures = ", ".join(f"`{m.column}` = {m.expression}" for m in agg.measures)
        lines.append(f"| `gold/{agg.name}` | per {', '.join(f'`{k}`' for k in agg.keys) or 'window'} and "
                     f"`{agg.window}` window: {measures} |")
        lines.append(f"| `late_events/{agg.name}` | events that arrived after their `{agg.name}` window closed "
                     f"(allowed lateness {agg.to_dict()['allowed_lateness']}), kept until a backfill applies them |")
    return "\n".join(lines)


def ingest_dag(job, definition):
    """``ingest_<pipeline>``: the pipeline's stages, scheduled (available-now) or continuous,
    then the proof (the checks), then the data-quality report."""
    from airflow.sdk import DAG, Param, TriggerRule, task

    from streamlake.orchestration.assets import stage_outputs, topic_assets
    from streamlake.orchestration.operators import JobQualityOperator, JobRunOperator, JobVerifyOperator

    doc = f"""
### {ingest_dag_id(job.name)}: pipeline `{job.name}`, Kafka -> bronze -> silver -> gold, exactly once

{definition.description or ''}

Defined in `{definition.source}` (`streamlake pipeline validate` prints it); tables under `{job.root}`:

{_tables_doc(definition)}
{_store_doc(job)}
Two modes, chosen by the `mode` param:

* **scheduled** (what the schedule runs, every {INGEST_EVERY_MINUTES} minutes): every stage with the
  *available-now* trigger, one after the other. Everything Kafka holds at the start flows through to
  gold. A job without Spark resources of its own, on a local master (`spark_default`), runs on the
  platform's Spark Connect server (`spark_connect_default`) when that answers, with no JVM of its
  own; so does the catch-up that completes a restore or rescale on a local master (`restored__…`,
  `rescaled__…`: the operation waits for it, and a job's resources do not apply to a local master).
  With `spark_cluster`, for another run of a job with resources of its own, or when no server answers, through
  the Spark provider's `spark-submit` on the master of the `spark_conn_id` connection. The task log
  says which.
* **continuous** (trigger by hand): a supervisor keeps the processing-time queries running and restarts
  them by the restart strategy in the params (`fixed-delay`, `failure-rate` or `none`, as in Flink).
  The run ends when the job is stopped (`streamlake job stop {job.name}`, or the `savepoint` DAG with
  *stop*).

Then **verify**, the proof: bronze against Kafka, every bronze row once downstream, every gold table
against a recompute from silver (StreamLake menu: *Consistency checks*). After it passes, **quality**:
Great Expectations on the rows the run added (*Data quality*); it fails the run when a critical
expectation fails. A run started by `restore` or `rescale` (`restored__…` / `rescaled__…`) completes
that operation: its proof is that operation's, and its checks and quality results are recorded under
it. A rescale starts its run before it stops the job, with the new settings in the run's configuration:
that run's job starts its Spark session at once and waits for the rescale to hand the stopped job over
before it touches a table (its log says when).

Two runs at a time, each task of them one run at a time: the next run's job starts while the run
before it still proves itself, so a restore's or rescale's run never waits for a proof, and two runs'
jobs never run side by side. A scheduled run while a supervisor runs the job continuously does nothing:
its `ingest_available_now` is skipped and says why (the continuous job keeps every stage up to date).
"""
    tables = stage_outputs(job.name)
    topics = topic_assets(job.name)
    with DAG(
        dag_id=ingest_dag_id(job.name),
        description=f"{job.name}: Kafka -> bronze -> silver -> gold exactly once, then the proof",
        doc_md=doc,
        schedule=dt.timedelta(minutes=INGEST_EVERY_MINUTES),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=INGEST_ACTIVE_RUNS,
        is_paused_upon_creation=False,
        tags=["streamlake", "ingest", f"pipeline:{job.name}"],
        default_args={"owner": "streamlake", "retries": 2, "retry_delay": dt.timedelta(minutes=1)},
        params={
            "mode": Param("scheduled", type="string", enum=["scheduled", "continuous"], title="Mode",
                          description="scheduled: one available-now run, then stop. continuous: a supervised "
                                      "processing-time query that runs until stopped."),
            "spark_conn_id": Param("spark_default", type="string", enum=["spark_default", "spark_cluster"],
                                   title="Spark connection",
                                   description="spark_default (local[*]) or spark_cluster (the standalone cluster)."),
            "restart_strategy": Param("fixed-delay", type="string", enum=["fixed-delay", "failure-rate", "none"],
                                      title="Restart strategy (continuous)", section="Continuous mode",
                                      description="fixed-delay: up to N restarts in a row; failure-rate: restart "
                                                  "while failures per interval stay under the maximum; none."),
            "restart_attempts": Param(3, type="integer", minimum=0, title="fixed-delay: attempts",
                                      section="Continuous mode", description="Restarts in a row before giving up."),
            "restart_delay_seconds": Param(10, type="number", minimum=0, title="Restart delay (s)",
                                           section="Continuous mode",
                                           description="Wait before each restart (fixed-delay and failure-rate)."),
            "max_failures_per_interval": Param(3, type="integer", minimum=0, title="failure-rate: max failures",
                                               section="Continuous mode",
                                               description="Most failures allowed within the interval."),
            "failure_interval_seconds": Param(300, type="number", exclusiveMinimum=0,
                                              title="failure-rate: interval (s)", section="Continuous mode",
                                              description="Window in which failures are counted."),
        },
    ) as dag:

        @task.branch(task_id="choose_mode")
        def choose_mode(params: dict) -> str:
            """Scheduled -> one available-now run; continuous -> the supervisor."""
            return "ingest_available_now" if params["mode"] == "scheduled" else "supervise_continuous"

        ingest = JobRunOperator(
            task_id="ingest_available_now", job_name=job.name, spark_conn_id="{{ params.spark_conn_id }}",
            resumes=f"{{{{ dag_run.conf.get('{RESUMES_CONF_KEY}') or '' }}}}",
            settings=f"{{{{ (dag_run.conf.get('{SETTINGS_CONF_KEY}') or {{}}) | tojson }}}}",
            handover=f"{{{{ dag_run.conf.get('{HANDOVER_CONF_KEY}') or '' }}}}",
            doc_md="The pipeline's stages, available-now, one after the other: on the Spark Connect server, "
                   "or a spark-submit of its own (the log says which and why).",
            on_failure_callback=operation_failed,  # in a rescale's run: the rescale failed
            inlets=topics, outlets=tables, **ONE_RUN_AT_A_TIME)

        @task(task_id="supervise_continuous", retries=0, inlets=topics, outlets=tables,
              on_failure_callback=operation_failed, **ONE_RUN_AT_A_TIME)
        def supervise(params: dict, dag_run=None) -> dict:
            """Run the processing-time job under the restart strategy; retries are the strategy's job."""
            from streamlake.orchestration.tasks import supervise_continuous

            conf = dag_run.conf or {}
            return supervise_continuous(job.name, params["spark_conn_id"], {
                "kind": params["restart_strategy"], "attempts": params["restart_attempts"],
                "delay_s": params["restart_delay_seconds"], "max_failures": params["max_failures_per_interval"],
                "interval_s": params["failure_interval_seconds"]},
                settings=conf.get(SETTINGS_CONF_KEY), handover=conf.get(HANDOVER_CONF_KEY),
                resumes=conf.get(RESUMES_CONF_KEY))

        operation = f"{{{{ dag_run.conf.get('{RESUMES_CONF_KEY}') or 'ingest-' ~ params.mode }}}}"
        verify = JobVerifyOperator(
            task_id="verify", job_name=job.name, spark_conn_id="{{ params.spark_conn_id }}", operation=operation,
            quality=False, trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS, **ONE_RUN_AT_A_TIME,
            # in the run a rescale started, this proves (or fails) the rescale (operation_outcomes)
            on_success_callback=operation_proven, on_failure_callback=operation_failed,
            doc_md="The proof: bronze vs Kafka, every bronze row once downstream, gold vs a recompute from silver.")
        quality = JobQualityOperator(
            task_id="quality", job_name=job.name, spark_conn_id="{{ params.spark_conn_id }}", operation=operation,
            doc_md="Great Expectations on the rows each table gained since its last validation (after the proof).",
            **ONE_RUN_AT_A_TIME)

        @task.run_if(lambda context: (context["dag_run"].conf or {}).get(RESUMES_CONF_KEY) == "rescale",
                     skip_message="not resuming a rescale")
        @task(task_id="rescale_throughput")
        def rescale_throughput(run_id: str) -> dict:
            """After a rescale: rows/s on the new resources, recorded next to the throughput before
            (of the rescale whose run started this one, ``rescaled__<its run id>``, when it did)."""
            from streamlake.orchestration.dag_parts import resumed_run_prefix
            from streamlake.orchestration.tasks import measure_rescale

            prefix = resumed_run_prefix("rescale")
            if run_id.startswith(prefix):  # its rescale is recorded while this run starts: wait for it a while
                return measure_rescale(job.name, run_id.removeprefix(prefix), wait_s=120)
            return measure_rescale(job.name)

        choose_mode() >> [ingest, supervise()] >> verify >> [quality, rescale_throughput()]
    return dag


def backfill_dag(job, definition):
    """``backfill_<pipeline>``: apply pending late events to gold (a range, or all), prove it."""
    from airflow.sdk import DAG, Param, task
    from airflow.timetables.interval import CronDataIntervalTimetable

    from streamlake.orchestration.assets import table_assets
    from streamlake.orchestration.dag_parts import START_DATE as start
    from streamlake.orchestration.operators import JobBackfillOperator

    aggregates = [a.name for a in definition.aggregates]
    doc = f"""
### {backfill_dag_id(job.name)}: repair the gold tables of pipeline `{job.name}` with their late events

Gold never drops a late event (one whose window had closed when it arrived): each aggregate keeps its
own in `late_events/<aggregate>` with `applied = false`. This DAG applies them:

1. **resolve_range**: a **manual trigger** uses the form: an event-time range (date-time pickers) or
   *all pending late events*, one aggregate or every one ({', '.join(f'`{a}`' for a in aggregates)});
   *dry run* lists what would change. A **scheduled** run (hourly) and Airflow's own **Backfill** (the
   trigger dialog's *Backfill* tab) repair their **data interval**.
2. **backfill** (`jobs/backfill.py` on the platform's Spark Connect server; spark-submit when none
   answers): per aggregate, pins silver at the version gold has consumed, recomputes every window the pending late events of the range belong to, replaces them in
   **one Delta commit**, marks those late events applied; then proves gold equals a recompute from
   silver for the range and every bronze row is accounted for once (recorded in `consistency_checks`),
   and validates data quality. Safe while the pipeline runs; a second run changes nothing.
3. **report**: the restated windows and the checks.
{_store_doc(job)}
Shell: `streamlake backfill --job {job.name} [--aggregate NAME] [--from T1 --to T2] [--dry-run]`.
*StreamLake -> Late events* shows pending late events per hour with a link to this form.
"""
    tables = table_assets(job.name)
    with DAG(
        dag_id=backfill_dag_id(job.name),
        description=f"{job.name}: apply pending late events to gold, prove gold equals a recompute from silver",
        doc_md=doc,
        # Data intervals: each scheduled run restates the hour before it; Backfill restates the hours given.
        schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
        start_date=start,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,
        tags=["streamlake", "backfill", "late-data", f"pipeline:{job.name}"],
        default_args={"owner": "streamlake", "retries": 1, "retry_delay": dt.timedelta(seconds=30),
                      "on_failure_callback": operation_failed},
        params={
            "aggregate": Param(None, type=["null", "string"], enum=[None, *aggregates], title="Aggregate",
                               section="What", values_display={"null": "every aggregate"},
                               description="Which gold table to repair (empty: every aggregate of the pipeline)."),
            "all_pending": Param(True, type="boolean", title="All pending late events", section="What",
                                 description="Apply every late event not applied yet, whatever its event time "
                                             "(the range below is then ignored)."),
            "start": Param(None, type=["null", "string"], format="date-time", title="Event time from",
                           section="Range", description="First event time to repair (UTC); used when 'All "
                                                        "pending' is off."),
            "end": Param(None, type=["null", "string"], format="date-time", title="Event time to", section="Range",
                         description="Event time to repair up to, exclusive (UTC); used when 'All pending' is off."),
            "dry_run": Param(False, type="boolean", title="Dry run", section="What",
                             description="Only list the windows that would be restated and the late events that "
                                         "would be applied; change nothing."),
            "spark_conn_id": Param("spark_default", type="string", enum=["spark_default", "spark_cluster"],
                                   title="Spark connection", section="Where",
                                   description="Where the backfill job runs when no Spark Connect server "
                                               "answers (it runs on that server when one does): spark_default "
                                               "(local[*]) or spark_cluster."),
        },
    ) as dag:

        @task(task_id="resolve_range")
        def resolve_range(params: dict, dag_run=None, data_interval_start=None, data_interval_end=None) -> dict:
            """Manual runs: the form's range (or all pending); scheduled and backfill runs: the data interval."""
            from streamlake.orchestration.tasks import backfill_range

            return backfill_range(params, dag_run.run_type, data_interval_start, data_interval_end, dag_run.run_id)

        window = resolve_range()
        gold = [tables[a.gold_table] for a in definition.aggregates if a.gold_table in tables]
        late = [tables[a.late_table] for a in definition.aggregates if a.late_table in tables]
        backfill = JobBackfillOperator(
            task_id="backfill", job_name=job.name, spark_conn_id="{{ params.spark_conn_id }}", window=window,
            inlets=[tables["silver"], *late] if "silver" in tables else late, outlets=[*gold, *late],
            doc_md="jobs/backfill.py on the Spark Connect server (spark-submit when none answers): restate the "
                   "windows, mark late events applied, prove and record.")

        @task(task_id="report", on_success_callback=operation_proven)
        def report(window: dict) -> dict:
            """The windows restated, the late events applied and the checks' verdicts."""
            from streamlake.orchestration.tasks import backfill_report

            return backfill_report(window)

        window >> backfill >> report(window)
    return dag
