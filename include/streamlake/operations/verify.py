"""The proof after an operation: every check, and the data-quality validation.

After an ingest, a savepoint, a restore, a rescale or a backfill, the DAGs run
``jobs/verify.py`` (on the Spark Connect server, or a spark-submit), which calls
:func:`verify_job`. The checks (1-3) prove that nothing was lost or duplicated;
the validation (4) reports on the rows. They can run together (the savepoint and
restore DAGs' verify) or apart (the ingest DAG: ``verify`` runs the checks, the
proof of the run and of the operation it completes, then ``quality`` the report):

1. **bronze against Kafka** (:func:`streamlake.operations.consistency.check_consistency`,
   incremental from the last proof), optionally at a pinned version and with the
   offsets the table must hold (a savepoint's, after a restore);
2. **every bronze row once downstream** (silver + quarantine + dropped duplicates,
   :func:`~streamlake.operations.pipeline_checks.account_for_bronze`), over the
   bronze versions since the last passing accounting;
3. **every gold table equals a recompute from silver** (:func:`~streamlake.operations.pipeline_checks.check_gold`,
   one check per aggregate) for the event times of the silver rows added since
   that aggregate's last gold check;
4. **data quality**: the rows each table's commits added since its last
   validation, with Great Expectations (:mod:`streamlake.quality`).

Every result is recorded (``consistency_checks``, ``quality_results``). Raises
ConsistencyError when a check fails, QualityError when a critical expectation
fails; warnings only flag the results.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Mapping

from streamlake.operations.jobs import JobSpec

log = logging.getLogger(__name__)


def _last_passing(job: JobSpec, kind: str, aggregate: str | None = None) -> dict | None:
    """The details of the job's newest passing check of ``kind`` (of ``aggregate`` for gold)."""
    from streamlake.operations.consistency import recent_checks

    for row in recent_checks(500, job.name):
        if row.get("kind") == kind and row.get("verdict") == "PASS":
            details = json.loads(row.get("context") or "{}").get("details") or {}
            if aggregate is None or details.get("aggregate") == aggregate:
                return details
    return None


def verify_job(spark, job: JobSpec, operation: str, *, context: Mapping | None = None,
               expected_offsets: dict | None = None, bronze_version: int | None = None,
               checks: bool = True, quality: bool = True, job_running: bool = False) -> dict:
    """Run and record every check (``checks``) and the quality validation (``quality``) for
    ``job`` after ``operation`` (see the module docstring). Returns a JSON-able summary; raises
    ConsistencyError when a check failed, QualityError when a critical expectation failed
    (every result recorded first), ValueError when asked for neither. The checks of one job
    run one at a time, and so do its validations (``JobControl.proving``): the later one covers
    what changed since; a run's checks do not wait for the previous run's validation."""
    import contextlib

    if not (checks or quality):
        raise ValueError("verify_job needs checks, quality or both")
    with contextlib.ExitStack() as held:
        for part, wanted in (("checks", checks), ("quality", quality)):  # always in this order
            if wanted:
                held.enter_context(job.control.proving(part=part))
        return _verify(spark, job, operation, context=context, expected_offsets=expected_offsets,
                       bronze_version=bronze_version, checks=checks, quality=quality, job_running=job_running)


def _verify(spark, job: JobSpec, operation: str, *, context: Mapping | None, expected_offsets: dict | None,
            bronze_version: int | None, checks: bool, quality: bool, job_running: bool) -> dict:
    context = dict(context or {})
    summary = {"job": job.name, "operation": operation, "checks": []}
    if checks:
        summary["checks"] = _run_checks(spark, job, operation, context, expected_offsets, bronze_version)
    if quality:
        from streamlake.quality.validate import validate_operation

        reports = validate_operation(job.tables(), None, operation, context, definition=job.definition, spark=spark,
                                     job_running=job_running, raise_on_critical=False)
        summary["quality"] = [{"table": r.table, "status": r.status, "rows": r.rows,
                               "versions": [r.from_version, r.to_version]} for r in reports]
        for r in reports:
            log.info("quality of %s %s: %s (%d rows)", r.table, [r.from_version, r.to_version], r.status, r.rows)
    from streamlake.operations.consistency import require_passed

    require_passed(summary["checks"])
    if quality:
        from streamlake.quality.validate import require_quality

        require_quality(reports)
    return summary


