"""Gold: one table per aggregate of the definition, from silver, with every late event kept.

Each aggregate is its own streaming query on silver (``streamlake-delta``
source, checkpoint ``_checkpoints/gold/<aggregate>``), so an aggregate added to
a definition starts from silver's beginning and builds its table from all of
silver, and aggregates never wait for each other. Spark's own windowed
aggregation would drop late rows and tie its state to the shuffle partitions
of its first batch (see DESIGN.md); here the state is **the gold table itself**
plus a **watermark** kept as a ``txn`` action of it (``streamlake:watermark``,
epoch ms), so any parallelism can continue it and savepoints, restores and
restarts carry it. Each micro-batch:

1. reads the watermark as of the batch's start (none before the first event);
2. assigns every event its windows (:mod:`streamlake.pipeline.windows`); an
   (event, window) pair whose window end is at or before the watermark is
   **late**: the event goes to ``late_events/<aggregate>`` with the watermark it
   missed and those windows, ``applied = false`` (a backfill applies it later);
3. aggregates the on-time pairs per key and window in Spark, on ``partitions``
   shuffle partitions (:func:`streamlake.pipeline.measures.partial_columns`);
4. combines them with the gold rows of those windows
   (:func:`streamlake.pipeline.measures.combine`; sessions that touch merge) and
   writes them in **one Delta merge**, whose ``txn`` actions hold the silver
   position consumed and the new watermark (max event time of the batch minus
   the allowed lateness, never moving back).

Both writes are exactly once by position (:mod:`streamlake.pipeline.stage`).
A backfill restating windows commits with the same position ``txn``, so a
stream commit racing it fails and re-plans on top of the restated rows: the
stream never overwrites a restated window with older values. Sums are exact
decimals, so gold does not depend on batch boundaries or parallelism.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field
from typing import Sequence

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake.transaction import CommitProperties

from streamlake.delta.table import (
    COMPACT_AFTER_SMALL_FILES,
    TableSpec,
    ensure_table,
    files_overlapping,
    open_table,
    parquet_dataset,
    table_exists,
    with_commit_retries,
)
from streamlake.delta.txn import commit_info
from streamlake.errors import InvalidOptionError
from streamlake.faults import crash_point
from streamlake.pipeline.definition import Aggregate, PipelineDefinition
from streamlake.pipeline.measures import MAX_EVENT, combine, partial_columns
from streamlake.pipeline.schemas import gold_spec, late_spec
from streamlake.pipeline.silver import ensure_silver
from streamlake.pipeline.stage import (
    DRIVER_READ_MAX_BYTES,
    BatchRange,
    DeltaFedStage,
    append_batch,
    commit_metadata,
    compact_appended,
    stage_transactions,
)
from streamlake.pipeline.windows import WindowSpec, merge_sessions
from streamlake.spark.session import is_connect

log = logging.getLogger(__name__)

WATERMARK_APP_ID = "streamlake:watermark"
_LATE, _NEEDED = "_late", "_needed"  # a batch's rows: behind the watermark; in the versions gold's plan needs
SOURCE = "silver"
VERSION_COLUMN = "_commit_version"
LINEAGE = ("topic", "partition", "offset")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def ensure_gold(path: str, definition: PipelineDefinition, aggregate: Aggregate, storage=None):
    """Open or create the aggregate's gold table. The window and the measures are recorded
    in gold's creating commit (``streamlake.window``, ``streamlake.aggregate``), so backfills and
    checks use what gold was built with. Raises InvalidOptionError if an existing gold holds
    other windows (its rows would mean something else)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    from streamlake.delta.features import require_spark_readable
    from streamlake.delta.table import delta_options
    from streamlake.storage.location import is_object_store

    spec = gold_spec(definition, aggregate)
    options = delta_options(path, storage)
    if not table_exists(path, options):
        parent = path.rsplit("/", 1)[0]
        if table_exists(parent, options):
            raise InvalidOptionError(f"{parent} is a gold table of an older StreamLake (one gold table "
                                     "per pipeline); run this pipeline under a new root")
        require_spark_readable(f"gold table {spec.name} at {path}", spec.schema, spec.partition_by,
                               spec.configuration)
        if not is_object_store(path):
            os.makedirs(path, exist_ok=True)
        try:
            DeltaTable.create(path, spec.schema, mode="ignore", partition_by=list(spec.partition_by), name=spec.name,
                              description=spec.description, configuration=dict(spec.configuration),
                              storage_options=options, commit_properties=CommitProperties(custom_metadata=commit_info({
                                  "operation": "create", "window": str(aggregate.window),
                                  "aggregate": aggregate.to_dict()})))
        except CommitFailedError:
            pass  # another process created it first
    table = ensure_table(path, spec, options)
    built = gold_window(path, options)
    if built is not None and built != aggregate.window:
        raise InvalidOptionError(f"gold at {path} holds {built} windows; the definition asks for {aggregate.window}. "
                                 "Give the aggregate a new name (it is built from silver) or use a new root")
    return table


