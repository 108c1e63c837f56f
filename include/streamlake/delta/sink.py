"""The Delta sink of a two-phase commit with Kafka as the source.

One micro-batch becomes at most one Delta commit:

1. **Plan** (driver): read the batch's Kafka range from the query checkpoint's
   offset log and the offsets already committed from the table snapshot's
   ``txn`` actions (:mod:`streamlake.delta.txn`). Offsets already in the table
   are left out, so a replayed batch, or one that overlaps a racing writer,
   writes only what is missing. A table *behind* the batch start (records would
   be skipped) stops the query with OffsetGapError.
2. **Pre-commit** (executors): the rows are written as Parquet files into a
   directory unique to this attempt inside the table
   (:mod:`streamlake.delta.files`). They are invisible until step 3. Either
   Spark's writer writes the batch's DataFrame, or (``file_constants`` given,
   bronze's fast path) the Kafka source's read tasks write the files
   themselves with pyarrow (``output=files``, see
   :mod:`streamlake.kafka.source`) and the driver only collects their
   descriptions; the plan's offsets travel to the tasks, so a task writes only
   what the table still needs.
3. **Commit** (driver): one Delta commit from the *same snapshot* as step 1,
   holding the ``add`` actions and ``txn`` actions with the new next offset of
   every partition in the batch. A concurrent commit of any of those partitions
   makes it fail (``CommitFailedError``); the sink then plans again against the
   new snapshot. Files of a failed or killed attempt are never referenced
   (abort); ``DeltaTable.vacuum(full=True)`` removes them.

Crash anywhere and restart: Spark replays the batch from its offset log, step 1
sees what the table already holds, and every record lands exactly once. If the
checkpoint is lost, :mod:`streamlake.pipeline.ingest` restarts from the table's offsets.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping

from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties

from streamlake.spark.checkpoint import QueryCheckpoint
from streamlake.delta.files import add_actions, write_attempt_files
from streamlake.delta.table import TableSpec, ensure_table
from streamlake.delta.txn import commit_info, committed_offsets, offset_transactions
from streamlake.errors import CommitConflictError, InvalidOptionError, OffsetGapError
from streamlake.faults import crash_point
from streamlake.kafka.offsets import Offsets, TopicPartition, offsets_to_json
from streamlake.storage.data_files import DataFile, FileTarget, attempt_directory, data_file_from_json
from streamlake.storage.location import StorageOptions, is_object_store, require_safe_commits, storage_options

log = logging.getLogger(__name__)

MAX_COMMIT_ATTEMPTS = 10


@dataclass(frozen=True)
class BatchPlan:
    """What one commit attempt of a micro-batch writes.

    ``write_from[tp]`` is the lowest offset still to be written for each
    partition that the commit advances to ``end[tp]``; partitions the table
    already holds up to ``end`` are absent. ``first`` holds the start offsets of
    partitions the table has never seen (known from the offset log);
    ``first_from_data`` names new partitions whose start is taken from the rows.
    """

    batch_id: int
    start: Offsets | None
    end: Offsets
    committed: Offsets
    write_from: Offsets
    first: Offsets
    first_from_data: frozenset[TopicPartition] = field(default_factory=frozenset)

    @property
    def is_replay(self) -> bool:
        """Everything in the batch is already in the table: commit nothing."""
        return not self.write_from

    @property
    def next_offsets(self) -> Offsets:
        return {tp: self.end[tp] for tp in self.write_from}

    def filter_needed(self) -> bool:
        """True if some rows of the batch must not be written (already committed)."""
        if set(self.write_from) != set(self.end):
            return True
        start = self.start or {}
        return any(tp in start and off > start[tp] for tp, off in self.write_from.items())


def skipped_to_json(skipped: Mapping[TopicPartition, tuple[int, int]]) -> dict[str, dict[str, list[int]]]:
    """``{"topic": {"0": [from, to]}}``: the ``skippedOffsets`` of an ingest commit."""
    out: dict[str, dict[str, list[int]]] = {}
    for tp, (lo, hi) in sorted(skipped.items()):
        out.setdefault(tp.topic, {})[str(tp.partition)] = [int(lo), int(hi)]
    return out


def recorded_topic_ids(table_path: str, version: int, topics, commits: int = 200,
                       storage: Mapping[str, str] | None = None) -> dict[str, str]:
    """Topic -> the Kafka topic id that the newest ingest commit of it at or before ``version``
    recorded (``topicIds``), for each of ``topics``; the Delta log is read backwards until every
    topic is found, at most ``commits`` commits (a topic not found is absent)."""
    from streamlake.delta.log import DeltaLog

    wanted = set(topics)
    log_ = DeltaLog(table_path, storage=dict(storage or {}))
    found: dict[str, str] = {}
    for v in range(version, max(-1, version - commits), -1):
        if not wanted - set(found):
            break
        try:
            info = log_.commit_info(v)
        except (OSError, ValueError):
            break  # cleaned up (or unreadable): nothing older to learn
        custom = info.get("streamlake") if isinstance(info.get("streamlake"), dict) else {}
        ids = custom.get("topicIds")
        for topic, topic_id in (ids.items() if isinstance(ids, dict) else ()):
            if topic in wanted:
                found.setdefault(topic, str(topic_id))
    return found


def plan_batch(batch_id: int, start: Mapping[TopicPartition, int] | None, end: Mapping[TopicPartition, int],
               committed: Mapping[TopicPartition, int]) -> BatchPlan:
    """Decide what a micro-batch adds to a table holding ``committed`` offsets.

    Raises OffsetGapError if the table is behind the batch start for some
    partition: writing the batch would leave records out of the table forever.
    """
    start = dict(start) if start is not None else None
    write_from: Offsets = {}
    first: Offsets = {}
    from_data: set[TopicPartition] = set()
    gaps: list[str] = []
    for tp, e in sorted(end.items()):
        s = start.get(tp) if start is not None else None
        c = committed.get(tp)
        if c is not None:
            if c >= e:
                continue
            if s is not None and c < s:
                gaps.append(f"{tp}: the table holds offsets below {c}, this batch starts at {s}")
                continue
            write_from[tp] = max(c, s) if s is not None else c
        elif s is not None:
            if batch_id > 0:
                gaps.append(f"{tp}: the table has no offsets for it, but the query already processed up to {s}")
                continue
            write_from[tp] = s
            first[tp] = s
        else:
            write_from[tp] = -1
            from_data.add(tp)
    if gaps:
        raise OffsetGapError(
            "committing micro-batch %d would skip records: %s. The query checkpoint is ahead of the "
            "table (was the table restored or replaced without its checkpoint?). Restore the checkpoint "
            "saved with the table, or delete the checkpoint to resume from the table's own offsets."
            % (batch_id, "; ".join(gaps))
        )
    return BatchPlan(batch_id, start, dict(end), dict(committed), write_from, first, frozenset(from_data))


@dataclass(frozen=True)
class CommitResult:
    batch_id: int
    version: int | None  # Delta version written, None when the batch was a replay
    records: int
    files: int
    attempts: int
    next_offsets: Offsets
    # Where the sink's time went (ms): planning against the table, writing the
    # files (the Spark job: reading Kafka included), the Delta commit.
    timings: Mapping[str, int] = field(default_factory=dict)
    # failOnDataLoss=false: [from, to) per partition that the batch skipped, Kafka no longer holding it
    skipped: Mapping[TopicPartition, tuple[int, int]] = field(default_factory=dict)


def describe_skipped(skipped: Mapping[TopicPartition, tuple[int, int]]) -> str:
    """``topic-partition [from, to)`` of each skipped range."""
    return ", ".join(f"{tp} [{lo}, {hi})" for tp, (lo, hi) in sorted(skipped.items()))


class DeltaKafkaSink:
    """``foreachBatch`` target committing Kafka micro-batches to a Delta table exactly once.

    ``prepare(df, batch_id, batch_time_ms)`` turns the batch (Spark's Kafka
    schema) into table rows; ``partition_values(batch_time_ms)`` gives the
    partition all rows of a batch go to. The sink needs the query's checkpoint
    path to read the offset log (see :mod:`streamlake.spark.checkpoint`).

    With ``file_constants`` the batch comes from the Kafka source with
    ``output=files`` (its read tasks write the files):
    ``file_constants(batch_id, batch_time_ms)`` gives the columns the files
    add to the Kafka columns, as ``{name: (type, value)}`` (see
    :class:`streamlake.storage.data_files.FileTarget`), and ``prepare``, if given, is
    applied to the source's rows (column ``file``) before the sink collects
    that column: the bronze job passes the same ``prepare`` in both modes,
    and the columns it adds are pruned.

    ``log_start`` (given when the source runs with ``failOnDataLoss=false``) answers Kafka's
    log start offsets of partitions: the read tasks then skip offsets Kafka no longer holds,
    and each commit records what its batch skipped (commit metadata ``skippedOffsets``, see
    :meth:`_skipped`), which the consistency check reads instead of calling it unverified.

    ``topic_ids`` (topic -> Kafka's topic id when the run started) go into each commit's
    metadata (``topicIds``) for the topics of its batch: a topic deleted and created again
    has a new id, which the next run compares with these (:func:`recorded_topic_ids`).
    """

    def __init__(self, table_path: str, spec: TableSpec, checkpoint: QueryCheckpoint,
                 prepare: Callable | None, partition_values: Callable[[int], Mapping[str, str]],
                 stats_columns: tuple[str, ...] = (),
                 file_constants: Callable[[int, int], Mapping[str, tuple[str, object]]] | None = None,
                 storage: StorageOptions | None = None,
                 log_start: Callable[[list[TopicPartition]], Offsets] | None = None,
                 topic_ids: Mapping[str, str] | None = None):
        self.table_path = str(table_path)
        self.storage = storage if storage is not None else storage_options(self.table_path)
        require_safe_commits(self.storage)
        if file_constants is None and is_object_store(self.table_path):
            raise InvalidOptionError(
                f"{self.table_path} is on an object store, where only the source's read tasks write files "
                "(writer=source): Spark's own writer would need the s3a/gcs/abfs connector jars")
        self.spec = spec
        self.checkpoint = checkpoint
        self.prepare = prepare
        self.partition_values = partition_values
        self.stats_columns = stats_columns
        self.file_constants = file_constants
        self.log_start = log_start
        self.topic_ids = dict(topic_ids or {})
        self.last_result: CommitResult | None = None
        self._table = None  # the table, kept between batches and brought up to date incrementally

    @property
    def source_writes_files(self) -> bool:
        """True when the source's read tasks write the files (``output=files``)."""
        return self.file_constants is not None

    def __call__(self, df, batch_id: int) -> None:
        """Commit the batch; its Delta version and timings go to the query's checkpoint for the
        progress line (:meth:`QueryCheckpoint.take_batch_result`)."""
        self.last_result = self.commit_batch(df, batch_id)
        self.checkpoint.save_batch_result(batch_id, {"version": self.last_result.version,
                                                     "timings": dict(self.last_result.timings),
                                                     "rows": self.last_result.records,
                                                     "skipped": describe_skipped(self.last_result.skipped)})

    def _current_table(self):
        """The table's latest snapshot: opened (created) once, then updated incrementally,
        which reads only the commits since the last batch."""
        if self._table is None:
            self._table = ensure_table(self.table_path, self.spec, self.storage.for_delta())
        else:
            self._table.update_incremental()
        return self._table

    def commit_batch(self, df, batch_id: int) -> CommitResult:
        """Commit micro-batch ``batch_id`` (see the module docstring for the protocol).

        Raises OffsetGapError (table behind the checkpoint) and CommitConflictError
        (lost the commit race MAX_COMMIT_ATTEMPTS times in a row).
        """
        clock = time.monotonic
        timings = {"plan": 0.0, "write": 0.0, "commit": 0.0}
        mark = clock()

        def lap(what: str) -> None:
            nonlocal mark
            now = clock()
            timings[what] += now - mark
            mark = now

        def ms() -> dict:
            return {k: int(v * 1000) for k, v in timings.items()}

        end, batch_time_ms = self.checkpoint.batch_end(batch_id)
        start = self.checkpoint.batch_start(batch_id)
        query_id = self.checkpoint.query_id()
        for attempt in range(1, MAX_COMMIT_ATTEMPTS + 1):
            table = self._current_table()
            plan = plan_batch(batch_id, start, end, committed_offsets(table, end))
            lap("plan")
            if plan.is_replay:
                log.info("batch %d: already committed (table version %d), nothing to write", batch_id, table.version())
                return CommitResult(batch_id, None, 0, 0, attempt, {}, ms())
            attempt_id = uuid.uuid4().hex
            files = self._write_files(df, plan, batch_time_ms, attempt_id)
            lap("write")
            crash_point("after_files", batch_id)
            first = dict(plan.first)
            for tp in plan.first_from_data:
                mins = [f.min_offset for f in files if (f.topic, f.partition) == tp and f.min_offset is not None]
                first[tp] = min(mins) if mins else plan.end[tp]
            records = sum(f.num_records for f in files)
            skipped = self._skipped(plan, files)
            ids = {t: self.topic_ids[t] for t in sorted({tp.topic for tp in plan.write_from}) if t in self.topic_ids}
            properties = CommitProperties(
                app_transactions=offset_transactions(plan.next_offsets, first, query_id, batch_id),
                custom_metadata=commit_info({
                    "operation": "ingest",
                    "queryId": query_id,
                    "batchId": batch_id,
                    "attempt": attempt_id,
                    "startOffsets": offsets_to_json({tp: (plan.start or {}).get(tp, first.get(tp, -1))
                                                     for tp in plan.write_from}),
                    "endOffsets": offsets_to_json(plan.next_offsets),
                    "records": records,
                    **({"skippedOffsets": skipped_to_json(skipped)} if skipped else {}),
                    **({"topicIds": ids} if ids else {}),
                }),
            )
            try:
                table.create_write_transaction(
                    add_actions(files), "append", self.spec.schema,
                    partition_by=list(self.spec.partition_by) or None, commit_properties=properties,
                )
            except CommitFailedError as exc:
                self._table = None  # start the next attempt from a freshly loaded snapshot
                log.warning("batch %d: commit attempt %d lost to a concurrent commit (%s); re-planning",
                            batch_id, attempt, exc)
                time.sleep(random.uniform(0.05, 0.5) * attempt)
                lap("commit")
                continue
            version = self._committed_version(table.version(), attempt_id)
            lap("commit")
            crash_point("after_commit", batch_id)
            log.info("batch %d: committed Delta version %d: %d records in %d files, offsets %s",
                     batch_id, version, records, len(files), offsets_to_json(plan.next_offsets))
            if skipped:
                log.warning("batch %d (Delta version %d): skipped offsets Kafka no longer held "
                            "(failOnDataLoss=false): %s", batch_id, version, describe_skipped(skipped))
            return CommitResult(batch_id, version, records, len(files), attempt, plan.next_offsets, ms(), skipped)
        raise CommitConflictError(
            f"batch {batch_id}: lost the Delta commit to concurrent writers {MAX_COMMIT_ATTEMPTS} times"
        )

    def _skipped(self, plan: BatchPlan, files: list[DataFile]) -> dict[TopicPartition, tuple[int, int]]:
        """With ``log_start`` (failOnDataLoss=false): per partition, the offsets at the start of
        what the batch had to write that it did not write because Kafka no longer held them:
        ``[write_from, to)``, ``to`` the log start now or the first offset the files hold,
        whichever is lower (the read tasks skipped up to the log start they met, no later than
        now's; records read before retention took them are in the files). Partitions whose
        files do not say their first offset count as written from ``write_from``."""
        if self.log_start is None:
            return {}
        asked = sorted(tp for tp, low in plan.write_from.items() if low >= 0)
        starts = self.log_start(asked) if asked else {}
        unknown = any(f.topic is None or f.partition is None for f in files)
        skipped: dict[TopicPartition, tuple[int, int]] = {}
        for tp in asked:
            low = plan.write_from[tp]
            high = min(starts.get(tp, low), plan.end[tp])
            if unknown:
                high = low
            for f in files:
                if (f.topic, f.partition) == tp and f.min_offset is not None:
                    high = min(high, f.min_offset)
            if high > low:
                skipped[tp] = (low, high)
        return skipped

    def _committed_version(self, read_version: int, attempt_id: str) -> int:
        """Version our commit landed at (delta-rs may rebase a commit past others)."""
        table = self._current_table()
        latest = table.version()
        for entry in table.history(limit=max(1, latest - read_version)):
            if entry.get("streamlake", {}).get("attempt") == attempt_id:
                return int(entry["version"])
        return latest

    def _write_files(self, df, plan: BatchPlan, batch_time_ms: int, attempt_id: str) -> list[DataFile]:
        """Pre-commit: write the rows the plan keeps as Parquet files; describe them."""
        from pyspark.sql import functions as F

        if self.source_writes_files:
            return self._collect_source_files(df, plan, batch_time_ms, attempt_id)
        rows = self.prepare(df, plan.batch_id, batch_time_ms)
        if plan.filter_needed():
            keep = None
            for tp, low in plan.write_from.items():
                cond = (F.col("topic") == tp.topic) & (F.col("partition") == tp.partition) & (F.col("offset") >= low)
                keep = cond if keep is None else keep | cond
            rows = rows.where(keep)
        return write_attempt_files(rows, self.table_path, attempt_id, self.spec.file_schema.names,
                                   self.stats_columns, partition_values=self.partition_values(batch_time_ms))

    def _collect_source_files(self, df, plan: BatchPlan, batch_time_ms: int, attempt_id: str) -> list[DataFile]:
        """Pre-commit of the fast path: one Spark job in which the source's read tasks
        write the attempt's files (only offsets the plan keeps) and return their
        descriptions. The attempt travels to the tasks as the job's local property."""
        from pyspark.sql import functions as F

        from streamlake.kafka.source import FILES_CONTEXT_PROPERTY, FilesContext

        values = dict(self.partition_values(batch_time_ms))
        target = FileTarget(self.table_path, attempt_directory(attempt_id, values), tuple(self.spec.file_schema.names),
                            dict(self.file_constants(plan.batch_id, batch_time_ms)), tuple(self.stats_columns), values,
                            self.storage.public())
        context = FilesContext(target, plan.write_from)
        sc = df.sparkSession.sparkContext
        sc.setLocalProperty(FILES_CONTEXT_PROPERTY, context.to_json())
        rows = self.prepare(df, plan.batch_id, batch_time_ms) if self.prepare is not None else df
        try:
            described = rows.where(F.col("file").isNotNull()).select("file").collect()
        finally:
            sc.setLocalProperty(FILES_CONTEXT_PROPERTY, None)
        return [data_file_from_json(row["file"]) for row in described]
