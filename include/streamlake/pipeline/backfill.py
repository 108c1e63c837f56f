"""Backfills: apply an aggregate's pending late events by restating the gold windows they belong to.

A backfill of one aggregate over an event-time range ``[start, end)`` (or over
every pending late event) does, in this order:

1. **Pin the inputs.** Read gold's position in silver (its ``txn``): gold holds
   exactly silver's versions ``< v``. Silver at version ``v - 1`` is therefore
   the input that gold agrees with; late events are taken only if they came
   from those versions. (A position inside a version, which only a split
   initial snapshot produces, is refused with a message: run it after the next
   micro-batch.)
2. **Plan.** The pending late events (``applied = false``) whose event time is
   in the range, and the windows they belong to (for session windows: the
   stretch of the key's timeline the event can reach, widened until no
   neighbouring event or session could merge into it).
3. **Recompute** those windows from silver ``v - 1`` in batch: Spark for fixed
   windows, per key on the driver for sessions (their boundaries depend on
   every event). Silver's event-time file statistics prune what is read, so the
   cost follows the range, not the table.
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
import logging
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties

from streamlake.delta.table import evolve_table, files_overlapping, open_table, parquet_dataset, read_files
from streamlake.delta.txn import commit_info
from streamlake.errors import StreamLakeError
from streamlake.pipeline.definition import Aggregate, PipelineDefinition
from streamlake.pipeline.gold import (
    aggregate_fixed,
    gold_row,
    key_of,
    merge_into_gold,
    micros_to_datetime,
    partials_to_rows,
    read_gold_rows,
    to_micros,
    window_pairs,
)
from streamlake.pipeline.measures import compared_columns, event_partial
from streamlake.pipeline.schemas import gold_spec, late_spec, silver_spec
from streamlake.pipeline.stage import committed_position, position_app_id
from streamlake.pipeline.windows import merge_sessions
from streamlake.spark.session import local_frame

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5


class BackfillError(StreamLakeError):
    """A backfill cannot run now (the message says why and what to do)."""


@dataclass(frozen=True)
class AggregatePaths:
    """The tables one aggregate's backfill reads and writes."""

    silver: str
    gold: str
    late_events: str

    @classmethod
    def of(cls, root: str, aggregate: Aggregate) -> "AggregatePaths":
        from streamlake.storage.location import join

        return cls(join(root, "silver"), join(root, aggregate.gold_table), join(root, aggregate.late_table))


@dataclass
class BackfillPlan:
    """What a backfill restates: pinned silver version, late events, windows."""

    aggregate: str
    range_start: dt.datetime | None
    range_end: dt.datetime | None
    silver_version: int  # silver as of this version is what gold has consumed
    gold_version: int
    gold_position: int  # encoded txn value, written back unchanged
    late_events: pa.Table  # the pending late events applied (lineage, event time, windows, ...)
    windows: list[tuple[tuple, int, int]]  # (key, start µs, end µs) to restate
    keys: list[tuple] = field(default_factory=list)

    def describe_windows(self, limit: int = 20) -> list[str]:
        return [f"{describe_key(k)} [{micros_to_datetime(a):%Y-%m-%d %H:%M:%S}, {micros_to_datetime(b):%H:%M:%S})"
                for k, a, b in self.windows[:limit]]


def describe_key(key: tuple) -> str:
    return "/".join(str(k) for k in key) if key else "(all)"


@dataclass
class BackfillResult:
    run_id: str
    aggregate: str
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
        head = f"backfill {self.run_id} of gold/{self.aggregate} ({where})"
        if not self.late_events:
            return f"{head}: nothing pending, gold unchanged"
        text = (f"{head}: {what} {self.windows} window(s) from silver version {self.silver_version} for "
                f"{self.late_events} late event(s)")
        if not self.dry_run:
            text += (f"; {self.changed_windows} gold row(s) changed, {self.deleted_windows} merged away"
                     + (f" in gold version {self.gold_version}" if self.gold_version is not None else
                        " (gold already held these values)"))
        return text

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def gold_has_consumed_silver(gold_path: str) -> bool:
    """Whether the gold table at ``gold_path`` exists and has committed a silver position: late
    events are written with gold's commits, so before that none can be pending."""
    from streamlake.delta.table import table_exists

    return table_exists(gold_path) and committed_position(open_table(gold_path), "silver") is not None


