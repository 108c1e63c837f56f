"""Delta tables on delta-rs: creation from a spec, snapshots, reading into Spark.

Tables are read through their snapshot's file list (``DeltaTable.file_uris``),
never through ``DeltaTable.to_pyarrow_table``/``to_pyarrow_dataset``: in
deltalake 1.6 those leave Arrow threads running that abort the interpreter at
exit ("terminate called without an active exception", delta-rs#2184), which
would turn a successful CLI run into exit status 134.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from streamlake.delta.features import require_spark_readable
from streamlake.errors import CommitConflictError
from streamlake.spark.session import local_frame
from streamlake.storage.location import is_object_store, normalize, storage_options

log = logging.getLogger(__name__)
# How often a writer re-plans a commit it lost to concurrent writers before giving up.
MAX_COMMIT_ATTEMPTS = 10

# Deletion vectors stay off: delta-rs cannot delete from a table that has them.
DEFAULT_TABLE_CONFIGURATION = {
    "delta.enableDeletionVectors": "false",
}


@dataclass(frozen=True)
class TableSpec:
    """Schema and layout of a platform table.

    ``schema`` is the full table schema; ``partition_by`` columns are stored in
    the Delta log's partition values, not in the data files.
    """

    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    description: str = ""
    configuration: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_TABLE_CONFIGURATION))

    @property
    def file_schema(self) -> pa.Schema:
        """Schema of the data files: the table schema without partition columns."""
        return pa.schema([f for f in self.schema if f.name not in self.partition_by])


def table_exists(path: str | os.PathLike, storage_options: Mapping[str, str] | None = None) -> bool:
    return DeltaTable.is_deltatable(str(path), storage_options=delta_options(path, storage_options))


def delta_options(path: str | os.PathLike, given: Mapping[str, str] | None) -> dict[str, str] | None:
    """delta-rs ``storage_options`` for ``path``: None on the local filesystem; on an object
    store its family's environment variables, then ``given`` (as :func:`storage_options`),
    so a caller without options of its own still reaches the store the environment names."""
    if not is_object_store(path):
        return dict(given) if given else None
    return storage_options(path, dict(given or {})).for_delta()


def parquet_dataset(files: list[str], schema: pa.Schema | None = None,
                    storage_options: Mapping[str, str] | None = None):
    """A pyarrow dataset of data files (local paths, or URIs of one object store, reached with
    its environment's options and ``storage_options``)."""
    import pyarrow.dataset as ds

    from streamlake.storage.location import arrow_filesystem, storage_options as options_of

    if not files or not is_object_store(files[0]):
        return ds.dataset(files, format="parquet", schema=schema)
    fs, _ = arrow_filesystem(options_of(files[0], dict(storage_options or {})))
    return ds.dataset([f.split("://", 1)[1] for f in files], format="parquet", schema=schema, filesystem=fs)


def ensure_table(path: str | os.PathLike, spec: TableSpec,
                 storage_options: Mapping[str, str] | None = None) -> DeltaTable:
    """Open the table at ``path`` (a local path or an object-store URI, reached with
    ``storage_options``), creating it (version 0, no data) if missing.

    Safe against concurrent creators: the loser of the create race opens the
    winner's table. Raises ValueError if an existing table's schema differs.
    """
    path = str(path)
    options = delta_options(path, storage_options)
    if not table_exists(path, options):
        require_spark_readable(f"table {spec.name} at {path}", spec.schema, spec.partition_by, spec.configuration)
        if "://" not in path:
            os.makedirs(path, exist_ok=True)
        try:
            DeltaTable.create(
                path, spec.schema, mode="ignore", partition_by=list(spec.partition_by) or None,
                name=spec.name, description=spec.description, configuration=dict(spec.configuration),
                storage_options=options,
            )
        except CommitFailedError:
            pass  # another process created it first
    table = DeltaTable(path, storage_options=options)
    existing = pa.schema(table.schema().to_arrow())
    if existing.names != spec.schema.names:
        raise ValueError(
            f"table at {path} has columns {existing.names}, expected {spec.name} columns {spec.schema.names}"
        )
    return table


def with_commit_retries(what: str, attempt_once: Callable[[int], object]) -> object:
    """Run ``attempt_once(attempt)`` until it does not raise CommitFailedError (a commit lost
    to a concurrent writer: nothing of it landed, so it is planned and tried again), at most
    MAX_COMMIT_ATTEMPTS times; then raises CommitConflictError."""
    for attempt in range(1, MAX_COMMIT_ATTEMPTS + 1):
        try:
            return attempt_once(attempt)
        except CommitFailedError as exc:
            log.warning("%s: commit lost to a concurrent commit (%s); re-planning", what, exc)
            time.sleep(0.05 * attempt)
    raise CommitConflictError(f"{what}: lost the commit {MAX_COMMIT_ATTEMPTS} times to concurrent writers")


def evolve_table(path: str | os.PathLike, spec: TableSpec,
                 storage_options: Mapping[str, str] | None = None) -> tuple[DeltaTable, TableSpec]:
    """Open or create the table at ``path`` for ``spec``, adding the columns ``spec`` has
    and the table lacks (nullable, at the end: a field added to a definition). Returns the
    table and ``spec`` with its columns in the table's order (what files and commits must use).

    Raises ValueError if the table has a column ``spec`` lacks, or one of another type:
    those changes would make existing rows wrong (a definition change refuses them first).
    """
    from deltalake.schema import Field

    path = str(path)
    options = delta_options(path, storage_options)
    if not table_exists(path, options):
        return ensure_table(path, spec, options), spec
    table = DeltaTable(path, storage_options=options)
    existing = pa.schema(table.schema().to_arrow())
    wanted = {f.name: f for f in spec.schema}
    for f in existing:
        if f.name not in wanted:
            raise ValueError(f"table at {path} has column {f.name!r}, which {spec.name} no longer declares")
        if not _same_type(f.type, wanted[f.name].type):
            raise ValueError(f"table at {path} has {f.name} as {f.type}; {spec.name} declares {wanted[f.name].type}")
    new = [f for f in spec.schema if f.name not in existing.names]
    if new:
        # the columns' types may need a table feature (a local timestamp: timestampNtz)
        require_spark_readable(f"table {spec.name} at {path} with the columns {[f.name for f in new]} added",
                               pa.schema([*existing, *(f.with_nullable(True) for f in new)]), spec.partition_by,
                               spec.configuration)
        try:
            table.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in new])
        except CommitFailedError:
            pass  # a concurrent writer added them first
        table = DeltaTable(path, storage_options=options)
    order = pa.schema(table.schema().to_arrow()).names
    schema = pa.schema([wanted[name] for name in order])
    return table, TableSpec(spec.name, schema, spec.partition_by, spec.description, spec.configuration)


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """The same Delta type (delta-rs reads strings back as string_view, names list items
    ``element``, ...: Arrow's spelling differs, Delta's does not)."""
    from deltalake.schema import Field

    def delta(t):
        return Field.from_arrow(pa.field("c", t)).type

    try:
        return delta(a) == delta(b)
    except Exception:  # noqa: BLE001 - a type delta-rs cannot map: compare as Arrow
        return a == b


