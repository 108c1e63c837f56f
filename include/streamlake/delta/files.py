"""Pre-commit phase of the Delta sink: Spark writes the micro-batch's Parquet files.

Each commit attempt writes its rows with Spark's own Parquet writer into a
directory of its own inside the table (``<partition>/attempt-<id>/`` when the
whole batch goes to one partition, as in bronze; ``attempt-<id>/<partition>/``
when Spark partitions the rows by the table's partition columns), then the
driver reads the files' footers (row counts, column statistics) to build Delta
``add`` actions. Until the commit, no snapshot references these files: readers
cannot see them, and an attempt that dies leaves files no commit will ever
reference. ``DeltaTable.vacuum(full=True)`` deletes those (delta-rs's default
"lite" vacuum only deletes files that commits removed), and so does
:func:`streamlake.delta.table.vacuum_table`, which also deletes the ``_temporary``
directory a Spark job killed mid-write leaves behind (Delta skips it as hidden).

Spark's writer (JVM) is used rather than writing from Python: handing 1 KB
records back from the JVM to Python workers cost 3-4x more than the whole write
(see bench/results).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import unquote

import pyarrow.parquet as pq
from deltalake.transaction import AddAction

ATTEMPT_PREFIX = "attempt-"
# Spark settings the files must be written with (readable by delta-rs and Delta Spark).
WRITE_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
}


def partition_path(partition_values: Mapping[str, str]) -> str:
    """Hive-style directory for a partition: ``ingest_date=2026-11-21``."""
    return "/".join(f"{k}={v}" for k, v in partition_values.items())


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written for a commit attempt, described from its footer."""

    path: str  # relative to the table root
    size: int
    modification_time: int  # epoch ms
    num_records: int
    stats: str  # Delta stats JSON
    topic: str | None  # set when every row of the file has the same topic ...
    partition: int | None  # ... and Kafka partition (one task reads one partition)
    min_offset: int | None
    partition_values: Mapping[str, str | None] = field(default_factory=dict)  # Delta partition values