def gold_window(path: str, storage=None) -> WindowSpec | None:
    """The windows the gold table at ``path`` was built with (None if it does not say)."""
    from streamlake.delta.log import DeltaLog

    try:
        info = DeltaLog(path, storage=storage).commit_info(0)
    except FileNotFoundError:
        return None
    window = (info.get("streamlake") or {}).get("window")
    return WindowSpec.parse(window) if window else None


def watermark_ms(table) -> int | None:
    """A gold table's watermark (epoch ms), or None before the first event."""
    return table.transaction_version(WATERMARK_APP_ID)


def micros_to_datetime(micros: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=int(micros))


def to_micros(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - _EPOCH) // dt.timedelta(microseconds=1)


# -- Spark side -------------------------------------------------------------------------------

def window_pairs(events, spec: WindowSpec, event_time: str):
    """One row per (event, fixed window): columns ``_wstart``/``_wend`` (epoch µs)."""
    from pyspark.sql import functions as F

    size = spec.size_ms * 1000
    step = (spec.slide_ms or spec.size_ms) * 1000
    t = F.unix_micros(F.col(f"`{event_time}`"))
    last = t - F.pmod(t, F.lit(step))
    return (events.withColumn("_wstart", F.explode(F.sequence(last - F.lit(size - step), last, F.lit(step))))
            .withColumn("_wend", F.col("_wstart") + F.lit(size)))


def _keys(aggregate: Aggregate):
    from pyspark.sql import functions as F

    return [F.col(f"`{k}`") for k in aggregate.keys]


def aggregate_fixed(pairs, definition: PipelineDefinition, aggregate: Aggregate, partitions: int | None,
                    split_by: Sequence[str] = ()):
    """Partials per key and fixed window; ``pairs`` has ``_wstart``/``_wend``. ``split_by``:
    columns of ``pairs`` that split each group further (kept in the result)."""
    keys = _keys(aggregate)
    if partitions:
        pairs = pairs.repartition(partitions, *keys, "_wstart", "_wend")
    return pairs.groupBy(*keys, "_wstart", "_wend", *split_by).agg(*partial_columns(definition, aggregate))


def aggregate_sessions(events, definition: PipelineDefinition, aggregate: Aggregate, partitions: int | None,
                       split_by: Sequence[str] = ()):
    """Per key, the batch's own sessions (Spark's ``session_window``) with their partials;
    they still have to be merged with each other and with gold's where they touch.
    ``split_by``: columns of ``events`` whose values keep sessions apart (kept in the result)."""
    from pyspark.sql import functions as F

    keys = _keys(aggregate)
    if partitions:
        events = events.repartition(partitions, *keys) if keys else events.repartition(partitions)
    gap = f"{aggregate.window.size_ms} milliseconds"
    grouped = events.groupBy(*keys, *split_by,
                             F.session_window(F.col(f"`{definition.event_time}`"), gap).alias("_s"))
    partial = grouped.agg(*partial_columns(definition, aggregate))
    rest = [c for c in partial.columns if c not in ("_s", *aggregate.keys)]
    return partial.select(*keys, F.unix_micros("_s.start").alias("_wstart"), F.unix_micros("_s.end").alias("_wend"),
                          *rest)


