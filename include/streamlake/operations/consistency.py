"""The consistency check run after every operation, and the table of its results.

A check is the offset audit (:mod:`streamlake.operations.audit`) of a job's table, plus an
optional expectation about the offsets the table must hold (after a restore:
exactly the savepoint's). Every check is appended to the platform table
``consistency_checks`` (:mod:`streamlake.delta.records`): operation, time,
table, Delta version, counts and verdict, so the history of proofs is itself data.

**Incremental by default.** A passing check records what it proved in the ledger
(:mod:`streamlake.operations.ledger`). The next check starts from the newest
proof at or before the version it checks and reads the Delta log since:

* a partition whose proven rows no commit removed is audited *incrementally*:
  every row the commits since added (whatever its offset) is compared with Kafka's
  records from the proven end on, or, when it lands in the proven range, with the
  proven row at its offset (a copy is a duplicate, a row where none was proven is
  extra); Kafka is read only from the proven end;
* a partition whose proven rows a commit removed or rewrote (compaction, delete,
  overwrite, an unknown writer), whose first offset moved or whose committed
  offsets went back is audited *in full*, as is everything when there is no proof
  or the log since it cannot be read, and with ``full=True``.

**Past Kafka's retention.** Where Kafka no longer holds part of a committed range,
a part some check proved passes, and the summary says so ("proven at version V on
DATE; Kafka no longer holds them"); a full audit compares those rows with the
proven version's rows. A part that an ingest run with ``failOnDataLoss=false``
skipped (its commit recorded so, see :func:`streamlake.operations.ledger.skipped_since`)
must hold no row, and the summary says so ("skipped by the ingest commit of version
V"). Any other part, which no check ever proved, fails: nothing can verify it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping

import pyarrow as pa

from streamlake.delta.table import TableSpec, open_table, table_exists
from streamlake.delta.txn import committed_offsets, first_offsets
from streamlake.errors import StreamLakeError
from streamlake.kafka.client import client_config
from streamlake.kafka.offsets import Offsets, TopicPartition, offsets_to_json
from streamlake.operations import audit as audit_mod
from streamlake.operations import ledger
from streamlake.operations.audit import (
    KAFKA,
    NONE,
    PROVEN,
    SNAPSHOT,
    UNVERIFIED,
    AuditReport,
    FileInfo,
    PartitionAudit,
    Segment,
    audit_partition,
    partitions_in_files,
    snapshot_index,
)
from streamlake.operations.jobs import JobSpec
from streamlake.delta.records import append_row, platform_table_path, read_rows, writable_options

log = logging.getLogger(__name__)

RESULTS = TableSpec(
    name="consistency_checks",
    schema=pa.schema([
        ("check_id", pa.string()), ("operation", pa.string()), ("checked_at", pa.timestamp("us", tz="UTC")),
        ("job", pa.string()), ("table_path", pa.string()), ("topics", pa.string()),
        ("delta_version", pa.int64()), ("kafka_records", pa.int64()), ("table_rows", pa.int64()),
        ("missing", pa.int64()), ("duplicated", pa.int64()), ("extra", pa.int64()), ("mismatched", pa.int64()),
        ("offsets_expected", pa.string()), ("offsets_match", pa.bool_()),
        ("verdict", pa.string()), ("summary", pa.string()), ("context", pa.string()),
        # added with incremental checks (older tables get them on their next check; older rows read as null)
        ("mode", pa.string()), ("proof_version", pa.int64()), ("kafka_records_read", pa.int64()),
        ("table_rows_read", pa.int64()), ("duration_s", pa.float64()),
        # added with the pipeline: "kafka-audit" (bronze against Kafka), "gold" (gold against a
        # recompute from silver), "pipeline-accounting" (every bronze row once downstream)
        ("kind", pa.string()),
    ]),
    description="every consistency check the platform ran",
)
_DELTA_TYPES = {pa.string(): "string", pa.int64(): "long", pa.float64(): "double", pa.bool_(): "boolean"}


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
    mode: str = "full"
    proof_version: int | None = None  # the proof an incremental check started from
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        return {"check_id": self.check_id, "operation": self.operation, "job": self.job, "passed": self.passed,
                "summary": self.summary, "offsets_match": self.offsets_match, **self.report.totals(),
                "delta_version": self.report.delta_version, "mode": self.mode, "proof_version": self.proof_version,
                **self.report.read_totals(), "duration_s": self.duration_s}


def _offsets_mismatch(report: AuditReport, expected: Mapping[TopicPartition, int]) -> list[str]:
    held = {TopicPartition(p.topic, p.partition): p.next_offset for p in report.partitions}
    return [f"{tp}: table {held.get(tp)} != expected {off}" for tp, off in sorted(expected.items())
            if held.get(tp) != off]


def check_consistency(job: JobSpec, operation: str, *, expected_offsets: Offsets | None = None,
                      version: int | None = None, context: Mapping | None = None,
                      record: bool = True, full: bool = False) -> CheckResult:
    """Audit the job's table (latest or ``version``) and record the result.

    Incremental from the newest proof unless ``full`` (see the module docstring).
    Passes when the table is exactly once and, if ``expected_offsets`` is given,
    its committed offsets are exactly those. With ``record`` the result is recorded
    (:func:`record_check`: an exactly-once audit becomes a proof); without it the
    caller records it. Raises what the audit raises when the check cannot run
    (Kafka down, table missing).
    """
    started = time.monotonic()
    report, base = audit_job(job, version=version, full=full)
    mismatch = _offsets_mismatch(report, expected_offsets) if expected_offsets is not None else []
    passed = report.exactly_once and not mismatch
    summary = f"[{operation}] job {job.name}: " + report.summary()
    if expected_offsets is not None:
        summary += ("\n  offsets match the expected ones" if not mismatch
                    else "\n  OFFSETS DIFFER from the expected ones: " + "; ".join(mismatch))
    result = CheckResult(f"chk-{uuid.uuid4().hex[:12]}", operation, job.name, passed, summary, report,
                         None if expected_offsets is None else not mismatch, report.mode,
                         base.version if base is not None and report.mode == "incremental" else None)
    result.duration_s = round(time.monotonic() - started, 3)
    if record:
        record_check(result, job, expected_offsets, context)
    return result


def record_check(result: CheckResult, job: JobSpec, expected_offsets: Offsets | None = None,
                 context: Mapping | None = None) -> None:
    """Record ``result`` of :func:`check_consistency` (made with ``record=False``) in
    ``consistency_checks``, and as a proof the next incremental audit starts from when
    the table was exactly once (whether or not the expected offsets matched)."""
    if result.report.exactly_once:
        _record_proof(result, job)
    _record(result, job, expected_offsets, context)


def require_consistent(job: JobSpec, operation: str, **kwargs) -> CheckResult:
    """:func:`check_consistency`, raising ConsistencyError with the summary on failure."""
    result = check_consistency(job, operation, **kwargs)
    if not result.passed:
        raise ConsistencyError(result.summary)
    return result


# -- the audit of a job's table, incremental or full -------------------------------


class _Lazy:
    def __init__(self, fn: Callable[[], list[FileInfo]]):
        self.fn, self.value = fn, None

    def __call__(self) -> list[FileInfo]:
        if self.value is None:
            self.value = self.fn()
        return self.value


def audit_job(job: JobSpec, *, version: int | None = None, full: bool = False
              ) -> tuple[AuditReport, ledger.Proof | None]:
    """The audit behind a check: (report, the proof it started from or used for
    ranges Kafka no longer holds). Records nothing."""
    topics = sorted(set(job.source_topics))
    conf = client_config({f"kafka.{k}": v for k, v in (job.kafka or {}).items()})
    table = open_table(job.table, version)
    at = table.version()
    proofs = ledger.ProofIndex(table.metadata().id)
    base = proofs.latest(at)
    notes: list[str] = []
    changes: ledger.Changes | None = None
    if full:
        notes.append("full audit (requested)")
    elif base is None:
        notes.append("full audit: no earlier proof of this table")
    else:
        changes = ledger.changes_since(job.table, base, at, proofs)
        base = changes.proof
        if changes.everything:
            notes.append(f"full audit: {changes.everything}")
            notes += changes.notes
            changes = None
    snapshot = _Lazy(lambda: snapshot_index(table))
    kafka = audit_mod.KafkaLog(conf)  # looked up at call time: the boundary tests replace
    try:
        tps = kafka.partitions(topics)
        known = set(tps) | ({tp for tp in base.ranges if tp.topic in topics} if base is not None else set())
        nexts = committed_offsets(table, known)
        firsts = first_offsets(table, known)
        if changes is not None:
            added = list(changes.added.values())
            candidates = known | partitions_in_files(added, topics)
            uncovered = [t for t in topics if t not in base.topics]
            if uncovered:
                candidates |= partitions_in_files(snapshot(), uncovered)
        else:
            candidates = known | partitions_in_files(snapshot(), topics)
        starts = kafka.log_start(sorted(tp for tp in candidates if tp in set(tps) and tp in firsts))
        proven_snapshot = _Lazy(lambda: _proof_snapshot(job.table, base))
        # what failOnDataLoss=false runs skipped: since the proof, or (a full audit) ever
        skipped_ever = _Lazy(lambda: ledger.skipped_since(job.table, -1, at))
        partitions: list[PartitionAudit] = []
        for tp in sorted(candidates):
            first, nxt = firsts.get(tp), nexts.get(tp)
            audit = PartitionAudit(tp.topic, tp.partition, first, nxt)
            reason = _full_reason(tp, first, nxt, base, changes) if changes is not None else "full"
            if reason is None:
                audit.mode = "incremental"
                files = [f for f in changes.added.values() if f.may_contain(tp)]
                segments = _incremental_segments(audit, base, starts.get(tp),
                                                 _Lazy(lambda: ledger.proven_files(snapshot(), changes)),
                                                 changes.skipped.get(tp, []))
            else:
                if changes is not None:
                    audit.notes.append(f"audited in full: {reason}")
                files = snapshot()
                segments = _full_segments(audit, base, starts.get(tp), proven_snapshot,
                                          lambda tp=tp: skipped_ever().get(tp, []))
            audit_partition(audit, files, segments, kafka)
            if audit.table_rows or audit.kafka_records or first is not None:
                partitions.append(audit)
    finally:
        kafka.close()
    report = AuditReport(table=str(job.table), topics=topics, delta_version=at,
                         checked_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                         partitions=partitions, mode="incremental" if changes is not None else "full")
    read = report.read_totals()
    if changes is not None:
        report.notes.append(f"incremental from the proof of {base.describe()}: {changes.describe_commits()}; "
                            f"read {read['kafka_records_read']} Kafka records and {read['table_rows_read']} "
                            "table rows")
        report.notes += changes.notes
    else:
        report.notes += notes
    return report, base


def _full_reason(tp: TopicPartition, first: int | None, nxt: int | None, base: ledger.Proof,
                 changes: ledger.Changes) -> str | None:
    """Why ``tp`` must be audited in full after ``changes`` (None: incrementally)."""
    if tp.topic not in base.topics:
        return "its topic was not part of the proof"
    if tp in changes.touched:
        return changes.touched[tp]
    proven = base.ranges.get(tp)
    if proven is None:
        return None  # no proven rows: all its rows are new
    if first is None or nxt is None:
        return "the table no longer has committed offsets for it"
    if first != proven.first:
        return f"its first offset moved from {proven.first} to {first}"
    if nxt < proven.next:
        return f"its committed offsets went back from {proven.next} to {nxt}"
    return None


def _lost_note(lo: int, hi: int, start: int) -> str:
    return (f"offsets [{lo}, {hi}) are no longer in Kafka (log start {start}) and no check proved them: "
            "they cannot be verified")


def _lost_segments(audit: PartitionAudit, lo: int, hi: int, start: int | None,
                   skipped: list[tuple[int, int, int]]) -> list[Segment]:
    """``[lo, hi)``: offsets Kafka no longer holds that no proof covers. Parts an ingest
    commit skipped (``(from, to, version)`` in ``skipped``) must hold no row (rows there are
    extra); the rest cannot be verified."""
    segments: list[Segment] = []
    at = lo
    for a, b, version in sorted(skipped):
        a, b = max(a, at), min(b, hi)
        if a >= b:
            continue
        if a > at:
            segments.append(Segment(at, a, UNVERIFIED))
            audit.notes.append(_lost_note(at, a, start))
        segments.append(Segment(a, b, NONE))
        audit.notes.append(f"offsets [{a}, {b}) skipped by the ingest commit of version {version} "
                           f"(failOnDataLoss=false): Kafka no longer held them")
        at = b
    if hi > at:
        segments.append(Segment(at, hi, UNVERIFIED))
        audit.notes.append(_lost_note(at, hi, start))
    return segments


def _incremental_segments(audit: PartitionAudit, base: ledger.Proof, start: int | None,
                          proven_files: Callable[[], list[FileInfo]],
                          skipped: list[tuple[int, int, int]] = ()) -> list[Segment]:
    """Rows added since the proof: before the proven range extra, inside it compared
    with the proven rows, after it with Kafka (from the proven end); where Kafka no longer
    holds them, none where an ingest commit skipped them (``skipped``), else unverified."""
    first, nxt = audit.first_offset, audit.next_offset
    proven = base.ranges.get(audit.tp)
    if first is None or nxt is None:
        return [Segment(None, None, NONE)]
    lo, pn = first, first
    if proven is not None:
        lo, pn = proven.first, proven.next
        audit.table_rows += proven.table_rows
        audit.kafka_records += proven.kafka_records
        if start is not None and start > lo:
            audit.notes.append(f"offsets [{lo}, {min(start, pn)}) proven at {base.describe()}; "
                               f"Kafka no longer holds them (log start {start})")
    segments = [Segment(None, lo, NONE)]
    if pn > lo:
        segments.append(Segment(lo, pn, PROVEN, proven_files))
    held = max(pn, start) if start is not None else pn
    lost_hi = min(held, nxt)
    if lost_hi > pn:
        segments += _lost_segments(audit, pn, lost_hi, start, skipped)
    if nxt > max(pn, lost_hi):
        segments.append(Segment(max(pn, lost_hi), nxt, KAFKA))
    segments.append(Segment(max(nxt, pn), None, NONE))
    return segments


def _proof_snapshot(table_path: str, proof: ledger.Proof | None) -> list[FileInfo] | None:
    if proof is None:
        return None
    try:
        return snapshot_index(open_table(table_path, proof.version))
    except Exception as exc:
        log.info("cannot load the proven version %d of %s: %s", proof.version, table_path, exc)
        return None


def _full_segments(audit: PartitionAudit, base: ledger.Proof | None, start: int | None,
                   proven_snapshot: Callable[[], list[FileInfo] | None],
                   skipped: Callable[[], list[tuple[int, int, int]]] = list) -> list[Segment]:
    """Every row: Kafka where it holds the range; where it does not, the proven
    version's rows for the part a proof covers, no row for parts an ingest commit skipped
    (``skipped()``), nothing (a failure) for the rest."""
    first, nxt = audit.first_offset, audit.next_offset
    if first is None or nxt is None or nxt <= first:
        return [Segment(None, None, NONE)]
    segments = [Segment(None, first, NONE)]
    held = max(first, start) if start is not None else first
    lost_hi = min(held, nxt)
    if lost_hi > first:
        proven = base.ranges.get(audit.tp) if base is not None else None
        lo = max(first, proven.first) if proven is not None else lost_hi
        hi = min(lost_hi, proven.next) if proven is not None else lost_hi
        reference = None
        if lo < hi:
            files = proven_snapshot()
            wanted = [f for f in files or () if f.may_contain(audit.tp) and f.overlaps(lo, hi)]
            if files is not None and all(_exists(f) for f in wanted):
                reference = files
            else:
                audit.notes.append(f"offsets [{lo}, {hi}) were proven at {base.describe()}, but Kafka no longer "
                                   "holds them and the files of that version are gone (vacuumed)")
        if reference is None:
            lo = hi = lost_hi
        if lo > first:
            segments += _lost_segments(audit, first, lo, start, skipped())
        if hi > lo:
            segments.append(Segment(lo, hi, SNAPSHOT, lambda files=reference: files))
            audit.notes.append(f"offsets [{lo}, {hi}) proven at {base.describe()}; Kafka no longer holds them "
                               f"(log start {start}): compared with the table at version {base.version}")
        if lost_hi > hi:
            segments += _lost_segments(audit, hi, lost_hi, start, skipped())
    if nxt > lost_hi:
        segments.append(Segment(lost_hi, nxt, KAFKA))
    segments.append(Segment(nxt, None, NONE))
    return segments


def _exists(file: FileInfo) -> bool:
    """Whether a data file of the audit still exists (on its object store, if it is on one)."""
    if file.fs is None:
        import os

        return os.path.exists(file.path)
    import pyarrow.fs as pafs

    return file.fs.get_file_info(file.path).type != pafs.FileType.NotFound


# -- records -----------------------------------------------------------------------


def _record_proof(result: CheckResult, job: JobSpec) -> None:
    table = open_table(job.table, result.report.delta_version)
    ranges = {p.tp: ledger.ProvenRange(p.first_offset, p.next_offset, p.kafka_records, p.table_rows)
              for p in result.report.partitions if p.first_offset is not None and p.next_offset is not None}
    ledger.record_proof(ledger.Proof(
        result.check_id, job.name, str(job.table), table.metadata().id, result.report.delta_version,
        dt.datetime.now(dt.timezone.utc), tuple(sorted(set(job.source_topics))), ranges, result.mode,
        result.proof_version))


def migrate_results_table() -> None:
    """Add the columns newer checks record to a ``consistency_checks`` table of an
    older version (its rows read them as null)."""
    from deltalake.schema import Field, PrimitiveType

    path = platform_table_path(RESULTS.name)
    if not table_exists(path):
        return
    table = open_table(path, storage_options=writable_options(path))
    names = pa.schema(table.schema().to_arrow()).names
    wanted = RESULTS.schema.names
    if names == wanted or names != wanted[:len(names)]:
        return  # current, or not a layout this code knows how to extend (ensure_table reports it)
    new = [Field(f.name, PrimitiveType(_DELTA_TYPES[f.type]), nullable=True)
           for f in RESULTS.schema if f.name not in names]
    try:
        table.alter.add_columns(new)
        log.info("added columns %s to %s", [f.name for f in RESULTS.schema if f.name not in names], path)
    except Exception:
        if pa.schema(open_table(path).schema().to_arrow()).names != wanted:
            raise


def _record(result: CheckResult, job: JobSpec, expected: Offsets | None, context: Mapping | None) -> None:
    t = result.report.totals()
    migrate_results_table()
    append_row(RESULTS, {
        "check_id": result.check_id, "operation": result.operation,
        "checked_at": dt.datetime.now(dt.timezone.utc), "job": job.name, "table_path": job.table,
        "topics": json.dumps(job.source_topics), "delta_version": result.report.delta_version,
        **{k: t[k] for k in ("kafka_records", "table_rows", "missing", "duplicated", "extra", "mismatched")},
        "offsets_expected": json.dumps(offsets_to_json(expected)) if expected is not None else None,
        "offsets_match": result.offsets_match, "verdict": "PASS" if result.passed else "FAIL",
        "summary": result.summary, "context": json.dumps(dict(context or {}), default=str),
        "mode": result.mode, "proof_version": result.proof_version, **result.report.read_totals(),
        "duration_s": result.duration_s, "kind": "kafka-audit",
    })


# How each pipeline check's counts map onto the table's columns.
_PIPELINE_COUNTS = {
    "gold": {"table_rows": "windows_checked", "missing": "missing", "extra": "extra", "mismatched": "mismatched"},
    "pipeline-accounting": {"table_rows": "bronze_rows", "missing": "unaccounted", "duplicated": "counted_twice",
                            "extra": "extra"},
}


def record_pipeline_check(job: JobSpec, operation: str, kind: str, passed: bool, summary: str, details: Mapping,
                          context: Mapping | None = None, table_path: str | None = None) -> dict:
    """Record a pipeline check (see :mod:`streamlake.operations.pipeline_checks`) in
    ``consistency_checks`` next to the Kafka audits; returns its id, verdict and summary."""
    check_id = f"chk-{uuid.uuid4().hex[:12]}"
    columns = {column: int(details.get(field) or 0) for column, field in _PIPELINE_COUNTS[kind].items()}
    migrate_results_table()
    append_row(RESULTS, {
        "check_id": check_id, "operation": operation, "checked_at": dt.datetime.now(dt.timezone.utc),
        "job": job.name, "table_path": table_path or job.table_path("gold" if kind == "gold" else "silver"),
        "topics": json.dumps(job.source_topics), "verdict": "PASS" if passed else "FAIL",
        "summary": f"[{operation}] job {job.name}: {summary}",
        "context": json.dumps({**dict(context or {}), "details": dict(details)}, default=str), "kind": kind,
        **columns,
    })
    return {"check_id": check_id, "operation": operation, "kind": kind, "passed": passed,
            "verdict": "PASS" if passed else "FAIL", "summary": summary}


def require_passed(checks: list[dict]) -> None:
    """Raise ConsistencyError with the summaries of the failed ``checks``, if any."""
    failed = [c for c in checks if not c["passed"]]
    if failed:
        raise ConsistencyError("\n".join(f"{c['check_id']}: {c['summary']}" for c in failed))


def recent_checks(limit: int = 50, job: str | None = None) -> list[dict]:
    """The newest recorded checks first (optionally of one job)."""
    return read_rows(RESULTS, "checked_at", limit, job=job)