def open_table(path: str | os.PathLike, version: int | None = None,
               storage_options: Mapping[str, str] | None = None) -> DeltaTable:
    """The table's latest snapshot, or ``version``. Raises FileNotFoundError if absent."""
    try:
        return DeltaTable(str(path), version=version, storage_options=delta_options(path, storage_options))
    except TableNotFoundError:
        raise FileNotFoundError(f"no Delta table at {path}") from None


def snapshot_files(table: DeltaTable) -> list[str]:
    """Local paths of the data files in the table's loaded snapshot."""
    return [uri[len("file://"):] if uri.startswith("file://") else uri for uri in table.file_uris()]


def files_overlapping(table: DeltaTable, column: str, low=None, high=None) -> list[str]:
    """Local paths of the snapshot's files whose ``column`` statistics overlap
    ``[low, high]`` (either bound may be None). Files without statistics for the
    column are included: pruning never drops a file that might hold a match."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    paths = actions.column("path").to_pylist()
    names = actions.column_names
    mins = actions.column(f"min.{column}").to_pylist() if f"min.{column}" in names else [None] * len(paths)
    maxs = actions.column(f"max.{column}").to_pylist() if f"max.{column}" in names else [None] * len(paths)
    root = table_root(table)
    keep = []
    for path, lo, hi in zip(paths, mins, maxs):
        if lo is None or hi is None or ((high is None or lo <= high) and (low is None or hi >= low)):
            keep.append(path if os.path.isabs(path) else os.path.join(root, path))
    return keep


def table_root(table: DeltaTable) -> str:
    uri = table.table_uri
    return uri[len("file://"):] if uri.startswith("file://") else uri


def read_files(spark, path: str | os.PathLike, spec: TableSpec, files: list[str], version: int | None = None):
    """A Spark DataFrame of some of a table's data files (partition columns from the paths'
    values as declared in ``spec``); empty with the table's schema when ``files`` is.

    A table on an object store is read by ``streamlake-delta``'s tasks with pyarrow (Spark's
    Parquet reader would need the s3a connector): ``files`` must be in the snapshot of
    ``version`` (None: the latest), whose partition values they take."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(spec.schema)
    if not files:
        return local_frame(spark, [], schema)
    if is_object_store(path):
        return read_object_store_files(spark, normalize(path), schema, files, version)
    return spark.read.schema(schema).option("basePath", str(path)).parquet(*files)