def partials_to_rows(partials) -> list[dict]:
    """Collect aggregated windows (small: one row per touched window) as dicts with
    ``window_start``/``window_end`` in epoch µs."""
    return [{**r, "window_start": r.pop("_wstart"), "window_end": r.pop("_wend")}
            for r in partials.toArrow().to_pylist()]


# -- combining with gold ------------------------------------------------------------------------

def key_of(aggregate: Aggregate, row: dict) -> tuple:
    return tuple(row[k] for k in aggregate.keys)


def gold_row(definition: PipelineDefinition, aggregate: Aggregate, key: tuple, start_us: int, end_us: int,
             parts: list[dict], now: dt.datetime) -> dict:
    """A gold row for window ``[start, end)`` of ``key`` from the partial/gold rows it combines."""
    start = micros_to_datetime(start_us)
    return {**dict(zip(aggregate.keys, key)), "window_start": start, "window_end": micros_to_datetime(end_us),
            **combine(definition, aggregate, parts), "updated_at": now, "window_date": start.date()}


def read_gold_rows(table, spec: TableSpec, aggregate: Aggregate, keys: set[tuple] | None, low_us: int,
                   high_us: int, storage=None) -> list[dict]:
    """Gold rows (of ``keys``; None: all) whose window overlaps or touches ``[low_us, high_us]``,
    with ``window_start``/``window_end`` as datetimes."""
    low, high = micros_to_datetime(low_us), micros_to_datetime(high_us)
    files = files_overlapping(table, "window_end", low, None)
    if not files:
        return []
    data = parquet_dataset(files, spec.file_schema, storage)
    ts_type = spec.schema.field("window_end").type
    flt = (ds.field("window_end") >= pa.scalar(low, ts_type)) & (ds.field("window_start") <= pa.scalar(high, ts_type))
    rows = data.to_table(filter=flt)
    out = []
    for r in rows.to_pylist():
        if keys is None or key_of(aggregate, r) in keys:
            out.append({**r, "window_date": r["window_start"].date()})
    return out


def combine_fixed(definition, aggregate, existing: list[dict], partials: list[dict], now: dt.datetime) -> list[dict]:
    """Gold rows after adding ``partials`` (fixed windows, µs bounds) to ``existing`` ones."""
    have = {(key_of(aggregate, r), to_micros(r["window_start"]), to_micros(r["window_end"])): r for r in existing}
    out = []
    for p in partials:
        key = key_of(aggregate, p)
        old = have.get((key, p["window_start"], p["window_end"]))
        out.append(gold_row(definition, aggregate, key, p["window_start"], p["window_end"],
                            [p] if old is None else [old, p], now))
    return out


