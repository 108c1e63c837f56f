"""Executor-side reading of one Kafka offset range into Arrow record batches.

Runs inside Spark's Python workers. Consumers are cached per worker process and
client configuration (Spark reuses Python workers across tasks), so a task pays
for an ``assign()``, not for a new connection; except after a read that ended
at the end of the log, where the consumer's prefetch is held by the broker for
the fetch wait and would delay the next task: that consumer is closed.

A read that stalls (records are there but hardly arrive, as on the embedded
broker with partitions of many small batches) moves the fetch wait up a step
and continues from where it was (:mod:`streamlake.kafka.fetch_wait`).

Guarantees: every record Kafka returns with ``start <= offset < end`` is
emitted once, in offset order, and nothing outside the range. Offsets Kafka skips
(transaction markers, compacted records) are simply absent. A range that cannot
be read completely raises instead of returning a short result.

:func:`write_range_files` is the source's ``output=files`` mode (bronze's fast
path): the same range read, written by the task itself as one Parquet file of
a commit attempt (:class:`streamlake.delta.files.AttemptFileWriter`), so the
records never cross into the JVM; the task returns only the file's
description. Kept free of heavy imports: this module is what Spark's Python
workers import to read.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition

from streamlake.errors import DataLossError, KafkaUnavailableError
from streamlake.kafka import fetch_wait
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

_consumers: dict[tuple, tuple[Consumer, int]] = {}


def _cached_consumer(conf: Mapping[str, str]) -> tuple[Consumer, int]:
    """This process's consumer for ``conf`` and its fetch wait (ms); a new one when
    the wait for the cluster has moved up since it was made."""
    key = tuple(sorted(conf.items()))
    wait_ms = fetch_wait.current_ms(conf)
    cached = _consumers.get(key)
    if cached is not None and cached[1] != wait_ms:
        _evict(conf)
        cached = None
    if cached is None:
        cached = _consumers[key] = (new_consumer(conf, "reader", wait_ms), wait_ms)
    return cached


def _evict(conf: Mapping[str, str]) -> None:
    cached = _consumers.pop(tuple(sorted(conf.items())), None)
    if cached is not None:
        try:
            cached[0].close()
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


def write_range_files(conf: Mapping[str, str], rng: OffsetRange, target, name: str, *, poll_timeout_ms: int,
                      fail_on_data_loss: bool) -> Iterator[pa.RecordBatch]:
    """Read ``rng`` (as :func:`read_range`) and write it as the Parquet file ``name`` in
    ``target`` (a :class:`streamlake.delta.files.FileTarget`); yield
    :func:`files_rows` for it (nothing for a range without records). A failure
    leaves at most a partial file that no commit references."""
    from streamlake.delta.files import AttemptFileWriter, data_file_to_json

    writer = AttemptFileWriter(target, name)
    try:
        for batch in read_range(conf, rng, poll_timeout_ms=poll_timeout_ms, fail_on_data_loss=fail_on_data_loss):
            writer.write(batch)
        described = writer.close()
    except BaseException:
        writer.abort()
        raise
    if described is not None:
        yield files_rows(data_file_to_json(described), described.num_records)


def read_range(conf: Mapping[str, str], rng: OffsetRange, *, poll_timeout_ms: int,
               fail_on_data_loss: bool, batch_rows: int = 20_000) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``rng`` as Arrow batches in Spark's Kafka schema.

    Raises DataLossError when offsets of the range are no longer held by Kafka
    and ``fail_on_data_loss`` (otherwise the lost prefix is skipped with a
    warning), and KafkaUnavailableError when no record arrives for
    ``poll_timeout_ms`` or the broker reports an error.
    """
    from streamlake.faults import crash_point

    tp = f"{rng.topic}-{rng.partition}"
    ktp = KafkaTopicPartition(rng.topic, rng.partition)
    consumer, wait_ms = _cached_consumer(conf)
    consumer.assign([KafkaTopicPartition(rng.topic, rng.partition, rng.start)])
    stall = fetch_wait.StallDetector(wait_ms)
    builder = _BatchBuilder(rng.topic, rng.partition)
    position = rng.start
    last_progress = time.monotonic()
    ok = False
    try:
        while position < rng.end:
            # consume() waits until it has num_messages or the timeout passed: ask for
            # what is left of the range, so it returns as soon as the range's last record
            # is in (one more would wait for a record after the range or the EOF event,
            # which a broker holds for fetch.wait.max.ms at the end of the log). Offsets
            # without records (transaction markers) are made up by the EOF event or the
            # records after them.
            msgs = consumer.consume(num_messages=max(1, min(rng.end - position, 10_000)), timeout=0.1)
            if not msgs and time.monotonic() - last_progress > poll_timeout_ms / 1000:
                raise KafkaUnavailableError(
                    f"no progress reading {tp} offsets [{rng.start}, {rng.end}) at offset {position} "
                    f"for {poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs)"
                )
            received = 0
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if msg.offset() >= rng.end:  # only markers/compacted offsets were left
                            position = rng.end
                            break
                        stall.end_reported()  # end not readable yet (e.g. open transaction); keep polling
                        continue
                    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        position = _handle_out_of_range(consumer, rng, position, fail_on_data_loss, err)
                        break
                    raise KafkaUnavailableError(f"reading {tp} at offset {position} failed: {err}")
                offset = msg.offset()
                if msg.topic() != rng.topic or msg.partition() != rng.partition or offset < position:
                    continue  # stale message of an earlier assignment
                if offset >= rng.end:
                    position = rng.end
                    break
                builder.append(msg)
                position = offset + 1
                received += 1
                if len(builder) >= batch_rows:
                    crash_point("read")
                    yield builder.flush()
            if received:
                last_progress = time.monotonic()
                stall.records(received)
            if position < rng.end and stall.stalled():
                longer = fetch_wait.raise_step(conf, wait_ms)
                if longer is not None:
                    consumer.unassign()
                    consumer, wait_ms = _cached_consumer(conf)
                    consumer.assign([KafkaTopicPartition(rng.topic, rng.partition, position)])
                    stall = fetch_wait.StallDetector(wait_ms)
                    last_progress = time.monotonic()
        if len(builder):
            crash_point("read")
            yield builder.flush()
        ok = True
    finally:
        if ok and not _at_end_of_log(consumer, ktp, position):
            consumer.unassign()
        else:
            _evict(conf)


