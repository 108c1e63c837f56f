"""The consistency check run after every operation, and the table of its results.

A check is the offset audit (:mod:`streamlake.operations.audit`) of a job's table, plus an
optional expectation about the offsets the table must hold (after a restore:
exactly the savepoint's). Every check is appended to the platform table
``consistency_checks`` (:mod:`streamlake.operations.records`): operation, time,
table, Delta version, counts and verdict, so the history of proofs is itself data.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass, field
from typing import Mapping

import pyarrow as pa

from streamlake.operations.audit import AuditReport, audit_offsets
from streamlake.delta.table import TableSpec
from streamlake.errors import StreamLakeError
from streamlake.operations.jobs import JobSpec
from streamlake.kafka.offsets import Offsets, TopicPartition, offsets_to_json
from streamlake.operations.records import append_row, read_rows

RESULTS = TableSpec(
    name="consistency_checks",
    schema=pa.schema([
        ("check_id", pa.string()), ("operation", pa.string()), ("checked_at", pa.timestamp("us", tz="UTC")),
        ("job", pa.string()), ("table_path", pa.string()), ("topics", pa.string()),
        ("delta_version", pa.int64()), ("kafka_records", pa.int64()), ("table_rows", pa.int64()),
        ("missing", pa.int64()), ("duplicated", pa.int64()), ("extra", pa.int64()), ("mismatched", pa.int64()),
        ("offsets_expected", pa.string()), ("offsets_match", pa.bool_()),
        ("verdict", pa.string()), ("summary", pa.string()), ("context", pa.string()),
    ]),
    description="every consistency check the platform ran",
)


class ConsistencyError(StreamLakeError):
    """A consistency check failed; the message is the readable summary."""


@dataclass
class CheckResult:
    check_id: str
    operation: str
    job: str
    passed: bool
    summary: str
    report: AuditReport = field(repr=False)
    offsets_match: bool | None = None

    def to_dict(self) -> dict:
        return {"check_id": self.check_id, "operation": self.operation, "job": self.job, "passed": self.passed,
                "summary": self.summary, "offsets_match": self.offsets_match, **self.report.totals(),
                "delta_version": self.report.delta_version}


def _offsets_mismatch(report: AuditReport, expected: Mapping[TopicPartition, int]) -> list[str]:
    held = {TopicPartition(p.topic, p.partition): p.next_offset for p in report.partitions}
    return [f"{tp}: table {held.get(tp)} != expected {off}" for tp, off in sorted(expected.items())
            if held.get(tp) != off]


def check_consistency(job: JobSpec, operation: str, *, expected_offsets: Offsets | None = None,
                      version: int | None = None, context: Mapping | None = None,
                      record: bool = True) -> CheckResult:
    """Audit the job's table (latest or ``version``) and record the result.

    Passes when the table is exactly once and, if ``expected_offsets`` is given,
    its committed offsets are exactly those. Raises what the audit raises when
    the check cannot run (Kafka down, table missing).
    """
    report = audit_offsets(job.table, job.topics, job.kafka, version=version)
    mismatch = _offsets_mismatch(report, expected_offsets) if expected_offsets is not None else []
    passed = report.exactly_once and not mismatch
    summary = f"[{operation}] job {job.name}: " + report.summary()
    if expected_offsets is not None:
        summary += ("\n  offsets match the expected ones" if not mismatch
                    else "\n  OFFSETS DIFFER from the expected ones: " + "; ".join(mismatch))
    result = CheckResult(f"chk-{uuid.uuid4().hex[:12]}", operation, job.name, passed, summary, report,
                         None if expected_offsets is None else not mismatch)
    if record:
        _record(result, job, expected_offsets, context)
    return result


def require_consistent(job: JobSpec, operation: str, **kwargs) -> CheckResult:
    """:func:`check_consistency`, raising ConsistencyError with the summary on failure."""
    result = check_consistency(job, operation, **kwargs)
    if not result.passed:
        raise ConsistencyError(result.summary)
    return result


def _record(result: CheckResult, job: JobSpec, expected: Offsets | None, context: Mapping | None) -> None:
    t = result.report.totals()
    append_row(RESULTS, {
        "check_id": result.check_id, "operation": result.operation,
        "checked_at": dt.datetime.now(dt.timezone.utc), "job": job.name, "table_path": job.table,
        "topics": json.dumps(job.topics), "delta_version": result.report.delta_version,
        **{k: t[k] for k in ("kafka_records", "table_rows", "missing", "duplicated", "extra", "mismatched")},
        "offsets_expected": json.dumps(offsets_to_json(expected)) if expected is not None else None,
        "offsets_match": result.offsets_match, "verdict": "PASS" if result.passed else "FAIL",
        "summary": result.summary, "context": json.dumps(dict(context or {}), default=str),
    })


def recent_checks(limit: int = 50, job: str | None = None) -> list[dict]:
    """The newest recorded checks first (optionally of one job)."""
    return read_rows(RESULTS, "checked_at", limit, job=job)
