"""Stages fed by a Delta table (silver from bronze, gold from silver), exactly once.

A stage is a Spark streaming query on the ``streamlake-delta`` source
(:mod:`streamlake.delta.source`) whose ``foreachBatch`` writes one or more
Delta tables. The guarantee is the bronze sink's, with a table position in
place of Kafka offsets:

* Every commit a stage makes carries, as a ``txn`` action, the position in the
  upstream table its micro-batch consumed up to
  (``streamlake:source:<upstream>``, :class:`SourcePosition` encoded in the
  txn version) and the query's batch id. A table already at or past a batch's
  end position has that batch: a replay commits nothing there.
* A table *behind* the batch's start would lose rows: :class:`PositionGapError`.
* A new query (no checkpoint, e.g. a lost one) starts exactly where the
  stage's tables say: the ``startingOffset`` of the source is the committed
  position; with no position at all it starts from the upstream's snapshot.
* Writes are the two-phase commit of :mod:`streamlake.delta.files`: Parquet
  files of an attempt, then one delta-rs commit from the snapshot that was
  checked; a concurrent commit of the same position (the job is locked, so
  only a backfill or an operator can race) makes it fail and re-plan.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import CommitProperties, Transaction

from streamlake.delta.files import add_actions, write_arrow_files, write_attempt_files
from streamlake.delta.table import MAX_COMMIT_ATTEMPTS, TableSpec, compact_small_files, ensure_table, open_table
from streamlake.delta.txn import commit_info, query_app_id
from streamlake.errors import CommitConflictError, PositionGapError
from streamlake.faults import crash_point
from streamlake.spark.checkpoint import QueryCheckpoint

log = logging.getLogger(__name__)

_INDEX_SPAN = 10_000_000  # files per version an encoded position can address
#: A stage's micro-batch whose upstream data files hold at most this many bytes is read on the
#: driver into a local relation (:func:`streamlake.delta.source.read_batch_on_driver`); a larger
#: one (a catch-up, a first batch of a big table) by Spark's tasks. Measured (2 cores): silver's
#: parse of a 200-row batch 310 ms read by a task of the Python source, 150 ms from the driver.
DRIVER_READ_MAX_BYTES = 8 << 20


def position_app_id(source: str) -> str:
    """``txn`` app id of the position a table consumed from the upstream table ``source``."""
    return f"streamlake:source:{source}"


@functools.total_ordering
@dataclass(frozen=True)
class SourcePosition:
    """A position in the ``streamlake-delta`` source's stream of a table.

    Mirrors Delta's streaming offset: ``version`` and the ``index`` of the next
    file inside it (-1: before its first file); ``starting`` marks positions
    inside the initial snapshot of ``version``. Ordered as the stream reads:
    the snapshot of ``v``, then the commits after ``v``.
    """

    version: int
    starting: bool
    index: int

    def sort_key(self) -> tuple[int, int, int]:
        return self.version, (0 if self.starting else 1), self.index

    def __lt__(self, other: "SourcePosition") -> bool:  # type: ignore[override]
        return self.sort_key() < other.sort_key()

    def encode(self) -> int:
        """As one non-negative integer (a ``txn`` version), order preserved."""
        if not -1 <= self.index < _INDEX_SPAN - 1:
            raise ValueError(f"file index {self.index} out of range")
        return (self.version * 2 + (0 if self.starting else 1)) * _INDEX_SPAN + self.index + 1

    @classmethod
    def decode(cls, value: int) -> "SourcePosition":
        major, rest = divmod(int(value), _INDEX_SPAN)
        version, increments = divmod(major, 2)
        return cls(version, not increments, rest - 1)

    @classmethod
    def from_offset(cls, offset: Mapping | str) -> "SourcePosition":
        """From the source's offset JSON (``reservoirVersion``, ``index``, ``isStartingVersion``)."""
        data = json.loads(offset) if isinstance(offset, str) else offset
        return cls(int(data["reservoirVersion"]), bool(data["isStartingVersion"]), int(data["index"]))

    def to_offset(self, reservoir_id: str) -> dict:
        return {"sourceVersion": 1, "reservoirId": reservoir_id, "reservoirVersion": self.version,
                "index": self.index, "isStartingVersion": self.starting}

    def __str__(self) -> str:
        return f"{'snapshot ' if self.starting else ''}v{self.version}" + (f"#{self.index}" if self.index >= 0 else "")


