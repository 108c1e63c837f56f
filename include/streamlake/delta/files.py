"""Pre-commit phase of the Delta sink: Spark writes the micro-batch's Parquet files.

Each commit attempt writes its rows with Spark's own Parquet writer into a
directory of its own inside the table, ``<partition>/attempt-<id>/``, then the
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

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

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


def _footer_stats(meta: pq.FileMetaData, columns: Sequence[str]) -> tuple[dict, dict, dict]:
    schema = meta.schema.to_arrow_schema()
    mins: dict = {}
    maxs: dict = {}
    nulls: dict = {}
    for name in columns:
        if name not in schema.names:
            continue
        index = schema.get_field_index(name)
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
        if complete and lo is not None:
            mins[name], maxs[name] = lo, hi
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


def write_attempt_files(rows, table_root: str, attempt_id: str, partition_values: Mapping[str, str],
                        columns: Sequence[str], stats_columns: Sequence[str]) -> list[DataFile]:
    """Write ``rows`` (a Spark DataFrame) as Parquet files of one commit attempt.

    Returns the non-empty files written, described from their footers. Raises
    whatever Spark raises; a failed write leaves only unreferenced files.
    """
    directory = "/".join(p for p in (partition_path(partition_values), ATTEMPT_PREFIX + attempt_id) if p)
    out = os.path.join(table_root, directory)
    spark = rows.sparkSession
    for key, value in WRITE_CONF.items():
        spark.conf.set(key, value)
    rows.select(*columns).write.mode("errorifexists").parquet(out)
    files = []
    for name in sorted(os.listdir(out)):
        if not name.endswith(".parquet") or name.startswith("."):
            os.remove(os.path.join(out, name))  # _SUCCESS, Hadoop's .crc sidecars: not table data
        else:
            described = describe_file(table_root, f"{directory}/{name}", stats_columns)
            if described.num_records:
                files.append(described)
    return files


def add_actions(files: Sequence[DataFile], partition_values: Mapping[str, str]) -> list[AddAction]:
    """Delta ``add`` actions for the files of a commit."""
    return [AddAction(f.path, f.size, dict(partition_values), f.modification_time, True, f.stats) for f in files]


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