def pinned_silver_version(gold) -> tuple[int, int]:
    """(silver version gold has consumed completely, encoded position). Raises BackfillError."""
    position = committed_position(gold, "silver")
    if position is None:
        raise BackfillError("gold has not consumed any silver yet: nothing to backfill")
    if position.index != -1 or position.starting:
        raise BackfillError(f"gold is in the middle of silver version {position.version} ({position}); "
                            "run the backfill after the gold stage's next micro-batch")
    return position.version - 1, position.encode()


def pending_late_events(definition: PipelineDefinition, aggregate: Aggregate, late_path: str,
                        start: dt.datetime | None, end: dt.datetime | None, max_silver_version: int) -> pa.Table:
    """Pending late events with event time in ``[start, end)`` from silver versions <= the given one."""
    table, spec = evolve_table(late_path, late_spec(definition, aggregate))
    event_time = definition.event_time
    files = files_overlapping(table, event_time, start, end)
    if not files:
        return spec.schema.empty_table()
    data = parquet_dataset(files, spec.file_schema)
    flt = (ds.field("applied") == False) & (ds.field("silver_version") <= max_silver_version)  # noqa: E712
    ts_type = spec.schema.field(event_time).type
    if start is not None:
        flt &= ds.field(event_time) >= pa.scalar(start, ts_type)
    if end is not None:
        flt &= ds.field(event_time) < pa.scalar(end, ts_type)
    return data.to_table(filter=flt)


def plan_backfill(definition: PipelineDefinition, aggregate: Aggregate, paths: AggregatePaths,
                  start: dt.datetime | None = None, end: dt.datetime | None = None) -> BackfillPlan:
    """Steps 1 and 2 (see the module docstring): pinned inputs, late events, windows."""
    try:
        gold = open_table(paths.gold)
    except FileNotFoundError:
        raise BackfillError(f"no gold table at {paths.gold}: run the pipeline first") from None
    silver_version, position = pinned_silver_version(gold)
    late = pending_late_events(definition, aggregate, paths.late_events, start, end, silver_version)
    windows: set[tuple[tuple, int, int]] = set()
    rows = late.select([*aggregate.keys, "windows"]).to_pylist()
    for row in rows:
        for w in row["windows"]:
            windows.add((key_of(aggregate, row), to_micros(w["start"]), to_micros(w["end"])))
    return BackfillPlan(aggregate.name, start, end, silver_version, gold.version(), position, late,
                        sorted(windows, key=_window_order), sorted({key_of(aggregate, r) for r in rows}, key=repr))


def _window_order(window: tuple) -> tuple:
    key, start, end = window
    return start, end, repr(key)


# -- recompute ----------------------------------------------------------------------------------

def recompute_fixed(spark, definition: PipelineDefinition, aggregate: Aggregate, silver_path: str,
                    silver_version: int, windows: list[tuple[tuple, int, int]]) -> list[dict]:
    """Partials of the given fixed windows over silver at ``silver_version`` (Spark, batch)."""
    from pyspark.sql import functions as F

    if not windows:
        return []
    low, high = min(w[1] for w in windows), max(w[2] for w in windows)
    table = open_table(silver_path, silver_version)
    spec = silver_spec(definition)
    files = files_overlapping(table, definition.event_time, micros_to_datetime(low), micros_to_datetime(high))
    t = F.unix_micros(F.col(f"`{definition.event_time}`"))
    events = read_files(spark, silver_path, spec, files, table.version()).where((t >= low) & (t < high))
    key_schema = ", ".join(f"`{k}` {definition.field(k).type.sql}" for k in aggregate.keys)
    wanted = local_frame(spark, [(*k, a, b) for k, a, b in windows],
                         (key_schema + ", " if key_schema else "") + "_wstart long, _wend long")
    pairs = window_pairs(events, aggregate.window, definition.event_time).join(
        F.broadcast(wanted), [*aggregate.keys, "_wstart", "_wend"])
    return partials_to_rows(aggregate_fixed(pairs, definition, aggregate, None))


def silver_events(definition: PipelineDefinition, aggregate: Aggregate, silver_path: str, silver_version: int,
                  key: tuple, low_us: int, high_us: int) -> list[dict]:
    """Silver events of one key with event time in ``[low, high]``, sorted by time (typed values)."""
    table = open_table(silver_path, silver_version)
    spec = silver_spec(definition)
    event_time = definition.event_time
    files = files_overlapping(table, event_time, micros_to_datetime(low_us), micros_to_datetime(high_us))
    if not files:
        return []
    ts_type = spec.schema.field(event_time).type
    data = parquet_dataset(files, spec.file_schema)
    flt = ((ds.field(event_time) >= pa.scalar(micros_to_datetime(low_us), ts_type))
           & (ds.field(event_time) <= pa.scalar(micros_to_datetime(high_us), ts_type)))
    rows = data.to_table(filter=flt, columns=definition.field_names)
    # Keys are compared after reading: delta-rs writes string_view columns, whose statistics
    # pyarrow cannot compare with a string literal inside a dataset scan.
    out = [r for r in rows.to_pylist() if key_of(aggregate, r) == key]
    return sorted(out, key=lambda r: r[event_time])