def committed_position(table: DeltaTable, source: str) -> SourcePosition | None:
    value = table.transaction_version(position_app_id(source))
    return SourcePosition.decode(value) if value is not None else None


@dataclass(frozen=True)
class BatchRange:
    """What micro-batch ``batch_id`` of a stage consumed: ``(start, end]`` in the upstream
    (``offsets``: the two as the source's offsets, as Spark planned them)."""

    batch_id: int
    start: SourcePosition | None  # None: the query's first batch from the upstream's beginning
    end: SourcePosition
    batch_time_ms: int
    query_id: str | None
    offsets: tuple[dict, dict] | None = None

    def plan(self, table: DeltaTable, source: str, name: str) -> "WritePlan":
        """What ``table`` still needs of this batch.

        All of it normally; nothing for a replay; the rows of upstream versions
        from ``committed.version`` on when the table already holds the batch up
        to a version boundary (a new query, after a lost checkpoint, planned
        wider batches than the one that crashed between two tables' commits).
        Raises PositionGapError when the table is behind the batch start (rows
        between would never be written) or holds part of a version."""
        committed = committed_position(table, source)
        if committed is not None and self.end <= committed:
            return WritePlan(False)
        if committed == self.start:
            return WritePlan(True)
        if (committed is not None and (self.start is None or self.start < committed)
                and committed.index == -1 and not committed.starting):
            return WritePlan(True, from_version=committed.version)
        raise PositionGapError(
            f"micro-batch {self.batch_id} reads {source} from {self.start or 'its beginning'} to {self.end}, but "
            f"table {name} holds {source} up to {committed or 'nothing'}: the query checkpoint and the table "
            "disagree (was one restored or replaced without the other?). Restore both from a savepoint, or "
            "delete the checkpoint to resume from the table's own position."
        )


@dataclass(frozen=True)
class WritePlan:
    """``write``: the table needs (part of) the batch; ``from_version``: only rows read
    from upstream versions >= this one (None: all rows)."""

    write: bool
    from_version: int | None = None

    def rows(self, df, version_column: str):
        """The rows of ``df`` (a Spark DataFrame or an Arrow table) the table needs."""
        if self.from_version is None:
            return df
        if isinstance(df, pa.Table):
            return df.filter(pc.greater_equal(df.column(version_column), self.from_version))
        from pyspark.sql import functions as F

        return df.where(F.col(version_column) >= self.from_version)


def batch_range(checkpoint: QueryCheckpoint, batch_id: int) -> BatchRange:
    """The upstream range of a planned micro-batch, from the checkpoint's offset log."""
    end, meta = checkpoint.batch_entry(batch_id)
    first = checkpoint.batch_entry(batch_id - 1)[0] if batch_id > 0 else checkpoint.initial_position()
    start = SourcePosition.from_offset(first) if first is not None else None
    if first is None:  # a query with no starting option: its snapshot, version not chosen yet
        first = {**end, "reservoirVersion": -1, "index": -1, "isStartingVersion": True}
    return BatchRange(batch_id, start, SourcePosition.from_offset(end), int(meta.get("batchTimestampMs", 0)),
                      checkpoint.query_id(), (first, end))


def stage_transactions(source: str, batch: BatchRange, extra: Mapping[str, int] | None = None) -> list[Transaction]:
    txns = [Transaction(position_app_id(source), batch.end.encode())]
    if batch.query_id is not None:
        txns.append(Transaction(query_app_id(batch.query_id), batch.batch_id))
    txns += [Transaction(app_id, int(version)) for app_id, version in sorted((extra or {}).items())]
    return txns


