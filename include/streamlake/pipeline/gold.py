"""Gold: per sensor and event-time window, from silver, with every late event kept.

A streaming query on silver (``streamlake-delta`` source). Spark's own
windowed aggregation would drop late rows and tie its state to the shuffle
partitions of its first batch (see DESIGN.md); here the state is **gold
itself** plus a **watermark** kept as a ``txn`` action of gold
(``streamlake:watermark``, epoch ms), so any parallelism can continue it and
savepoints, restores and restarts carry it. Each micro-batch:

1. reads the watermark as of the batch's start (none before the first event);
2. assigns every event its windows (:mod:`streamlake.pipeline.windows`); an
   (event, window) pair whose window end is at or before the watermark is
   **late**: the event goes to ``late_events`` with the watermark it missed
   and those windows, ``applied = false`` (a backfill applies it later);
3. aggregates the on-time pairs per (sensor, window) in Spark, on
   ``partitions`` shuffle partitions (count, exact decimal sum, min, max);
4. combines them with the gold rows of those windows and writes them in **one
   Delta merge**, whose ``txn`` actions hold the silver position consumed and
   the new watermark (max event time of the batch minus the allowed lateness,
   never moving back).

Both writes are exactly once by position (:mod:`streamlake.pipeline.stage`).
A backfill restating windows commits with the same position ``txn``, so a
stream commit racing it fails and re-plans on top of the restated rows: the
stream never overwrites a restated window with older values. Sums are exact
decimals, so gold does not depend on batch boundaries or parallelism.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake.transaction import CommitProperties

from streamlake.delta.table import ensure_table, files_overlapping, open_table, table_exists
from streamlake.faults import crash_point
from streamlake.pipeline.schemas import GOLD, LATE_EVENTS, SILVER, SUM_SCALE
from streamlake.pipeline.stage import (
    BatchRange,
    DeltaFedStage,
    append_batch,
    commit_metadata,
    stage_transactions,
    with_commit_retries,
)
from streamlake.pipeline.windows import WindowSpec, merge_sessions

log = logging.getLogger(__name__)

WATERMARK_APP_ID = "streamlake:watermark"
SOURCE = "silver"
VERSION_COLUMN = "_commit_version"
KEY = ("sensor_id", "window_start", "window_end")
LATE_STATS = ("event_id", "sensor_id", "event_time", "topic", "partition", "offset", "silver_version", "applied")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_QUANTUM = decimal.Decimal(1).scaleb(-SUM_SCALE)
# Windows as (sensor, start µs, end µs) with their aggregates, as Spark rows.
GOLD_KEY_SCHEMA = (f"sensor_id string, _wstart long, _wend long, count long, sum_temperature decimal(38,{SUM_SCALE}), "
                   "min_temperature double, max_temperature double")


def ensure_gold(path: str, window: WindowSpec):
    """Open or create gold for ``window``. The window definition is recorded in gold's
    commits (``streamlake.window``, from the creating commit on), so backfills and checks
    use the windows gold was built with. Raises InvalidOptionError if the existing gold
    holds other windows (its rows would mean something else)."""
    import os

    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    from streamlake.errors import InvalidOptionError

    if not table_exists(path):
        os.makedirs(path, exist_ok=True)
        try:
            DeltaTable.create(path, GOLD.schema, mode="ignore", partition_by=list(GOLD.partition_by), name=GOLD.name,
                              description=GOLD.description, configuration=dict(GOLD.configuration),
                              commit_properties=CommitProperties(custom_metadata={"streamlake": {
                                  "operation": "create", "window": str(window)}}))
        except CommitFailedError:
            pass  # another process created it first
    table = ensure_table(path, GOLD)
    built = gold_window(path)
    if built is not None and built != window:
        raise InvalidOptionError(f"gold at {path} holds {built} windows; this job asks for {window}. Point the job "
                                 "at a new root (or delete gold and its checkpoint to rebuild it from silver)")
    return table


def gold_window(path: str) -> WindowSpec | None:
    """The windows the gold table at ``path`` was built with (None if it does not say)."""
    import json
    import os

    for entry in open_table(path).history(limit=20):
        window = (entry.get("streamlake") or {}).get("window")
        if window:
            return WindowSpec.parse(window)
    first = os.path.join(path, "_delta_log", f"{0:020d}.json")
    try:
        with open(first, encoding="utf-8") as fh:
            for line in fh:
                info = json.loads(line).get("commitInfo") or {}
                if (info.get("streamlake") or {}).get("window"):
                    return WindowSpec.parse(info["streamlake"]["window"])
    except FileNotFoundError:
        pass
    return None


def watermark_ms(table) -> int | None:
    """The gold table's watermark (epoch ms), or None before the first event."""
    return table.transaction_version(WATERMARK_APP_ID)


