"""How each operation a user triggered ended: proven, or failed.

An operation (a savepoint, a restore, a rescale, a backfill) is triggered in Airflow and is
done when its consistency check has proven it: the ``verify`` task of ``savepoint``; the
``resume`` of ``restore`` (after ``verify_restored``, as Flink's ``run -s`` is done once the
job runs again on proven state); the ``verify`` of the run a ``rescale`` started on the new
settings; the ``report`` of ``backfill_<pipeline>`` (after the backfill proved gold). Airflow
records each end here, in the platform table ``operation_outcomes``
(the callbacks of :mod:`streamlake.orchestration.dag_parts`): one row per operation run that
ended, ``proven`` with the seconds from its trigger to its proof, or ``failed`` with the
task that failed for good (its retries spent) and why. The exporter's
``streamlake_operation_duration_seconds`` and ``streamlake_operation_failures_total`` come
from this table (:func:`outcome_summary`).

A run cleared and run again in Airflow ends again: a second row, as a second attempt of the
operation.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pyarrow as pa

from streamlake.delta.records import append_row, platform_rows
from streamlake.delta.table import TableSpec

TS = pa.timestamp("us", tz="UTC")
OPERATIONS_MEASURED = ("savepoint", "restore", "rescale", "backfill")
PROVEN, FAILED = "proven", "failed"

OPERATION_OUTCOMES = TableSpec(
    name="operation_outcomes",
    schema=pa.schema([
        ("run_id", pa.string()), ("operation", pa.string()), ("job", pa.string()),
        ("triggered_at", TS), ("finished_at", TS), ("outcome", pa.string()),
        ("duration_s", pa.float64()), ("task", pa.string()), ("error", pa.string()),
    ]),
    description="how each savepoint, restore, rescale and backfill run ended: proven (trigger to proof) or failed",
)


def record_outcome(operation: str, job: str, run_id: str, triggered_at: dt.datetime, outcome: str,
                   task: str, error: str | None = None, finished_at: dt.datetime | None = None) -> dict:
    """Append how the run ``run_id`` of ``operation`` on ``job`` ended (``outcome``: proven or
    failed, at ``task``); returns the row. Raises ValueError for an operation or outcome not
    known, and what :func:`streamlake.delta.records.append_rows` raises."""
    if operation not in OPERATIONS_MEASURED:
        raise ValueError(f"not an operation measured here: {operation!r} (one of {', '.join(OPERATIONS_MEASURED)})")
    if outcome not in (PROVEN, FAILED):
        raise ValueError(f"an outcome is {PROVEN!r} or {FAILED!r}, not {outcome!r}")
    finished_at = finished_at or dt.datetime.now(dt.timezone.utc)
    row = {"run_id": run_id, "operation": operation, "job": job, "triggered_at": triggered_at,
           "finished_at": finished_at, "outcome": outcome,
           "duration_s": max(0.0, (finished_at - triggered_at).total_seconds()), "task": task,
           "error": (error or "")[:2000] or None}
    append_row(OPERATION_OUTCOMES, row)
    return row


@dataclass
class OperationRecord:
    """One job's runs of one operation: the proven runs' trigger-to-proof seconds, the ids of
    the runs that failed (a rescale refused before the stop fails its own run and the job's run
    it started: one failed operation), and the newest end (its outcome and time)."""
    durations: list[float] = field(default_factory=list)
    failed_runs: set[str] = field(default_factory=set)
    last_outcome: str | None = None
    last_at: dt.datetime | None = None


def outcome_summary() -> dict[tuple[str, str], OperationRecord]:
    """(job, operation) -> :class:`OperationRecord`, from every recorded outcome."""
    rows = platform_rows(OPERATION_OUTCOMES,
                         columns=["run_id", "job", "operation", "finished_at", "outcome", "duration_s"])
    out: dict[tuple[str, str], OperationRecord] = {}
    if rows is None:
        return out
    for r in sorted(rows.to_pylist(), key=lambda r: r["finished_at"]):
        record = out.setdefault((r["job"], r["operation"]), OperationRecord())
        if r["outcome"] == PROVEN:
            record.durations.append(r["duration_s"])
        else:
            record.failed_runs.add(r["run_id"])
        record.last_outcome, record.last_at = r["outcome"], r["finished_at"]
    return out