def commit_metadata(stage: str, batch: BatchRange, source: str, attempt: str, **extra) -> dict:
    return commit_info({"operation": stage, "queryId": batch.query_id, "batchId": batch.batch_id,
                        "attempt": attempt, "source": source, "from": str(batch.start or "beginning"),
                        "to": str(batch.end), **extra})


@dataclass(frozen=True)
class Appended:
    """What :func:`append_batch` committed: the Delta version, rows and files, and the
    table's snapshot read right after the commit (at ``version`` or later)."""

    version: int
    rows: int
    files: int
    table: DeltaTable


def append_batch(path: str, spec: TableSpec, rows, batch: BatchRange, *, source: str, stage: str,
                 version_column: str, stats_columns: Sequence[str] = (),
                 extra_txns: Mapping[str, int] | None = None, metadata: Mapping | None = None,
                 storage: Mapping[str, str] | None = None) -> Appended | None:
    """Append ``rows`` (a Spark DataFrame in ``spec``'s schema, or an Arrow table with its
    columns, written here: :func:`~streamlake.delta.files.write_arrow_files`; ``version_column``
    holds the upstream version each row was read from) to the table at ``path``
    as micro-batch ``batch``, exactly once. ``rows`` None: the caller knows the
    batch has no rows for this table; no Spark job runs, and the commit (no files)
    still records the batch's position. Returns what was committed, or None
    when the table already has the batch (nothing is written). ``storage``: the
    options of a table on an object store, without secrets (see
    :func:`streamlake.delta.files.write_attempt_files`).

    Raises PositionGapError (see :meth:`BatchRange.plan`) and CommitConflictError
    after MAX_COMMIT_ATTEMPTS lost commit races."""
    for attempt in range(1, MAX_COMMIT_ATTEMPTS + 1):
        table = ensure_table(path, spec, storage)
        plan = batch.plan(table, source, spec.name)
        if not plan.write:
            log.info("%s batch %d: %s already has it, nothing to write", stage, batch.batch_id, spec.name)
            return None
        attempt_id = uuid.uuid4().hex
        write = write_arrow_files if isinstance(rows, pa.Table) else write_attempt_files
        files = [] if rows is None else write(
            plan.rows(rows, version_column), path, attempt_id, spec.file_schema.names, stats_columns,
            partition_by=spec.partition_by, storage=storage)
        kind = spec.name.split("/")[0]  # late_events/<aggregate>: the crash point of any aggregate's
        crash_point(f"after_files_{kind}", batch.batch_id)
        records = sum(f.num_records for f in files)
        properties = CommitProperties(
            app_transactions=stage_transactions(source, batch, extra_txns),
            custom_metadata=commit_metadata(stage, batch, source, attempt_id, records=records,
                                            **dict(metadata or {})),
        )
        try:
            table.create_write_transaction(add_actions(files), "append", spec.schema,
                                           partition_by=list(spec.partition_by) or None,
                                           commit_properties=properties)
        except CommitFailedError as exc:
            log.warning("%s batch %d: commit to %s lost to a concurrent commit (%s); re-planning",
                        stage, batch.batch_id, spec.name, exc)
            time.sleep(0.05 * attempt)
            continue
        read_version = table.version()
        table.update_incremental()  # the commits since the one it was planned on, ours among them
        version = committed_version(table, read_version, attempt_id)
        crash_point(f"after_commit_{kind}", batch.batch_id)
        log.info("%s batch %d: %s version %d: %d rows in %d files (%s -> %s)", stage, batch.batch_id,
                 spec.name, version, records, len(files), batch.start or "beginning", batch.end)
        return Appended(version, records, len(files), table)
    raise CommitConflictError(f"{stage} batch {batch.batch_id}: lost the commit to {spec.name} "
                              f"{MAX_COMMIT_ATTEMPTS} times")