def micros_to_datetime(micros: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=int(micros))


# -- Spark side -------------------------------------------------------------------------------

def window_pairs(events, spec: WindowSpec):
    """One row per (event, fixed window): columns ``_wstart``/``_wend`` (epoch µs)."""
    from pyspark.sql import functions as F

    size = spec.size_ms * 1000
    step = (spec.slide_ms or spec.size_ms) * 1000
    t = F.unix_micros("event_time")
    last = t - F.pmod(t, F.lit(step))
    return (events.withColumn("_wstart", F.explode(F.sequence(last - F.lit(size - step), last, F.lit(step))))
            .withColumn("_wend", F.col("_wstart") + F.lit(size)))


def aggregate(pairs, partitions: int | None):
    """Per (sensor, window): count, exact sum, min, max; ``pairs`` has ``_wstart``/``_wend``."""

    if partitions:
        pairs = pairs.repartition(partitions, "sensor_id", "_wstart", "_wend")
    return pairs.groupBy("sensor_id", "_wstart", "_wend").agg(*_aggregates())


def _aggregates():
    """count, exact sum, min, max of the temperature, and the newest event time (µs)."""
    from pyspark.sql import functions as F

    return (F.count(F.lit(1)).alias("count"),
            F.sum(F.col("temperature").cast(f"decimal(38,{SUM_SCALE})")).alias("sum_temperature"),
            F.min("temperature").alias("min_temperature"),
            F.max("temperature").alias("max_temperature"),
            F.max(F.unix_micros("event_time")).alias("max_event_us"))


def session_partials(events, spec: WindowSpec, partitions: int | None):
    """Per sensor, the batch's own sessions (Spark's ``session_window``) with their aggregates."""
    from pyspark.sql import functions as F

    if partitions:
        events = events.repartition(partitions, "sensor_id")
    grouped = events.groupBy("sensor_id", F.session_window("event_time", f"{spec.size_ms} milliseconds").alias("_s"))
    return grouped.agg(*_aggregates()).select(
        "sensor_id", F.unix_micros("_s.start").alias("_wstart"), F.unix_micros("_s.end").alias("_wend"),
        "count", "sum_temperature", "min_temperature", "max_temperature", "max_event_us")


def partials_to_rows(partials) -> list[dict]:
    """Collect aggregated windows (small: one row per touched window) as dicts."""
    table = partials.toArrow()
    return [{**r, "window_start": r.pop("_wstart"), "window_end": r.pop("_wend")} for r in table.to_pylist()]


# -- combining with gold ------------------------------------------------------------------------

def _row(sensor: str, start: int, end: int, count: int, total: decimal.Decimal, low: float, high: float,
         now: dt.datetime) -> dict:
    total = decimal.Decimal(total).quantize(_QUANTUM)
    return {"sensor_id": sensor, "window_start": micros_to_datetime(start), "window_end": micros_to_datetime(end),
            "count": int(count), "sum_temperature": total, "min_temperature": float(low),
            "max_temperature": float(high), "avg_temperature": float(total / count), "updated_at": now,
            "window_date": micros_to_datetime(start).date()}


