"""Backfills: apply pending late events by restating the gold windows they belong to.

A backfill over an event-time range ``[start, end)`` (or over every pending
late event) does, in this order:

1. **Pin the inputs.** Read gold's position in silver (its ``txn``): gold holds
   exactly silver's versions ``< v``. Silver at version ``v - 1`` is therefore
   the input that gold agrees with; late events are taken only if they came
   from those versions. (A position inside a version, which only a split
   initial snapshot produces, is refused with a message: run it after the next
   micro-batch.)
2. **Plan.** The pending late events (``applied = false``) whose event time is
   in the range, and the windows they belong to (for session windows: the
   stretch of the sensor's timeline the event can reach, widened until no
   neighbouring event or session could merge into it).
3. **Recompute** those windows from silver ``v - 1`` in batch: Spark for fixed
   windows, per sensor for sessions (their boundaries depend on every event).
   Silver's event-time file statistics prune what is read, so the cost follows
   the range, not the table.
4. **Replace** the windows in **one gold commit** (a merge; rows that already
   hold the recomputed values are left alone), carrying gold's position
   ``txn`` unchanged: a streaming commit racing it fails and re-plans on top
   of the restated rows, and if the stream commits first the backfill fails and
   starts over from step 1 (up to a few times).
5. **Mark** the late events applied (``applied_at``, ``applied_by``).

A second run over the same range finds nothing pending and changes nothing. A
crash between 4 and 5 is repaired by running again: the recompute equals gold,
so only the marking happens. Closed windows only change through backfills (a
new event for a closed window is itself late), so the stream never overwrites
a restated window. ``dry_run`` stops after step 2 and reports the plan.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties

from streamlake.delta.table import ensure_table, files_overlapping, open_table, read_files
from streamlake.errors import StreamLakeError
from streamlake.pipeline.gold import (
    _row,
    aggregate,
    exact_temperature,
    merge_into_gold,
    micros_to_datetime,
    read_gold_rows,
    window_pairs,
)
from streamlake.pipeline.schemas import LATE_EVENTS, SILVER
from streamlake.pipeline.stage import committed_position, position_app_id
from streamlake.pipeline.windows import WindowSpec, merge_sessions

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class BackfillError(StreamLakeError):
    """A backfill cannot run now (the message says why and what to do)."""


@dataclass(frozen=True)
class PipelinePaths:
    silver: str
    gold: str
    late_events: str

    @classmethod
    def of(cls, root: str) -> "PipelinePaths":
        from pathlib import Path

        return cls(str(Path(root) / "silver"), str(Path(root) / "gold"), str(Path(root) / "late_events"))


@dataclass
class BackfillPlan:
    """What a backfill restates: pinned silver version, late events, windows."""

    range_start: dt.datetime | None
    range_end: dt.datetime | None
    silver_version: int  # silver as of this version is what gold has consumed
    gold_version: int
    gold_position: int  # encoded txn value, written back unchanged
    late_events: pa.Table  # the pending late events applied (lineage, event_time, windows, ...)
    windows: list[tuple[str, int, int]]  # (sensor, start µs, end µs) to restate
    sensors: list[str] = field(default_factory=list)

    def describe_windows(self, limit: int = 20) -> list[str]:
        return [f"{s} [{micros_to_datetime(a):%Y-%m-%d %H:%M:%S}, {micros_to_datetime(b):%H:%M:%S})"
                for s, a, b in self.windows[:limit]]


@dataclass
class BackfillResult:
    run_id: str
    dry_run: bool
    late_events: int
    windows: int
    changed_windows: int
    deleted_windows: int
    gold_version: int | None  # the commit that restated gold (None: nothing changed)
    silver_version: int
    attempts: int
    window_list: list[str]
    range_start: str | None
    range_end: str | None

    def summary(self) -> str:
        what = "would restate" if self.dry_run else "restated"
        where = (f"event time [{self.range_start}, {self.range_end})" if self.range_start or self.range_end
                 else "all pending late events")
        if not self.late_events:
            return f"backfill {self.run_id} ({where}): nothing pending, gold unchanged"
        text = (f"backfill {self.run_id} ({where}): {what} {self.windows} window(s) from silver version "
                f"{self.silver_version} for {self.late_events} late event(s)")
        if not self.dry_run:
            text += (f"; {self.changed_windows} gold row(s) changed, {self.deleted_windows} merged away"
                     + (f" in gold version {self.gold_version}" if self.gold_version is not None else
                        " (gold already held these values)"))
        return text

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _micros(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - _EPOCH) // dt.timedelta(microseconds=1)


def pinned_silver_version(gold) -> tuple[int, int]:
    """(silver version gold has consumed completely, encoded position). Raises BackfillError."""
    position = committed_position(gold, "silver")
    if position is None:
        raise BackfillError("gold has not consumed any silver yet: nothing to backfill")
    if position.index != -1 or position.starting:
        raise BackfillError(f"gold is in the middle of silver version {position.version} ({position}); "
                            "run the backfill after the gold stage's next micro-batch")
    return position.version - 1, position.encode()


def pending_late_events(late_path: str, start: dt.datetime | None, end: dt.datetime | None,
                        max_silver_version: int) -> pa.Table:
    """Pending late events with event time in ``[start, end)`` from silver versions <= the given one."""
    table = open_table(late_path)
    files = files_overlapping(table, "event_time", start, end)
    if not files:
        return pa.Table.from_pylist([], schema=LATE_EVENTS.file_schema)
    data = ds.dataset(files, format="parquet", schema=LATE_EVENTS.file_schema)
    flt = (ds.field("applied") == False) & (ds.field("silver_version") <= max_silver_version)  # noqa: E712
    ts_type = LATE_EVENTS.schema.field("event_time").type
    if start is not None:
        flt &= ds.field("event_time") >= pa.scalar(start, ts_type)
    if end is not None:
        flt &= ds.field("event_time") < pa.scalar(end, ts_type)
    return data.to_table(filter=flt)


def plan_backfill(paths: PipelinePaths, window: WindowSpec, start: dt.datetime | None = None,
                  end: dt.datetime | None = None) -> BackfillPlan:
    """Steps 1 and 2 (see the module docstring): pinned inputs, late events, windows."""
    try:
        gold = open_table(paths.gold)
    except FileNotFoundError:
        raise BackfillError(f"no gold table at {paths.gold}: run the pipeline first") from None
    ensure_table(paths.late_events, LATE_EVENTS)
    silver_version, position = pinned_silver_version(gold)
    late = pending_late_events(paths.late_events, start, end, silver_version)
    windows: set[tuple[str, int, int]] = set()
    for sensor, wins in zip(late.column("sensor_id").to_pylist(), late.column("windows").to_pylist()):
        for w in wins:
            windows.add((sensor, _micros(w["start"]), _micros(w["end"])))
    return BackfillPlan(start, end, silver_version, gold.version(), position, late, sorted(windows),
                        sorted(set(late.column("sensor_id").to_pylist())))


# -- recompute ----------------------------------------------------------------------------------

def recompute_fixed(spark, silver_path: str, silver_version: int, windows: list[tuple[str, int, int]],
                    spec: WindowSpec) -> list[dict]:
    """Aggregates of the given fixed windows over silver at ``silver_version`` (Spark, batch)."""
    from pyspark.sql import functions as F

    if not windows:
        return []
    low, high = min(w[1] for w in windows), max(w[2] for w in windows)
    table = open_table(silver_path, silver_version)
    files = files_overlapping(table, "event_time", micros_to_datetime(low), micros_to_datetime(high))
    events = read_files(spark, silver_path, SILVER, files).where(
        (F.unix_micros("event_time") >= low) & (F.unix_micros("event_time") < high)
        & F.col("sensor_id").isin(sorted({w[0] for w in windows})))
    wanted = spark.createDataFrame(windows, "sensor_id string, _wstart long, _wend long")
    pairs = window_pairs(events, spec).join(F.broadcast(wanted), ["sensor_id", "_wstart", "_wend"])
    table_rows = aggregate(pairs, None).toArrow().to_pylist()
    return [{**r, "window_start": r.pop("_wstart"), "window_end": r.pop("_wend")} for r in table_rows]


def _silver_events(silver_path: str, silver_version: int, sensor: str, low_us: int, high_us: int) -> pa.Table:
    """Silver events of one sensor with event time in ``[low, high]``, sorted by time."""
    table = open_table(silver_path, silver_version)
    files = files_overlapping(table, "event_time", micros_to_datetime(low_us), micros_to_datetime(high_us))
    if not files:
        return pa.Table.from_pylist([], schema=SILVER.file_schema)
    ts_type = SILVER.schema.field("event_time").type
    data = ds.dataset(files, format="parquet", schema=SILVER.file_schema)
    flt = ((ds.field("event_time") >= pa.scalar(micros_to_datetime(low_us), ts_type))
           & (ds.field("event_time") <= pa.scalar(micros_to_datetime(high_us), ts_type)))
    rows = data.to_table(filter=flt, columns=["sensor_id", "event_time", "temperature"])
    rows = rows.filter(pc.equal(rows.column("sensor_id").cast(pa.string()), sensor))  # see gold.read_gold_rows
    return rows.select(["event_time", "temperature"]).sort_by("event_time")


def session_region(paths: PipelinePaths, silver_version: int, gold, sensor: str, times_us: list[int],
                   gap_us: int) -> tuple[int, int]:
    """The stretch ``[low, high)`` of a sensor's timeline whose sessions a late event at
    each of ``times_us`` can change, widened until nothing outside can merge in."""
    low, high = min(times_us), max(times_us) + gap_us
    while True:
        sessions = read_gold_rows(gold, {sensor}, low, high)
        new_low = min([low] + [_micros(r["window_start"]) for r in sessions])
        new_high = max([high] + [_micros(r["window_end"]) for r in sessions])
        before = _silver_events(paths.silver, silver_version, sensor, new_low - gap_us, new_low - 1)
        after = _silver_events(paths.silver, silver_version, sensor, new_high - gap_us, new_high)
        if before.num_rows:
            new_low = _micros(before.column("event_time")[0].as_py())
        if after.num_rows:
            new_high = max(new_high, _micros(after.column("event_time")[-1].as_py()) + gap_us)
        if (new_low, new_high) == (low, high):
            return low, high
        low, high = new_low, new_high


def recompute_sessions(events: pa.Table, sensor: str, gap_us: int, now: dt.datetime) -> list[dict]:
    """Sessions ``[first event, last event + gap)`` of one sensor's sorted events."""
    times = [_micros(t) for t in events.column("event_time").to_pylist()]
    temps = events.column("temperature").to_pylist()
    groups = merge_sessions([(t, t + gap_us) for t in times], gap_us // 1000)
    rows = []
    for group in groups:
        members = sorted(group)
        total = sum((exact_temperature(temps[i]) for i in members), decimal.Decimal(0))
        rows.append(_row(sensor, times[members[0]], times[members[-1]] + gap_us, len(members), total,
                         min(temps[i] for i in members), max(temps[i] for i in members), now))
    return rows


# -- run ------------------------------------------------------------------------------------------

def run_backfill(spark, paths: PipelinePaths, window: WindowSpec, start: dt.datetime | None = None,
                 end: dt.datetime | None = None, *, dry_run: bool = False, run_id: str | None = None) -> BackfillResult:
    """Apply the pending late events in ``[start, end)`` (all, when both are None).

    Raises BackfillError when gold cannot be pinned (see :func:`pinned_silver_version`)
    or when the stream kept winning the commit race MAX_ATTEMPTS times."""
    run_id = run_id or f"bf-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    for attempt in range(1, MAX_ATTEMPTS + 1):
        plan = plan_backfill(paths, window, start, end)
        result = BackfillResult(run_id, dry_run, plan.late_events.num_rows, len(plan.windows), 0, 0, None,
                                plan.silver_version, attempt, plan.describe_windows(),
                                start.isoformat() if start else None, end.isoformat() if end else None)
        if dry_run or not plan.late_events.num_rows:
            return result
        try:
            upserts, deletes = _restated_rows(spark, paths, window, plan)
            result.changed_windows, result.deleted_windows = len(upserts), len(deletes)
            result.gold_version = _commit_gold(paths, plan, upserts, deletes, run_id, window)
        except CommitFailedError as exc:
            log.warning("backfill %s: gold changed while restating (%s); planning again", run_id, exc)
            continue
        _mark_applied(paths.late_events, plan.late_events, run_id)
        log.info("%s", result.summary())
        return result
    raise BackfillError(f"backfill {run_id}: gold kept changing while restating; {MAX_ATTEMPTS} attempts failed")


def _restated_rows(spark, paths: PipelinePaths, window: WindowSpec, plan: BackfillPlan) -> tuple[list, list]:
    """Gold rows to write (only those whose values change) and to delete."""
    gold = open_table(paths.gold, plan.gold_version)
    now = dt.datetime.now(dt.timezone.utc)
    if window.is_session:
        gap = window.size_ms * 1000
        upserts, deletes = [], []
        late_times: dict[str, list[int]] = {}
        for sensor, t in zip(plan.late_events.column("sensor_id").to_pylist(),
                             plan.late_events.column("event_time").to_pylist()):
            late_times.setdefault(sensor, []).append(_micros(t))
        for sensor, times in sorted(late_times.items()):
            low, high = session_region(paths, plan.silver_version, gold, sensor, times, gap)
            fresh = recompute_sessions(_silver_events(paths.silver, plan.silver_version, sensor, low, high - gap),
                                       sensor, gap, now)
            old = read_gold_rows(gold, {sensor}, low, high)
            keep = {(r["window_start"], r["window_end"]) for r in fresh}
            upserts += _changed(old, fresh)
            deletes += [r for r in old if (r["window_start"], r["window_end"]) not in keep]
        return upserts, deletes
    fresh = recompute_fixed(spark, paths.silver, plan.silver_version, plan.windows, window)
    rows = [_row(r["sensor_id"], r["window_start"], r["window_end"], r["count"], r["sum_temperature"],
                 r["min_temperature"], r["max_temperature"], now) for r in fresh]
    low = min(w[1] for w in plan.windows)
    high = max(w[2] for w in plan.windows)
    old = read_gold_rows(gold, set(plan.sensors), low, high)
    return _changed(old, rows), []


def _changed(old: list[dict], fresh: list[dict]) -> list[dict]:
    """The fresh rows whose values differ from (or are missing in) ``old``."""
    values = ("count", "sum_temperature", "min_temperature", "max_temperature")
    have = {(r["sensor_id"], r["window_start"], r["window_end"]): r for r in old}
    out = []
    for r in fresh:
        prior = have.get((r["sensor_id"], r["window_start"], r["window_end"]))
        if prior is None or any(prior[k] != r[k] for k in values):
            out.append(r)
    return out


def _commit_gold(paths: PipelinePaths, plan: BackfillPlan, upserts: list[dict], deletes: list[dict],
                 run_id: str, window: WindowSpec) -> int | None:
    """One gold commit from the pinned snapshot; raises CommitFailedError if gold moved."""
    if not upserts and not deletes:
        return None
    from deltalake.transaction import Transaction

    gold = open_table(paths.gold, plan.gold_version)
    properties = CommitProperties(
        app_transactions=[Transaction(position_app_id("silver"), plan.gold_position)],
        custom_metadata={"streamlake": {"operation": "backfill", "run": run_id, "window": str(window),
                                        "silverVersion": plan.silver_version, "windows": len(upserts),
                                        "deleted": len(deletes), "lateEvents": plan.late_events.num_rows,
                                        "from": plan.range_start.isoformat() if plan.range_start else None,
                                        "to": plan.range_end.isoformat() if plan.range_end else None}})
    merge_into_gold(gold, upserts, deletes, properties)
    return open_table(paths.gold).version()


def _mark_applied(late_path: str, late: pa.Table, run_id: str) -> None:
    """``applied = true`` on the given late events (by lineage), retried on conflicts."""
    from deltalake.transaction import CommitProperties as Props

    keys = late.select(["topic", "partition", "offset"]).append_column(
        "event_date", pc.cast(late.column("event_time"), pa.date32()))
    now = dt.datetime.now(dt.timezone.utc)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        table = open_table(late_path)
        try:
            (table.merge(keys, "t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset AND "
                               "t.event_date = s.event_date",
                         source_alias="s", target_alias="t",
                         commit_properties=Props(custom_metadata={"streamlake": {"operation": "backfill-applied",
                                                                                 "run": run_id}}))
             .when_matched_update({"applied": "true", "applied_at": f"'{now.isoformat()}'",
                                   "applied_by": f"'{run_id}'"}).execute())
            return
        except CommitFailedError as exc:
            log.warning("backfill %s: marking late events lost a commit race (%s); again", run_id, exc)
    raise BackfillError(f"backfill {run_id}: could not mark the late events applied after {MAX_ATTEMPTS} tries; "
                        "run the backfill again (it will only mark them)")