def _run_checks(spark, job: JobSpec, operation: str, context: dict, expected_offsets: dict | None,
                bronze_version: int | None) -> list[dict]:
    """Run and record checks 1-3 of the module docstring; their results (not raised here).

    The checks run side by side, then are recorded one after the other (audit, accounting,
    gold per aggregate): the Kafka audit is Python (delta-rs and Kafka), the others are Spark
    jobs the session runs at the same time, and none reads what another records (each starts
    from the proofs before this verify). Small jobs leave a session's cores idle between
    their stages, so together they take about the time of the longest, not the sum. An error
    of a check (Kafka down, a table missing) is raised once the checks before it are recorded."""
    from concurrent.futures import ThreadPoolExecutor

    from streamlake.kafka.offsets import offsets_from_json
    from streamlake.operations.consistency import check_consistency, record_check, record_pipeline_check
    from streamlake.operations.pipeline_checks import account_for_bronze

    expected = offsets_from_json(expected_offsets) if expected_offsets else None
    tables = job.tables()
    definition = job.definition
    stages = job.run_stages
    aggregates = definition.aggregates if "gold" in stages else []
    checks = []
    with ThreadPoolExecutor(max_workers=min(4, 2 + len(aggregates)), thread_name_prefix="verify") as pool:
        audit = pool.submit(_timed, check_consistency, job, operation, version=bronze_version, context=context,
                            expected_offsets=expected, record=False)
        accounting = None
        if "silver" in stages:
            previous = _last_passing(job, "pipeline-accounting")
            accounting = pool.submit(_timed, account_for_bronze, spark, tables, definition,
                                     previous.get("bronze_version") if previous else None)
        golds = [(aggregate, pool.submit(_timed, _check_gold_since_last, spark, job, aggregate))
                 for aggregate in aggregates]
        result, seconds = audit.result()
        record_check(result, job, expected, context)
        checks.append({"check_id": result.check_id, "kind": "kafka-audit", "passed": result.passed,
                       "verdict": "PASS" if result.passed else "FAIL", "summary": result.summary, "seconds": seconds})
        if accounting is not None:
            report, seconds = accounting.result()
            checks.append({**record_pipeline_check(job, operation, "pipeline-accounting", report.passed,
                                                   report.summary(), {**report.to_dict(), "duration_s": seconds},
                                                   context), "seconds": seconds})
        for aggregate, gold in golds:
            report, seconds = gold.result()
            if report is None:
                continue
            details = {**report.to_dict(), "silver_version": report.silver_version, "duration_s": seconds}
            checks.append({**record_pipeline_check(job, operation, "gold", report.passed, report.summary(), details,
                                                   context, table_path=tables[aggregate.gold_table]),
                           "seconds": seconds})
    for check in checks:
        log.info("%s in %.1f s: %s", check["verdict"], check["seconds"], check["summary"])
    return checks


def _timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), its wall seconds)``: each check's own time, as the checks overlap."""
    started = time.monotonic()
    result = fn(*args, **kwargs)
    return result, round(time.monotonic() - started, 2)


def _check_gold_since_last(spark, job: JobSpec, aggregate):
    """:func:`~streamlake.operations.pipeline_checks.check_gold` of ``aggregate`` for the
    event times its gold can have changed since its last passing check (None: nothing can
    have changed, no check), both read at one snapshot of gold: rows gold consumes while the
    check runs are the next check's, none is skipped."""
    from streamlake.delta.table import open_table
    from streamlake.operations.pipeline_checks import check_gold

    try:
        gold = open_table(job.table_path(aggregate.gold_table))
    except FileNotFoundError:
        gold = None  # no gold yet: check_gold says so
    start = _changed_event_times(spark, job, aggregate, _last_passing(job, "gold", aggregate.name), gold)
    if start is False:
        return None
    return check_gold(spark, job.tables(), job.definition, aggregate, start,
                      gold_version=gold.version() if gold is not None else None)


def _changed_event_times(spark, job: JobSpec, aggregate, previous: dict | None, gold):
    """Where ``aggregate``'s gold can have changed since its last gold check: the earliest
    event time of the silver rows gold consumed after the silver version that check compared
    against (None: everything; False: nothing). Rows silver holds and gold has not consumed
    yet cannot have changed gold: the next proof after gold consumes them covers them. Gold
    restored to before the last check's version (a savepoint's restore): everything. ``gold``:
    the snapshot of gold the check compares (None: no table)."""
    from pyspark.sql import functions as F

    from streamlake.delta.changes import read_changes
    from streamlake.operations.pipeline_checks import consumed_version

    if not previous or previous.get("silver_version") is None or gold is None:
        return None
    since = int(previous["silver_version"])
    consumed = consumed_version(gold, "silver")
    if consumed is None or consumed < since:
        return None
    if consumed == since:
        return False
    added, _range = read_changes(spark, job.table_path("silver"), since, consumed)
    earliest = added.agg(F.min(F.unix_micros(F.col(f"`{job.definition.event_time}`")))).first()[0]
    if earliest is None:
        return False
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=earliest)