def exact_temperature(value: float) -> decimal.Decimal:
    """A temperature as the exact decimal gold sums: Spark's ``CAST(double AS DECIMAL(38,9))``
    (the double's shortest decimal form, rounded half-up to 9 places)."""
    return decimal.Decimal(repr(float(value))).quantize(_QUANTUM, rounding=decimal.ROUND_HALF_UP)


def _micros(value: dt.datetime) -> int:
    return (value - _EPOCH) // dt.timedelta(microseconds=1)


def read_gold_rows(table, sensors: set[str], low_us: int, high_us: int) -> list[dict]:
    """Gold rows of ``sensors`` whose window overlaps or touches ``[low_us, high_us]``."""
    low, high = micros_to_datetime(low_us), micros_to_datetime(high_us)
    files = files_overlapping(table, "window_end", low, None)
    if not files:
        return []
    data = ds.dataset(files, format="parquet", schema=GOLD.file_schema)
    flt = (ds.field("window_end") >= pa.scalar(low, GOLD.schema.field("window_end").type)) & \
          (ds.field("window_start") <= pa.scalar(high, GOLD.schema.field("window_start").type))
    rows = data.to_table(filter=flt)
    # Filter strings after reading: delta-rs writes string_view columns, whose statistics
    # pyarrow cannot compare with a string literal inside a dataset scan.
    rows = rows.filter(pc.is_in(rows.column("sensor_id").cast(pa.string()), pa.array(sorted(sensors), pa.string())))
    return [{**r, "window_date": r["window_start"].date()} for r in rows.to_pylist()]


def combine_fixed(existing: list[dict], partials: list[dict], now: dt.datetime) -> list[dict]:
    """Gold rows after adding ``partials`` (fixed windows) to ``existing`` ones."""
    have = {(r["sensor_id"], _micros(r["window_start"]), _micros(r["window_end"])): r for r in existing}
    out = []
    for p in partials:
        key = (p["sensor_id"], p["window_start"], p["window_end"])
        old = have.get(key)
        if old is None:
            out.append(_row(*key, p["count"], p["sum_temperature"], p["min_temperature"], p["max_temperature"], now))
        else:
            out.append(_row(*key, old["count"] + p["count"], old["sum_temperature"] + p["sum_temperature"],
                            min(old["min_temperature"], p["min_temperature"]),
                            max(old["max_temperature"], p["max_temperature"]), now))
    return out


def combine_sessions(existing: list[dict], partials: list[dict], gap_ms: int,
                     now: dt.datetime) -> tuple[list[dict], list[dict]]:
    """Merge new partial sessions with the overlapping/touching gold sessions, per sensor.

    Returns (rows to upsert, rows to delete): a gold session absorbed into a
    bigger one is deleted; sessions are ``[first event, last event + gap)``."""
    upserts, deletes = [], []
    by_sensor: dict[str, list[tuple[dict, bool]]] = {}
    for r in existing:
        by_sensor.setdefault(r["sensor_id"], []).append(({**r, "_s": _micros(r["window_start"]),
                                                          "_e": _micros(r["window_end"])}, True))
    for p in partials:
        by_sensor.setdefault(p["sensor_id"], []).append(({**p, "_s": p["window_start"], "_e": p["window_end"]}, False))
    for sensor, items in by_sensor.items():
        groups = merge_sessions([(r["_s"], r["_e"]) for r, _ in items], gap_ms)
        for group in groups:
            members = [items[i] for i in group]
            if all(is_old for _, is_old in members):
                continue  # untouched gold session
            start = min(r["_s"] for r, _ in members)
            end = max(r["_e"] for r, _ in members)
            merged = _row(sensor, start, end, sum(r["count"] for r, _ in members),
                          sum((decimal.Decimal(r["sum_temperature"]) for r, _ in members), decimal.Decimal(0)),
                          min(r["min_temperature"] for r, _ in members),
                          max(r["max_temperature"] for r, _ in members), now)
            upserts.append(merged)
            for r, is_old in members:
                if is_old and (r["_s"], r["_e"]) != (start, end):
                    deletes.append({k: v for k, v in r.items() if not k.startswith("_")})
    return upserts, deletes


