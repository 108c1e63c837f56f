"""Demo and test data: records of a pipeline definition produced to Kafka.

Each record is a JSON object of the definition's fields
(:mod:`streamlake.kafka.events` makes them, from the definition's ``datagen``
hints, and says what each is), optionally padded with a ``pad`` field to about
``value_bytes`` bytes. The same seed gives the same values. Late, out-of-order,
malformed and duplicate records can be mixed in; every record is stamped with
the Kafka timestamp its event time was derived from. A manifest (JSON lines)
can record where each record landed and what it is.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from streamlake.errors import InvalidOptionError, KafkaUnavailableError
from streamlake.kafka.client import KafkaMetadataClient, api_timeout_s, client_config, librdkafka_config
from streamlake.kafka.events import KINDS, DefinitionEvents, EventMix, GeneratedRecord
from streamlake.kafka.offsets import TopicPartition

__all__ = ["ProduceSummary", "ensure_topic", "produce_records", "summary_dict"]

log = logging.getLogger(__name__)


def ensure_topic(conf: Mapping[str, str], topic: str, partitions: int) -> bool:
    """Create ``topic`` with ``partitions`` partitions unless it exists. True if created.

    A new topic gets the cluster's default replication factor
    (``default.replication.factor``). An existing topic is used as is (a warning if its
    partition count differs). Either way this returns once every partition of the topic
    answers a ListOffsets from its leader: on Apache Kafka a topic just created has no
    serving leader for a moment (its partitions answer NOT_LEADER_OR_FOLLOWER or
    UNKNOWN_TOPIC_OR_PARTITION), and a reader or a job started right after would see that.
    Raises KafkaUnavailableError if the cluster does not answer within the API timeout.
    """
    timeout = api_timeout_s(conf)
    admin = AdminClient(librdkafka_config(conf), logger=logging.getLogger("streamlake.librdkafka.admin"))
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise KafkaUnavailableError(f"Kafka at {conf.get('bootstrap.servers')} did not answer: {exc}") from None
    if topic in existing and existing[topic].error is None:
        have = len(existing[topic].partitions)
        if have != partitions:
            log.warning("topic %s exists with %d partitions (asked for %d); using it as is", topic, have, partitions)
        _await_leaders(conf, topic, have)
        return False
    future = admin.create_topics([NewTopic(topic, partitions)], request_timeout=timeout)[topic]
    created = True
    try:
        future.result(timeout=timeout)
    except KafkaException as exc:
        if exc.args[0].code() != exc.args[0].TOPIC_ALREADY_EXISTS:
            raise
        created = False
        partitions = len(admin.list_topics(topic, timeout=timeout).topics[topic].partitions) or partitions
    _await_leaders(conf, topic, partitions)
    return created


def _await_leaders(conf: Mapping[str, str], topic: str, partitions: int) -> None:
    """Return once every partition of ``topic`` answers a ListOffsets (the metadata client
    retries "no leader yet" until the API timeout)."""
    with KafkaMetadataClient(conf) as kafka:
        kafka.earliest([TopicPartition(topic, p) for p in range(partitions)])


@dataclass
class ProduceSummary:
    topic: str
    records: int
    bytes: int
    partitions: int
    seconds: float
    records_per_second: float
    topic_created: bool
    kinds: dict[str, int] = field(default_factory=dict)    # records per kind (valid, late, duplicate, malformed)
    reasons: dict[str, int] = field(default_factory=dict)  # malformed records per expected reason code
    seed: int | None = None
    one_per_batch: bool = False
    manifest: str | None = None


def produce_records(definition, topic: str | None = None, count: int = 1000, partitions: int = 3,
                    rate: float | None = None, value_bytes: int | None = None, seed: int | None = None,
                    options: Mapping[str, str] | None = None, progress: bool = True, should_stop=lambda: False, *,
                    late_fraction: float = 0.0, out_of_order_seconds: float = 0.0, malformed_fraction: float = 0.0,
                    duplicate_fraction: float = 0.0, malformed_reasons: Sequence[str] | None = None,
                    one_per_batch: bool = False, manifest_path: str | Path | None = None,
                    clock: Callable[[], dt.datetime] | None = None) -> ProduceSummary:
    """Produce ``count`` records of ``definition`` (0 = until ``should_stop()``) to ``topic``
    (default: the definition's first topic), at most ``rate`` per second.

    ``late_fraction``, ``malformed_fraction``, ``duplicate_fraction`` and
    ``out_of_order_seconds`` shape the data (see :mod:`streamlake.kafka.events`);
    ``clock`` gives each record's "now" (event times and the Kafka timestamp).
    ``one_per_batch`` makes every record its own record batch
    (``batch.num.messages=1``, ``linger.ms=0``), as a real-time producer writes.
    ``manifest_path``: a JSON line per delivered record (partition, offset from
    the delivery report; seq, timestamp, kind, reason, variant, event_id,
    event_time, duplicate_of), in delivery order.

    Delivery is confirmed (idempotent producer, acks=all) before returning.
    Raises InvalidOptionError for bad arguments (before connecting) and
    KafkaUnavailableError if records could not be delivered.
    """
    topic = topic or (definition.topics[0] if definition.topics else None)
    if not topic:
        raise InvalidOptionError(f"pipeline {definition.name} reads a topic pattern: give the topic to produce to")
    if count < 0 or partitions < 1 or (value_bytes is not None and value_bytes < 1) or \
            (rate is not None and rate <= 0):
        raise InvalidOptionError("count >= 0, partitions >= 1, value-bytes >= 1 and rate > 0 are required")
    mix = EventMix(late_fraction, out_of_order_seconds, malformed_fraction, duplicate_fraction,
                   tuple(malformed_reasons) if malformed_reasons is not None else None)
    events = DefinitionEvents(definition, seed, value_bytes=value_bytes, mix=mix, clock=clock)
    conf = client_config({f"kafka.{k}": v for k, v in (options or {}).items()})
    if manifest_path is None:
        return _produce(conf, topic, count, partitions, rate, events, progress, should_stop, one_per_batch, None)
    with open(manifest_path, "w", encoding="utf-8") as manifest:
        return _produce(conf, topic, count, partitions, rate, events, progress, should_stop, one_per_batch,
                        manifest)


def _produce(conf, topic, count, partitions, rate, events: DefinitionEvents, progress, should_stop, one_per_batch,
             manifest) -> ProduceSummary:
    created = ensure_topic(conf, topic, partitions)
    settings = librdkafka_config(conf)
    if one_per_batch:
        settings.update({"batch.num.messages": "1", "linger.ms": "0"})
    settings.setdefault("linger.ms", "20")
    settings.setdefault("enable.idempotence", "true")
    settings.setdefault("acks", "all")
    producer = Producer(settings, logger=logging.getLogger("streamlake.librdkafka.producer"))
    kinds = dict.fromkeys(KINDS, 0)
    reasons = dict.fromkeys(events.reasons, 0)
    failures: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    def on_delivery_manifest(record: GeneratedRecord, err, msg) -> None:
        if err is not None:
            failures.append(str(err))
            return
        manifest.write(json.dumps(record.manifest_line(msg.partition(), msg.offset()), separators=(",", ":")))
        manifest.write("\n")

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=count or None, unit="rec", unit_scale=True, desc=f"produce {topic}", file=sys.stderr,
                   mininterval=0.5)
    started = time.monotonic()
    sent = size = 0
    try:
        while (count == 0 or sent < count) and not should_stop():
            if rate is not None:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(min(ahead, 0.5))
                    continue
            record = events.next()
            callback = on_delivery if manifest is None else functools.partial(on_delivery_manifest, record)
            while True:
                try:
                    producer.produce(topic, value=record.value, key=record.key, timestamp=record.timestamp_ms,
                                     on_delivery=callback)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            sent += 1
            size += len(record.value)
            kinds[record.kind] += 1
            if record.reason:
                reasons[record.reason] += 1
            if bar is not None and sent % 1000 == 0:
                bar.update(1000)
        left = producer.flush(api_timeout_s(conf))
    finally:
        if bar is not None:
            bar.update(sent % 1000)
            bar.close()
    if left or failures:
        raise KafkaUnavailableError(
            f"{left + len(failures)} of {sent} records to {topic} were not delivered "
            f"({failures[0] if failures else 'flush timed out'})"
        )
    seconds = time.monotonic() - started
    return ProduceSummary(topic, sent, size, partitions, round(seconds, 2),
                          round(sent / seconds, 1) if seconds else 0.0, created, kinds=kinds,
                          reasons=reasons, seed=events.seed, one_per_batch=one_per_batch,
                          manifest=manifest.name if manifest is not None else None)


def summary_dict(summary: ProduceSummary) -> dict:
    return asdict(summary)
