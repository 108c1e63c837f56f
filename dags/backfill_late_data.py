"""
### backfill_late_data: repair gold with the late events it kept, and prove it

Gold never drops a late event (one whose window had closed when it arrived):
the streaming gold stage keeps it in `late_events` with `applied = false`. This
DAG applies them. Each run:

1. **resolve_range**: which event times to repair. A **manual trigger** uses the
   form: an event-time range (date-time pickers), or *all pending late events*;
   *dry run* lists what would change and changes nothing. A **scheduled** run
   (hourly, no catch-up) and Airflow's own **Backfill** (the trigger dialog's
   *Backfill* tab, or `airflow backfill create --dag-id backfill_late_data
   --from-date ... --to-date ...`) repair their **data interval**.
2. **backfill** (spark-submit `jobs/backfill.py`): pins silver at the version
   gold has consumed, recomputes every window the pending late events of the
   range belong to from silver in batch, replaces them in **one Delta commit**
   (only rows whose values change), and marks those late events applied. Safe
   while the streaming job runs: the commit carries gold's position, so
   whichever of the two commits second re-plans on top of the other; closed
   windows only change through backfills. Idempotent: a second run over the
   same range finds nothing pending and changes nothing.
3. Then, in the same job, the **proof**, recorded in `consistency_checks`: for
   the range, gold equals a batch recompute from silver (counts, min, max and
   exact sums; averages within 1e-9) and every late event the run saw is marked
   applied; and every bronze row is accounted for once (silver + quarantine +
   dropped duplicates, by lineage). A failed proof fails the run.
4. **report**: the restated windows and the checks, in the log and as XCom.

Shell: `streamlake backfill --job NAME [--from T1 --to T2] [--dry-run]`. The
*StreamLake -> Late events* view shows pending late events per hour with a link
that opens this form for that hour.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param, task
from airflow.timetables.interval import CronDataIntervalTimetable

from streamlake.operations.jobs import DEMO_JOB
from streamlake.orchestration.assets import table_assets
from streamlake.orchestration.dag_parts import START_DATE
from streamlake.orchestration.operators import JobBackfillOperator

TABLES = table_assets(DEMO_JOB)

with DAG(
    dag_id="backfill_late_data",
    description="Apply pending late events to gold (manual range or hourly data interval), prove gold equals a "
                "recompute from silver",
    doc_md=__doc__,
    # Data intervals (not Airflow 3's default trigger timetable, whose runs have none):
    # each run restates the hour before it; Backfill restates the hours it is given.
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    tags=["streamlake", "backfill", "late-data", "pipeline"],
    default_args={"owner": "streamlake", "retries": 1, "retry_delay": dt.timedelta(seconds=30)},
    params={
        "job": Param(DEMO_JOB, type="string", title="Job", section="What",
                     description="Name of the job whose gold to repair (`streamlake job list`)."),
        "all_pending": Param(True, type="boolean", title="All pending late events", section="What",
                             description="Apply every late event not applied yet, whatever its event time "
                                         "(the range below is then ignored)."),
        "start": Param(None, type=["null", "string"], format="date-time", title="Event time from", section="Range",
                       description="First event time to repair (UTC); used when 'All pending' is off."),
        "end": Param(None, type=["null", "string"], format="date-time", title="Event time to", section="Range",
                     description="Event time to repair up to, exclusive (UTC); used when 'All pending' is off."),
        "dry_run": Param(False, type="boolean", title="Dry run", section="What",
                         description="Only list the windows that would be restated and the late events that would "
                                     "be applied; change nothing."),
        "spark_conn_id": Param("spark_default", type="string", title="Spark connection", section="Where",
                               description="Where the backfill job runs: spark_default (local[*]) or spark_cluster."),
    },
) as dag:

    @task(task_id="resolve_range")
    def resolve_range(params: dict, dag_run=None, data_interval_start=None, data_interval_end=None) -> dict:
        """Manual runs: the form's range (or all pending); scheduled and backfill runs: the data interval."""
        from streamlake.orchestration.tasks import backfill_range

        return backfill_range(params, dag_run.run_type, data_interval_start, data_interval_end, dag_run.run_id)

    window = resolve_range()

    backfill = JobBackfillOperator(
        task_id="backfill",
        job_name="{{ params.job }}",
        spark_conn_id="{{ params.spark_conn_id }}",
        window=window,
        inlets=[TABLES["silver"], TABLES["late_events"]],
        outlets=[TABLES["gold"], TABLES["late_events"]],
        doc_md="spark-submit jobs/backfill.py: restate the windows, mark late events applied, prove and record.",
    )

    @task(task_id="report")
    def report(window: dict) -> dict:
        """The windows restated, the late events applied and the checks' verdicts."""
        from streamlake.orchestration.tasks import backfill_report

        return backfill_report(window)

    window >> backfill >> report(window)