def merge_into_gold(table, upserts: list[dict], deletes: list[dict], properties: CommitProperties) -> None:
    """One Delta commit: a merge that updates or inserts ``upserts`` and deletes
    ``deletes`` (by key); with neither, an empty commit carrying ``properties``
    (a merge of nothing would not commit, and the position must advance)."""
    if not upserts and not deletes:
        table.create_write_transaction([], "append", GOLD.schema, partition_by=list(GOLD.partition_by),
                                       commit_properties=properties)
        return
    source_rows = [{**r, "_op": "upsert"} for r in upserts] + [{**r, "_op": "delete"} for r in deletes]
    schema = GOLD.schema.append(pa.field("_op", pa.string()))
    source = pa.Table.from_pylist(source_rows, schema=schema)
    columns = {name: f"s.{name}" for name in GOLD.schema.names}
    (table.merge(source, "t.sensor_id = s.sensor_id AND t.window_start = s.window_start AND "
                         "t.window_end = s.window_end AND t.window_date = s.window_date",
                 source_alias="s", target_alias="t", commit_properties=properties)
     .when_matched_delete(predicate="s._op = 'delete'")
     .when_matched_update(columns, predicate="s._op = 'upsert'")
     .when_not_matched_insert(columns, predicate="s._op = 'upsert'")
     .execute())


# -- the stage --------------------------------------------------------------------------------

