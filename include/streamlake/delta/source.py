"""Delta streaming source for Spark, on Spark 4's Python Data Source API.

``readStream.format("delta")`` needs Delta's JVM jars, which cannot be
installed here; this source reads the same tables with delta-rs and the log's
JSON commit files, and mirrors delta-spark's streaming source. Usage::

    from streamlake.delta.source import register
    register(spark)
    df = (spark.readStream.format("streamlake-delta")
          .option("maxFilesPerTrigger", 100)
          .load("/lake/bronze/sensors"))          # or .option("path", ...)

The schema is the table's schema when the query starts (partition columns
included, with their declared types).

``spark.read.format("streamlake-delta")`` reads one snapshot the same way
(``versionAsOf``: that version, else the latest; ``files``: a JSON list of
some of its files, relative to the table): how the platform reads tables on
an object store, where Spark's Parquet reader would need the s3a connector.

Options (names as in delta-spark; unknown options are an error):

``startingVersion``
    an int: stream the commits from that version on (no snapshot); ``latest``:
    only commits after the latest version. Without a starting option the first
    micro-batches read the snapshot of the version current when the query
    starts (all its files), then every later commit, as delta-spark does.
    Starting options only apply to a new checkpoint. (``latest`` is resolved
    when the query starts, as in delta-spark: if the first micro-batch never
    completed, a restart resolves it again. Spark runs a first micro-batch
    even when it is empty.)
``startingTimestamp``
    the first commit at or after this time (ISO date or timestamp, UTC unless
    it has a zone), as delta-spark does.
``maxFilesPerTrigger`` (default 1000 unless only ``maxBytesPerTrigger`` is set), ``maxBytesPerTrigger``
    admission control: files per micro-batch, and a soft byte limit (a batch
    takes files while it is under the limit, so always at least one file).
    Both hold under processing-time and available-now triggers (available-now
    reads up to the version current when the query starts).
``skipChangeCommits`` (default false)
    skip commits that remove or rewrite data entirely (see below).
``ignoreDeletes`` (default false)
    skip commits that only remove data (no rows added), as delta-spark does.
``failOnDataLoss`` (default true)
    whether a lost commit or data file is an error (see below).
``minPartitions``
    spread each micro-batch over at least this many Spark tasks when it has
    that many files (default: the driver's core count), like the Kafka source.
``startingOffset`` (StreamLake)
    a full offset (the JSON below): a new query starts exactly there, also inside
    a version or a snapshot. The pipeline resumes a stage whose checkpoint was
    lost from the position its own Delta commits recorded.
``storage.<KEY>`` (StreamLake)
    a storage option of a table on an object store (``s3://...``), such as
    ``storage.AWS_ENDPOINT_URL``; the driver and every task also read the
    store's environment variables (``AWS_*``), which is where credentials go:
    a secret given as an option is refused (options show in query plans).
``waitForCommitMs`` (StreamLake, default: no wait)
    when the stream has read every commit, wait up to this long for the table's next
    commit before answering that nothing is new (a local table: a look for its log entry
    every 10 ms; a table on an object store is not waited for). Under a processing-time
    trigger of 0 a micro-batch then starts within ~10 ms of the upstream's commit, where
    a trigger of its own would add half its interval on average, and an idle query asks
    once per wait instead of once per trigger. The wait shows in the progress's
    ``latestOffset`` duration.
``includeCommitVersion`` (StreamLake, default false)
    add a ``_commit_version`` column: the version whose commit added the row's
    file (for rows of a starting snapshot, the snapshot's version), as Delta's
    change data feed names it. Pipeline stages keep it as lineage.

What streams
------------

Offsets mirror delta-spark's ``DeltaSourceOffset``: ``{"sourceVersion": 1,
"reservoirId": <table id>, "reservoirVersion": v, "index": i,
"isStartingVersion": b}``. With ``isStartingVersion=false`` it means: every
commit before ``v`` is consumed, and of commit ``v`` the data files with index
``<= i`` (``i = -1``: the stream is exactly at the start of version ``v``);
with ``isStartingVersion=true`` the stream is reading the snapshot of version
``v`` and has read its files with index ``<= i``. Once a version's last file is
consumed the offset moves to ``(v + 1, -1)``. A query with no starting option
starts at ``reservoirVersion = -1`` ("snapshot, version not chosen yet"); its
first micro-batch fixes the snapshot version in its end offset, and batches
that read the snapshot never also read later commits, so a replayed first
batch reads the same snapshot. :func:`covered_versions` says which versions a
batch covers; a pipeline that records the last version it consumed completely
resumes from the table alone with ``startingVersion = consumed + 1``
(:func:`starting_options_after`).

* **Appends** stream: each commit's ``add`` actions with ``dataChange=true``, in
  order, each file once.
* **No data change**: a commit whose actions all have ``dataChange=false``
  (``optimize.compact``, Z-order) or that has no file actions (vacuum, property
  changes) is skipped silently.
* **Change commits**: a commit with ``remove`` actions with ``dataChange=true``
  (delete, overwrite, merge, update) or a RESTORE stops the query with an error
  naming the table and the version and saying how to skip it, unless
  ``skipChangeCommits=true``, which skips such commits entirely (also the rows
  they add), or ``ignoreDeletes=true`` for commits that only delete. Files of
  the versions before it are streamed first; the error comes when the stream
  reaches the commit.
* **Restores by the platform** (the rule that makes pipeline restores work): a
  RESTORE commit at version ``r`` that restores version ``X`` (delta-rs writes
  ``operationParameters.version``; the platform also writes
  ``{"streamlake": {"operation": "restore", "toVersion": X}}`` into the commit
  info) is **not** a change for a stream positioned exactly at the start of
  version ``X + 1``, i.e. that has consumed everything up to and including
  ``X`` and nothing after: the table at ``r`` equals the table at ``X``, so
  versions ``X + 1 .. r`` add up to nothing and the stream continues at
  ``r + 1`` (with several such restores, after the latest one). The platform's
  restore resets downstream checkpoints to exactly such a position. At any
  other position the restore removes rows the stream already emitted (or
  re-adds rows it already read), so it is a change commit as above.
* **Lost versions or files**: a version whose commit file is gone (log
  cleanup) or whose data files are gone (vacuum) fails the query with
  ``version V of TABLE: file F no longer exists ... set failOnDataLoss=false to
  skip`` under ``failOnDataLoss=true``; otherwise the lost commit or file is
  skipped with a warning.
* **Schema changes**: a commit whose schema has a column the query does not
  know, or a different type, fails the query (restart it to read the new
  schema); added columns read as null from older files.

Not supported (clear errors): tables with column mapping or deletion vectors,
object-store paths (the platform's tables are on a local or shared filesystem).
Files are the unit of work: a micro-batch's files are grouped into input
partitions of bounded size (Spark's ``maxPartitionBytes``/``openCostInBytes``
rule), a file is never split.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from streamlake.data_sources import freeze_heap_after
from streamlake.delta.log import (
    DataFile,
    DeltaLog,
    Position,
    ScanBlocked,
    ScanBoundary,
    ScanFile,
    ScanSettings,
    table_root,
)
from streamlake.errors import DataLossError, InvalidOptionError, StreamLakeError
from streamlake.storage.location import is_secret

log = logging.getLogger(__name__)

FORMAT = "streamlake-delta"
DEFAULT_MAX_FILES_PER_TRIGGER = 1000
MAX_PARTITION_BYTES = 128 * 1024 * 1024  # spark.sql.files.maxPartitionBytes
OPEN_COST_BYTES = 4 * 1024 * 1024        # spark.sql.files.openCostInBytes
_KNOWN_OPTIONS = {
    "path", "startingversion", "startingtimestamp", "maxfilespertrigger", "maxbytespertrigger",
    "skipchangecommits", "ignoredeletes", "failondataloss", "minpartitions", "startingoffset",
    "includecommitversion", "versionasof", "files", "waitforcommitms",
}
COMMIT_VERSION_COLUMN = "_commit_version"
_BYTE_UNITS = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


class TableChangedError(StreamLakeError):
    """The offsets belong to another table than the one at the path (replaced table)."""


# -- offsets ---------------------------------------------------------------------------

@dataclass(frozen=True)
class DeltaSourceOffset:
    """A stream position, serialized like delta-spark's DeltaSourceOffset (see the module
    docstring). ``reservoir_version = -1`` with ``is_starting_version`` is the initial
    offset of a query with no starting option (snapshot version not chosen yet)."""

    reservoir_id: str
    reservoir_version: int
    index: int = -1
    is_starting_version: bool = False
    source_version: int = 1

    @property
    def unresolved(self) -> bool:
        return self.reservoir_version < 0

    @property
    def position(self) -> Position:
        return Position(self.reservoir_version, self.index, self.is_starting_version)

    def to_dict(self) -> dict:
        return {
            "sourceVersion": self.source_version,
            "reservoirId": self.reservoir_id,
            "reservoirVersion": self.reservoir_version,
            "index": self.index,
            "isStartingVersion": self.is_starting_version,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, value: str | Mapping) -> DeltaSourceOffset:
        """Parse an offset (JSON text or the dict Spark hands the reader)."""
        try:
            data = json.loads(value) if isinstance(value, (str, bytes)) else dict(value)
            if int(data["sourceVersion"]) != 1:
                raise InvalidOptionError(
                    f"unsupported Delta source offset version {data['sourceVersion']} in {value!r}"
                )
            return cls(
                reservoir_id=str(data["reservoirId"]),
                reservoir_version=int(data["reservoirVersion"]),
                index=int(data["index"]),
                is_starting_version=bool(data["isStartingVersion"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidOptionError):
                raise
            raise InvalidOptionError(f"not a streamlake-delta offset: {value!r} ({exc})") from None

    @classmethod
    def at(cls, reservoir_id: str, position: Position) -> DeltaSourceOffset:
        return cls(reservoir_id, position.version, position.index, position.starting)


@dataclass(frozen=True)
class VersionCoverage:
    """Which table versions the offset range ``(start, end]`` covers.

    ``fully``: versions the range holds entirely (every data file of the version is
    in the range; skipped versions count as covered). ``partly``: versions only
    some of whose files are in the range (admission control split them).
    ``consumed_through``: the last version consumed completely at ``end`` (None
    while the stream is still inside its starting snapshot, or before version 0).
    ``snapshot``: the version whose snapshot the range reads, if any (the snapshot
    counts as that version in ``fully``/``partly``).
    """

    fully: range
    partly: tuple[int, ...]
    consumed_through: int | None
    snapshot: int | None = None


def consumed_through(offset: DeltaSourceOffset | Mapping | str) -> int | None:
    """Last table version a stream at ``offset`` has consumed completely."""
    off = offset if isinstance(offset, DeltaSourceOffset) else DeltaSourceOffset.from_json(offset)
    if off.is_starting_version or off.reservoir_version < 1:
        return None
    return off.reservoir_version - 1


def _resolve_start(start: DeltaSourceOffset, end: DeltaSourceOffset) -> Position:
    """A concrete start position; an unresolved initial offset takes its snapshot version
    from the end offset (snapshot batches never extend past the snapshot)."""
    if not start.unresolved:
        return start.position
    if end.is_starting_version:
        return Position(end.reservoir_version, -1, True)
    if end.index != -1:
        raise ValueError(f"end offset {end.to_json()} cannot follow an initial snapshot offset")
    return Position(end.reservoir_version - 1, -1, True)


def covered_versions(start: DeltaSourceOffset | Mapping | str,
                     end: DeltaSourceOffset | Mapping | str) -> VersionCoverage:
    """Pure function: the versions a micro-batch ``(start, end]`` covers fully or partly.

    A pipeline records ``consumed_through`` with its output (for example as a ``txn``
    action in its own Delta commit): a replayed batch then commits nothing, and a
    lost checkpoint resumes from the table with :func:`starting_options_after`.
    """
    s = start if isinstance(start, DeltaSourceOffset) else DeltaSourceOffset.from_json(start)
    e = end if isinstance(end, DeltaSourceOffset) else DeltaSourceOffset.from_json(end)
    done = consumed_through(e)
    if s == e or e.unresolved:
        return VersionCoverage(range(0), (), done if not e.unresolved else None)
    pos = _resolve_start(s, e)
    if e.is_starting_version and not pos.starting:
        raise ValueError(f"end offset {e.to_json()} is inside a snapshot but start {s.to_json()} is not")
    if (pos.version, pos.index) > (e.reservoir_version, e.index):
        raise ValueError(f"end offset {e.to_json()} is before start offset {s.to_json()}")
    first_full = pos.version + (1 if pos.index >= 0 else 0)
    fully = range(first_full, max(first_full, e.reservoir_version))
    partly = set()
    if pos.index >= 0:
        partly.add(pos.version)
    if e.index >= 0:
        partly.add(e.reservoir_version)
    return VersionCoverage(fully, tuple(sorted(partly)), done, pos.version if pos.starting else None)


def starting_options_after(version: int) -> dict[str, str]:
    """Options for a new query that continues after ``version`` was consumed completely
    (resuming without a checkpoint): ``startingVersion = version + 1``."""
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return {"startingVersion": str(version + 1)}


# -- options ---------------------------------------------------------------------------

def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise InvalidOptionError(f"{name} must be true or false, got {raw!r}")
    return value == "true"


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidOptionError(f"{name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise InvalidOptionError(f"{name} must be a positive integer, got {value}")
    return value


def parse_bytes(raw: str) -> int:
    """``1048576``, ``512k``, ``10m``, ``1g`` (binary units, as Spark reads byte sizes)."""
    text = str(raw).strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits):] or "b"
    if not digits.isdigit() or unit not in _BYTE_UNITS:
        raise InvalidOptionError(f"maxBytesPerTrigger must be a size such as 1048576, 512k, 10m or 1g, got {raw!r}")
    value = int(digits) * _BYTE_UNITS[unit]
    if value <= 0:
        raise InvalidOptionError(f"maxBytesPerTrigger must be positive, got {raw!r}")
    return value


def _version(raw) -> int | None:
    if raw is None:
        return None
    try:
        version = int(str(raw).strip())
    except ValueError:
        version = -1
    if version < 0:
        raise InvalidOptionError(f"versionAsOf must be a version >= 0, got {raw!r}")
    return version


def _timestamp_ms(raw: str) -> int:
    from datetime import datetime, timezone

    try:
        parsed = datetime.fromisoformat(str(raw).strip())
    except ValueError:
        raise InvalidOptionError(
            f"startingTimestamp must be an ISO date or timestamp such as 2026-01-31 or "
            f"2026-01-31T12:00:00Z, got {raw!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp() * 1000)


@dataclass(frozen=True)
class DeltaSourceOptions:
    """Validated source options. Raises InvalidOptionError naming the bad option."""

    path: str
    starting_version: int | str | None = None  # int, "latest" or None
    starting_timestamp_ms: int | None = None
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    skip_change_commits: bool = False
    ignore_deletes: bool = False
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    starting_offset: DeltaSourceOffset | None = None
    include_commit_version: bool = False
    storage: dict[str, str] = field(default_factory=dict)  # storage options without secrets
    version_as_of: int | None = None  # batch reads: this snapshot (None: the latest)
    files: tuple[str, ...] | None = None  # batch reads: only these of the snapshot's files (relative paths)
    wait_for_commit_ms: int = 0

    @property
    def settings(self) -> ScanSettings:
        return ScanSettings(self.skip_change_commits, self.ignore_deletes, self.fail_on_data_loss)

    @property
    def max_files(self) -> int | None:
        """delta-spark: 1000 files by default, unless only maxBytesPerTrigger is given."""
        if self.max_files_per_trigger is not None:
            return self.max_files_per_trigger
        return None if self.max_bytes_per_trigger is not None else DEFAULT_MAX_FILES_PER_TRIGGER

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> DeltaSourceOptions:
        opts = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(k for k in opts if k not in _KNOWN_OPTIONS and not k.startswith("storage."))
        if unknown:
            raise InvalidOptionError(
                f"unknown option(s) {', '.join(unknown)} for format {FORMAT!r}; known: path, "
                "startingVersion, startingTimestamp, maxFilesPerTrigger, maxBytesPerTrigger, "
                "skipChangeCommits, ignoreDeletes, failOnDataLoss, minPartitions, startingOffset, "
                "includeCommitVersion, waitForCommitMs; batch reads: versionAsOf, files"
            )
        path = opts.get("path")
        if not path or not str(path).strip():
            raise InvalidOptionError(
                f"format {FORMAT!r} needs the table path: .load(path) or .option('path', path)"
            )
        starting: int | str | None = None
        raw = opts.get("startingversion")
        if raw is not None:
            text = str(raw).strip().lower()
            if text == "latest":
                starting = "latest"
            else:
                try:
                    starting = int(text)
                except ValueError:
                    starting = -1
                if starting < 0:
                    raise InvalidOptionError(f"startingVersion must be a version >= 0 or 'latest', got {raw!r}")
        ts = opts.get("startingtimestamp")
        offset = opts.get("startingoffset")
        if sum(x is not None for x in (raw, ts, offset)) > 1:
            raise InvalidOptionError("give at most one of startingVersion, startingTimestamp and startingOffset")
        max_bytes = opts.get("maxbytespertrigger")
        storage = {str(k)[len("storage."):]: str(v) for k, v in options.items() if str(k).lower().startswith("storage.")}
        secret = sorted(k for k in storage if is_secret(k))
        if secret:
            raise InvalidOptionError(f"storage option(s) {', '.join(secret)} hold credentials: set them as environment "
                                     "variables of the driver and the executors, not as source options")
        return cls(
            path=table_root(str(path).strip()),
            starting_version=starting,
            starting_timestamp_ms=_timestamp_ms(ts) if ts is not None else None,
            max_files_per_trigger=_positive_int(opts, "maxFilesPerTrigger"),
            max_bytes_per_trigger=parse_bytes(max_bytes) if max_bytes is not None else None,
            skip_change_commits=_bool(opts, "skipChangeCommits", False),
            ignore_deletes=_bool(opts, "ignoreDeletes", False),
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            min_partitions=_positive_int(opts, "minPartitions"),
            starting_offset=DeltaSourceOffset.from_json(offset) if offset is not None else None,
            include_commit_version=_bool(opts, "includeCommitVersion", False),
            storage=storage,
            version_as_of=_version(opts.get("versionasof")),
            files=tuple(json.loads(opts["files"])) if opts.get("files") is not None else None,
            wait_for_commit_ms=_positive_int(opts, "waitForCommitMs") or 0,
        )


class AdmissionLimits:
    """delta-spark's admission control: a file is admitted while both the file and the
    byte budget are positive, so the byte limit is soft (at least one file per batch)."""

    def __init__(self, max_files: int | None = None, max_bytes: int | None = None):
        self.files_left = max_files
        self.bytes_left = max_bytes

    def admit(self, size: int) -> bool:
        if (self.files_left is not None and self.files_left <= 0) or (
                self.bytes_left is not None and self.bytes_left <= 0):
            return False
        if self.files_left is not None:
            self.files_left -= 1
        if self.bytes_left is not None:
            self.bytes_left -= size
        return True


# -- planning --------------------------------------------------------------------------

def group_files(files: Sequence[DataFile], min_partitions: int,
                max_bytes: int = MAX_PARTITION_BYTES, open_cost: int = OPEN_COST_BYTES) -> list[list[DataFile]]:
    """Split a micro-batch's files, in order, into groups for Spark tasks: Spark's file
    split rule (each file costs its size plus an open cost; a group holds up to
    ``min(maxPartitionBytes, max(openCost, total / minPartitions))``)."""
    if not files:
        return []
    total = sum(f.size + open_cost for f in files)
    split = min(max_bytes, max(open_cost, total // max(1, min_partitions)))
    groups: list[list[DataFile]] = []
    current: list[DataFile] = []
    size = 0
    for f in files:
        cost = f.size + open_cost
        if current and size + cost > split:
            groups.append(current)
            current, size = [], 0
        current.append(f)
        size += cost
    groups.append(current)
    return groups


class DeltaInputPartition(InputPartition):
    """One Spark task: some data files of the table (with the version that added each), in order."""

    def __init__(self, root: str, files: Sequence[DataFile], versions: Sequence[int] = (),
                 storage: Mapping[str, str] | None = None):
        super().__init__(len(files))
        self.root = root
        self.files = tuple(files)
        self.versions = tuple(versions)
        self.storage = dict(storage or {})  # without secrets: a task reads those from its environment


def read_files(root: str, files: Sequence[DataFile], schema, fail_on_data_loss: bool = True,
               versions: Sequence[int] = (), storage: Mapping[str, str] | None = None) -> Iterator:
    """Executor side: the rows of ``files`` as pyarrow RecordBatches in ``schema`` (a Spark
    StructType), partition columns filled from the files' partition values and, when the
    schema has it, ``_commit_version`` from ``versions`` (one per file). A table on an
    object store is read with ``storage`` plus the task's environment (credentials)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    from streamlake.delta.log import store_path
    from streamlake.storage.location import arrow_filesystem, storage_options

    target = to_arrow_schema(schema, timezone="UTC")
    fs = arrow_filesystem(storage_options(root, storage or {}))[0] if "://" in root else None
    for number, file in enumerate(files):
        path = file.location(root)
        try:
            parquet = pq.ParquetFile(path) if fs is None else pq.ParquetFile(fs.open_input_file(store_path(path)))
        except FileNotFoundError:
            message = (f"{root}: file {file.path} no longer exists (removed by VACUUM?). Set "
                       "failOnDataLoss=false to skip lost files")
            if fail_on_data_loss:
                raise DataLossError(message) from None
            log.warning("%s; skipping it (failOnDataLoss=false)", message)
            continue
        partition = dict(file.partition_values)
        present = set(parquet.schema_arrow.names)
        columns = [n for n in target.names if n in present and n not in partition]
        for batch in parquet.iter_batches(columns=columns):
            n = batch.num_rows
            arrays = []
            for field in target:
                if field.name == COMMIT_VERSION_COLUMN:
                    arrays.append(pa.array([versions[number]] * n, type=field.type))
                elif field.name in partition:
                    arrays.append(pa.array([partition[field.name]] * n, type=field.type))
                elif field.name in columns:
                    column = batch.column(field.name)
                    arrays.append(column if column.type == field.type else column.cast(field.type))
                else:
                    arrays.append(pa.nulls(n, type=field.type))
            yield pa.RecordBatch.from_arrays(arrays, schema=target)