def combine_sessions(definition, aggregate, existing: list[dict], partials: list[dict],
                     now: dt.datetime) -> tuple[list[dict], list[dict]]:
    """Merge new partial sessions with the overlapping/touching gold sessions, per key.

    Returns (rows to upsert, rows to delete): a gold session absorbed into a
    bigger one is deleted; sessions are ``[first event, last event + gap)``."""
    upserts, deletes = [], []
    by_key: dict[tuple, list[tuple[dict, bool]]] = {}
    for r in existing:
        by_key.setdefault(key_of(aggregate, r), []).append(
            ({**r, "_s": to_micros(r["window_start"]), "_e": to_micros(r["window_end"])}, True))
    for p in partials:
        by_key.setdefault(key_of(aggregate, p), []).append(({**p, "_s": p["window_start"], "_e": p["window_end"]},
                                                           False))
    for key, items in by_key.items():
        for group in merge_sessions([(r["_s"], r["_e"]) for r, _ in items], aggregate.window.size_ms):
            members = [items[i] for i in group]
            if all(is_old for _, is_old in members):
                continue  # untouched gold session
            start, end = min(r["_s"] for r, _ in members), max(r["_e"] for r, _ in members)
            upserts.append(gold_row(definition, aggregate, key, start, end, [r for r, _ in members], now))
            for r, is_old in members:
                if is_old and (r["_s"], r["_e"]) != (start, end):
                    deletes.append({k: v for k, v in r.items() if k not in ("_s", "_e")})
    return upserts, deletes


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def merge_into_gold(table, spec: TableSpec, aggregate: Aggregate, upserts: list[dict], deletes: list[dict],
                    properties: CommitProperties) -> None:
    """One Delta commit: a merge that updates or inserts ``upserts`` and deletes ``deletes``
    (by key and window); with neither, an empty commit carrying ``properties`` (a merge of
    nothing would not commit, and the position must advance)."""
    if not upserts and not deletes:
        table.create_write_transaction([], "append", spec.schema, partition_by=list(spec.partition_by),
                                       commit_properties=properties)
        return
    names = spec.schema.names
    source_rows = [{**{n: r.get(n) for n in names}, "_op": "upsert"} for r in upserts] + \
                  [{**{n: r.get(n) for n in names}, "_op": "delete"} for r in deletes]
    source = pa.Table.from_pylist(source_rows, schema=spec.schema.append(pa.field("_op", pa.string())))
    columns = {_quoted(name): f"s.{_quoted(name)}" for name in names}
    on = " AND ".join(f"t.{_quoted(c)} = s.{_quoted(c)}"
                      for c in (*aggregate.keys, "window_start", "window_end", "window_date"))
    (table.merge(source, on, source_alias="s", target_alias="t", commit_properties=properties)
     .when_matched_delete(predicate="s._op = 'delete'")
     .when_matched_update(columns, predicate="s._op = 'upsert'")
     .when_not_matched_insert(columns, predicate="s._op = 'upsert'")
     .execute())


# -- the stage --------------------------------------------------------------------------------

