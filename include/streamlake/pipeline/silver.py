"""Silver: typed, validated, de-duplicated events from bronze; everything else to quarantine.

A streaming query on the bronze table (``streamlake-delta`` source). Each
micro-batch:

1. parses every bronze record (:func:`streamlake.pipeline.validation.parse_events`);
2. appends the records that are not valid events to ``quarantine`` with their
   reason, raw key and value, and lineage;
3. removes duplicate event ids: within the batch the first record wins
   (Kafka timestamp, then topic, partition, offset), and an event whose id is
   already in silver with an event time within the **deduplication horizon**
   (default 24 hours) of its own is dropped. The lookup reads only silver files
   whose event-time statistics overlap the batch's events +/- the horizon, so
   its cost follows the horizon's volume, not the table's;
4. appends the remaining events to ``silver``.

Both appends are exactly once (:mod:`streamlake.pipeline.stage`). Every bronze
row therefore ends up in exactly one of silver, quarantine, or the dropped
duplicates (whose event id is in silver under another lineage), which the
pipeline check verifies by lineage. Counts per batch (records, valid,
quarantined, duplicates) go to the progress line.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from streamlake.delta.table import ensure_table, files_overlapping
from streamlake.pipeline import bronze as bronze_table
from streamlake.pipeline.schemas import QUARANTINE, SILVER
from streamlake.pipeline.stage import BatchRange, DeltaFedStage, append_batch
from streamlake.pipeline.validation import parse_events

log = logging.getLogger(__name__)

DEFAULT_DEDUP_HORIZON_S = 24 * 3600
SOURCE = "bronze"
SILVER_STATS = ("event_id", "event_time", "sensor_id", "topic", "partition", "offset", "bronze_version")
QUARANTINE_STATS = ("topic", "partition", "offset", "reason", "bronze_version")
VERSION_COLUMN = "_commit_version"


@dataclass
class SilverStage(DeltaFedStage):
    """The silver stage of a pipeline rooted at ``root`` (tables ``bronze``, ``silver``,
    ``quarantine``; checkpoint ``_checkpoints/silver``)."""

    bronze_path: str
    silver_path: str
    quarantine_path: str
    checkpoint: str
    dedup_horizon_s: int = DEFAULT_DEDUP_HORIZON_S
    max_files_per_trigger: int | None = None
    processing_time_s: float | None = None
    query_name: str = "pipeline"
    name: str = "silver"
    source: str = SOURCE

    @property
    def source_path(self) -> str:
        return self.bronze_path

    def outputs(self) -> dict[str, str]:
        return {"silver": self.silver_path, "quarantine": self.quarantine_path}

    def source_options(self) -> dict[str, str]:
        opts = {"includeCommitVersion": "true"}
        if self.max_files_per_trigger:
            opts["maxFilesPerTrigger"] = str(self.max_files_per_trigger)
        return opts

    def prepare(self) -> None:
        bronze_table.ensure_bronze_table(self.bronze_path)
        ensure_table(self.silver_path, SILVER)
        ensure_table(self.quarantine_path, QUARANTINE)

    def process(self, df, batch: BatchRange) -> dict:
        """Write one micro-batch of bronze rows to quarantine and silver (see the module docstring).

        Spark runs three jobs on the batch (read once and cached): collecting the
        valid events' ids and times for de-duplication, writing quarantine,
        writing silver; the counts come from the written files."""
        from pyspark.sql import functions as F

        parsed = parse_events(df.withColumnRenamed("timestamp", "kafka_timestamp")).persist()
        try:
            batch_time = dt.datetime.fromtimestamp(batch.batch_time_ms / 1000, dt.timezone.utc)
            rejected = parsed.where(F.col("reason").isNotNull()).select(
                "topic", "partition", "offset", "kafka_timestamp", "key", "value", "reason", "message",
                F.col(VERSION_COLUMN).alias("bronze_version"),
                F.lit(batch_time).cast("timestamp").alias("quarantined_at"), "ingest_date", VERSION_COLUMN)
            valid = parsed.where(F.col("reason").isNull())
            candidates = valid.select("event_id", F.unix_micros("event_time").alias("t"),
                                      F.unix_micros("kafka_timestamp").alias("kt"), "topic", "partition",
                                      "offset").toArrow()
            dropped = self.duplicates(candidates)
            if dropped.num_rows:
                drop = df.sparkSession.createDataFrame(dropped.to_pylist(), "topic string, partition int, offset long")
                valid = valid.join(F.broadcast(drop), ["topic", "partition", "offset"], "left_anti")
            events = valid.select(
                "event_id", "sensor_id", "event_time", "temperature", "topic", "partition", "offset",
                "kafka_timestamp", F.col(VERSION_COLUMN).alias("bronze_version"),
                F.to_date("event_time").alias("event_date"), VERSION_COLUMN)
            quarantined = append_batch(self.quarantine_path, QUARANTINE, rejected, batch, source=self.source,
                                       stage=self.name, version_column=VERSION_COLUMN,
                                       stats_columns=QUARANTINE_STATS)
            written = append_batch(self.silver_path, SILVER, events, batch, source=self.source, stage=self.name,
                                   version_column=VERSION_COLUMN, stats_columns=SILVER_STATS,
                                   metadata={"valid": candidates.num_rows, "duplicates": dropped.num_rows})
        finally:
            parsed.unpersist()
        return {"valid": candidates.num_rows, "quarantined": quarantined.rows if quarantined else 0,
                "events": written.rows if written else 0, "duplicates": dropped.num_rows}

    def duplicates(self, candidates: pa.Table) -> pa.Table:
        """Lineage (topic, partition, offset) of the valid records to drop: all but the first
        record of an event id in the batch (Kafka timestamp, then lineage), and every
        record whose event id silver already holds within the horizon of its event time."""
        if not candidates.num_rows:
            return candidates.select(["topic", "partition", "offset"])
        ordered = candidates.append_column("_i", pa.array(range(candidates.num_rows), pa.int64())).sort_by(
            [("event_id", "ascending"), ("kt", "ascending"), ("topic", "ascending"), ("partition", "ascending"),
             ("offset", "ascending")])
        ids = ordered.column("event_id")
        first = pc.not_equal(ids, pa.concat_arrays([pa.array([None], pa.string()), ids.combine_chunks()[:-1]]))
        first = pc.fill_null(first, True)
        drop = pc.invert(first)
        keep = ordered.filter(first)
        known = self._known_in_silver(keep)
        if known:
            drop = pc.or_(drop, pc.and_(first, pc.is_in(ids, value_set=pa.array(sorted(known), pa.string()))))
        return ordered.filter(drop).select(["topic", "partition", "offset"])

    def _known_in_silver(self, events: pa.Table) -> set[str]:
        """Event ids of ``events`` (columns event_id, t) that silver already holds with an
        event time within the horizon of theirs; reads only overlapping files."""
        if not events.num_rows:
            return set()
        horizon = self.dedup_horizon_s * 1_000_000
        times = events.column("t")
        low, high = pc.min(times).as_py(), pc.max(times).as_py()
        files = files_overlapping(ensure_table(self.silver_path, SILVER), "event_time",
                                  from_micros(low - horizon), from_micros(high + horizon))
        if not files:
            return set()
        wanted = pa.array(events.column("event_id").to_pylist(), pa.string())
        found = ds.dataset(files, format="parquet", schema=SILVER.file_schema).to_table(
            columns=["event_id", "event_time"])
        found = found.filter(pc.is_in(found.column("event_id").cast(pa.string()), wanted))
        if not found.num_rows:
            return set()
        mine = dict(zip(events.column("event_id").to_pylist(), events.column("t").to_pylist()))
        return {i for i, t in zip(found.column("event_id").to_pylist(), found.column("event_time").to_pylist())
                if abs((t - _EPOCH) // dt.timedelta(microseconds=1) - mine[i]) <= horizon}


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def from_micros(micros: int) -> dt.datetime:
    """Epoch microseconds as an aware UTC datetime (collect epoch numbers from Spark,
    not timestamps: PySpark turns those into naive local-time datetimes)."""
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=int(micros))