def _stat_value(value):
    """A footer statistic as Delta's stats JSON writes it (timestamps ISO-8601 UTC)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _footer_stats(meta: pq.FileMetaData, columns: Sequence[str]) -> tuple[dict, dict, dict]:
    """min, max and null count of top-level primitive ``columns`` over all row groups
    (a column without complete statistics gets none)."""
    leaf = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    mins: dict = {}
    maxs: dict = {}
    nulls: dict = {}
    for name in columns:
        if name not in leaf:
            continue
        index = leaf[name]
        lo = hi = None
        null_count = 0
        complete = True
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(index).statistics
            if st is None or not st.has_min_max:
                complete = complete and meta.row_group(rg).num_rows == (st.null_count if st else -1)
                null_count += st.null_count if st is not None and st.has_null_count else 0
                continue
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
            null_count += st.null_count if st.has_null_count else 0
        if complete and lo is not None and not isinstance(lo, (bytes, decimal.Decimal)):
            mins[name], maxs[name] = _stat_value(lo), _stat_value(hi)
            nulls[name] = null_count
    return mins, maxs, nulls


def describe_file(table_root: str, rel_path: str, stats_columns: Sequence[str]) -> DataFile:
    """Footer-derived description of one written file."""
    full = os.path.join(table_root, rel_path)
    meta = pq.read_metadata(full)
    mins, maxs, nulls = _footer_stats(meta, stats_columns)
    st = os.stat(full)
    stats = json.dumps({"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
                       separators=(",", ":"), default=str)
    single = lambda col: mins[col] if col in mins and mins[col] == maxs[col] else None  # noqa: E731
    return DataFile(rel_path, st.st_size, int(st.st_mtime * 1000), meta.num_rows, stats,
                    single("topic"), single("partition"), mins.get("offset"))


def write_attempt_files(rows, table_root: str, attempt_id: str, columns: Sequence[str],
                        stats_columns: Sequence[str], *, partition_values: Mapping[str, str] | None = None,
                        partition_by: Sequence[str] = ()) -> list[DataFile]:
    """Write ``rows`` (a Spark DataFrame) as Parquet files of one commit attempt.

    ``columns`` are the data files' columns. With ``partition_values`` every row
    goes to that one partition; with ``partition_by`` Spark splits the rows by
    those columns (which must be in ``rows``) into Hive-style directories. Returns
    the non-empty files written, described from their footers, each with its
    partition values. Raises whatever Spark raises; a failed write leaves only
    unreferenced files.
    """
    if partition_values is not None:
        directory = "/".join(p for p in (partition_path(partition_values), ATTEMPT_PREFIX + attempt_id) if p)
    else:
        directory = ATTEMPT_PREFIX + attempt_id
    out = os.path.join(table_root, directory)
    spark = rows.sparkSession
    for key, value in WRITE_CONF.items():
        spark.conf.set(key, value)
    writer = rows.select(*columns, *partition_by).write.mode("errorifexists")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(out)
    directories = _move_partitions_outside(table_root, directory) if partition_by else [directory]
    files = []
    for rel_dir in directories:
        for name in sorted(os.listdir(os.path.join(table_root, rel_dir))):
            if not name.endswith(".parquet") or name.startswith("."):
                os.remove(os.path.join(table_root, rel_dir, name))  # _SUCCESS, .crc sidecars: not table data
                continue
            described = describe_file(table_root, f"{rel_dir}/{name}", stats_columns)
            if described.num_records:
                values = dict(partition_values) if partition_values is not None else \
                    _hive_partition_values(os.path.dirname(rel_dir))
                files.append(replace(described, partition_values=values))
    return files


def _move_partitions_outside(table_root: str, directory: str) -> list[str]:
    """``attempt-X/event_date=D/part.parquet`` -> ``event_date=D/attempt-X/part.parquet``,
    the layout bronze uses, which Spark's partition discovery (``basePath``) reads
    without seeing several roots. Returns the new directories (relative to the
    table). The emptied attempt directory and Spark's marker files are removed."""
    attempt = os.path.join(table_root, directory)
    moved = []
    for root, _dirs, names in os.walk(attempt, topdown=False):
        rel = os.path.relpath(root, attempt)
        parquet = [n for n in names if n.endswith(".parquet") and not n.startswith(".")]
        if rel != "." and parquet:
            target = os.path.join(rel, directory)
            os.makedirs(os.path.join(table_root, target), exist_ok=True)
            for name in parquet:
                os.replace(os.path.join(root, name), os.path.join(table_root, target, name))
            moved.append(target)
    shutil.rmtree(attempt, ignore_errors=True)
    return sorted(moved)


def _hive_partition_values(rel_dir: str) -> dict[str, str | None]:
    """``event_date=2026-11-22/x=a%2Fb`` -> {"event_date": "2026-11-22", "x": "a/b"}."""
    values: dict[str, str | None] = {}
    for part in rel_dir.split(os.sep):
        if "=" in part:
            key, _, value = part.partition("=")
            values[unquote(key)] = None if value == "__HIVE_DEFAULT_PARTITION__" else unquote(value)
    return values


def add_actions(files: Sequence[DataFile]) -> list[AddAction]:
    """Delta ``add`` actions for the files of a commit (each with its partition values)."""
    return [AddAction(f.path, f.size, dict(f.partition_values), f.modification_time, True, f.stats) for f in files]


def stale_spark_temporaries(table_root: str, older_than_hours: float) -> list[Path]:
    """``attempt-*/_temporary`` directories (Spark write jobs killed mid-write) not
    modified for ``older_than_hours``."""
    cutoff = time.time() - older_than_hours * 3600
    stale = []
    for temp in Path(table_root).glob(f"**/{ATTEMPT_PREFIX}*/_temporary"):
        newest = max((p.stat().st_mtime for p in temp.rglob("*")), default=temp.stat().st_mtime)
        if newest <= cutoff:
            stale.append(temp)
    return stale
