"""Executor-side reading of Kafka offset ranges into Arrow record batches.

Runs inside Spark's Python workers. A task reads *all* its ranges with one
consumer (:func:`read_ranges`): every range is assigned at once, so one fetch
request covers every partition of the task, and a range that is complete is
paused, so later fetches do not touch it. Consumers are cached per worker
process, client configuration and kind of read (Spark reuses Python workers
across tasks), so a task pays for an ``assign()``, not for a new connection.

Two kinds of read:

* **tail** reads (every range at most :data:`TAIL_RANGE_RECORDS` records, what
  a micro-batch of a live stream reads): the consumer does not prefetch
  (``queued.min.messages=1``), so a range that one answer covers costs one
  fetch, not two, and no fetch is left waiting at the broker afterwards;
* **bulk** reads (catch-up, backfills of Kafka, benchmarks): librdkafka's
  prefetching keeps the next answer coming while this one is decoded. After a
  bulk read that ended at the end of the log, the consumer's prefetch is held by
  the broker for the fetch wait (``fetch.wait.max.ms``,
  :data:`streamlake.kafka.client.DEFAULT_FETCH_WAIT_MS`) and would delay the
  next task: that consumer is closed.

Guarantees: every record Kafka returns with ``start <= offset < end`` is
emitted once per range, in offset order, and nothing outside the ranges.
Offsets Kafka skips (transaction markers, compacted records) are simply
absent. A range that cannot be read completely raises instead of returning a
short result.

:func:`write_ranges_files` is the source's ``output=files`` mode (bronze's fast
path): the same read, each range written by the task itself as one Parquet
file of a commit attempt (:class:`streamlake.storage.data_files.AttemptFileWriter`),
so the records never cross into the JVM; the task returns only the files'
descriptions. Kept free of heavy imports: this module is what Spark's Python
workers import to read.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition

from streamlake.errors import DataLossError, KafkaUnavailableError
from streamlake.kafka.client import new_consumer
from streamlake.kafka.offsets import OffsetRange

log = logging.getLogger(__name__)

# Spark's Kafka source schema (spark-sql-kafka), headers always included.
KAFKA_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, headers array<struct<key: string, value: binary>>"
)
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
KAFKA_ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
    ("headers", HEADERS_TYPE),
])
# librdkafka timestamp type -> Kafka's TimestampType id, which Spark exposes.
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}

# A range of at most this many records is read without prefetching (a "tail" read).
TAIL_RANGE_RECORDS = 5_000
# librdkafka settings of each kind of read (see the module docstring). A tail consumer
# stops fetching a partition while one record of it waits to be consumed, and looks
# again 5 ms after its queue drained.
_KIND_SETTINGS = {
    "tail": {"queued.min.messages": "100", "fetch.queue.backoff.ms": "5"},
    "bulk": {},
}

_consumers: dict[tuple, Consumer] = {}


def _cache_key(conf: Mapping[str, str], kind: str) -> tuple:
    return (kind, tuple(sorted(conf.items())))


def _cached_consumer(conf: Mapping[str, str], kind: str = "bulk") -> Consumer:
    """This process's consumer for ``conf`` and ``kind`` of read. Settings of the kind
    that the user gave as ``kafka.*`` options are left as the user set them."""
    key = _cache_key(conf, kind)
    cached = _consumers.get(key)
    if cached is None:
        cached = _consumers[key] = new_consumer({**_KIND_SETTINGS[kind], **conf}, "reader")
    return cached


def _evict(conf: Mapping[str, str], kind: str = "bulk") -> None:
    cached = _consumers.pop(_cache_key(conf, kind), None)
    if cached is not None:
        try:
            cached.close()
        except Exception:  # noqa: BLE001 - closing a broken consumer must not mask the real error
            pass


class _BatchBuilder:
    """Accumulates records of one topic-partition into Arrow record batches."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        self._reset()

    def _reset(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.ts_types: list[int] = []
        self.headers: list = []

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, msg) -> None:
        ts_type, ts = msg.timestamp()
        self.keys.append(msg.key())
        self.values.append(msg.value())
        self.offsets.append(msg.offset())
        self.timestamps.append(ts if ts_type else None)
        self.ts_types.append(_TIMESTAMP_TYPE.get(ts_type, -1))
        self.headers.append(msg.headers())

    def flush(self) -> pa.RecordBatch:
        n = len(self.offsets)
        millis = pa.array(self.timestamps, pa.int64())
        batch = pa.record_batch([
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.ts_types, pa.int32()),
            pa.array(self.headers, HEADERS_TYPE),
        ], schema=KAFKA_ARROW_SCHEMA)
        self._reset()
        return batch