def session_region(definition: PipelineDefinition, aggregate: Aggregate, paths: AggregatePaths,
                   silver_version: int, gold, key: tuple, times_us: list[int]) -> tuple[int, int]:
    """The stretch ``[low, high)`` of a key's timeline whose sessions a late event at each of
    ``times_us`` can change, widened until nothing outside can merge in."""
    gap = aggregate.window.size_ms * 1000
    spec = gold_spec(definition, aggregate)
    event_time = definition.event_time
    low, high = min(times_us), max(times_us) + gap
    while True:
        sessions = read_gold_rows(gold, spec, aggregate, {key}, low, high)
        new_low = min([low] + [to_micros(r["window_start"]) for r in sessions])
        new_high = max([high] + [to_micros(r["window_end"]) for r in sessions])
        before = silver_events(definition, aggregate, paths.silver, silver_version, key, new_low - gap, new_low - 1)
        after = silver_events(definition, aggregate, paths.silver, silver_version, key, new_high - gap, new_high)
        if before:
            new_low = to_micros(before[0][event_time])
        if after:
            new_high = max(new_high, to_micros(after[-1][event_time]) + gap)
        if (new_low, new_high) == (low, high):
            return low, high
        low, high = new_low, new_high


def recompute_sessions(definition: PipelineDefinition, aggregate: Aggregate, events: list[dict], key: tuple,
                       now: dt.datetime) -> list[dict]:
    """Sessions ``[first event, last event + gap)`` of one key's events, sorted by time."""
    gap = aggregate.window.size_ms * 1000
    times = [to_micros(e[definition.event_time]) for e in events]
    rows = []
    for group in merge_sessions([(t, t + gap) for t in times], aggregate.window.size_ms):
        members = sorted(group)
        rows.append(gold_row(definition, aggregate, key, times[members[0]], times[members[-1]] + gap,
                             [event_partial(definition, aggregate, events[i]) for i in members], now))
    return rows


# -- run ------------------------------------------------------------------------------------------

def run_backfill(spark, definition: PipelineDefinition, aggregate: Aggregate, paths: AggregatePaths,
                 start: dt.datetime | None = None, end: dt.datetime | None = None, *, dry_run: bool = False,
                 run_id: str | None = None) -> BackfillResult:
    """Apply the aggregate's pending late events in ``[start, end)`` (all, when both are None).

    Raises BackfillError when gold cannot be pinned (see :func:`pinned_silver_version`)
    or when the stream kept winning the commit race MAX_ATTEMPTS times."""
    run_id = run_id or f"bf-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    for attempt in range(1, MAX_ATTEMPTS + 1):
        plan = plan_backfill(definition, aggregate, paths, start, end)
        result = BackfillResult(run_id, aggregate.name, dry_run, plan.late_events.num_rows, len(plan.windows), 0, 0,
                                None, plan.silver_version, attempt, plan.describe_windows(),
                                start.isoformat() if start else None, end.isoformat() if end else None)
        if dry_run or not plan.late_events.num_rows:
            return result
        try:
            upserts, deletes = _restated_rows(spark, definition, aggregate, paths, plan)
            result.changed_windows, result.deleted_windows = len(upserts), len(deletes)
            result.gold_version = _commit_gold(definition, aggregate, paths, plan, upserts, deletes, run_id)
        except CommitFailedError as exc:
            log.warning("backfill %s: gold changed while restating (%s); planning again", run_id, exc)
            continue
        _mark_applied(definition, paths.late_events, plan.late_events, run_id)
        log.info("%s", result.summary())
        return result
    raise BackfillError(f"backfill {run_id}: gold kept changing while restating; {MAX_ATTEMPTS} attempts failed")