def compact_appended(stage: str, appended: Mapping[str, Appended | None], max_small_files: int) -> dict[str, int]:
    """Bin-pack the small files of each table a stage's batch appended files to (``appended``:
    table name -> what :func:`append_batch` committed), once it has more than
    ``max_small_files`` (:func:`streamlake.delta.table.compact_small_files`, on the snapshot
    read after the append: a ``dataChange=false`` commit that keeps every row, the ``txn``
    positions and every earlier version). Returns the files removed per table compacted.

    Every micro-batch adds files to a stage's tables; compacting between batches keeps their
    number bounded for their readers. A compaction that fails (a store error, or a commit of
    another writer, such as a backfill marking late events applied, that removed the same
    files first) is logged and tried again after a later batch: the batch is committed
    either way, so nothing is raised."""
    compacted = {}
    for name, done in appended.items():
        if done is None or not done.files:
            continue
        try:
            metrics = compact_small_files(done.table, max_small_files)
        except (DeltaError, OSError) as exc:
            log.warning("%s: compacting %s failed, tried again after a later batch: %s", stage, name, exc)
            continue
        if metrics:
            compacted[name] = metrics["numFilesRemoved"]
            log.info("%s: compacted %s: %d small files into %d", stage, name, metrics["numFilesRemoved"],
                     metrics["numFilesAdded"])
    return compacted


def committed_version(table: DeltaTable, read_version: int, attempt_id: str) -> int:
    """The version an attempt's commit landed at (delta-rs may rebase it past others), from
    ``table`` read after the commit (opened or brought up to date then), ``read_version`` the
    version the attempt was planned on."""
    latest = table.version()
    for entry in table.history(limit=max(1, latest - read_version)):
        if entry.get("streamlake", {}).get("attempt") == attempt_id:
            return int(entry["version"])
    return latest


def resume_options(tables: Mapping[str, str], source: str, source_path: str, checkpoint: QueryCheckpoint,
                   storage: Mapping[str, str] | None = None) -> dict:
    """Source options for a stage's query: where a *new* query starts.

    An existing checkpoint is resumed as is. Otherwise the query starts at the
    position its tables committed (the lowest, if a crash left them apart:
    the others skip what they already have) and that start is saved in the
    checkpoint, so batch 0's range is known; with no committed position it
    starts from the upstream table's snapshot."""
    if checkpoint.has_offsets():
        return {}
    saved = checkpoint.initial_position()
    if saved is None:
        positions = []
        for path in tables.values():
            try:
                positions.append(committed_position(open_table(path, storage_options=storage), source))
            except FileNotFoundError:
                positions.append(None)
        if any(p is None for p in positions) or not positions:
            checkpoint.save_initial_position(None)
            return {}
        start = min(positions, key=SourcePosition.sort_key)
        reservoir_id = open_table(source_path, storage_options=storage).metadata().id
        saved = start.to_offset(reservoir_id)
        checkpoint.save_initial_position(saved)
    return {"startingOffset": json.dumps(saved)} if saved else {}


