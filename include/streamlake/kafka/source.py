"""Kafka streaming source for Spark, on Spark 4's Python Data Source API.

Usage::

    from streamlake.kafka.source import register
    register(spark)
    df = (spark.readStream.format("streamlake-kafka")
          .option("subscribe", "sensors")
          .option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", 10000)
          .load())

Options follow Spark's own Kafka source: ``subscribe`` | ``subscribePattern`` |
``assign``, ``startingOffsets``, ``startingTimestamp``,
``startingOffsetsByTimestampStrategy``, ``maxOffsetsPerTrigger``,
``minPartitions``, ``failOnDataLoss``, ``kafkaConsumer.pollTimeoutMs`` and
``kafka.*`` client properties. Unknown options are rejected, so a typo does not
silently fall back to a default. The schema is Spark's Kafka schema.

``output`` (an option of this source only) chooses what the read tasks return:

``rows`` (default)
    the records, in Spark's Kafka schema;
``files``
    bronze's fast path: each read task writes its records itself, with
    pyarrow, as one Parquet file of the current Delta commit attempt and
    returns only the file's description, so the payload never crosses into
    the JVM. The schema is ``file string``: one row per record written (Spark's
    ``numInputRows`` stays the number of records), all null except the first
    row of each file, which holds the file's description as JSON
    (:func:`streamlake.storage.data_files.data_file_from_json`). Where and how to
    write (attempt directory, constant columns, which offsets the table
    still needs) comes from the sink that runs the batch, through the Spark
    job's local property :data:`FILES_CONTEXT_PROPERTY` (a
    :class:`FilesContext`); without it a read fails. The bronze ingest
    (:mod:`streamlake.pipeline.ingest`) uses this mode with
    :class:`streamlake.delta.sink.DeltaKafkaSink`; it is not meant for
    queries of your own. Here ``minPartitions`` is the number of read tasks
    per micro-batch: the batch's ranges are cut and packed so that each task
    reads about the same number of offsets (one file per piece); without it,
    one task per partition. Every Spark task of a Python source costs tens of
    milliseconds in its Python worker, so one task per core, evenly loaded,
    is what the bronze job asks for.

Offsets are ``{"topic": {"partition": next_offset}}``. Every micro-batch reads
exactly the records in ``[start, end)`` of each partition; the end of a batch
never exceeds what Kafka holds (ListOffsets(latest): the last stable offset under
``read_committed``, see :mod:`streamlake.kafka.client`). Read limits are honoured
under processing-time and available-now triggers.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from streamlake.data_sources import freeze_heap_after
from streamlake.errors import DataLossError, InvalidOptionError, UnknownTopicError
from streamlake.kafka.client import KafkaMetadataClient, api_timeout_s, client_config
from streamlake.kafka.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    Offsets,
    StartingOffsets,
    TopicPartition,
    offsets_from_json,
    offsets_to_json,
    parse_starting_offsets,
    plan_ranges,
    rate_limit,
)
from streamlake.kafka.reader import FILES_SCHEMA_DDL, KAFKA_SCHEMA_DDL, read_range, write_ranges_files

log = logging.getLogger(__name__)

FORMAT = "streamlake-kafka"
_KNOWN_OPTIONS = {
    "subscribe", "subscribepattern", "assign", "startingoffsets", "startingtimestamp",
    "startingoffsetsbytimestampstrategy", "maxoffsetspertrigger", "minpartitions",
    "failondataloss", "kafkaconsumer.polltimeoutms", "includeheaders", "output",
}
OUTPUTS = ("rows", "files")
# Spark job-local property carrying the FilesContext of output=files reads.
FILES_CONTEXT_PROPERTY = "streamlake.kafka.files"


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise InvalidOptionError(f"{name} must be true or false, got {raw!r}")
    return value == "true"


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"{name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise InvalidOptionError(f"{name} must be a positive integer, got {value}")
    return value


@dataclass(frozen=True)
class KafkaSourceOptions:
    """Validated source options. Raises InvalidOptionError naming the bad option."""

    client: Mapping[str, str]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()
    starting_offsets: str | None = None
    starting_timestamp: str | None = None
    timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    output: str = "rows"

    @property
    def starting(self) -> StartingOffsets:
        return parse_starting_offsets(self.starting_offsets, self.starting_timestamp)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "KafkaSourceOptions":
        opts = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(k for k in opts if not k.startswith("kafka.") and k not in _KNOWN_OPTIONS)
        if unknown:
            raise InvalidOptionError(
                f"unknown option(s) {', '.join(unknown)} for format {FORMAT!r}; known: "
                "subscribe, subscribePattern, assign, startingOffsets, startingTimestamp, "
                "startingOffsetsByTimestampStrategy, maxOffsetsPerTrigger, minPartitions, "
                "failOnDataLoss, kafkaConsumer.pollTimeoutMs, output, kafka.<client property>"
            )
        given = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
        if len(given) != 1:
            raise InvalidOptionError("exactly one of subscribe, subscribePattern or assign must be set")
        topics: tuple[str, ...] = ()
        pattern = None
        assigned: tuple[TopicPartition, ...] = ()
        if opts.get("subscribe"):
            topics = tuple(sorted({t.strip() for t in opts["subscribe"].split(",") if t.strip()}))
            if not topics:
                raise InvalidOptionError("subscribe must name at least one topic")
        elif opts.get("subscribepattern"):
            import re

            pattern = opts["subscribepattern"]
            try:
                re.compile(pattern)
            except re.error as exc:
                raise InvalidOptionError(f"subscribePattern {pattern!r} is not a valid regex: {exc}") from None
        else:
            try:
                spec = json.loads(opts["assign"])
                assigned = tuple(sorted(TopicPartition(t, int(p)) for t, ps in spec.items() for p in ps))
            except (ValueError, TypeError, AttributeError):
                raise InvalidOptionError(
                    f'assign must be JSON like {{"topic": [0, 1]}}, got {opts["assign"]!r}'
                ) from None
        strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).lower()
        if strategy not in ("error", "latest"):
            raise InvalidOptionError(f"startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}")
        poll = _positive_int(opts, "kafkaconsumer.polltimeoutms")
        output = output_mode(opts)
        client = client_config(options)
        api_timeout_s(client)  # validate early
        parsed = cls(
            client=client,
            topics=topics,
            pattern=pattern,
            assigned=assigned,
            starting_offsets=opts.get("startingoffsets"),
            starting_timestamp=opts.get("startingtimestamp"),
            timestamp_strategy=strategy,
            max_offsets_per_trigger=_positive_int(opts, "maxoffsetspertrigger"),
            min_partitions=_positive_int(opts, "minpartitions"),
            fail_on_data_loss=_bool(opts, "failondataloss", True),
            poll_timeout_ms=poll if poll is not None else 120_000,
            output=output,
        )
        parse_starting_offsets(parsed.starting_offsets, parsed.starting_timestamp)  # validate now
        return parsed


def output_mode(options: Mapping[str, str]) -> str:
    """The ``output`` option (``rows`` or ``files``); InvalidOptionError otherwise."""
    raw = next((v for k, v in options.items() if str(k).lower() == "output"), None)
    value = "rows" if raw is None else str(raw).strip().lower()
    if value not in OUTPUTS:
        raise InvalidOptionError(f"output must be one of {', '.join(OUTPUTS)}, got {raw!r}")
    return value


@dataclass(frozen=True)
class FilesContext:
    """What ``output=files`` read tasks of one commit attempt need from the sink:
    the attempt's :class:`streamlake.storage.data_files.FileTarget` and, per
    partition, the lowest offset the table still needs (a partition absent
    here is not read at all; -1: from the start of the range)."""

    target: object  # streamlake.storage.data_files.FileTarget
    write_from: Mapping[TopicPartition, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"target": json.loads(self.target.to_json()),
                           "writeFrom": offsets_to_json(self.write_from)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "FilesContext":
        from streamlake.storage.data_files import FileTarget

        data = json.loads(text)
        return cls(FileTarget.from_json(json.dumps(data["target"])),
                   offsets_from_json(data["writeFrom"], "writeFrom") if data["writeFrom"] else {})

    def first_offset(self, rng: OffsetRange) -> int | None:
        """Where a task reading ``rng`` starts writing; None: nothing of it is needed."""
        low = self.write_from.get(TopicPartition(rng.topic, rng.partition))
        if low is None or max(low, rng.start) >= rng.end:
            return None
        return max(low, rng.start)


def files_context_in_task() -> FilesContext:
    """The FilesContext of the running Spark task. Raises InvalidOptionError when the
    job was not started by a sink that sets it."""
    from pyspark import TaskContext

    task = TaskContext.get()
    raw = task.getLocalProperty(FILES_CONTEXT_PROPERTY) if task is not None else None
    if not raw:
        raise InvalidOptionError(
            f"option output=files of {FORMAT!r} writes the files of a Delta commit attempt and runs only under "
            "the bronze sink (streamlake.delta.sink.DeltaKafkaSink), which sets the Spark job's local property "
            f"{FILES_CONTEXT_PROPERTY}; use output=rows (the default) to read records"
        )
    return FilesContext.from_json(raw)


class KafkaInputPartition(InputPartition):
    """One Spark task: the records ``[start, end)`` of one topic-partition."""

    def __init__(self, rng: OffsetRange):
        super().__init__((rng.topic, rng.partition, rng.start, rng.end))
        self.range = rng


class KafkaFilesPartition(InputPartition):
    """One ``output=files`` task: pieces of one or more topic-partitions, read in
    order, one file each (see :func:`pack_ranges`)."""

    def __init__(self, ranges: Sequence[OffsetRange]):
        super().__init__(tuple((r.topic, r.partition, r.start, r.end) for r in ranges))
        self.ranges = tuple(ranges)


def pack_ranges(ranges: Sequence[OffsetRange], tasks: int | None) -> list[list[OffsetRange]]:
    """``ranges`` cut and grouped into ``tasks`` groups of about the same number of
    offsets (fewer when there are fewer offsets than tasks): group ``i`` holds
    offsets ``[i*T/n, (i+1)*T/n)`` of the ranges laid end to end, so each group
    is one or more contiguous pieces. Without ``tasks``: one group per range."""
    ranges = [r for r in ranges if r.size > 0]
    if not tasks:
        return [[r] for r in ranges]
    total = sum(r.size for r in ranges)
    n = max(1, min(int(tasks), total))
    bounds = [total * i // n for i in range(n + 1)]
    groups: list[list[OffsetRange]] = [[] for _ in range(n)]
    laid = 0  # offsets laid out before the current range
    for r in ranges:
        lo, hi = laid, laid + r.size
        for i in range(n):
            a, b = max(lo, bounds[i]), min(hi, bounds[i + 1])
            if a < b:
                groups[i].append(OffsetRange(r.topic, r.partition, r.start + a - laid, r.start + b - laid))
        laid = hi
    return [g for g in groups if g]


class KafkaOffsetPlanner:
    """Driver-side offset logic of the source, usable without Spark (jobs, tests).

    Raises UnknownTopicError, DataLossError, KafkaUnavailableError and
    InvalidOptionError with messages naming the topic-partition and offsets.
    """

    def __init__(self, options: KafkaSourceOptions):
        self.options = options
        self._client: KafkaMetadataClient | None = None
        self._earliest_at_start: Offsets | None = None  # available-now: what Kafka held when the run started

    @property
    def client(self) -> KafkaMetadataClient:
        if self._client is None:
            self._client = KafkaMetadataClient(self.options.client)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def partitions(self) -> list[TopicPartition]:
        o = self.options
        if o.assigned:
            existing = self.client.topics()
            missing = [str(tp) for tp in o.assigned if existing.get(tp.topic, 0) <= tp.partition]
            if missing:
                raise UnknownTopicError(f"assigned partition(s) {', '.join(missing)} do not exist")
            return list(o.assigned)
        return self.client.partitions(topics=o.topics or None, pattern=o.pattern)

    def resolve_starting(self, tps: Sequence[TopicPartition]) -> Offsets:
        """Concrete start offsets for a new query (startingOffsets / startingTimestamp)."""
        start = self.options.starting
        if start.kind == "earliest":
            return self.client.earliest(tps)
        if start.kind == "latest":
            return self.client.latest(tps)
        if start.kind == "timestamp":
            found = self.client.for_timestamp(tps, start.timestamp_ms)
            missing = [tp for tp, off in found.items() if off is None]
            if missing and self.options.timestamp_strategy == "error":
                raise InvalidOptionError(
                    f"no record at or after startingTimestamp {start.timestamp_ms} in "
                    f"{', '.join(map(str, missing))} (set startingOffsetsByTimestampStrategy=latest "
                    "to start those partitions at their end)"
                )
            latest = self.client.latest(missing) if missing else {}
            return {tp: (off if off is not None else latest[tp]) for tp, off in found.items()}
        specific = dict(start.specific)
        unknown = sorted(set(specific) - set(tps))
        if unknown:
            raise UnknownTopicError(
                f"startingOffsets names {', '.join(map(str, unknown))}, which the subscription does not include "
                f"or which do not exist"
            )
        unspecified = sorted(set(tps) - set(specific))
        if unspecified:
            raise InvalidOptionError(
                f"startingOffsets must give every subscribed partition (-2 = earliest, -1 = latest); "
                f"missing: {', '.join(map(str, unspecified))}"
            )
        earliest = self.client.earliest(tps)
        latest = self.client.latest(tps)
        resolved = {}
        for tp in tps:
            off = specific[tp]
            resolved[tp] = earliest[tp] if off == EARLIEST else latest[tp] if off == LATEST else off
        return self.check_available(resolved, earliest=earliest, latest=latest)

    def check_available(self, start: Mapping[TopicPartition, int], *,
                        earliest: Mapping[TopicPartition, int] | None = None,
                        latest: Mapping[TopicPartition, int] | None = None,
                        retention: bool = True) -> Offsets:
        """Start offsets Kafka can serve. Offsets before the log start (retention) or
        past the end (topic recreated) are data loss: DataLossError when
        ``failOnDataLoss``, else moved to the earliest offset with a warning.
        Without ``retention`` only the end is checked (the reads find offsets that
        retention removed) and Kafka is asked for earliest offsets only where needed."""
        tps = list(start)
        latest = latest if latest is not None else self.client.latest(tps)
        if earliest is None:
            asked = tps if retention else [tp for tp in tps if start[tp] > latest[tp]]
            earliest = self.client.earliest(asked) if asked else {}
        problems, fixed = [], dict(start)
        for tp in tps:
            off = start[tp]
            if tp in earliest and off < earliest[tp]:
                problems.append(f"{tp}: offsets [{off}, {earliest[tp]}) are no longer in Kafka (earliest {earliest[tp]})")
                fixed[tp] = earliest[tp]
            elif off > latest[tp]:
                problems.append(
                    f"{tp}: start offset {off} is past the end of the partition ({latest[tp]}); "
                    "the topic was probably deleted and recreated"
                )
                fixed[tp] = earliest[tp]
        if problems:
            message = "Kafka no longer holds offsets this query must read: " + "; ".join(problems)
            if self.options.fail_on_data_loss:
                raise DataLossError(message + ". Set failOnDataLoss=false to skip them.")
            log.warning("%s; continuing from the earliest offsets (failOnDataLoss=false)", message)
        return fixed

    def next_end(self, start: Mapping[TopicPartition, int], limit: ReadLimit,
                 target: Mapping[TopicPartition, int] | None) -> tuple[Offsets, Offsets]:
        """End offsets of the next micro-batch and the latest offsets seen.

        New partitions start at their earliest offset. ``target`` (available-now:
        what Kafka held when the run started, see :meth:`available_now_target`) caps
        every partition and is the end this run reads to, so Kafka is not asked
        again; otherwise from one ListOffsets request. ``limit`` caps the
        total number of offsets. A start past the end (the topic was recreated) is
        data loss; so is, in an available-now run, a start before what Kafka holds
        (retention). Under processing-time triggers offsets that retention removed
        are found by the read tasks, which fail or skip them the same way.
        """
        tps = self.partitions()
        gone = sorted(set(start) - set(tps))
        if gone:
            message = f"partition(s) {', '.join(map(str, gone))} no longer exist in Kafka"
            if self.options.fail_on_data_loss:
                raise DataLossError(message + ". Set failOnDataLoss=false to drop them.")
            log.warning("%s; dropping them", message)
        new = [tp for tp in tps if tp not in start]
        begin = {tp: start[tp] for tp in tps if tp in start}
        if target is not None:
            latest = {tp: target.get(tp, begin.get(tp, 0)) for tp in tps}
            earliest = self._earliest_at_start
        else:
            latest = self.client.latest(tps)
            earliest = None
        if begin:
            begin = self.check_available(begin, earliest=earliest, latest=latest, retention=earliest is not None)
        if new:
            begin.update(self.client.earliest(new))
        end = {tp: max(begin[tp], latest[tp]) for tp in tps}
        if target is not None:
            end = {tp: max(begin[tp], min(end[tp], target.get(tp, begin[tp]))) for tp in tps}
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, end, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            raise InvalidOptionError(f"unsupported read limit {limit!r}")
        # Keep partitions that failOnDataLoss=false dropped out of the offsets.
        return end, latest

    def available_now_target(self) -> Offsets:
        """What an available-now run reads to: every partition's end as Kafka holds it now
        (:meth:`KafkaMetadataClient.latest`). Also notes the earliest offsets, against which
        the run's start is checked."""
        tps = self.partitions()
        self._earliest_at_start = self.client.earliest(tps)
        return self.client.latest(tps)

    def ranges(self, start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
               split: bool = True) -> list[OffsetRange]:
        """The non-empty ranges ``[start, end)``, split for ``minPartitions`` unless not ``split``."""
        begin = dict(start)
        new = [tp for tp in end if tp not in begin]
        if new:
            begin.update(self.client.earliest(new))
        return plan_ranges(begin, end, self.options.min_partitions if split else None)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's view of the source. Driver methods delegate to KafkaOffsetPlanner;
    ``read`` runs on executors (see :mod:`streamlake.kafka.reader`).

    Construction is cheap and opens no connection: Spark builds extra instances
    only to pickle ``read``.
    """

    def __init__(self, options: Mapping[str, str]):
        self.options = KafkaSourceOptions.parse(options)
        self._planner: KafkaOffsetPlanner | None = None
        self._target: Offsets | None = None
        self._latest: Offsets | None = None

    def __getstate__(self) -> dict:
        return {"options": self.options, "_planner": None, "_target": None, "_latest": None}

    @property
    def planner(self) -> KafkaOffsetPlanner:
        if self._planner is None:
            self._planner = KafkaOffsetPlanner(self.options)
        return self._planner

    def initialOffset(self) -> dict:
        planner = self.planner
        return offsets_to_json(planner.resolve_starting(planner.partitions()))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.planner.available_now_target()
        log.info("available-now target offsets: %s", offsets_to_json(self._target))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end, self._latest = self.planner.next_end(offsets_from_json(start, "start offset"), limit, self._target)
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = offsets_from_json(start, "start offset"), offsets_from_json(end, "end offset")
        if self.options.output == "files":
            whole = self.planner.ranges(begin, stop, split=False)
            return [KafkaFilesPartition(group) for group in pack_ranges(whole, self.options.min_partitions)]
        ranges = self.planner.ranges(begin, stop)
        return [KafkaInputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator:
        if self.options.output == "files":
            return freeze_heap_after(self._write_files(partition.ranges))
        return freeze_heap_after(read_range(
            self.options.client, partition.range,
            poll_timeout_ms=self.options.poll_timeout_ms,
            fail_on_data_loss=self.options.fail_on_data_loss,
        ))

    def _write_files(self, ranges: Sequence[OffsetRange]) -> Iterator:
        """``output=files``: write the part of each range the table still needs, one file per
        range, all ranges read at once (:func:`streamlake.kafka.reader.write_ranges_files`)."""
        from pyspark import TaskContext

        context = files_context_in_task()
        task = TaskContext.get()
        attempt = task.taskAttemptId() if task is not None else 0
        needed = [OffsetRange(r.topic, r.partition, first, r.end)
                  for r in ranges for first in [context.first_offset(r)] if first is not None]
        names = [f"part-{r.topic}-{r.partition}-{r.start}-t{attempt}.snappy.parquet" for r in needed]
        return write_ranges_files(self.options.client, needed, context.target, names,
                                  poll_timeout_ms=self.options.poll_timeout_ms,
                                  fail_on_data_loss=self.options.fail_on_data_loss)

    def commit(self, end: dict) -> None:
        # Nothing to acknowledge: offsets live in Spark's offset log and in the Delta
        # table's txn actions. Spark calls this late (see DESIGN.md), never rely on it.
        pass

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()


class KafkaDataSource(DataSource):
    """``spark.readStream.format("streamlake-kafka")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return FILES_SCHEMA_DDL if output_mode(self.options) == "files" else KAFKA_SCHEMA_DDL

    def streamReader(self, schema) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)


