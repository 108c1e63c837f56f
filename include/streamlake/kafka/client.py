"""Driver-side Kafka access: client settings, topic metadata and offset queries.

All components build their librdkafka settings with :func:`client_config`, so
TLS/SASL or any other client property is given once, as ``kafka.``-prefixed
options (the convention of Spark's Kafka source), and the bootstrap servers
default to :func:`streamlake.config.bootstrap_servers`.

End offsets are found by a fetch, not by ListOffsets alone: the embedded broker
(Tansu 0.6) answers ListOffsets(latest) with the newest *batch's* base offset
+ 1, which is wrong whenever producers batch. A consumer positioned at the listed
offset learns the true end from the fetch answers: the partition-EOF event (the
high watermark, or the last stable offset under ``read_committed``), or, on a
topic that is being written so that no fetch ever comes back empty, having read
up to the high watermark a fetch answer carried. On real Kafka the listed offset
already is the end, so the probe costs one fetch per partition.

How long fetches wait at the broker adapts to the broker (see
:mod:`streamlake.kafka.fetch_wait`).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from streamlake import config
from streamlake.errors import InvalidOptionError, KafkaUnavailableError, UnknownTopicError
from streamlake.kafka import fetch_wait
from streamlake.kafka.offsets import Offsets, TopicPartition

log = logging.getLogger(__name__)

KAFKA_OPTION_PREFIX = "kafka."
# Java client property Spark users set for admin/metadata calls; librdkafka has no
# such property, so it is taken out of the passthrough and used as our timeout.
API_TIMEOUT_PROPERTY = "default.api.timeout.ms"
DEFAULT_API_TIMEOUT_MS = 60_000
# Properties the platform owns: setting them would break offset management.
_RESERVED = {"group.id", "enable.auto.commit", "auto.offset.reset", "enable.partition.eof"}
# Fetch waits an end probe allows for the EOF event after the first fetch answer.
SETTLE_WAITS = 2


def client_config(options: Mapping[str, str] | None = None) -> dict[str, str]:
    """librdkafka settings from ``kafka.*`` options, bootstrap servers defaulted.

    Raises InvalidOptionError for properties the source manages itself.
    """
    conf: dict[str, str] = {}
    for key, value in (options or {}).items():
        if key.lower().startswith(KAFKA_OPTION_PREFIX):
            prop = key[len(KAFKA_OPTION_PREFIX):]
            if prop in _RESERVED:
                raise InvalidOptionError(
                    f"option {key!r} is managed by the source (offsets are tracked by Spark and "
                    f"the Delta table, not by consumer groups); remove it"
                )
            conf[prop] = str(value)
    conf.setdefault("bootstrap.servers", config.bootstrap_servers())
    return conf


def api_timeout_s(conf: Mapping[str, str]) -> float:
    """Timeout for metadata and offset requests, from ``kafka.default.api.timeout.ms``."""
    raw = conf.get(API_TIMEOUT_PROPERTY, DEFAULT_API_TIMEOUT_MS)
    try:
        ms = int(raw)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"kafka.{API_TIMEOUT_PROPERTY} must be milliseconds, got {raw!r}") from None
    if ms <= 0:
        raise InvalidOptionError(f"kafka.{API_TIMEOUT_PROPERTY} must be > 0, got {ms}")
    return ms / 1000.0


def librdkafka_config(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` without the properties librdkafka does not know."""
    return {k: v for k, v in conf.items() if k != API_TIMEOUT_PROPERTY}


def new_consumer(conf: Mapping[str, str], purpose: str, wait_ms: int) -> Consumer:
    """A consumer for assign()-based reads: no group management, no offset commits,
    partition EOF events on, out-of-range offsets reported as errors (never reset).

    ``fetch.wait.max.ms`` is ``wait_ms``: the user's setting or this process's
    current step (:func:`streamlake.kafka.fetch_wait.current_ms`).
    """
    settings = librdkafka_config(conf)
    settings.update({
        "group.id": f"streamlake-{purpose}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "enable.partition.eof": "true",
        "auto.offset.reset": "error",
        "allow.auto.create.topics": "false",
    })
    settings.setdefault("isolation.level", "read_committed")
    settings[fetch_wait.PROPERTY] = str(wait_ms)
    settings.setdefault("client.id", f"streamlake-{purpose}")
    return Consumer(settings, logger=logging.getLogger(f"streamlake.librdkafka.{purpose}"))