class DeltaFedStage:
    """Mixin for stages whose query reads an upstream Delta table: starting the query,
    progress lines. Subclasses define ``name``, ``source``, ``source_path``,
    ``checkpoint``, ``processing_time_s``, ``upstream_wait_ms``, ``driver_read_max_bytes``,
    ``max_files_per_trigger``, ``outputs()``, ``prepare()`` and ``process(df, batch, on_driver)``;
    ``storage`` (options without secrets) when the tables are on an object store."""

    def source_options(self) -> dict[str, str]:
        """The ``streamlake-delta`` options of the stage's query: the upstream's commit version on
        every row (lineage), the wait for its next commit, the files per micro-batch."""
        opts = {"includeCommitVersion": "true"}
        if self.upstream_wait_ms:
            opts["waitForCommitMs"] = str(self.upstream_wait_ms)
        if self.max_files_per_trigger:
            opts["maxFilesPerTrigger"] = str(self.max_files_per_trigger)
        return opts

    def query_options(self) -> dict[str, str]:
        """:meth:`source_options` and the object store's options (``storage.*``, without secrets):
        what the query reads with, and a batch read on the driver too."""
        return {**self.source_options(), **{f"storage.{k}": v for k, v in self.storage.items()}}

    def __call__(self, df, batch_id: int) -> None:
        """Process the batch; what it did goes to the query's checkpoint for the progress line
        (:meth:`QueryCheckpoint.take_batch_result`: the sink may run in another process).
        A batch of at most ``driver_read_max_bytes`` of upstream files is read on the driver
        (:data:`DRIVER_READ_MAX_BYTES`); Spark's tasks then never read ``df``, so its rows are
        counted here."""
        from streamlake.delta.source import read_batch_on_driver

        checkpoint = QueryCheckpoint(self.checkpoint)
        batch = batch_range(checkpoint, batch_id)
        local = read_batch_on_driver(df.sparkSession, self.source_path, df.schema, *batch.offsets,
                                     self.query_options(), self.driver_read_max_bytes)
        if local is None:
            result = {**self.process(df, batch), "read_on_driver": False}
        else:
            result = {**self.process(local[0], batch, on_driver=True), "read_on_driver": True, "rows": local[1]}
        checkpoint.save_batch_result(batch_id, result)

    def start(self, spark, available_now: bool):
        """Start the stage's streaming query on ``streamlake-delta`` (see :func:`resume_options`)."""
        from streamlake.delta.source import FORMAT, register
        from streamlake.pipeline.driver import RunningQuery

        register(spark)
        self.prepare()
        checkpoint = QueryCheckpoint(self.checkpoint)
        for name in checkpoint.discard_interrupted_first_batch():
            log.warning("%s: removed %s, a write a kill interrupted before the first batch", self.name, name)
        options = {**self.query_options(),
                   **resume_options(self.outputs(), self.source, self.source_path, checkpoint, self.storage)}
        reader = spark.readStream.format(FORMAT)
        for key, value in options.items():
            reader = reader.option(key, value)
        writer = (reader.load(self.source_path).writeStream.queryName(f"{self.query_name}:{self.name}")
                  .option("checkpointLocation", self.checkpoint).foreachBatch(self))
        writer = writer.trigger(availableNow=True) if available_now or self.processing_time_s is None else \
            writer.trigger(processingTime=f"{self.processing_time_s} seconds")
        return RunningQuery(self.name, writer.start(), self.progress_line)

    def progress_line(self, progress: dict) -> dict:
        result = QueryCheckpoint(self.checkpoint).take_batch_result(progress.get("batchId"))
        # Spark's count of the rows its tasks read; the stage's own when they read none (a batch
        # read on the driver) or Spark does not say (foreachBatch on a Spark Connect server)
        rows = result.pop("rows", 0)
        durations = progress.get("durationMs", {})
        # a source that waits for the upstream's commit (upstream_wait_ms) waits in latestOffset,
        # before the batch: waitMs, and the batch's own time is the rest of the trigger
        waited = durations.get("latestOffset", 0) if self.upstream_wait_ms else 0
        duration_ms = durations.get("triggerExecution", 0) - waited if durations else None
        if result.get("read_on_driver"):
            per_second = rows * 1000 / duration_ms if duration_ms else 0.0
        else:
            rows, per_second = progress.get("numInputRows", rows), progress.get("processedRowsPerSecond") or 0.0
        return {
            "batchId": progress.get("batchId"),
            "timestamp": progress.get("timestamp"),
            "numInputRows": rows,
            "processedRowsPerSecond": round(per_second, 1),
            "durationMs": duration_ms,
            "durations": durations,
            **({"waitMs": waited} if self.upstream_wait_ms else {}),
            "endOffset": (progress.get("sources") or [{}])[0].get("endOffset"),
            **result,
        }