def _restated_rows(spark, definition: PipelineDefinition, aggregate: Aggregate, paths: AggregatePaths,
                   plan: BackfillPlan) -> tuple[list, list]:
    """Gold rows to write (only those whose values change) and to delete."""
    gold = open_table(paths.gold, plan.gold_version)
    spec = gold_spec(definition, aggregate)
    now = dt.datetime.now(dt.timezone.utc)
    if aggregate.window.is_session:
        gap = aggregate.window.size_ms * 1000
        upserts, deletes = [], []
        late_times: dict[tuple, list[int]] = {}
        for row in plan.late_events.select([*aggregate.keys, definition.event_time]).to_pylist():
            late_times.setdefault(key_of(aggregate, row), []).append(to_micros(row[definition.event_time]))
        for key, times in sorted(late_times.items(), key=lambda kv: repr(kv[0])):
            low, high = session_region(definition, aggregate, paths, plan.silver_version, gold, key, times)
            events = silver_events(definition, aggregate, paths.silver, plan.silver_version, key, low, high - gap)
            fresh = recompute_sessions(definition, aggregate, events, key, now)
            old = read_gold_rows(gold, spec, aggregate, {key}, low, high)
            keep = {(r["window_start"], r["window_end"]) for r in fresh}
            upserts += _changed(aggregate, old, fresh)
            deletes += [r for r in old if (r["window_start"], r["window_end"]) not in keep]
        return upserts, deletes
    fresh = [gold_row(definition, aggregate, key_of(aggregate, p), p["window_start"], p["window_end"], [p], now)
             for p in recompute_fixed(spark, definition, aggregate, paths.silver, plan.silver_version, plan.windows)]
    low = min(w[1] for w in plan.windows)
    high = max(w[2] for w in plan.windows)
    old = read_gold_rows(gold, spec, aggregate, set(plan.keys), low, high)
    return _changed(aggregate, old, fresh), []


def _changed(aggregate: Aggregate, old: list[dict], fresh: list[dict]) -> list[dict]:
    """The fresh rows whose values differ from (or are missing in) ``old``."""
    values = compared_columns(aggregate)
    have = {(key_of(aggregate, r), r["window_start"], r["window_end"]): r for r in old}
    out = []
    for r in fresh:
        prior = have.get((key_of(aggregate, r), r["window_start"], r["window_end"]))
        if prior is None or any(prior[k] != r[k] for k in values):
            out.append(r)
    return out


def _commit_gold(definition: PipelineDefinition, aggregate: Aggregate, paths: AggregatePaths, plan: BackfillPlan,
                 upserts: list[dict], deletes: list[dict], run_id: str) -> int | None:
    """One gold commit from the pinned snapshot; raises CommitFailedError if gold moved."""
    if not upserts and not deletes:
        return None
    from deltalake.transaction import Transaction

    gold = open_table(paths.gold, plan.gold_version)
    properties = CommitProperties(
        app_transactions=[Transaction(position_app_id("silver"), plan.gold_position)],
        custom_metadata=commit_info({"operation": "backfill", "run": run_id, "aggregate": aggregate.name,
                                     "window": str(aggregate.window), "silverVersion": plan.silver_version,
                                     "windows": len(upserts), "deleted": len(deletes),
                                     "lateEvents": plan.late_events.num_rows,
                                     "from": plan.range_start.isoformat() if plan.range_start else None,
                                     "to": plan.range_end.isoformat() if plan.range_end else None}))
    merge_into_gold(gold, gold_spec(definition, aggregate), aggregate, upserts, deletes, properties)
    return open_table(paths.gold).version()


def _mark_applied(definition: PipelineDefinition, late_path: str, late: pa.Table, run_id: str) -> None:
    """``applied = true`` on the given late events (by lineage), retried on conflicts."""
    from deltalake.transaction import CommitProperties as Props

    keys = late.select(["topic", "partition", "offset"]).append_column(
        "event_date", pc.cast(late.column(definition.event_time), pa.date32()))
    now = dt.datetime.now(dt.timezone.utc)
    for _attempt in range(1, MAX_ATTEMPTS + 1):
        table = open_table(late_path)
        try:
            (table.merge(keys, 't."topic" = s."topic" AND t."partition" = s."partition" AND t."offset" = s."offset" '
                               'AND t.event_date = s.event_date',
                         source_alias="s", target_alias="t",
                         commit_properties=Props(custom_metadata=commit_info({"operation": "backfill-applied",
                                                                              "run": run_id})))
             .when_matched_update({"applied": "true", "applied_at": f"'{now.isoformat()}'",
                                   "applied_by": f"'{run_id}'"}).execute())
            return
        except CommitFailedError as exc:
            log.warning("backfill %s: marking late events lost a commit race (%s); again", run_id, exc)
    raise BackfillError(f"backfill {run_id}: could not mark the late events applied after {MAX_ATTEMPTS} tries; "
                        "run the backfill again (it will only mark them)")