def register(spark) -> None:
    """Register the source with a SparkSession (:func:`streamlake.data_sources.register_once`)."""
    from streamlake.data_sources import register_once

    register_once(spark, KafkaDataSource)


# -- warm-up -----------------------------------------------------------------------------------

WARM_UP_FORMAT = "streamlake-kafka-warmup"
_warmed: set[str] = set()
_background: dict[str, tuple[threading.Thread, dict]] = {}  # app id -> warm-up under way
_warm_up_lock = threading.Lock()


class _WarmUpReader(DataSourceReader):
    def __init__(self, tasks: int, hold_s: float):
        self.tasks, self.hold_s = tasks, hold_s

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator:
        import os
        import time

        import pyarrow.parquet  # noqa: F401 - what output=files tasks import
        from pyspark import TaskContext  # noqa: F401

        from streamlake.storage import data_files  # noqa: F401
        from streamlake.faults import crash_point  # noqa: F401

        time.sleep(self.hold_s)  # keep the tasks overlapping: one worker per core
        yield (os.getpid(),)


class WarmUpDataSource(DataSource):
    """A batch source whose tasks only import what this source's read tasks import."""

    @classmethod
    def name(cls) -> str:
        return WARM_UP_FORMAT

    def schema(self) -> str:
        return "pid int"

    def reader(self, schema) -> DataSourceReader:
        return _WarmUpReader(int(self.options.get("tasks", 2)), float(self.options.get("holdSeconds", 0.3)))


