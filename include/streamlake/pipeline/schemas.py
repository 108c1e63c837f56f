"""The pipeline's tables: schemas, layouts and the quarantine's reason codes.

One place for the contracts every stage, check, quality suite and test relies
on. Times are UTC timestamps in microseconds. Lineage columns (``topic``,
``partition``, ``offset``) name the Kafka record a row came from, so every
bronze row can be followed to exactly one place downstream.

``bronze``
    Kafka records as they arrived (see :mod:`streamlake.pipeline.bronze`).
``silver``
    typed, validated, de-duplicated events, partitioned by ``event_date``;
    ``bronze_version`` is the bronze commit the row was read from.
``quarantine``
    every bronze record that is not a valid event, with the raw key and value,
    a reason code from :data:`QUARANTINE_REASONS` and a readable message.
``gold``
    per sensor and event-time window: count, sum, min, max and average of the
    temperature. The sum is an exact decimal (each temperature rounded half-up
    to :data:`SUM_SCALE` decimal places, then added without error), so windows
    combine exactly and gold does not depend on how events were split into
    micro-batches or partitions; ``avg_temperature`` is ``sum / count`` as a
    double. Keyed by (``sensor_id``, ``window_start``, ``window_end``).
``late_events``
    events whose window(s) had already closed when they arrived (window end
    at or before the watermark), with the watermark they missed and the
    windows they belong to; ``applied`` turns true when a backfill restated
    those windows.
"""

from __future__ import annotations

import pyarrow as pa

from streamlake.delta.table import TableSpec

TS = pa.timestamp("us", tz="UTC")

# Reason codes of quarantined records, in the order validation checks them: a
# record gets the first that applies.
QUARANTINE_REASONS: dict[str, str] = {
    "not_json": "the value is not valid JSON (or is empty)",
    "not_object": "the value is JSON but not an object",
    "missing_field": "event_id, sensor_id, event_time or temperature is missing or null",
    "wrong_type": "a field has the wrong JSON type (event_id, sensor_id and event_time must be strings, "
                  "temperature a number, not a string or boolean)",
    "empty_field": "event_id or sensor_id is an empty string",
    "invalid_timestamp": "event_time is not an ISO-8601 timestamp with a UTC offset",
    "out_of_range": "temperature is outside -60..80 °C",
    "far_future": "event_time is more than 1 hour after the record's Kafka timestamp",
}
TEMPERATURE_RANGE = (-60.0, 80.0)
SUM_SCALE = 9
SUM_TYPE = pa.decimal128(38, SUM_SCALE)
MAX_FUTURE_SECONDS = 3600

LINEAGE = [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())]

SILVER = TableSpec(
    name="silver",
    schema=pa.schema([
        ("event_id", pa.string()), ("sensor_id", pa.string()), ("event_time", TS), ("temperature", pa.float64()),
        *LINEAGE, ("kafka_timestamp", TS), ("bronze_version", pa.int64()), ("event_date", pa.date32()),
    ]),
    partition_by=("event_date",),
    description="typed, validated, de-duplicated sensor events",
)

QUARANTINE = TableSpec(
    name="quarantine",
    schema=pa.schema([
        *LINEAGE, ("kafka_timestamp", TS), ("key", pa.binary()), ("value", pa.binary()),
        ("reason", pa.string()), ("message", pa.string()), ("bronze_version", pa.int64()),
        ("quarantined_at", TS), ("ingest_date", pa.date32()),
    ]),
    partition_by=("ingest_date",),
    description="bronze records that are not valid events, with the reason",
)

WINDOW_TYPE = pa.struct([("start", TS), ("end", TS)])

GOLD = TableSpec(
    name="gold",
    schema=pa.schema([
        ("sensor_id", pa.string()), ("window_start", TS), ("window_end", TS),
        ("count", pa.int64()), ("sum_temperature", SUM_TYPE), ("min_temperature", pa.float64()),
        ("max_temperature", pa.float64()), ("avg_temperature", pa.float64()),
        ("updated_at", TS), ("window_date", pa.date32()),
    ]),
    partition_by=("window_date",),
    description="per sensor and event-time window: count, sum, min, max, average temperature",
)

LATE_EVENTS = TableSpec(
    name="late_events",
    schema=pa.schema([
        ("event_id", pa.string()), ("sensor_id", pa.string()), ("event_time", TS), ("temperature", pa.float64()),
        *LINEAGE, ("watermark", TS), ("windows", pa.list_(WINDOW_TYPE)), ("silver_version", pa.int64()),
        ("batch_id", pa.int64()), ("arrived_at", TS), ("applied", pa.bool_()), ("applied_at", TS),
        ("applied_by", pa.string()), ("event_date", pa.date32()),
    ]),
    partition_by=("event_date",),
    description="events that arrived after their window closed, kept until a backfill applies them",
)

TABLES: dict[str, TableSpec] = {spec.name: spec for spec in (SILVER, QUARANTINE, GOLD, LATE_EVENTS)}
STAGES = ("bronze", "silver", "gold")