@dataclass
class GoldStage(DeltaFedStage):
    """The gold stage: silver -> gold (and late_events)."""

    silver_path: str
    gold_path: str
    late_path: str
    checkpoint: str
    window: WindowSpec
    allowed_lateness_ms: int = 30_000
    partitions: int | None = None
    max_files_per_trigger: int | None = None
    processing_time_s: float | None = None
    query_name: str = "pipeline"
    name: str = "gold"
    source: str = SOURCE

    @property
    def source_path(self) -> str:
        return self.silver_path

    def outputs(self) -> dict[str, str]:
        return {"gold": self.gold_path, "late_events": self.late_path}

    def source_options(self) -> dict[str, str]:
        opts = {"includeCommitVersion": "true"}
        if self.max_files_per_trigger:
            opts["maxFilesPerTrigger"] = str(self.max_files_per_trigger)
        return opts

    def prepare(self) -> None:
        ensure_table(self.silver_path, SILVER)
        ensure_gold(self.gold_path, self.window)
        ensure_table(self.late_path, LATE_EVENTS)

    def process(self, df, batch: BatchRange) -> dict:
        """Write one micro-batch of silver events to late_events and gold (module docstring).

        Spark runs two jobs on the batch (read once and cached): writing the late
        events and aggregating the on-time ones; the rest happens on the driver."""
        gold = ensure_gold(self.gold_path, self.window)
        plan = batch.plan(gold, self.source, "gold")
        if not plan.write:
            log.info("gold batch %d: already in gold, nothing to write", batch.batch_id)
            return {"late": 0, "windows": 0, "watermark": watermark_ms(gold)}
        wm = watermark_ms(gold)
        events = df.select("event_id", "sensor_id", "event_time", "temperature", "topic", "partition", "offset",
                           VERSION_COLUMN).persist()
        try:
            late_windows, on_time = self._classify(events, wm)
            late = append_batch(self.late_path, LATE_EVENTS, self._late_rows(late_windows, wm, batch), batch,
                                source=self.source, stage=self.name, version_column=VERSION_COLUMN,
                                stats_columns=LATE_STATS)
            partials = self._partials(plan.rows(on_time, VERSION_COLUMN))
            new_wm = wm
            newest = max((p["max_event_us"] for p in partials), default=None)
            if newest is not None:  # late events are behind the watermark: only on-time ones can move it
                candidate = newest // 1000 - self.allowed_lateness_ms
                new_wm = candidate if wm is None else max(wm, candidate)
            windows = self._commit(batch, partials, new_wm)
        finally:
            events.unpersist()
        return {"late": late.rows if late else 0, "windows": windows, "watermark": new_wm}

    def _classify(self, events, wm: int | None):
        """(late (event, window) pairs, on-time pairs or events) against watermark ``wm``."""
        from pyspark.sql import functions as F

        if self.window.is_session:
            gap = self.window.size_ms * 1000
            end = F.unix_micros("event_time") + F.lit(gap)
            is_late = F.lit(False) if wm is None else end <= F.lit(wm * 1000)
            late = (events.where(is_late).withColumn("_wstart", F.unix_micros("event_time"))
                    .withColumn("_wend", F.col("_wstart") + F.lit(gap)))
            return late, events.where(~is_late)
        pairs = window_pairs(events, self.window)
        is_late = F.lit(False) if wm is None else F.col("_wend") <= F.lit(wm * 1000)
        return pairs.where(is_late), pairs.where(~is_late)

    def _late_rows(self, late_pairs, wm: int | None, batch: BatchRange):
        """One late_events row per late event, with every closed window it belongs to."""
        from pyspark.sql import functions as F

        arrived = dt.datetime.fromtimestamp(batch.batch_time_ms / 1000, dt.timezone.utc)
        cols = ["event_id", "sensor_id", "event_time", "temperature", "topic", "partition", "offset", VERSION_COLUMN]
        window = F.struct(F.timestamp_micros("_wstart").alias("start"), F.timestamp_micros("_wend").alias("end"))
        return (late_pairs.groupBy(*cols).agg(F.array_sort(F.collect_list(window)).alias("windows"))
                .select(*cols[:-1],
                        F.lit(micros_to_datetime((wm or 0) * 1000)).cast("timestamp").alias("watermark"),
                        "windows", F.col(VERSION_COLUMN).alias("silver_version"),
                        F.lit(batch.batch_id).cast("long").alias("batch_id"),
                        F.lit(arrived).cast("timestamp").alias("arrived_at"),
                        F.lit(False).alias("applied"), F.lit(None).cast("timestamp").alias("applied_at"),
                        F.lit(None).cast("string").alias("applied_by"),
                        F.to_date("event_time").alias("event_date"), VERSION_COLUMN))

    def _partials(self, on_time) -> list[dict]:
        if self.window.is_session:
            return partials_to_rows(session_partials(on_time, self.window, self.partitions))
        return partials_to_rows(aggregate(on_time, self.partitions))

    def _commit(self, batch: BatchRange, partials: list[dict], new_wm: int | None) -> int:
        """Merge the partials into gold as one commit (re-planned if a backfill commits first)."""
        def attempt(_n: int) -> int:
            gold = open_table(self.gold_path)
            if not batch.plan(gold, self.source, "gold").write:
                return 0  # committed by an earlier attempt whose result we did not see
            now = dt.datetime.now(dt.timezone.utc)
            upserts, deletes = self._combined(gold, partials, now)
            extra = {WATERMARK_APP_ID: new_wm} if new_wm is not None else {}
            properties = CommitProperties(
                app_transactions=stage_transactions(self.source, batch, extra),
                custom_metadata=commit_metadata(self.name, batch, self.source, f"merge-{batch.batch_id}",
                                                windows=len(upserts), watermark=new_wm, window=str(self.window)))
            merge_into_gold(gold, upserts, deletes, properties)
            crash_point("after_commit_gold", batch.batch_id)
            return len(upserts)

        return with_commit_retries(f"gold batch {batch.batch_id}", attempt)

    def _combined(self, gold, partials: list[dict], now: dt.datetime) -> tuple[list[dict], list[dict]]:
        if not partials:
            return [], []
        sensors = {p["sensor_id"] for p in partials}
        low = min(p["window_start"] for p in partials)
        high = max(p["window_end"] for p in partials)
        existing = read_gold_rows(gold, sensors, low, high)
        if self.window.is_session:
            return combine_sessions(existing, partials, self.window.size_ms, now)
        return combine_fixed(existing, partials, now), []
