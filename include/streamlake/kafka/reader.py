"""Executor-side reading of one Kafka offset range into Arrow record batches.

Runs inside Spark's Python workers. Consumers are cached per worker process and
client configuration (Spark reuses Python workers across tasks), so a task pays
for an ``assign()``, not for a new connection.

Guarantees: every record Kafka returns with ``start <= offset < end`` is
emitted once, in offset order, and nothing outside the range. Offsets Kafka skips
(transaction markers, compacted records) are simply absent. A range that cannot
be read completely raises instead of returning a short result.
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

_consumers: dict[tuple, Consumer] = {}


def _cached_consumer(conf: Mapping[str, str]) -> Consumer:
    key = tuple(sorted(conf.items()))
    consumer = _consumers.get(key)
    if consumer is None:
        consumer = _consumers[key] = new_consumer(conf, "reader")
    return consumer


def _evict(conf: Mapping[str, str]) -> None:
    consumer = _consumers.pop(tuple(sorted(conf.items())), None)
    if consumer is not None:
        try:
            consumer.close()
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


def read_range(conf: Mapping[str, str], rng: OffsetRange, *, poll_timeout_ms: int,
               fail_on_data_loss: bool, batch_rows: int = 20_000) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``rng`` as Arrow batches in Spark's Kafka schema.

    Raises DataLossError when offsets of the range are no longer held by Kafka
    and ``fail_on_data_loss`` (otherwise the lost prefix is skipped with a
    warning), and KafkaUnavailableError when no progress is made for
    ``poll_timeout_ms`` or the broker reports an error.
    """
    from streamlake.faults import crash_point

    tp = f"{rng.topic}-{rng.partition}"
    consumer = _cached_consumer(conf)
    consumer.assign([KafkaTopicPartition(rng.topic, rng.partition, rng.start)])
    builder = _BatchBuilder(rng.topic, rng.partition)
    position = rng.start
    last_progress = time.monotonic()
    ok = False
    try:
        while position < rng.end:
            # consume() waits until it has num_messages or the timeout passed: ask for
            # what is left of the range (plus the EOF event) so it returns at once.
            msgs = consumer.consume(num_messages=max(1, min(rng.end - position + 1, 10_000)), timeout=0.1)
            if not msgs and time.monotonic() - last_progress > poll_timeout_ms / 1000:
                raise KafkaUnavailableError(
                    f"no progress reading {tp} offsets [{rng.start}, {rng.end}) at offset {position} "
                    f"for {poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs)"
                )
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if msg.offset() >= rng.end:  # only markers/compacted offsets were left
                            position = rng.end
                            break
                        continue  # end not readable yet (e.g. open transaction); keep polling
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
                last_progress = time.monotonic()
                if len(builder) >= batch_rows:
                    crash_point("read")
                    yield builder.flush()
        if len(builder):
            crash_point("read")
            yield builder.flush()
        ok = True
    finally:
        if ok:
            consumer.unassign()
        else:
            _evict(conf)


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
