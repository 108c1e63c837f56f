"""The bronze table: Kafka records as they arrived, plus when and in which batch.

Columns: Spark's Kafka schema (key, value, topic, partition, offset, timestamp,
timestampType, headers), ``ingest_time`` (the micro-batch's timestamp from the
offset log, so a replayed batch gets the same value), ``batch_id``, and the
partition column ``ingest_date`` (UTC date of ``ingest_time``).
"""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa

from streamlake.delta.table import TableSpec, ensure_table, read_table
from streamlake.kafka.reader import KAFKA_ARROW_SCHEMA

BRONZE_SCHEMA = pa.schema(list(KAFKA_ARROW_SCHEMA) + [
    pa.field("ingest_time", pa.timestamp("us", tz="UTC")),
    pa.field("batch_id", pa.int64()),
    pa.field("ingest_date", pa.date32()),
])
BRONZE = TableSpec(
    name="bronze",
    schema=BRONZE_SCHEMA,
    partition_by=("ingest_date",),
    description="Kafka records ingested exactly once; offsets committed as txn actions",
)
# Columns with min/max statistics in the Delta log (data skipping by offset/partition).
STATS_COLUMNS = ("topic", "partition", "offset", "batch_id")


def ingest_time(batch_time_ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(batch_time_ms / 1000, tz=dt.timezone.utc)


def partition_values(batch_time_ms: int) -> dict[str, str]:
    """Partition of a micro-batch's rows: its UTC ingest date."""
    return {"ingest_date": ingest_time(batch_time_ms).date().isoformat()}


def file_constants(batch_id: int, batch_time_ms: int) -> dict[str, tuple[str, int]]:
    """The bronze columns a micro-batch's files add to the Kafka columns, for read tasks
    that write the files themselves (see :class:`streamlake.storage.data_files.FileTarget`);
    the same values :func:`to_bronze` adds."""
    return {"ingest_time": ("timestamp_us_utc", int(batch_time_ms) * 1000), "batch_id": ("int64", int(batch_id))}


def to_bronze(df, batch_id: int, batch_time_ms: int):
    """Add the bronze columns to a DataFrame in Spark's Kafka schema."""
    from pyspark.sql import functions as F

    return df.withColumns({
        "ingest_time": F.lit(ingest_time(batch_time_ms)).cast("timestamp"),
        "batch_id": F.lit(batch_id).cast("long"),
    })


def ensure_bronze_table(path: str | os.PathLike, storage_options=None):
    """Open or create the bronze table at ``path`` (see :func:`streamlake.delta.table.ensure_table`)."""
    return ensure_table(path, BRONZE, storage_options)


def read_bronze(spark, path: str | os.PathLike, version: int | None = None):
    """The bronze table (latest snapshot or ``version``) as a Spark DataFrame."""
    return read_table(spark, path, BRONZE, version)


def ingested_topics(path: str | os.PathLike) -> list[str]:
    """The topics a bronze table has ingested, from its newest ingest commits' offsets.
    Raises FileNotFoundError when there is no table or nothing was ingested yet."""
    from streamlake.delta.table import open_table

    for entry in open_table(path).history(limit=200):
        offsets = (entry.get("streamlake") or {}).get("endOffsets")
        if offsets:
            return sorted(offsets)
    raise FileNotFoundError(f"bronze at {path} has no ingest commits yet")