def warm_up(spark, force: bool = False) -> dict | None:
    """Start Spark's Python workers for this source before a query starts.

    The first job of a session that runs a Python data source starts the
    driver-side Python runners and one Python worker per core, which import
    pyspark, pyarrow and confluent-kafka: seconds that would otherwise land in
    the query's first micro-batch. A tiny batch job on a Python data source,
    one task per core, pays them up front; the workers are reused
    (``spark.python.worker.reuse``) by the query's read tasks. Once per
    SparkContext unless ``force``; returns what it did (None when skipped).
    When :func:`warm_up_in_background` started it, waits for that one instead
    and re-raises what it raised."""
    app = spark.sparkContext.applicationId
    with _warm_up_lock:
        pending = None if force else _background.pop(app, None)
        if pending is None and app in _warmed and not force:
            return None
    if pending is not None:
        thread, outcome = pending
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("result")
    return _run_warm_up(spark, app)


def warm_up_in_background(spark) -> None:
    """Begin :func:`warm_up` in a thread of its own and return at once (once per
    SparkContext). A job calls it right after its session starts, so the driver's own
    set-up (definition, tables, offsets: about 1.5 s) overlaps the executors' Python
    start; the query's :func:`warm_up` then only waits for what is left of it."""
    app = spark.sparkContext.applicationId
    with _warm_up_lock:
        if app in _warmed or app in _background:
            return
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = _run_warm_up(spark, app)
            except BaseException as exc:  # noqa: BLE001 - handed to the warm_up() that waits for it
                outcome["error"] = exc

        thread = threading.Thread(target=run, name="streamlake-warm-up", daemon=True)
        _background[app] = (thread, outcome)
        thread.start()


def _run_warm_up(spark, app: str) -> dict:
    import time

    started = time.monotonic()
    spark.dataSource.register(WarmUpDataSource)
    tasks = max(1, spark.sparkContext.defaultParallelism)
    pids = {row[0] for row in spark.read.format(WARM_UP_FORMAT).option("tasks", tasks).load().collect()}
    with _warm_up_lock:
        _warmed.add(app)
    result = {"seconds": round(time.monotonic() - started, 2), "tasks": tasks, "workers": len(pids)}
    log.info("Python workers warmed up in %.2f s (%d tasks, %d workers)", result["seconds"], tasks, len(pids))
    return result