class KafkaMetadataClient:
    """Topic metadata and offset queries for the driver (source planning, audit, jobs).

    Every call raises KafkaUnavailableError when the cluster does not answer
    within the API timeout, naming the bootstrap servers.
    """

    def __init__(self, conf: Mapping[str, str]):
        self.conf = dict(conf)
        self.timeout_s = api_timeout_s(conf)
        self.bootstrap = conf.get("bootstrap.servers", "?")
        self._consumer: Consumer | None = None
        self._consumer_wait_ms = 0

    @property
    def consumer(self) -> Consumer:
        wait_ms = fetch_wait.current_ms(self.conf, "probe")
        if self._consumer is not None and self._consumer_wait_ms != wait_ms:
            self.close()
        if self._consumer is None:
            self._consumer = new_consumer(self.conf, "metadata", wait_ms)
            self._consumer_wait_ms = wait_ms
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> "KafkaMetadataClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unavailable(self, what: str, exc: Exception) -> KafkaUnavailableError:
        return KafkaUnavailableError(
            f"Kafka at {self.bootstrap} did not answer {what} within {self.timeout_s:g}s "
            f"(set STREAMLAKE_KAFKA_BOOTSTRAP or kafka.bootstrap.servers; "
            f"kafka.{API_TIMEOUT_PROPERTY} sets the timeout): {exc}"
        )

    def topics(self) -> dict[str, int]:
        """Existing topics and their partition counts (full metadata: never auto-creates)."""
        try:
            md = self.consumer.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            raise self._unavailable("a metadata request", exc) from None
        return {
            name: len(t.partitions)
            for name, t in md.topics.items()
            if t.error is None and not name.startswith("__")
        }

    def partitions(self, topics: Iterable[str] | None = None, pattern: str | None = None) -> list[TopicPartition]:
        """Partitions of the named topics (all must exist) or of topics matching ``pattern``.

        Raises UnknownTopicError for a named topic that does not exist.
        """
        existing = self.topics()
        if pattern is not None:
            regex = re.compile(pattern)
            names = sorted(t for t in existing if regex.fullmatch(t))
        else:
            names = sorted(set(topics or ()))
            missing = [t for t in names if t not in existing]
            if missing:
                raise UnknownTopicError(
                    f"topic(s) {', '.join(missing)} do not exist on {self.bootstrap} "
                    f"(existing: {', '.join(sorted(existing)) or 'none'})"
                )
        return [TopicPartition(t, p) for t in names for p in range(existing[t])]

    def _list_offsets(self, tps: Iterable[TopicPartition], timestamp: int) -> Offsets:
        """ListOffsets for a timestamp, or -1 (latest) / -2 (earliest)."""
        request = [KafkaTopicPartition(tp.topic, tp.partition, timestamp) for tp in tps]
        if not request:
            return {}
        try:
            answer = self.consumer.offsets_for_times(request, timeout=self.timeout_s)
        except KafkaException as exc:
            raise self._unavailable("an offsets request", exc) from None
        out: Offsets = {}
        for r in answer:
            if r.error is not None:
                raise KafkaUnavailableError(f"offsets request for {r.topic}-{r.partition} failed: {r.error}")
            out[TopicPartition(r.topic, r.partition)] = r.offset
        return out

    def earliest(self, tps: Iterable[TopicPartition]) -> Offsets:
        """First offset Kafka still holds per partition (the log start offset)."""
        return self._list_offsets(tps, -2)

    def for_timestamp(self, tps: Iterable[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        """First offset whose record timestamp is >= ``timestamp_ms``; None when there is none.

        The broker's answer is checked against the record it points at (Kafka's
        contract: that record's timestamp is >= ``timestamp_ms``). The embedded
        broker answers 0 instead of "none" for a timestamp after every record;
        the check turns that into None.
        """
        found = {tp: (off if off >= 0 else None) for tp, off in self._list_offsets(tps, timestamp_ms).items()}
        for tp, off in found.items():
            if off is not None and not self._record_at_or_after(tp, off, timestamp_ms):
                log.warning("broker answered offset %d of %s for timestamp %d, but that record is older; "
                            "treating it as 'no such record'", off, tp, timestamp_ms)
                found[tp] = None
        return found

    def _record_at_or_after(self, tp: TopicPartition, offset: int, timestamp_ms: int) -> bool:
        """True if the record at ``offset`` exists and is not older than ``timestamp_ms``."""
        consumer = self.consumer
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset)])
        deadline = time.monotonic() + self.timeout_s
        try:
            while time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=1, timeout=0.2):
                    if msg.error() is None:
                        return msg.timestamp()[1] >= timestamp_ms
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return False
            raise KafkaUnavailableError(f"no answer reading {tp} at offset {offset} within {self.timeout_s:g}s")
        finally:
            consumer.unassign()

    def latest(self, tps: Iterable[TopicPartition]) -> Offsets:
        """End offset per partition: one past the last readable record.

        Starts from ListOffsets(latest) and confirms it by fetching from there (see
        the module docstring). A partition's end is the offset of its EOF event
        (under ``read_committed``: the last stable offset); on a partition being
        written, where a fetch at the end returns new records instead of EOF, it is
        where the newest fetch answer ended once :data:`SETTLE_WAITS` fetch waits
        passed without EOF: its high watermark, or under ``read_committed`` (the
        default) the offset after the newest record received, since the high
        watermark may count records of open transactions, not readable yet. Either is a real position no later than
        the true end, and the call never chases a producer. Raises
        KafkaUnavailableError if a partition's end is not known within the API
        timeout.
        """
        return self.confirm_ends(self.listed_ends(tps))

    def listed_ends(self, tps: Iterable[TopicPartition]) -> Offsets:
        """ListOffsets(latest) alone: the end on Apache Kafka; on the embedded broker, whose
        answer is the newest record batch's base offset + 1, a real position that may fall
        short of the end by the rest of that batch (never beyond it). One request, no fetch."""
        return self._list_offsets(list(tps), -1)

    def confirm_ends(self, listed: Mapping[TopicPartition, int]) -> Offsets:
        """The ends of :meth:`latest`, from ListOffsets answers ``listed`` (see there)."""
        tps = list(listed)
        if not tps:
            return {}
        consumer = self.consumer
        ktps = {tp: KafkaTopicPartition(tp.topic, tp.partition) for tp in tps}
        stale_high = {tp: consumer.get_watermark_offsets(ktps[tp], cached=True)[1] for tp in tps}
        seen: Offsets = dict(listed)
        answered: dict[TopicPartition, float] = {}  # when a fetch answer for the partition was first seen
        ends: Offsets = {}
        deadline = time.monotonic() + self.timeout_s
        stall = fetch_wait.StallDetector(self._consumer_wait_ms, min_records=1)
        committed_only = self.conf.get("isolation.level", "read_committed") == "read_committed"
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, listed[tp]) for tp in tps])
        try:
            while len(ends) < len(tps):
                now = time.monotonic()
                if now > deadline:
                    missing = ", ".join(str(tp) for tp in tps if tp not in ends)
                    raise KafkaUnavailableError(f"the end of {missing} was not known within {self.timeout_s:g}s "
                                                f"(kafka.{API_TIMEOUT_PROPERTY} sets the timeout)")
                for msg in consumer.consume(num_messages=10_000, timeout=0.01):
                    tp = TopicPartition(msg.topic(), msg.partition())
                    if tp in ends or tp not in seen:
                        continue
                    err = msg.error()
                    if err is None:
                        seen[tp] = max(seen[tp], msg.offset() + 1)
                        answered.setdefault(tp, now)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        ends[tp] = max(msg.offset(), seen[tp])
                    elif err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        ends[tp] = listed[tp]
                    elif not err.retriable() and err.fatal():
                        raise KafkaUnavailableError(f"probing the end of {tp} failed: {err}")
                settle = SETTLE_WAITS * self._consumer_wait_ms / 1000 + 0.02
                for tp in tps:
                    if tp in ends:
                        continue
                    high = consumer.get_watermark_offsets(ktps[tp], cached=True)[1]
                    if high != stale_high[tp]:
                        answered.setdefault(tp, now)
                    if tp in answered:
                        stall.records(1)
                        if now - answered[tp] >= settle:  # answered, no EOF: the partition is being written
                            ends[tp] = max(listed[tp], seen[tp], -1 if committed_only else high)
                if len(ends) < len(tps) and stall.stalled():  # no answer at all: fetches need longer
                    wait_ms = fetch_wait.raise_step(self.conf, self._consumer_wait_ms, "probe")
                    if wait_ms is not None:
                        consumer.unassign()
                        consumer = self.consumer  # a new consumer with the longer wait
                        stall = fetch_wait.StallDetector(self._consumer_wait_ms, min_records=1)
                        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, seen[tp])
                                         for tp in tps if tp not in ends])
        finally:
            consumer.unassign()
            if self._consumer_wait_ms > fetch_wait.STEPS_MS[0]:
                self.close()  # its last fetch waits at the end of the log: the next call would wait for it
        return ends
