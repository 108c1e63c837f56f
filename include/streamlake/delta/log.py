"""Reading a Delta table's log for the ``streamlake-delta`` streaming source.

Driver side only (the executors' read path is in :mod:`streamlake.delta.source`
and must not import ``deltalake``, which is therefore imported lazily here).

A stream position is ``Position(version, index, starting)``:

``starting=True``
    reading the *snapshot* of ``version`` (every file the table holds at that
    version, sorted by modification time then path, as delta-spark does); the
    files with index ``<= index`` have been read (``-1``: none).
``starting=False``
    every commit before ``version`` has been read, and the data files of
    commit ``version`` (its ``add`` actions with ``dataChange=true``, in log
    order) with index ``<= index`` (``-1``: none, the stream is exactly at the
    start of that version).

:meth:`DeltaLog.scan` walks the log from a position and yields, in stream
order, the files to read (:class:`ScanFile`), the positions where everything
before has been consumed (:class:`ScanBoundary`), and the first position the
stream cannot pass (:class:`ScanBlocked`, carrying the error to raise). It is a
pure function of the position, the bounds and the (immutable) committed log, so
the driver plans the same files for a micro-batch however often it is replayed.
The rules it applies (change commits, restores, lost files) are described in
:mod:`streamlake.delta.source`.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote

from streamlake.errors import DataLossError, StreamLakeError

log = logging.getLogger(__name__)

_COMMIT_CACHE_SIZE = 512


class DeltaTableNotFoundError(StreamLakeError, FileNotFoundError):
    """The source path holds no Delta table."""


class ChangeCommitError(StreamLakeError):
    """A commit removes or rewrites data the stream may already have emitted."""


class SchemaChangedError(StreamLakeError):
    """A commit changes the table schema incompatibly with the running query's schema."""


class UnsupportedTableError(StreamLakeError):
    """The table uses a Delta feature this source cannot read (column mapping, deletion vectors)."""


class Position(NamedTuple):
    version: int
    index: int = -1
    starting: bool = False


@dataclass(frozen=True)
class DataFile:
    """One data file to stream: its path (relative to the table root, decoded, or
    absolute), size in bytes, modification time (ms) and typed partition values."""

    path: str
    size: int
    modification_time: int = 0
    partition_values: tuple[tuple[str, Any], ...] = ()

    def location(self, root: str) -> str:
        """Where the file is: an absolute path or URI as the log has it, else under ``root``."""
        if os.path.isabs(self.path) or "://" in self.path:
            return self.path
        return f"{root}/{self.path}" if "://" in root else os.path.join(root, self.path)


@dataclass(frozen=True)
class Commit:
    """What the streaming source needs to know about one commit file."""

    version: int
    operation: str | None = None
    timestamp: int | None = None
    files: tuple[DataFile, ...] = ()  # add actions with dataChange=true, in log order
    data_removes: int = 0             # remove actions with dataChange=true
    restore_to: int | None = None     # for a RESTORE commit: the version it restored
    schema_string: str | None = None  # metaData.schemaString, if the commit has a metaData action
    partition_columns: tuple[str, ...] | None = None
    deletion_vectors: bool = False    # some add action carries a deletion vector

    @property
    def is_change(self) -> bool:
        """Removes or rewrites data: delete, overwrite, merge, update, restore."""
        return self.data_removes > 0 or self.operation == "RESTORE"

    @property
    def is_delete_only(self) -> bool:
        """Only removes data (what ``ignoreDeletes`` skips)."""
        return self.data_removes > 0 and not self.files and self.operation != "RESTORE"


@dataclass(frozen=True)
class ScanFile:
    position: Position
    file: DataFile


@dataclass(frozen=True)
class ScanBoundary:
    version: int  # the stream has consumed everything before this version

    @property
    def position(self) -> Position:
        return Position(self.version, -1, False)


@dataclass(frozen=True)
class ScanBlocked:
    position: Position
    error: Exception


ScanEvent = ScanFile | ScanBoundary | ScanBlocked


@dataclass(frozen=True)
class ScanSettings:
    skip_change_commits: bool = False
    ignore_deletes: bool = False
    fail_on_data_loss: bool = True


def table_root(path: str | os.PathLike) -> str:
    """A table's root: an absolute local path (given as a path or ``file://`` URI), or an
    object-store URI (``s3://``, ``gs://``, ``abfss://``) as given."""
    from streamlake.errors import StorageOptionError
    from streamlake.storage.location import normalize

    try:
        return normalize(path)
    except StorageOptionError as exc:
        raise UnsupportedTableError(f"streamlake-delta cannot read {os.fspath(path)!r}: {exc}") from None