# The source's output=files schema: one row per record written, all null but the
# first row of each file, which holds the file's description (DataFile as JSON).
# One row per record keeps Spark's numInputRows the number of Kafka records.
FILES_SCHEMA_DDL = "file string"
FILES_ARROW_SCHEMA = pa.schema([("file", pa.string())])


def files_rows(description: str, records: int) -> pa.RecordBatch:
    """The rows ``output=files`` yields for one written file of ``records`` records."""
    column = pa.concat_arrays([pa.array([description], pa.string()), pa.nulls(max(0, records - 1), pa.string())])
    return pa.RecordBatch.from_arrays([column], schema=FILES_ARROW_SCHEMA)


def write_ranges_files(conf: Mapping[str, str], ranges: Sequence[OffsetRange], target, names: Sequence[str], *,
                       poll_timeout_ms: int, fail_on_data_loss: bool) -> Iterator[pa.RecordBatch]:
    """Read ``ranges`` (as :func:`read_ranges`) and write range ``i`` as the Parquet file
    ``names[i]`` in ``target`` (a :class:`streamlake.storage.data_files.FileTarget`); yield
    :func:`files_rows` for each file written (nothing for a range without records).
    A failure leaves at most partial files that no commit references."""
    from streamlake.storage.data_files import AttemptFileWriter, data_file_to_json

    writers = [AttemptFileWriter(target, name) for name in names]
    try:
        for i, batch in read_ranges(conf, ranges, poll_timeout_ms=poll_timeout_ms,
                                    fail_on_data_loss=fail_on_data_loss):
            writers[i].write(batch)
        described = [writer.close() for writer in writers]
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    for file in described:
        if file is not None:
            yield files_rows(data_file_to_json(file), file.num_records)


def read_range(conf: Mapping[str, str], rng: OffsetRange, *, poll_timeout_ms: int,
               fail_on_data_loss: bool, batch_rows: int = 20_000) -> Iterator[pa.RecordBatch]:
    """The records of one range as Arrow batches in Spark's Kafka schema (see :func:`read_ranges`)."""
    for _i, batch in read_ranges(conf, [rng], poll_timeout_ms=poll_timeout_ms,
                                 fail_on_data_loss=fail_on_data_loss, batch_rows=batch_rows):
        yield batch


