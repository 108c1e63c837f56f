"""A backfill as an operation: restate gold, prove it, record it.

What the ``backfill_late_data`` DAG, ``streamlake backfill`` and the spark-submit
entrypoint ``jobs/backfill.py`` run (the algorithm itself is
:mod:`streamlake.pipeline.backfill`):

1. apply the pending late events of an event-time range (or all of them);
2. unless it was a dry run, prove the result: for the range, gold equals a
   batch recompute from silver and every late event the backfill saw is marked
   applied (:func:`streamlake.operations.pipeline_checks.check_gold`), and every
   bronze row is accounted for once (:func:`~streamlake.operations.pipeline_checks.account_for_bronze`);
3. record the checks in ``consistency_checks`` and the backfill in ``operations``;
4. validate data quality of what it changed (gold, late_events) with Great
   Expectations (:mod:`streamlake.quality`).

Raises ConsistencyError (after recording) when a proof fails, QualityError when
a critical expectation fails.
"""

from __future__ import annotations

import datetime as dt
import logging

from streamlake.operations.jobs import JobSpec

log = logging.getLogger(__name__)


def parse_time(value: str | None) -> dt.datetime | None:
    """An ISO-8601 date-time (UTC when it has no offset), or None for an empty value."""
    if value in (None, "", "None"):
        return None
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def backfill_job(spark, job: JobSpec, start: dt.datetime | None = None, end: dt.datetime | None = None, *,
                 dry_run: bool = False, run_id: str | None = None, context: dict | None = None) -> dict:
    """Backfill ``job``'s gold for ``[start, end)`` (all pending late events when both are
    None), prove and record it; see the module docstring. Returns a JSON-able summary."""
    from streamlake.operations.consistency import record_pipeline_check, require_passed
    from streamlake.operations.pipeline_checks import account_for_bronze, check_gold
    from streamlake.operations.records import record_operation
    from streamlake.pipeline.backfill import BackfillError, PipelinePaths, run_backfill
    from streamlake.pipeline.gold import gold_window

    if "gold" not in job.stages:
        raise BackfillError(f"job {job.name} has no gold stage (stages: {', '.join(job.stages)}): nothing to backfill")
    try:
        window = gold_window(job.table_path("gold"))  # the windows gold was built with
    except FileNotFoundError:
        # Late events are written by the gold stage: without gold there is none pending. Not an
        # error: the hourly schedule's first run may come before the job's first pipeline run.
        text = (f"backfill {run_id or ''} of job {job.name}: nothing to backfill, the job has no gold table yet "
                "(its pipeline has not run), so no late event is pending")
        log.info("%s", text)
        return {"run_id": run_id, "dry_run": dry_run, "late_events": 0, "windows": 0, "changed_windows": 0,
                "deleted_windows": 0, "gold_version": None, "summary": text, "job": job.name, "checks": []}
    if window is None:
        raise BackfillError(f"gold of job {job.name} does not record its windows (built by an older version?)")
    result = run_backfill(spark, PipelinePaths.of(job.root), window, start, end, dry_run=dry_run, run_id=run_id)
    log.info("%s", result.summary())
    summary = {**result.to_dict(), "summary": result.summary(), "job": job.name}
    if dry_run:
        return summary
    tables = job.tables()
    gold = check_gold(spark, tables, window, start, end, late_seen_through=result.silver_version)
    accounting = account_for_bronze(spark, tables)
    context = {**(context or {}), "backfill": result.run_id}
    checks = [record_pipeline_check(job, "backfill", "gold", gold.passed, gold.summary(), gold.to_dict(), context),
              record_pipeline_check(job, "backfill", "pipeline-accounting", accounting.passed, accounting.summary(),
                                    accounting.to_dict(), context)]
    record_operation("backfill", job.name, {**summary, "checks": [c["check_id"] for c in checks], **context})
    summary["checks"] = checks
    for check in checks:
        log.info("%s", check["summary"])
    from streamlake.quality.validate import require_quality, validate_operation

    reports = validate_operation({t: tables[t] for t in ("gold", "late_events")}, None, "backfill", context,
                                 spark=spark, raise_on_critical=False)
    summary["quality"] = [{"table": r.table, "status": r.status, "rows": r.rows} for r in reports]
    require_passed(checks)
    require_quality(reports)
    return summary