def commit_file(root: str, version: int) -> str:
    name = f"{version:020d}.json"
    return f"{root}/_delta_log/{name}" if "://" in root else os.path.join(root, "_delta_log", name)


def store_path(uri: str) -> str:
    """An object-store URI -> the path in its pyarrow filesystem (``bucket/key``)."""
    return unquote(uri.split("://", 1)[1])


def read_object(fs, path: str) -> bytes:
    """The bytes of ``path`` in an object store's filesystem; FileNotFoundError if absent."""
    import pyarrow.fs as pafs

    try:
        with fs.open_input_stream(path) as fh:
            return fh.read()
    except OSError:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise FileNotFoundError(path) from None
        raise


def _relative_path(raw: str) -> str:
    """A data file path as the log writes it (a URI, relative to the root) -> filesystem path."""
    if raw.startswith("file://"):
        return unquote(raw[len("file://"):])
    return unquote(raw)


def typed_partition_value(raw: str | None, arrow_type) -> Any:
    """A partition value as the Delta log serializes it (a string) -> a Python value of the
    column's type. ``None`` and ``""`` are null."""
    import pyarrow as pa

    if raw is None or raw == "":
        return None
    if arrow_type is None or pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return raw
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return raw.encode("latin-1", errors="surrogateescape")
    arr = pa.array([raw], pa.string())
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None:
        try:
            return arr.cast(arrow_type)[0].as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            # "2024-01-01 12:00:00[.ffffff]": a UTC wall-clock time without zone
            return arr.cast(pa.timestamp(arrow_type.unit)).cast(arrow_type)[0].as_py()
    return arr.cast(arrow_type)[0].as_py()


def parse_commit(version: int, lines: list[str], partition_types: dict[str, Any] | None = None) -> Commit:
    """Summarize one commit file's actions (newline-delimited JSON)."""
    partition_types = partition_types or {}
    operation = timestamp = restore_to = schema_string = partition_columns = None
    files: list[DataFile] = []
    removes = 0
    dvs = False
    custom_restore = None
    for line in lines:
        line = line.strip()
        if not line:
            continue
        action = json.loads(line)
        if "add" in action:
            add = action["add"]
            if add.get("deletionVector"):
                dvs = True
            if add.get("dataChange", True):
                values = tuple(
                    (name, typed_partition_value(raw, partition_types.get(name)))
                    for name, raw in sorted((add.get("partitionValues") or {}).items())
                )
                files.append(DataFile(_relative_path(add["path"]), int(add.get("size") or 0),
                                      int(add.get("modificationTime") or 0), values))
        elif "remove" in action:
            if action["remove"].get("dataChange", True):
                removes += 1
        elif "commitInfo" in action:
            info = action["commitInfo"] or {}
            operation = info.get("operation")
            timestamp = info.get("timestamp")
            params = info.get("operationParameters") or {}
            if operation == "RESTORE":
                try:
                    restore_to = int(params["version"])
                except (KeyError, TypeError, ValueError):
                    restore_to = None
                custom = info.get("streamlake")
                if isinstance(custom, dict) and custom.get("operation") == "restore":
                    try:
                        custom_restore = int(custom["toVersion"])
                    except (KeyError, TypeError, ValueError):
                        custom_restore = None
        elif "metaData" in action:
            meta = action["metaData"] or {}
            schema_string = meta.get("schemaString")
            partition_columns = tuple(meta.get("partitionColumns") or ())
    if operation == "RESTORE" and restore_to is None:
        restore_to = custom_restore
    return Commit(version=version, operation=operation, timestamp=timestamp, files=tuple(files),
                  data_removes=removes, restore_to=restore_to, schema_string=schema_string,
                  partition_columns=partition_columns, deletion_vectors=dvs)


def _field_types(schema) -> dict[str, str]:
    return {f.name.lower(): f.dataType.simpleString() for f in schema.fields}


def schema_compatible(commit_schema_json: str, stream_schema) -> bool:
    """True if every column of a commit's schema exists in the stream's schema with the
    same type (older files simply lack newer columns and read as null)."""
    from pyspark.sql.types import StructType

    new = _field_types(StructType.fromJson(json.loads(commit_schema_json)))
    have = _field_types(stream_schema)
    return all(have.get(name) == typ for name, typ in new.items())