def read_ranges(conf: Mapping[str, str], ranges: Sequence[OffsetRange], *, poll_timeout_ms: int,
                fail_on_data_loss: bool, batch_rows: int = 20_000) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Yield ``(i, batch)``: the records of ``ranges[i]`` as Arrow batches in Spark's Kafka
    schema, each range's batches in offset order.

    One consumer reads them: a tail read (every range at most
    :data:`TAIL_RANGE_RECORDS`) assigns all ranges at once, so the ranges'
    batches interleave; a bulk read takes one range after the other, each range's
    records in one run of prefetched answers (on Apache Kafka 4.1 as fast as
    reading them together: 60,000 one-record batches in 3 partitions, 0.43-0.94 s
    either way). The ranges must be of distinct
    partitions (ValueError otherwise). Raises DataLossError when offsets of a
    range are no longer held by Kafka and ``fail_on_data_loss`` (otherwise the
    lost prefix is skipped with a warning), and KafkaUnavailableError when no
    record arrives for ``poll_timeout_ms`` or the broker reports an error.
    """
    keys = [(r.topic, r.partition) for r in ranges]
    if len(set(keys)) != len(keys):
        raise ValueError(f"read_ranges reads each partition once; got {', '.join(map(str, ranges))}")
    todo = [i for i, r in enumerate(ranges) if r.size > 0]
    if not todo:
        return
    kind = "tail" if max(ranges[i].size for i in todo) <= TAIL_RANGE_RECORDS else "bulk"
    for together in ([todo] if kind == "tail" else [[i] for i in todo]):
        yield from _read_together(conf, ranges, together, kind, poll_timeout_ms=poll_timeout_ms,
                                  fail_on_data_loss=fail_on_data_loss, batch_rows=batch_rows)


def _read_together(conf: Mapping[str, str], ranges: Sequence[OffsetRange], together: Sequence[int], kind: str, *,
                   poll_timeout_ms: int, fail_on_data_loss: bool, batch_rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """:func:`read_ranges` of ``ranges[i]`` for each ``i`` in ``together``, all assigned at once."""
    from streamlake.faults import crash_point

    index = {(ranges[i].topic, ranges[i].partition): i for i in together}
    position = {i: ranges[i].start for i in together}
    builders = {i: _BatchBuilder(ranges[i].topic, ranges[i].partition) for i in together}
    open_ranges = set(together)
    paused: list[KafkaTopicPartition] = []  # an application's pause outlives unassign(): lifted at the end
    consumer = _cached_consumer(conf, kind)

    def assign_open() -> None:
        consumer.assign([KafkaTopicPartition(ranges[i].topic, ranges[i].partition, position[i])
                         for i in sorted(open_ranges)])

    def finish(i: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Range ``i`` is complete: stop fetching its partition, hand out what is left."""
        open_ranges.discard(i)
        position[i] = ranges[i].end
        paused.append(KafkaTopicPartition(ranges[i].topic, ranges[i].partition))
        consumer.pause(paused[-1:])
        if len(builders[i]):
            crash_point("read")
            yield i, builders[i].flush()

    assign_open()
    last_progress = time.monotonic()
    ok = False
    try:
        while open_ranges:
            # consume() waits until it has num_messages or the timeout passed: ask for
            # what is left of the ranges, so it returns as soon as their last records are
            # in (one more would wait for a record after them or an EOF event, which a
            # broker holds for fetch.wait.max.ms at the end of the log). Offsets without
            # records (transaction markers) are made up by EOF events or later records.
            left = sum(ranges[i].end - position[i] for i in open_ranges)
            msgs = consumer.consume(num_messages=max(1, min(left, 10_000)), timeout=0.1)
            if not msgs and time.monotonic() - last_progress > poll_timeout_ms / 1000:
                waiting = ", ".join(f"{ranges[i].topic}-{ranges[i].partition} [{ranges[i].start}, {ranges[i].end}) "
                                    f"at offset {position[i]}" for i in sorted(open_ranges))
                raise KafkaUnavailableError(
                    f"no progress reading {waiting} for {poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs)")
            received = 0
            reassign = False
            for msg in msgs:
                i = index.get((msg.topic(), msg.partition()))
                if i is None or i not in open_ranges:
                    continue  # a complete range, or a stale message of an earlier assignment
                rng = ranges[i]
                err = msg.error()
                if err is not None:
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if msg.offset() >= rng.end:  # only markers/compacted offsets were left
                            yield from finish(i)
                        # else: the end is not readable yet (e.g. an open transaction); keep polling
                        continue
                    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        moved = _handle_out_of_range(consumer, rng, position[i], fail_on_data_loss, err)
                        if moved >= rng.end:
                            yield from finish(i)
                        else:
                            position[i], reassign = moved, True
                        continue
                    raise KafkaUnavailableError(f"reading {rng.topic}-{rng.partition} at offset {position[i]} "
                                                f"failed: {err}")
                offset = msg.offset()
                if offset < position[i]:
                    continue  # stale message of an earlier assignment
                if offset >= rng.end:
                    yield from finish(i)
                    continue
                builders[i].append(msg)
                position[i] = offset + 1
                received += 1
                if position[i] >= rng.end:
                    yield from finish(i)
                elif len(builders[i]) >= batch_rows:
                    crash_point("read")
                    yield i, builders[i].flush()
            if reassign and open_ranges:
                assign_open()
            if received:
                last_progress = time.monotonic()
        ok = True
    finally:
        if ok and (kind == "tail" or not _any_at_end_of_log(consumer, [ranges[i] for i in together])):
            if paused:
                consumer.resume(paused)
            consumer.unassign()
            if kind == "tail":
                _drain(consumer)
        else:
            _evict(conf, kind)


def _drain(consumer: Consumer) -> None:
    """Drop what a tail consumer still holds (records after the ranges' ends): its
    partitions share one queue, and while that queue holds ``queued.min.messages``
    records librdkafka fetches no partition, the next read's included."""
    for _ in range(1000):
        if not consumer.consume(num_messages=10_000, timeout=0):
            return


def _any_at_end_of_log(consumer: Consumer, ranges: Sequence[OffsetRange]) -> bool:
    """True when the last fetch answers put some range's end at the end of its partition:
    the consumer then has a fetch waiting at the broker (see the module docstring)."""
    for rng in ranges:
        try:
            high = consumer.get_watermark_offsets(KafkaTopicPartition(rng.topic, rng.partition), cached=True)[1]
        except Exception:  # noqa: BLE001 - unknown: assume the worst, a new consumer is cheap
            return True
        if high < 0 or rng.end >= high:
            return True
    return False


def _handle_out_of_range(consumer: Consumer, rng: OffsetRange, position: int,
                         fail_on_data_loss: bool, err: KafkaError) -> int:
    """Kafka no longer holds ``position``: fail, or the earliest offset it holds (the
    caller assigns from there; ``rng.end`` or more: nothing of the range is left)."""
    tp = KafkaTopicPartition(rng.topic, rng.partition)
    low, _high = consumer.get_watermark_offsets(tp, timeout=10)
    message = (
        f"offsets [{position}, {min(low, rng.end)}) of {rng.topic}-{rng.partition} are no longer in Kafka "
        f"(earliest available: {low}; {err.str()})"
    )
    if fail_on_data_loss:
        raise DataLossError(message + ". Set failOnDataLoss=false to skip them.")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
    return max(low, position)