def read_batch_on_driver(spark, path: str, schema, start: Mapping, end: Mapping, options: Mapping[str, str],
                         max_bytes: int):
    """Micro-batch ``(start, end]`` (offsets as Spark hands them to ``foreachBatch``'s query) of
    the stream of the table at ``path``, read here, on the driver, into a local relation:
    ``(DataFrame, rows)``, or None when its data files hold more than ``max_bytes`` (Spark's
    tasks read it then, from the stream's own DataFrame).

    The same files and rows as the source's tasks: the same plan
    (:meth:`DeltaStreamReader.plan_versioned_files`, under the query's ``options``) and the
    same reader (:func:`read_files`), in ``schema``, the stream's own. A small batch saves
    what a task of a Python data source costs (planning in a Python process, a Python
    worker, the rows through Arrow into the JVM): about 160 ms of a 200-row batch here,
    half of the job that reads it. Raises what those two raise (DataLossError,
    TableChangedError)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    opts = DeltaSourceOptions.parse({**options, "path": path})
    versioned = DeltaStreamReader(opts, schema).plan_versioned_files(start, end)
    if sum(f.size for f, _ in versioned) > max_bytes:
        return None
    target = to_arrow_schema(schema, timezone="UTC")
    batches = list(read_files(opts.path, [f for f, _ in versioned], schema, opts.fail_on_data_loss,
                              [v for _, v in versioned], opts.storage))
    # an empty batch as one empty chunk per column: pyspark cannot convert columns of none
    table = pa.Table.from_batches(batches, schema=target) if batches else target.empty_table()
    return spark.createDataFrame(table, schema=schema), table.num_rows


# -- Spark -----------------------------------------------------------------------------

class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's view of the source. Driver methods walk the log with
    :class:`streamlake.delta.log.DeltaLog`; ``read`` runs on executors.

    Construction is cheap and opens nothing: Spark builds extra instances only to
    pickle ``read``.
    """

    def __init__(self, options: DeltaSourceOptions, schema):
        self.options = options
        self.schema = schema
        self._log: DeltaLog | None = None
        self._target: int | None = None
        self._latest: DeltaSourceOffset | None = None

    def __getstate__(self) -> dict:
        return {"options": self.options, "schema": self.schema, "_log": None, "_target": None, "_latest": None}

    @property
    def delta_log(self) -> DeltaLog:
        if self._log is None:
            self._log = DeltaLog(self.options.path, self.schema, self.options.storage)
        return self._log

    def _offset(self, raw, what: str) -> DeltaSourceOffset:
        offset = DeltaSourceOffset.from_json(raw)
        table_id = self.delta_log.table_id
        if offset.reservoir_id != table_id:
            raise TableChangedError(
                f"the {what} {offset.to_json()} belongs to Delta table id {offset.reservoir_id}, but "
                f"{self.options.path} is now table id {table_id} (the table was deleted and recreated?). "
                "Start a new query with a new checkpoint"
            )
        return offset

    def initialOffset(self) -> dict:
        dl = self.delta_log
        latest = dl.refresh()
        table_id = dl.table_id
        o = self.options
        if o.starting_version == "latest":
            return DeltaSourceOffset(table_id, latest + 1).to_dict()
        if isinstance(o.starting_version, int):
            if o.starting_version > latest + 1:
                raise InvalidOptionError(
                    f"startingVersion {o.starting_version} is after the latest version {latest} of "
                    f"{o.path} (at most {latest + 1}: the next commit)"
                )
            return DeltaSourceOffset(table_id, o.starting_version).to_dict()
        if o.starting_timestamp_ms is not None:
            return DeltaSourceOffset(table_id, dl.version_at_or_after(o.starting_timestamp_ms)).to_dict()
        if o.starting_offset is not None:
            return self._offset(o.starting_offset.to_dict(), "startingOffset").to_dict()
        return DeltaSourceOffset(table_id, -1, -1, True).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_files is not None:
            return ReadMaxFiles(o.max_files)
        return ReadMaxBytes(o.max_bytes_per_trigger)

    def _limits(self, limit: ReadLimit) -> AdmissionLimits:
        o = self.options
        if isinstance(limit, ReadAllAvailable):
            return AdmissionLimits()
        if isinstance(limit, ReadMaxFiles):
            return AdmissionLimits(limit.max_files, o.max_bytes_per_trigger)
        if isinstance(limit, ReadMaxBytes):
            return AdmissionLimits(o.max_files_per_trigger, limit.max_bytes)
        raise InvalidOptionError(f"unsupported read limit {limit!r} for format {FORMAT!r}")

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.delta_log.refresh()
        log.info("%s: available-now target version %d", self.options.path, self._target)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        dl = self.delta_log
        begin = self._offset(start, "start offset")
        latest = dl.refresh()
        caught_up = not begin.is_starting_version and begin.index < 0 and begin.reservoir_version > latest
        if caught_up and self._target is None and self.options.wait_for_commit_ms:
            if dl.wait_for_version(latest + 1, self.options.wait_for_commit_ms / 1000):
                latest = dl.refresh()
        self._latest = DeltaSourceOffset(begin.reservoir_id, latest + 1)
        horizon = latest if self._target is None else min(self._target, latest)
        position = begin.position
        in_snapshot = position.starting
        if begin.unresolved:
            position = Position(horizon, -1, True)
        limits = self._limits(limit)
        end: Position | None = None
        admitted = 0
        for event in dl.scan(position, horizon, horizon, self.options.settings):
            if isinstance(event, ScanBlocked):
                if admitted:
                    break
                raise event.error
            if isinstance(event, ScanFile):
                if not limits.admit(event.file.size):
                    break
                admitted += 1
                end = event.position
            elif isinstance(event, ScanBoundary):
                if admitted or in_snapshot:
                    end = event.position
                if in_snapshot:
                    break  # a snapshot batch never reads later commits (see _resolve_start)
        if end is None:
            return begin.to_dict()
        return DeltaSourceOffset.at(begin.reservoir_id, end).to_dict()

    def reportLatestOffset(self) -> dict | None:
        return self._latest.to_dict() if self._latest is not None else None

    def plan_files(self, start: dict, end: dict) -> list[DataFile]:
        """The data files of the micro-batch ``(start, end]``, in stream order."""
        return [f for f, _version in self.plan_versioned_files(start, end)]

    def plan_versioned_files(self, start: dict, end: dict) -> list[tuple[DataFile, int]]:
        """The data files of the micro-batch ``(start, end]`` with the version each came from."""
        s = self._offset(start, "start offset")
        e = self._offset(end, "end offset")
        if s == e:
            return []
        position = _resolve_start(s, e)
        stop = (e.reservoir_version, e.index)
        horizon = e.reservoir_version if e.index >= 0 else e.reservoir_version - 1
        files: list[tuple[DataFile, int]] = []
        for event in self.delta_log.scan(position, horizon, e.reservoir_version - 1, self.options.settings):
            if isinstance(event, ScanFile):
                p = event.position
                if e.is_starting_version:
                    if not p.starting or p.index > e.index:
                        break
                elif not p.starting and (p.version, p.index) > stop:
                    break
                files.append((event.file, p.version))
            elif isinstance(event, ScanBoundary):
                if not e.is_starting_version and e.index < 0 and event.version >= e.reservoir_version:
                    break
            else:
                raise event.error
        return files

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        versioned = self.plan_versioned_files(start, end)
        version_of = {id(f): v for f, v in versioned}
        min_partitions = self.options.min_partitions or os.cpu_count() or 1
        groups = group_files([f for f, _ in versioned], min_partitions) or [[]]
        return [DeltaInputPartition(self.options.path, g, [version_of[id(f)] for f in g], self.options.storage)
                for g in groups]

    def read(self, partition: InputPartition) -> Iterator:
        return freeze_heap_after(read_files(partition.root, partition.files, self.schema,
                                            self.options.fail_on_data_loss, partition.versions, partition.storage))

    def commit(self, end: dict) -> None:
        # Nothing to acknowledge: positions live in Spark's offset log (and in the
        # consumer's own Delta commits). Spark calls this late (see DESIGN.md).
        pass

    def stop(self) -> None:
        self._log = None


