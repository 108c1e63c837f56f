"""Delta tables on delta-rs: creation from a spec, snapshots, reading into Spark.

Tables are read through their snapshot's file list (``DeltaTable.file_uris``),
never through ``DeltaTable.to_pyarrow_table``/``to_pyarrow_dataset``: in
deltalake 1.6 those leave Arrow threads running that abort the interpreter at
exit ("terminate called without an active exception", delta-rs#2184), which
would turn a successful CLI run into exit status 134.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

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
    return DeltaTable.is_deltatable(str(path), storage_options=_delta_options(storage_options))


def _delta_options(storage_options: Mapping[str, str] | None) -> dict[str, str] | None:
    return dict(storage_options) if storage_options else None


def ensure_table(path: str | os.PathLike, spec: TableSpec,
                 storage_options: Mapping[str, str] | None = None) -> DeltaTable:
    """Open the table at ``path`` (a local path or an object-store URI, reached with
    ``storage_options``), creating it (version 0, no data) if missing.

    Safe against concurrent creators: the loser of the create race opens the
    winner's table. Raises ValueError if an existing table's schema differs.
    """
    path = str(path)
    options = _delta_options(storage_options)
    if not table_exists(path, options):
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


def evolve_table(path: str | os.PathLike, spec: TableSpec) -> tuple[DeltaTable, TableSpec]:
    """Open or create the table at ``path`` for ``spec``, adding the columns ``spec`` has
    and the table lacks (nullable, at the end: a field added to a definition). Returns the
    table and ``spec`` with its columns in the table's order (what files and commits must use).

    Raises ValueError if the table has a column ``spec`` lacks, or one of another type:
    those changes would make existing rows wrong (a definition change refuses them first).
    """
    from deltalake.schema import Field

    path = str(path)
    if not table_exists(path):
        return ensure_table(path, spec), spec
    table = DeltaTable(path)
    existing = pa.schema(table.schema().to_arrow())
    wanted = {f.name: f for f in spec.schema}
    for f in existing:
        if f.name not in wanted:
            raise ValueError(f"table at {path} has column {f.name!r}, which {spec.name} no longer declares")
        if not _same_type(f.type, wanted[f.name].type):
            raise ValueError(f"table at {path} has {f.name} as {f.type}; {spec.name} declares {wanted[f.name].type}")
    new = [f for f in spec.schema if f.name not in existing.names]
    if new:
        try:
            table.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in new])
        except CommitFailedError:
            pass  # a concurrent writer added them first
        table = DeltaTable(path)
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
        return DeltaTable(str(path), version=version, storage_options=_delta_options(storage_options))
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


def read_files(spark, path: str | os.PathLike, spec: TableSpec, files: list[str]):
    """A Spark DataFrame of some of a table's data files (partition columns from the paths'
    values as declared in ``spec``); empty with the table's schema when ``files`` is."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(spec.schema)
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", str(path)).parquet(*files)


def read_table(spark, path: str | os.PathLike, spec: TableSpec, version: int | None = None):
    """A Spark DataFrame of the table's snapshot (latest, or ``version``).

    Reads the snapshot's files with Spark's Parquet reader and the table schema,
    so partition columns come from the paths (``basePath``) with their declared
    types. Works without Delta's JVM connector; where it is installed,
    ``spark.read.format("delta").load(path)`` reads the same data.
    """
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