@dataclass
class GoldStage(DeltaFedStage):
    """The gold stage of one aggregate: silver -> gold/<aggregate> (and late_events/<aggregate>)."""

    definition: PipelineDefinition
    aggregate: Aggregate
    silver_path: str
    gold_path: str
    late_path: str
    checkpoint: str
    partitions: int | None = None
    max_files_per_trigger: int | None = None
    processing_time_s: float | None = None
    query_name: str = "pipeline"
    source: str = SOURCE
    storage: dict[str, str] = field(default_factory=dict)  # an object-store root's options, without secrets
    # late_events: bin-packed once more than this many of its files are small (every batch
    # with a late event appends one per event date; gold's merge rewrites its own files)
    compact_after_files: int = COMPACT_AFTER_SMALL_FILES
    driver_read_max_bytes: int = DRIVER_READ_MAX_BYTES  # smaller batches: read on the driver
    upstream_wait_ms: int | None = None  # the source's waitForCommitMs (a continuous run on a local root)

    @property
    def name(self) -> str:
        return self.aggregate.stage

    @property
    def source_path(self) -> str:
        return self.silver_path

    @property
    def gold_spec(self) -> TableSpec:
        return gold_spec(self.definition, self.aggregate)

    def outputs(self) -> dict[str, str]:
        return {self.aggregate.gold_table: self.gold_path, self.aggregate.late_table: self.late_path}

    def late_spec(self) -> TableSpec:
        from streamlake.delta.table import evolve_table

        return evolve_table(self.late_path, late_spec(self.definition, self.aggregate), self.storage)[1]

    def prepare(self) -> None:
        ensure_silver(self.silver_path, self.definition, self.storage)
        ensure_gold(self.gold_path, self.definition, self.aggregate, self.storage)
        self.late_spec()

    def process(self, df, batch: BatchRange, on_driver: bool = False) -> dict:
        """Write one micro-batch of silver events to late_events and gold (module docstring).

        Spark runs one job on the batch (read once and cached), aggregating every event
        split by late or on time, and a second one writing the late events only when
        the first found any; the rest happens on the driver. A batch read on the driver
        (``on_driver``: small) is aggregated on one shuffle partition, others on ``partitions``."""
        from pyspark.sql import functions as F

        gold = ensure_gold(self.gold_path, self.definition, self.aggregate, self.storage)
        plan = batch.plan(gold, self.source, self.aggregate.gold_table)
        if not plan.write:
            log.info("%s batch %d: already in gold, nothing to write", self.name, batch.batch_id)
            return {"late": 0, "windows": 0, "watermark": watermark_ms(gold)}
        wm = watermark_ms(gold)
        events = df.select(*[F.col(f"`{f}`") for f in self.definition.field_names], *LINEAGE,
                           VERSION_COLUMN).persist()
        try:
            flagged, late_windows = self._classify(events, wm)
            # gold takes the on-time rows of the versions its plan needs (WritePlan.rows); late_events
            # plans for itself, so whether the batch has late rows is asked of all of it
            needed = F.lit(True) if plan.from_version is None else F.col(VERSION_COLUMN) >= plan.from_version
            # a batch read on the driver is small: one shuffle partition (measured: 40-50 ms less for a 200-row batch)
            grouped = self._partials(flagged.withColumn(_NEEDED, needed), split_by=(_LATE, _NEEDED),
                                     partitions=1 if on_driver else self.partitions)
            any_late = any(p[_LATE] for p in grouped)
            partials = [{k: v for k, v in p.items() if k not in (_LATE, _NEEDED)} for p in grouped
                        if p[_NEEDED] and not p[_LATE]]
            # with no late event in the batch, late_events' commit only records the position: no Spark job
            late = append_batch(self.late_path, self.late_spec(),
                                self._late_rows(late_windows, wm, batch) if any_late else None, batch,
                                source=self.source, stage=self.name, version_column=VERSION_COLUMN,
                                stats_columns=self._late_stats(), storage=self.storage)
            new_wm = wm
            newest = max((p[MAX_EVENT] for p in partials if p[MAX_EVENT] is not None), default=None)
            if newest is not None:  # late events are behind the watermark: only on-time ones can move it
                candidate = newest // 1000 - self.aggregate.allowed_lateness_ms
                new_wm = candidate if wm is None else max(wm, candidate)
            windows = self._commit(batch, partials, new_wm)
            # A query on a Spark Connect server reports no input rows for foreachBatch: count them
            # here (the events are cached); elsewhere Spark's progress has them.
            rows = {"rows": events.count()} if is_connect(df.sparkSession) else {}
        finally:
            events.unpersist()
        compacted = compact_appended(self.name, {self.aggregate.late_table: late}, self.compact_after_files)
        return {"late": late.rows if late else 0, "windows": windows, "watermark": new_wm, **rows,
                **({"compacted": compacted} if compacted else {})}

    def _late_stats(self) -> tuple[str, ...]:
        ids = (self.definition.event_id,) if self.definition.event_id else ()
        return (*ids, self.definition.event_time, *self.aggregate.keys, *LINEAGE, "silver_version", "applied")

    def _classify(self, events, wm: int | None):
        """Against watermark ``wm``: (the pairs (fixed windows) or events (sessions) with the
        column ``_late``, the late (event, window) pairs)."""
        from pyspark.sql import functions as F

        window = self.aggregate.window
        t = F.unix_micros(F.col(f"`{self.definition.event_time}`"))
        if window.is_session:
            gap = window.size_ms * 1000
            is_late = F.lit(False) if wm is None else (t + F.lit(gap)) <= F.lit(wm * 1000)
            late = events.where(is_late).withColumn("_wstart", t).withColumn("_wend", F.col("_wstart") + F.lit(gap))
            return events.withColumn(_LATE, is_late), late
        pairs = window_pairs(events, window, self.definition.event_time)
        is_late = F.lit(False) if wm is None else F.col("_wend") <= F.lit(wm * 1000)
        return pairs.withColumn(_LATE, is_late), pairs.where(is_late)

    def _late_rows(self, late_pairs, wm: int | None, batch: BatchRange):
        """One late_events row per late event, with every closed window it belongs to."""
        from pyspark.sql import functions as F

        arrived = dt.datetime.fromtimestamp(batch.batch_time_ms / 1000, dt.timezone.utc)
        window = F.struct(F.timestamp_micros("_wstart").alias("start"), F.timestamp_micros("_wend").alias("end"))
        fields = self.definition.field_names
        grouped = late_pairs.groupBy(*LINEAGE, VERSION_COLUMN).agg(
            *[F.first(F.col(f"`{f}`")).alias(f) for f in fields], F.array_sort(F.collect_list(window)).alias("windows"))
        return grouped.select(
            *[F.col(f"`{f}`") for f in fields], *LINEAGE,
            F.lit(micros_to_datetime((wm or 0) * 1000)).cast("timestamp").alias("watermark"),
            "windows", F.col(VERSION_COLUMN).alias("silver_version"),
            F.lit(batch.batch_id).cast("long").alias("batch_id"),
            F.lit(arrived).cast("timestamp").alias("arrived_at"),
            F.lit(False).alias("applied"), F.lit(None).cast("timestamp").alias("applied_at"),
            F.lit(None).cast("string").alias("applied_by"),
            F.to_date(F.col(f"`{self.definition.event_time}`")).alias("event_date"), VERSION_COLUMN)

    def _partials(self, rows, split_by: Sequence[str] = (), partitions: int | None = None) -> list[dict]:
        aggregate = aggregate_sessions if self.aggregate.window.is_session else aggregate_fixed
        return partials_to_rows(aggregate(rows, self.definition, self.aggregate, partitions, split_by))

    def _commit(self, batch: BatchRange, partials: list[dict], new_wm: int | None) -> int:
        """Merge the partials into gold as one commit (re-planned if a backfill commits first)."""
        spec = self.gold_spec

        def attempt(_n: int) -> int:
            gold = open_table(self.gold_path, storage_options=self.storage)
            if not batch.plan(gold, self.source, self.aggregate.gold_table).write:
                return 0  # committed by an earlier attempt whose result we did not see
            now = dt.datetime.now(dt.timezone.utc)
            upserts, deletes = self._combined(gold, spec, partials, now)
            extra = {WATERMARK_APP_ID: new_wm} if new_wm is not None else {}
            properties = CommitProperties(
                app_transactions=stage_transactions(self.source, batch, extra),
                custom_metadata=commit_metadata(self.name, batch, self.source, f"merge-{batch.batch_id}",
                                                windows=len(upserts), watermark=new_wm,
                                                window=str(self.aggregate.window)))
            merge_into_gold(gold, spec, self.aggregate, upserts, deletes, properties)
            crash_point("after_commit_gold", batch.batch_id)
            return len(upserts)

        return with_commit_retries(f"{self.name} batch {batch.batch_id}", attempt)

    def _combined(self, gold, spec: TableSpec, partials: list[dict],
                  now: dt.datetime) -> tuple[list[dict], list[dict]]:
        if not partials:
            return [], []
        keys = {key_of(self.aggregate, p) for p in partials}
        low = min(p["window_start"] for p in partials)
        high = max(p["window_end"] for p in partials)
        existing = read_gold_rows(gold, spec, self.aggregate, keys, low, high, self.storage)
        if self.aggregate.window.is_session:
            return combine_sessions(self.definition, self.aggregate, existing, partials, now)
        return combine_fixed(self.definition, self.aggregate, existing, partials, now), []