class DeltaDataSource(DataSource):
    """``spark.readStream.format("streamlake-delta")``, and ``spark.read`` of one snapshot."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self):
        from pyspark.sql.types import LongType, StructField

        options = DeltaSourceOptions.parse(self.options)
        dl = DeltaLog(options.path, storage=options.storage)
        dl.check_readable()
        schema = dl.spark_schema()
        if options.include_commit_version:
            schema = schema.add(StructField(COMMIT_VERSION_COLUMN, LongType(), False))
        return schema

    def reader(self, schema) -> DataSourceReader:
        return DeltaBatchReader(DeltaSourceOptions.parse(self.options), schema)

    def streamReader(self, schema) -> DataSourceStreamReader:
        options = DeltaSourceOptions.parse(self.options)
        DeltaLog(options.path, storage=options.storage).check_readable()  # wrong path: fail when the query starts
        return DeltaStreamReader(options, schema)


class DeltaBatchReader(DataSourceReader):
    """``spark.read.format("streamlake-delta")``: one snapshot of the table (the latest, or
    ``versionAsOf``), or only the snapshot's ``files`` (a JSON list of paths relative to the
    table), spread over Spark tasks as a micro-batch is; ``_commit_version`` (with
    ``includeCommitVersion``) is the snapshot's version. Raises DataLossError when that
    version can no longer be loaded, InvalidOptionError for a file not in the snapshot."""

    def __init__(self, options: DeltaSourceOptions, schema):
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        dl = DeltaLog(self.options.path, storage=self.options.storage)
        version = self.options.version_as_of if self.options.version_as_of is not None else dl.refresh()
        files = list(dl.snapshot(version))
        if self.options.files is not None:
            by_path = {f.path: f for f in files}
            missing = sorted(set(self.options.files) - set(by_path))
            if missing:
                raise InvalidOptionError(f"{self.options.path} version {version} has no file {missing[0]}"
                                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            files = [by_path[p] for p in self.options.files]
        groups = group_files(files, self.options.min_partitions or os.cpu_count() or 1) or [[]]
        return [DeltaInputPartition(self.options.path, g, [version] * len(g), self.options.storage) for g in groups]

    def read(self, partition: InputPartition) -> Iterator:
        return freeze_heap_after(read_files(partition.root, partition.files, self.schema,
                                            self.options.fail_on_data_loss, partition.versions, partition.storage))


def register(spark) -> None:
    """Register the source with a SparkSession (:func:`streamlake.data_sources.register_once`)."""
    from streamlake.data_sources import register_once

    register_once(spark, DeltaDataSource)