class DeltaLog:
    """One table's log as the source reads it. Caches parsed commits and snapshots;
    everything it caches is immutable once committed."""

    def __init__(self, path: str | os.PathLike, schema=None, storage: dict[str, str] | None = None):
        from streamlake.storage.location import storage_options

        self.root = table_root(path)
        self.schema = schema
        self.storage = storage_options(self.root, storage or {})  # an object store's: the environment's + these
        self._fs = None
        self._table = None
        self._commits: OrderedDict[int, Commit | None] = OrderedDict()
        self._snapshots: dict[int, tuple[DataFile, ...]] = {}
        self._restores: dict[int, int] = {}
        self._indexed: tuple[int, int] | None = None
        self._partition_types: dict[str, Any] | None = None

    # -- the table -------------------------------------------------------------------
    @property
    def table(self):
        if self._table is None:
            from deltalake import DeltaTable
            from deltalake.exceptions import TableNotFoundError

            if not self._is_dir(f"{self.root}/_delta_log"):
                raise DeltaTableNotFoundError(
                    f"no Delta table at {self.root} (no _delta_log directory): check the path given to "
                    "readStream.format('streamlake-delta').load(path)"
                )
            try:
                self._table = DeltaTable(self.root, storage_options=self.storage.for_delta())
            except TableNotFoundError as exc:
                raise DeltaTableNotFoundError(f"no Delta table at {self.root}: {exc}") from None
        return self._table

    def refresh(self) -> int:
        """Load new commits; the latest version."""
        table = self.table
        table.update_incremental()
        return table.version()

    def wait_for_version(self, version: int, timeout_s: float, look_every_s: float = 0.01) -> bool:
        """Wait until the local table has ``version`` (its commit file exists) or ``timeout_s``
        passed; whether it has it. Looks every ``look_every_s`` (one ``stat``). A table on an
        object store is not waited for (each look would be a request): False at once."""
        import time

        path = commit_file(self.root, version)
        if "://" in self.root:
            return False
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(path):
            if time.monotonic() >= deadline:
                return False
            time.sleep(look_every_s)
        return True

    @property
    def table_id(self) -> str:
        return self.table.metadata().id

    def check_readable(self) -> None:
        """Refuse tables whose files this source cannot read correctly."""
        table = self.table
        mode = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
        if mode not in ("none", None, ""):
            raise UnsupportedTableError(
                f"table {self.root} uses column mapping (mode {mode}), which streamlake-delta cannot read"
            )
        features = table.protocol().reader_features or []
        if "deletionVectors" in features and any(batch.num_rows for batch in table.deletion_vectors()):
            raise UnsupportedTableError(
                f"table {self.root} has deletion vectors, which streamlake-delta cannot apply "
                "(the platform keeps delta.enableDeletionVectors=false)"
            )

    def spark_schema(self):
        """The table's schema as a Spark StructType (Delta's schemaString is Spark's JSON)."""
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.table.schema().to_json()))

    @property
    def partition_types(self) -> dict[str, Any]:
        if self._partition_types is None:
            from pyspark.sql.pandas.types import to_arrow_schema

            schema = self.schema if self.schema is not None else self.spark_schema()
            arrow = to_arrow_schema(schema, timezone="UTC")
            columns = self.table.metadata().partition_columns
            self._partition_types = {c: arrow.field(c).type for c in columns if c in arrow.names}
        return self._partition_types

    def version_at_or_after(self, timestamp_ms: int) -> int:
        """First version committed at or after ``timestamp_ms`` (latest + 1 if none)."""
        latest = self.refresh()
        found = None
        for entry in self.table.history():
            version, ts = entry.get("version"), entry.get("timestamp")
            if version is not None and ts is not None and ts >= timestamp_ms:
                found = version if found is None else min(found, version)
        return latest + 1 if found is None else found

    # -- commits and snapshots -------------------------------------------------------
    def commit(self, version: int) -> Commit | None:
        """The commit at ``version``; None if its file no longer (or not yet) exists."""
        if version in self._commits:
            self._commits.move_to_end(version)
            return self._commits[version]
        try:
            lines = self._read(commit_file(self.root, version)).decode("utf-8").splitlines(keepends=True)
        except FileNotFoundError:
            return None  # not cached: it may appear (a future version)
        commit = parse_commit(version, lines, self.partition_types)
        if commit.restore_to is not None:
            self._restores[version] = commit.restore_to
        self._commits[version] = commit
        while len(self._commits) > _COMMIT_CACHE_SIZE:
            self._commits.popitem(last=False)
        return commit

    def _is_restore(self, version: int) -> None:
        """Index ``version`` for restore look-ahead without parsing ordinary commits."""
        try:
            raw = self._read(commit_file(self.root, version))
        except FileNotFoundError:
            return
        if b'"RESTORE"' in raw:
            self.commit(version)

    def restore_jump(self, position_version: int, bound: int) -> int | None:
        """Latest RESTORE commit ``r`` in ``[position_version, bound]`` that restored version
        ``position_version - 1``: a stream exactly at the start of ``position_version`` may
        continue at ``r + 1``."""
        if bound < position_version or position_version < 1:
            return None
        lo, hi = position_version, bound
        if self._indexed is None:
            for v in range(lo, hi + 1):
                self._is_restore(v)
            self._indexed = (lo, hi)
        else:
            ilo, ihi = self._indexed
            for v in range(lo, ilo):  # also fills any gap, keeping the indexed range contiguous
                self._is_restore(v)
            for v in range(ihi + 1, hi + 1):
                self._is_restore(v)
            self._indexed = (min(lo, ilo), max(hi, ihi))
        hits = [r for r, to in self._restores.items() if lo <= r <= hi and to == position_version - 1]
        return max(hits) if hits else None

    def snapshot(self, version: int) -> tuple[DataFile, ...]:
        """Every data file of the table at ``version``, sorted by (modification time, path).
        Raises DataLossError if that version can no longer be loaded."""
        if version in self._snapshots:
            return self._snapshots[version]
        import pyarrow as pa
        from deltalake import DeltaTable

        try:
            table = DeltaTable(self.root, version=version, storage_options=self.storage.for_delta())
        except Exception as exc:  # noqa: BLE001 - delta-rs raises DeltaError/OSError/...
            raise DataLossError(
                f"version {version} of {self.root} can no longer be loaded ({exc}); its log was "
                "probably cleaned up. Set failOnDataLoss=false to skip it"
            ) from None
        actions = pa.table(table.get_add_actions(flatten=False))
        columns = actions.column_names
        paths = actions.column("path").to_pylist()
        sizes = actions.column("size_bytes").to_pylist()
        times = actions.column("modification_time").to_pylist()
        parts = actions.column("partition").to_pylist() if "partition" in columns else [None] * len(paths)
        files = [
            DataFile(_relative_path(p), int(s or 0), int(t or 0), tuple(sorted((pv or {}).items())))
            for p, s, t, pv in zip(paths, sizes, times, parts)
        ]
        files.sort(key=lambda f: (f.modification_time, f.path))
        self._snapshots = {version: tuple(files)}  # one snapshot per stream
        return self._snapshots[version]

    def exists(self, file: DataFile) -> bool:
        if self.filesystem is None:
            return os.path.exists(file.location(self.root))
        import pyarrow.fs as pafs

        return self.filesystem.get_file_info(store_path(file.location(self.root))).type != pafs.FileType.NotFound

    # -- the store ---------------------------------------------------------------------
    @property
    def filesystem(self):
        """The pyarrow filesystem of a table on an object store; None on the local one."""
        if self._fs is None and "://" in self.root:
            from streamlake.storage.location import arrow_filesystem

            self._fs = arrow_filesystem(self.storage)[0]
        return self._fs

    def _is_dir(self, path: str) -> bool:
        if self.filesystem is None:
            return os.path.isdir(path)
        import pyarrow.fs as pafs

        return self.filesystem.get_file_info(store_path(path)).type == pafs.FileType.Directory

    def actions(self, version: int) -> list[dict]:
        """The actions of commit ``version``, parsed. Raises FileNotFoundError if its file does
        not exist (never written, or cleaned up)."""
        return [json.loads(line) for line in self._read(commit_file(self.root, version)).decode("utf-8").splitlines()
                if line.strip()]

    def file_exists(self, path: str) -> bool:
        """Whether a data file (a path, or a URI of this table's store) still exists."""
        if self.filesystem is None:
            return os.path.exists(path)
        import pyarrow.fs as pafs

        return self.filesystem.get_file_info(store_path(path)).type != pafs.FileType.NotFound

    def commit_info(self, version: int) -> dict:
        """The ``commitInfo`` action of commit ``version`` ({} if it has none). Raises
        FileNotFoundError if that commit's file does not exist (never written, or cleaned up)."""
        return next((a["commitInfo"] or {} for a in self.actions(version) if "commitInfo" in a), {})

    def _read(self, path: str) -> bytes:
        """The bytes of a log file. Raises FileNotFoundError if it does not exist."""
        if self.filesystem is None:
            with open(path, "rb") as fh:
                return fh.read()
        return read_object(self.filesystem, store_path(path))

    # -- the walk --------------------------------------------------------------------
    def _missing_file(self, version: int, file: DataFile) -> DataLossError:
        return DataLossError(
            f"version {version} of {self.root}: file {file.path} no longer exists (removed by VACUUM "
            "or by hand), so the stream cannot read it. Set failOnDataLoss=false to skip lost files "
            "and versions (their rows are then missing from the stream)"
        )

    def _files(self, version: int, files: tuple[DataFile, ...], after: int, starting: bool,
               settings: ScanSettings) -> Iterator[ScanEvent]:
        for i, file in enumerate(files):
            if i <= after:
                continue
            position = Position(version, i, starting)
            if not self.exists(file):
                error = self._missing_file(version, file)
                if settings.fail_on_data_loss:
                    yield ScanBlocked(position, error)
                    return
                log.warning("%s; skipping it (failOnDataLoss=false)", error)
                continue
            yield ScanFile(position, file)

    def _change_error(self, commit: Commit, at: Position) -> ChangeCommitError:
        what = commit.operation or "a commit that removes data"
        detail = ""
        if commit.operation == "RESTORE" and commit.restore_to is not None:
            detail = (
                f" It restores version {commit.restore_to}, but this stream is not positioned exactly "
                f"after version {commit.restore_to} (it is at version {at.version}"
                + (f", file {at.index + 1}" if at.index >= 0 else "")
                + "), so the restore removes rows the stream has already emitted."
            )
        return ChangeCommitError(
            f"Detected a data update ({what}) in the source table {self.root} at version {commit.version}."
            f"{detail} streamlake-delta, like Delta's streaming source, only streams appends. To skip "
            "commits that change existing data, set the option skipChangeCommits=true (the whole "
            "commit is skipped, including any rows it adds); to pick up the table as it is now, "
            "start a new query with a new checkpoint."
        )

    def scan(self, start: Position, horizon: int, restore_bound: int,
             settings: ScanSettings) -> Iterator[ScanEvent]:
        """Walk the stream from ``start`` through version ``horizon`` (see the module
        docstring). RESTORE commits up to ``restore_bound`` are considered for the
        restore rule. The walk stops after a ScanBlocked event."""
        version, index, starting = start
        if starting:
            try:
                files = self.snapshot(version)
            except DataLossError as exc:
                if settings.fail_on_data_loss:
                    yield ScanBlocked(Position(version, index, True), exc)
                    return
                log.warning("%s; skipping it (failOnDataLoss=false)", exc)
                files = ()
            for event in self._files(version, files, index, True, settings):
                yield event
                if isinstance(event, ScanBlocked):
                    return
            version, index = version + 1, -1
            yield ScanBoundary(version)
        while True:
            if index < 0:
                restore = self.restore_jump(version, restore_bound)
                if restore is not None:
                    log.info("%s: versions %d..%d restore the table to version %d, where this stream "
                             "stands; continuing at version %d", self.root, version, restore,
                             version - 1, restore + 1)
                    version = restore + 1
                    yield ScanBoundary(version)
                    continue
            if version > horizon:
                return
            at = Position(version, index, False)
            commit = self.commit(version)
            if commit is None:
                error = DataLossError(
                    f"version {version} of {self.root}: commit file {commit_file(self.root, version)} "
                    "no longer exists (log cleanup), so the stream cannot read that version. Set "
                    "failOnDataLoss=false to skip lost versions (their rows are then missing from the stream)"
                )
                if settings.fail_on_data_loss:
                    yield ScanBlocked(at, error)
                    return
                log.warning("%s; skipping it (failOnDataLoss=false)", error)
                version, index = version + 1, -1
                yield ScanBoundary(version)
                continue
            if commit.schema_string and self.schema is not None and not schema_compatible(
                    commit.schema_string, self.schema):
                yield ScanBlocked(at, SchemaChangedError(
                    f"the schema of {self.root} changed at version {version} in a way the running query "
                    f"cannot read (query schema {self.schema.simpleString()}). Restart the query: it then "
                    "reads with the table's new schema"
                ))
                return
            skip = False
            if commit.is_change:
                if commit.is_delete_only and settings.ignore_deletes:
                    log.info("%s: skipping version %d (%s, ignoreDeletes=true)", self.root, version,
                             commit.operation)
                    skip = True
                elif settings.skip_change_commits:
                    log.info("%s: skipping version %d (%s, skipChangeCommits=true)", self.root, version,
                             commit.operation)
                    skip = True
                else:
                    yield ScanBlocked(at, self._change_error(commit, at))
                    return
            if not skip:
                if commit.deletion_vectors:
                    yield ScanBlocked(at, UnsupportedTableError(
                        f"version {version} of {self.root} adds files with deletion vectors, which "
                        "streamlake-delta cannot apply"
                    ))
                    return
                for event in self._files(version, commit.files, index, False, settings):
                    yield event
                    if isinstance(event, ScanBlocked):
                        return
            version, index = version + 1, -1
            yield ScanBoundary(version)