def read_object_store_files(spark, root: str, schema, files: list[str], version: int | None = None):
    """A Spark DataFrame (``schema``, a StructType) of data files of the table at ``root`` on an
    object store, read by ``streamlake-delta``'s tasks with pyarrow; ``files`` (URIs under the
    root, or paths relative to it) must be in the snapshot of ``version`` (None: the latest)."""
    relative = [f[len(root) + 1:] if f.startswith(root + "/") else f for f in files]
    return _object_store_reader(spark, root, schema, version).option("files", json.dumps(relative)).load(root)


def _object_store_reader(spark, root: str, schema, version: int | None):
    """``spark.read`` of ``streamlake-delta`` for a table on an object store, with the options of
    its store that are not secret (tasks take the secrets from their own environment)."""
    from streamlake.delta.source import FORMAT, register

    register(spark)
    reader = spark.read.format(FORMAT).schema(schema)
    for key, value in storage_options(root).public().items():
        reader = reader.option(f"storage.{key}", value)
    return reader if version is None else reader.option("versionAsOf", str(version))


def read_table(spark, path: str | os.PathLike, spec: TableSpec, version: int | None = None):
    """A Spark DataFrame of the table's snapshot (latest, or ``version``).

    Reads the snapshot's files with Spark's Parquet reader and the table schema,
    so partition columns come from the paths (``basePath``) with their declared
    types. Works without Delta's JVM connector; where it is installed,
    ``spark.read.format("delta").load(path)`` reads the same data.
    """
    if is_object_store(path):
        from pyspark.sql.pandas.types import from_arrow_schema

        root = normalize(path)
        return _object_store_reader(spark, root, from_arrow_schema(spec.schema), version).load(root)
    return read_files(spark, path, spec, snapshot_files(open_table(path, version)))


def vacuum_table(path: str | os.PathLike, retention_hours: int = 168, dry_run: bool = True,
                 storage_options: Mapping[str, str] | None = None) -> list[str]:
    """Delete files that no snapshot of the last ``retention_hours`` references.

    That is: data files of commit attempts that died or lost a commit race (the
    abort of the two-phase commit), files removed by later commits, and the
    ``_temporary`` directories of Spark writes killed mid-way (local tables: Spark
    never writes to an object store here). Returns the paths deleted (or that would
    be, with ``dry_run``), relative to the table root. A retention shorter than the
    longest running write can delete files that write is about to commit: keep the
    default unless no writer is running.
    """
    import shutil

    from streamlake.delta.files import stale_spark_temporaries

    files = open_table(path, storage_options=storage_options).vacuum(
        retention_hours=retention_hours, dry_run=dry_run, enforce_retention_duration=False, full=True)
    out = [str(Path(f)) for f in files]
    if "://" in str(path):
        return sorted(out)
    root = Path(path)
    for temp in stale_spark_temporaries(str(root), retention_hours):
        out += [str(p.relative_to(root)) for p in temp.rglob("*") if p.is_file()]
        if not dry_run:
            shutil.rmtree(temp, ignore_errors=True)
    return sorted(out)


# A stage's own tables: compacted once more than COMPACT_AFTER_SMALL_FILES of their files are
# smaller than SMALL_FILE_BYTES (a micro-batch writes one file per partition it touches).
SMALL_FILE_BYTES = 16 * 1024 * 1024
COMPACT_AFTER_SMALL_FILES = 64


def compact_small_files(table: DeltaTable, max_small_files: int = COMPACT_AFTER_SMALL_FILES,
                        target_size: int = SMALL_FILE_BYTES) -> dict | None:
    """Bin-pack the small files of ``table`` (its snapshot as opened) into files of about ``target_size``
    bytes (delta-rs ``optimize.compact``, per partition) once more than ``max_small_files``
    of its snapshot's files are smaller than ``target_size``; returns the compaction's
    metrics, or None when there were not that many.

    The commit removes and adds files with ``dataChange=false``: the rows, the ``txn``
    positions the table carries and every earlier version stay as they were (streaming
    readers skip such a commit; the removed files stay on disk until a vacuum). Files
    that reached ``target_size`` are never read again, so a row is rewritten a bounded
    number of times. Raises what delta-rs raises, CommitFailedError when another
    writer's commit conflicts: the caller decides whether to go on without it."""
    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    if sum(1 for size in sizes if size < target_size) <= max_small_files:
        return None
    return table.optimize.compact(target_size=target_size)
