"""A backfill as an operation: restate gold, prove it, record it.

What the ``backfill_<pipeline>`` DAGs, ``streamlake backfill`` and the spark-submit
entrypoint ``jobs/backfill.py`` run (the algorithm itself is
:mod:`streamlake.pipeline.backfill`), for one aggregate or each of the pipeline's:

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
                 aggregate: str | None = None, dry_run: bool = False, run_id: str | None = None,
                 context: dict | None = None) -> dict:
    """Backfill ``job``'s gold tables (one ``aggregate``, or every one) for ``[start, end)``
    (all pending late events when both are None), prove and record it; see the module
    docstring. Returns a JSON-able summary (one entry per aggregate under ``aggregates``)."""
    from streamlake.operations.consistency import record_pipeline_check, require_passed
    from streamlake.operations.pipeline_checks import account_for_bronze, check_gold
    from streamlake.delta.records import record_operation
    from streamlake.pipeline.backfill import AggregatePaths, BackfillError, gold_has_consumed_silver, run_backfill

    definition = job.definition
    if definition is None or "gold" not in job.run_stages:
        raise BackfillError(f"job {job.name} has no gold stage (stages: {', '.join(job.run_stages)}): nothing to "
                            "backfill")
    aggregates = [definition.aggregate(aggregate)] if aggregate else list(definition.aggregates)
    run_id = run_id or f"bf-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}"
    context = {**(context or {}), "backfill": run_id}
    tables = job.tables()
    results, checks, touched = [], [], {}
    for agg in aggregates:
        paths = AggregatePaths.of(job.root, agg)
        if not gold_has_consumed_silver(paths.gold):
            # Late events are written with gold's commits: before its first one none is pending. Not
            # an error: the hourly schedule's first run, or a user's, may come before the job's first
            # pipeline run has reached gold.
            text = (f"backfill {run_id} of gold/{agg.name}: nothing to backfill, gold has consumed no silver yet "
                    "(its pipeline has not reached gold), so no late event is pending")
            log.info("%s", text)
            results.append({"aggregate": agg.name, "late_events": 0, "windows": 0, "changed_windows": 0,
                            "deleted_windows": 0, "gold_version": None, "summary": text, "window_list": []})
            continue
        result = run_backfill(spark, definition, agg, paths, start, end, dry_run=dry_run, run_id=run_id)
        log.info("%s", result.summary())
        results.append({**result.to_dict(), "summary": result.summary()})
        if dry_run:
            continue
        gold = check_gold(spark, tables, definition, agg, start, end, late_seen_through=result.silver_version)
        checks.append(record_pipeline_check(job, "backfill", "gold", gold.passed, gold.summary(),
                                            {**gold.to_dict(), "silver_version": gold.silver_version}, context,
                                            table_path=tables[agg.gold_table]))
        touched.update({agg.gold_table: tables[agg.gold_table], agg.late_table: tables[agg.late_table]})
    summary = {"run_id": run_id, "job": job.name, "dry_run": dry_run, "aggregates": results,
               "late_events": sum(r["late_events"] for r in results), "windows": sum(r["windows"] for r in results),
               "changed_windows": sum(r["changed_windows"] for r in results),
               "window_list": [f"gold/{r['aggregate']}: {w}" for r in results for w in r.get("window_list", [])],
               "summary": "; ".join(r["summary"] for r in results) or f"job {job.name} has no aggregates"}
    if dry_run or not touched:
        if not dry_run:  # a run that found nothing to do is still one the operations view lists
            record_operation("backfill", job.name, {**summary, "checks": [], **context})
        summary["checks"] = checks
        return summary
    accounting = account_for_bronze(spark, tables, definition)
    checks.append(record_pipeline_check(job, "backfill", "pipeline-accounting", accounting.passed,
                                        accounting.summary(), accounting.to_dict(), context))
    record_operation("backfill", job.name, {**summary, "checks": [c["check_id"] for c in checks], **context})
    summary["checks"] = checks
    for check in checks:
        log.info("%s", check["summary"])
    from streamlake.quality.validate import require_quality, validate_operation

    reports = validate_operation(touched, None, "backfill", context, definition=definition, spark=spark,
                                 raise_on_critical=False)
    summary["quality"] = [{"table": r.table, "status": r.status, "rows": r.rows} for r in reports]
    require_passed(checks)
    require_quality(reports)
    return summary
