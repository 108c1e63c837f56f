"""A commit attempt's Parquet data files, written with pyarrow where the rows are.

A Delta commit attempt writes its rows into a directory of its own inside the table
(:func:`attempt_directory`); until the commit, no snapshot references them
(:mod:`streamlake.delta.files` says how the sinks write and commit them). This module holds
what every writer of such files shares, and what the tasks that *produce* the rows need to
write them where they are (bronze's fast path: the Kafka source's read tasks,
``output=files``, :mod:`streamlake.kafka.source`): :class:`FileTarget` (directory, columns,
constant columns, statistics columns, as JSON for the tasks), :class:`AttemptFileWriter`
(one Parquet file from record batches, its Delta statistics computed as it is written) and
:class:`DataFile` (a written file's description, as the compact JSON a task hands to the
driver). It imports pyarrow only: it runs in Spark's Python workers.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ATTEMPT_PREFIX = "attempt-"
def partition_path(partition_values: Mapping[str, str]) -> str:
    """Hive-style directory for a partition: ``ingest_date=2026-11-21`` (a null value as Hive
    spells it, ``__HIVE_DEFAULT_PARTITION__``)."""
    return "/".join(f"{k}={'__HIVE_DEFAULT_PARTITION__' if v is None else v}" for k, v in partition_values.items())


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


def attempt_directory(attempt_id: str, partition_values: Mapping[str, str] | None = None) -> str:
    """Directory of a commit attempt, relative to the table: ``<partition>/attempt-<id>``
    when all its rows go to one partition, else ``attempt-<id>``."""
    prefix = partition_path(partition_values) if partition_values else ""
    return "/".join(p for p in (prefix, ATTEMPT_PREFIX + attempt_id) if p)


def data_file_to_json(f: DataFile) -> str:
    """A file description as the compact JSON a task hands to the driver."""
    return json.dumps({"path": f.path, "size": f.size, "modificationTime": f.modification_time,
                       "numRecords": f.num_records, "stats": f.stats, "topic": f.topic, "partition": f.partition,
                       "minOffset": f.min_offset, "partitionValues": dict(f.partition_values)},
                      separators=(",", ":"))


def data_file_from_json(text: str) -> DataFile:
    d = json.loads(text)
    return DataFile(d["path"], int(d["size"]), int(d["modificationTime"]), int(d["numRecords"]), d["stats"],
                    d.get("topic"), d.get("partition"), d.get("minOffset"), dict(d.get("partitionValues") or {}))


# Types of constant columns a FileTarget can carry (JSON has no Arrow types).
CONSTANT_TYPES: dict[str, pa.DataType] = {
    "int32": pa.int32(),
    "int64": pa.int64(),
    "string": pa.string(),
    "date32": pa.date32(),
    "timestamp_us_utc": pa.timestamp("us", tz="UTC"),  # value: epoch microseconds
}


@dataclass(frozen=True)
class FileTarget:
    """Where and how a task writes its Parquet files of one commit attempt.

    ``directory`` is the attempt directory relative to the table ``root`` (a
    local path or an object-store URI; ``storage`` holds its storage options
    *without secrets*: a task adds the credentials from its own environment);
    ``columns`` are the data files' columns in order: the columns of the
    batches a task writes plus ``constants`` (name -> (type name in
    :data:`CONSTANT_TYPES`, value)), the same for every row of the attempt
    (bronze: ``ingest_time``, ``batch_id``). ``stats_columns`` get min/max/null
    counts in the Delta stats. JSON-able, so the driver can hand it to tasks.
    """

    root: str
    directory: str
    columns: tuple[str, ...]
    constants: Mapping[str, tuple[str, object]] = field(default_factory=dict)
    stats_columns: tuple[str, ...] = ()
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    storage: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from streamlake.storage.location import is_secret

        leaked = sorted(k for k in self.storage if is_secret(k))
        if leaked:
            raise ValueError(f"a FileTarget travels to tasks in the clear; keep {leaked} out of it")

    def to_json(self) -> str:
        return json.dumps({"root": self.root, "directory": self.directory, "columns": list(self.columns),
                           "constants": {k: list(v) for k, v in self.constants.items()},
                           "statsColumns": list(self.stats_columns),
                           "partitionValues": dict(self.partition_values),
                           "storage": dict(self.storage)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "FileTarget":
        d = json.loads(text)
        return cls(d["root"], d["directory"], tuple(d["columns"]),
                   {k: (v[0], v[1]) for k, v in d.get("constants", {}).items()},
                   tuple(d.get("statsColumns", ())), dict(d.get("partitionValues") or {}),
                   dict(d.get("storage") or {}))

    def filesystem(self):
        """``(pyarrow filesystem, root path in it)``, or None on the local filesystem.
        Credentials come from the environment of the process (a task's executor)."""
        from streamlake.storage.location import arrow_filesystem, is_object_store, storage_options

        if not is_object_store(self.root):
            return None
        return arrow_filesystem(storage_options(self.root, self.storage))

    def constant_arrays(self, n: int) -> dict[str, pa.Array]:
        out = {}
        for name, (type_name, value) in self.constants.items():
            if type_name not in CONSTANT_TYPES:
                raise ValueError(f"constant column {name}: unsupported type {type_name!r}")
            arrow_type = CONSTANT_TYPES[type_name]
            if type_name == "timestamp_us_utc":
                out[name] = pa.repeat(pa.scalar(int(value), pa.int64()), n).cast(arrow_type)
            else:
                out[name] = pa.repeat(pa.scalar(value, arrow_type), n)
        return out


class AttemptFileWriter:
    """One Parquet file of a commit attempt, written with pyarrow from record batches
    (executor side). :meth:`close` returns its :class:`DataFile` (None if no row was
    written: no file is left behind then).

    Statistics for the Delta log are computed from the data as it is written
    (no footer read); the Parquet footer keeps statistics for the non-binary
    columns only, and binary columns (the payload) skip dictionary encoding, which
    never pays for them and costs CPU on every row.
    """

    def __init__(self, target: FileTarget, name: str):
        self.target = target
        self.rel_path = f"{target.directory}/{name}"
        remote = target.filesystem()
        self._fs = remote[0] if remote else None
        self.full_path = f"{remote[1]}/{self.rel_path}" if remote else os.path.join(target.root, self.rel_path)
        self._writer: pq.ParquetWriter | None = None
        self.num_records = 0
        self._mins: dict = {}
        self._maxs: dict = {}
        self._nulls: dict = {}

    def write(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        if not n:
            return
        constants = self.target.constant_arrays(n)
        arrays = [constants[c] if c in constants else batch.column(c) for c in self.target.columns]
        if self._writer is None:
            schema = pa.schema([pa.field(c, a.type) for c, a in zip(self.target.columns, arrays)])
            plain = [f.name for f in schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
            simple = [f.name for f in schema if not pa.types.is_nested(f.type) and f.name not in plain]
            if self._fs is None:
                os.makedirs(os.path.dirname(self.full_path), exist_ok=True)
            self._writer = pq.ParquetWriter(self.full_path, schema, compression="snappy", filesystem=self._fs,
                                            use_dictionary=[c for c in simple], write_statistics=simple)
        out = pa.RecordBatch.from_arrays(arrays, schema=self._writer.schema)
        self._writer.write_batch(out)
        self.num_records += n
        for name in self.target.stats_columns:
            if name not in self.target.columns:
                continue
            column = out.column(name)
            self._nulls[name] = self._nulls.get(name, 0) + column.null_count
            if pa.types.is_binary(column.type) or pa.types.is_nested(column.type) or column.null_count == n:
                continue
            lo, hi = (v.as_py() for v in pc.min_max(column).values())
            self._mins[name] = lo if name not in self._mins else min(self._mins[name], lo)
            self._maxs[name] = hi if name not in self._maxs else max(self._maxs[name], hi)

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None

    def close(self) -> DataFile | None:
        if self._writer is None:
            return None
        self._writer.close()
        self._writer = None
        mins = {k: _stat_value(v) for k, v in self._mins.items()}
        maxs = {k: _stat_value(v) for k, v in self._maxs.items()}
        nulls = {k: v for k, v in self._nulls.items() if k in mins or v == self.num_records}
        stats = json.dumps({"numRecords": self.num_records, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
                           separators=(",", ":"), default=str)
        if self._fs is None:
            st = os.stat(self.full_path)
            size, mtime_ms = st.st_size, int(st.st_mtime * 1000)
        else:  # an object store: the size it reports, the time of the upload's end
            size, mtime_ms = self._fs.get_file_info(self.full_path).size, int(time.time() * 1000)
        single = lambda col: mins[col] if col in mins and mins[col] == maxs[col] else None  # noqa: E731
        return DataFile(self.rel_path, size, mtime_ms, self.num_records, stats,
                        single("topic"), single("partition"), mins.get("offset"),
                        dict(self.target.partition_values))
