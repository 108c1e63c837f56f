"""Pre-commit phase of the Delta sink: Spark tasks write Parquet data files.

Each task writes its rows to one new file at its final place in the table
directory, under a name unique to the commit attempt, and returns the file's
metadata (size, record count, column statistics). Until the driver commits
them, no snapshot references these files: readers cannot see them, and an
attempt that dies leaves files that no commit will ever reference
(``DeltaTable.vacuum(full=True)`` deletes them; delta-rs's default "lite" vacuum
only deletes files that commits removed). This is Delta's own write protocol, done from Python.
"""

from __future__ import annotations

import json
import os
from typing import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

# What a task reports for each file it wrote (Spark DDL, used by mapInArrow).
FILE_METADATA_DDL = (
    "path string, size long, modification_time long, num_records long, stats string, "
    "topic string, partition int, min_offset long, max_offset long"
)
FILE_METADATA_SCHEMA = pa.schema([
    ("path", pa.string()),
    ("size", pa.int64()),
    ("modification_time", pa.int64()),
    ("num_records", pa.int64()),
    ("stats", pa.string()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("min_offset", pa.int64()),
    ("max_offset", pa.int64()),
])


def partition_path(partition_values: Mapping[str, str]) -> str:
    """Hive-style directory for a partition: ``ingest_date=2026-11-21``."""
    return "/".join(f"{k}={v}" for k, v in partition_values.items())


class _ColumnStats:
    """Running min/max/null count of the numeric and string columns named in ``columns``."""

    def __init__(self, columns: Sequence[str]):
        self.columns = list(columns)
        self.mins: dict = {}
        self.maxs: dict = {}
        self.nulls = {c: 0 for c in self.columns}

    def update(self, batch: pa.RecordBatch) -> None:
        for name in self.columns:
            column = batch.column(name)
            self.nulls[name] += column.null_count
            mm = pc.min_max(column)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is not None:
                self.mins[name] = lo if name not in self.mins else min(self.mins[name], lo)
                self.maxs[name] = hi if name not in self.maxs else max(self.maxs[name], hi)

    def to_json(self, num_records: int) -> str:
        return json.dumps({
            "numRecords": num_records,
            "minValues": self.mins,
            "maxValues": self.maxs,
            "nullCount": self.nulls,
        }, separators=(",", ":"))


class ParquetFileWriter:
    """``mapInArrow`` function: write a task's rows to one Parquet file, report it.

    Picklable (plain attributes). The file name carries the attempt id, the
    Spark partition id and the task attempt number, so retries and concurrent
    attempts never write the same file.
    """

    def __init__(self, table_root: str, attempt_id: str, partition_values: Mapping[str, str],
                 file_schema: pa.Schema, stats_columns: Sequence[str], compression: str = "snappy"):
        self.table_root = table_root
        self.attempt_id = attempt_id
        self.partition_values = dict(partition_values)
        self.file_schema = file_schema
        self.stats_columns = list(stats_columns)
        self.compression = compression

    def _relative_path(self) -> str:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)
        name = f"part-{task:05d}-{self.attempt_id}-a{attempt}.c000.{self.compression}.parquet"
        directory = partition_path(self.partition_values)
        return f"{directory}/{name}" if directory else name

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = None
        stats = _ColumnStats(self.stats_columns)
        rows = 0
        rel = full = None
        topic = partition = None
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                batch = batch.select(self.file_schema.names).cast(self.file_schema)
                if writer is None:
                    rel = self._relative_path()
                    full = os.path.join(self.table_root, rel)
                    os.makedirs(os.path.dirname(full), exist_ok=True)
                    writer = pq.ParquetWriter(full, self.file_schema, compression=self.compression)
                writer.write_batch(batch)
                stats.update(batch)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            return
        if "topic" in stats.mins and stats.mins["topic"] == stats.maxs["topic"]:
            topic = stats.mins["topic"]
        if "partition" in stats.mins and stats.mins["partition"] == stats.maxs["partition"]:
            partition = stats.mins["partition"]
        st = os.stat(full)
        yield pa.record_batch([
            pa.array([rel]), pa.array([st.st_size], pa.int64()), pa.array([int(st.st_mtime * 1000)], pa.int64()),
            pa.array([rows], pa.int64()), pa.array([stats.to_json(rows)]),
            pa.array([topic], pa.string()), pa.array([partition], pa.int32()),
            pa.array([stats.mins.get("offset")], pa.int64()), pa.array([stats.maxs.get("offset")], pa.int64()),
        ], schema=FILE_METADATA_SCHEMA)


def add_actions(files: Sequence[Mapping], partition_values: Mapping[str, str]) -> list[AddAction]:
    """Delta ``add`` actions for the files tasks reported."""
    return [
        AddAction(f["path"], int(f["size"]), dict(partition_values), int(f["modification_time"]), True, f["stats"])
        for f in files
    ]