def _at_end_of_log(consumer: Consumer, ktp: KafkaTopicPartition, position: int) -> bool:
    """True when the last fetch answer put ``position`` at the end of the partition:
    the consumer then has a fetch waiting at the broker (see the module docstring)."""
    try:
        high = consumer.get_watermark_offsets(ktp, cached=True)[1]
    except Exception:  # noqa: BLE001 - unknown: assume the worst, a new consumer is cheap
        return True
    return high < 0 or position >= high


def _handle_out_of_range(consumer: Consumer, rng: OffsetRange, position: int,
                         fail_on_data_loss: bool, err: KafkaError) -> int:
    """Kafka no longer holds ``position``: fail, or skip to the earliest offset it holds."""
    tp = KafkaTopicPartition(rng.topic, rng.partition)
    low, _high = consumer.get_watermark_offsets(tp, timeout=10)
    message = (
        f"offsets [{position}, {min(low, rng.end)}) of {rng.topic}-{rng.partition} are no longer in Kafka "
        f"(earliest available: {low}; {err.str()})"
    )
    if fail_on_data_loss:
        raise DataLossError(message + ". Set failOnDataLoss=false to skip them.")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
    new_position = max(low, position)
    if new_position < rng.end:
        consumer.assign([KafkaTopicPartition(rng.topic, rng.partition, new_position)])
        return new_position
    return rng.end
