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
  runs the rows through ``mapInArrow`` tasks that write with the writer below;
  :func:`write_arrow_files` writes rows the driver already holds (a silver
  micro-batch read on the driver) with it, in the driver.
* :class:`~streamlake.storage.data_files.AttemptFileWriter`: the tasks that
  *produce* the rows write them with pyarrow, where they are (bronze's fast path:
  the Kafka source's read tasks, ``output=files``), and hand the driver only a
  :class:`~streamlake.storage.data_files.DataFile` as JSON. The payload never
  crosses into the JVM. Everything a task needs (directory, columns, constant
  columns, statistics columns) travels as a
  :class:`~streamlake.storage.data_files.FileTarget`. That part lives in
  :mod:`streamlake.storage.data_files` (pyarrow only: it runs in Spark's Python
  workers, and the Kafka source below this layer uses it); delta-rs is imported
  here, where ``add`` actions are built.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from streamlake.storage.data_files import (
    ATTEMPT_PREFIX,
    AttemptFileWriter,
    DataFile,
    FileTarget,
    attempt_directory,
    data_file_from_json,
    data_file_to_json,
    describe_file,
)

# Spark settings the files must be written with (readable by delta-rs and Delta Spark).
WRITE_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
}


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
        done = [data_file_to_json(f) for f in write_batches(batches, FileTarget.from_json(template), attempt_id,
                                                            by, fixed)]
        if done:
            yield pa.RecordBatch.from_pydict({"file": done})

    written = rows.select(*columns, *partition_by).mapInArrow(write, "file string").collect()
    return [data_file_from_json(r["file"]) for r in written]


def write_arrow_files(rows: pa.Table, table_root: str, attempt_id: str, columns: Sequence[str],
                      stats_columns: Sequence[str], *, partition_values: Mapping[str, str] | None = None,
                      partition_by: Sequence[str] = (), storage: Mapping[str, str] | None = None) -> list[DataFile]:
    """:func:`write_attempt_files` for rows already in this process (an Arrow table with
    ``columns`` and the ``partition_by`` columns): written here with pyarrow, one file per
    partition, in the layout and with the statistics of the tasks' files. Raises what
    pyarrow raises; a failed write leaves only unreferenced files."""
    base = FileTarget(table_root, "", tuple(columns), stats_columns=tuple(stats_columns), storage=dict(storage or {}))
    fixed = dict(partition_values) if partition_values is not None else None
    return write_batches(rows.select([*columns, *partition_by]).to_batches(), base, attempt_id, list(partition_by),
                         fixed)


def write_batches(batches, base: FileTarget, attempt_id: str, partition_by: Sequence[str],
                  fixed: Mapping[str, str] | None) -> list[DataFile]:
    """Write record batches as the Parquet files of commit attempt ``attempt_id`` (one per
    partition of ``partition_by``, or all under the ``fixed`` partition values), with
    ``base``'s columns and statistics; the non-empty files written. A failure aborts every
    file begun (nothing is left half-written) and raises."""
    import uuid

    writers: dict[tuple, AttemptFileWriter] = {}
    try:
        for batch in batches:
            for values, part in _split_by_partition(batch, partition_by, fixed):
                key = tuple(sorted(values.items()))
                if key not in writers:
                    target = replace(base, directory=attempt_directory(attempt_id, values), partition_values=values)
                    writers[key] = AttemptFileWriter(target, f"part-{uuid.uuid4().hex}.parquet")
                writers[key].write(part)
        described = [w.close() for w in writers.values()]
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    return [f for f in described if f is not None]


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
