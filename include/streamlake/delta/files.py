"""Pre-commit phase of the Delta sinks: the Parquet files of one commit attempt.

Each commit attempt writes its rows into a directory of its own inside the
table (``<partition>/attempt-<id>/`` when the whole batch goes to one
partition, as in bronze; ``attempt-<id>/<partition>/`` when Spark partitions
the rows by the table's partition columns), and the driver turns the files'
descriptions (row counts, column statistics) into Delta ``add`` actions. Until
the commit, no snapshot references these files: readers cannot see them, and
an attempt that dies leaves files no commit will ever reference.
``DeltaTable.vacuum(full=True)`` deletes those (delta-rs's default "lite"
vacuum only deletes files that commits removed), and so does
:func:`streamlake.delta.table.vacuum_table`, which also deletes the
``_temporary`` directory a Spark job killed mid-write leaves behind (Delta
skips it as hidden).

Two writers fill an attempt directory:

* :func:`write_attempt_files`: Spark's own Parquet writer (JVM) writes a
  DataFrame; the driver reads the footers. Used by the silver and gold stages,
  and by bronze with ``writer="spark"``. For a table on an object store it
  runs the rows through ``mapInArrow`` tasks that write with the writer below.
* :class:`AttemptFileWriter`: the tasks that *produce* the rows write them with
  pyarrow, where they are (bronze's fast path: the Kafka source's read tasks,
  ``output=files``), and hand the driver only a :class:`DataFile` as JSON. The
  payload never crosses into the JVM. Everything a task needs (directory,
  columns, constant columns, statistics columns) travels as a
  :class:`FileTarget`. This part imports pyarrow only (it runs in Spark's
  Python workers); delta-rs is imported where ``add`` actions are built.
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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ATTEMPT_PREFIX = "attempt-"
# Spark settings the files must be written with (readable by delta-rs and Delta Spark).
WRITE_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
}


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


def write_attempt_files(rows, table_root: str, attempt_id: str, columns: Sequence[str],
                        stats_columns: Sequence[str], *, partition_values: Mapping[str, str] | None = None,
                        partition_by: Sequence[str] = (), storage: Mapping[str, str] | None = None) -> list[DataFile]:
    """Write ``rows`` (a Spark DataFrame) as Parquet files of one commit attempt.

    ``columns`` are the data files' columns. With ``partition_values`` every row
    goes to that one partition; with ``partition_by`` Spark splits the rows by
    those columns (which must be in ``rows``) into Hive-style directories. Returns
    the non-empty files written, described from their footers, each with its
    partition values. Raises whatever Spark raises; a failed write leaves only
    unreferenced files.

    On an object store (``table_root`` an ``s3://``... URI; ``storage`` its options
    without secrets) the tasks write the files with pyarrow (:class:`AttemptFileWriter`,
    credentials from their own environment): Spark's writer would need the s3a connector.
    """
    from streamlake.storage.location import is_object_store

    if is_object_store(table_root):
        return _write_with_tasks(rows, table_root, attempt_id, columns, stats_columns, partition_values,
                                 partition_by, storage or {})
    directory = attempt_directory(attempt_id, partition_values)
    out = os.path.join(table_root, directory)
    spark = rows.sparkSession
    for key, value in WRITE_CONF.items():
        spark.conf.set(key, value)
    # "error" is "errorifexists", the one name Spark Connect knows too
    writer = rows.select(*columns, *partition_by).write.mode("error")
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


def _write_with_tasks(rows, table_root: str, attempt_id: str, columns: Sequence[str], stats_columns: Sequence[str],
                     partition_values: Mapping[str, str] | None, partition_by: Sequence[str],
                     storage: Mapping[str, str]) -> list[DataFile]:
    """:func:`write_attempt_files` on an object store: each task writes its rows with pyarrow,
    one file per partition it holds (``<partition>/attempt-<id>/part-<uuid>.parquet``, bronze's
    layout), and returns the files' descriptions; the driver collects them. A task that dies
    leaves only objects no commit references (vacuum deletes them)."""
    template = FileTarget(table_root, "", tuple(columns), stats_columns=tuple(stats_columns),
                          storage=dict(storage)).to_json()
    fixed = dict(partition_values) if partition_values is not None else None
    by = list(partition_by)

    def write(batches):
        import uuid

        base = FileTarget.from_json(template)
        writers: dict[tuple, AttemptFileWriter] = {}
        try:
            for batch in batches:
                for values, part in _split_by_partition(batch, by, fixed):
                    key = tuple(sorted(values.items()))
                    if key not in writers:
                        target = replace(base, directory=attempt_directory(attempt_id, values),
                                         partition_values=values)
                        writers[key] = AttemptFileWriter(target, f"part-{uuid.uuid4().hex}.parquet")
                    writers[key].write(part)
            described = [w.close() for w in writers.values()]
        except BaseException:
            for w in writers.values():
                w.abort()
            raise
        done = [data_file_to_json(f) for f in described if f is not None]
        if done:
            yield pa.RecordBatch.from_pydict({"file": done})

    written = rows.select(*columns, *partition_by).mapInArrow(write, "file string").collect()
    return [data_file_from_json(r["file"]) for r in written]


def _split_by_partition(batch: pa.RecordBatch, partition_by: Sequence[str],
                        fixed: Mapping[str, str] | None) -> list[tuple[dict, pa.RecordBatch]]:
    """``batch`` split by the values of its ``partition_by`` columns (Delta's partition values:
    text, None for null), or whole under ``fixed`` values."""
    if fixed is not None or not partition_by:
        return [(dict(fixed or {}), batch)]
    table = pa.Table.from_batches([batch])
    keys = table.select(list(partition_by)).group_by(list(partition_by)).aggregate([])
    out = []
    for key in keys.to_pylist():
        mask = None
        for name in partition_by:
            column = table.column(name)
            match = pc.is_null(column) if key[name] is None else pc.equal(column, pa.scalar(key[name], column.type))
            mask = match if mask is None else pc.and_(mask, match)
        part = table.filter(mask).combine_chunks()
        values = {name: None if key[name] is None else str(key[name]) for name in partition_by}
        out += [(values, b) for b in part.to_batches()]
    return out


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


def add_actions(files: Sequence[DataFile]) -> list:
    """Delta ``add`` actions (``deltalake.transaction.AddAction``) for the files of a
    commit (each with its partition values)."""
    from deltalake.transaction import AddAction

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
