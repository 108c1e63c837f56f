"""Driver-side Kafka access: client settings, topic metadata and offset queries.

All components build their librdkafka settings with :func:`client_config`, so
TLS/SASL or any other client property is given once, as ``kafka.``-prefixed
options (the convention of Spark's Kafka source), and the bootstrap servers
default to :func:`streamlake.config.bootstrap_servers`.

Offsets come from ListOffsets, one request per call. ListOffsets(latest) is the
end of what a reader can read: the high watermark, or under ``read_committed``
(the platform's default) the last stable offset, since librdkafka sends the
consumer's isolation level with the request (measured on Apache Kafka 4.1.1
with a transaction open over offsets 6-8: 6 under ``read_committed``, 9 under
``read_uncommitted``). ListOffsets(earliest) is the log start offset, which
retention and DeleteRecords move. Errors Kafka documents as retriable (a
partition without a leader right after its topic was created or while its
leader moves: NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE,
UNKNOWN_TOPIC_OR_PARTITION, ...) are retried until the API timeout
(``kafka.default.api.timeout.ms``), as Kafka's own clients do.

Every consumer waits at most :data:`DEFAULT_FETCH_WAIT_MS` at the broker for a
fetch that finds nothing new (``kafka.fetch.wait.max.ms`` sets another value).
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
from streamlake.kafka.offsets import Offsets, TopicPartition

log = logging.getLogger(__name__)

KAFKA_OPTION_PREFIX = "kafka."
# Java client property Spark users set for admin/metadata calls; librdkafka has no
# such property, so it is taken out of the passthrough and used as our timeout.
API_TIMEOUT_PROPERTY = "default.api.timeout.ms"
DEFAULT_API_TIMEOUT_MS = 60_000
# Properties the platform owns: setting them would break offset management.
_RESERVED = {"group.id", "enable.auto.commit", "auto.offset.reset", "enable.partition.eof"}
FETCH_WAIT_PROPERTY = "fetch.wait.max.ms"
#: ``fetch.wait.max.ms`` of every consumer the platform makes, unless ``kafka.fetch.wait.max.ms``
#: sets it. A broker answers a fetch as soon as it has a record, so the wait costs nothing while
#: records are there; it is how long a fetch that finds nothing new is held at the broker, i.e.
#: how late a read that ended at the end of the log learns it (the partition-EOF event) and how
#: long a consumer reused after such a read waits for that fetch to come back. librdkafka's
#: default is 500 ms; 50 ms read a partition of 60,000 one-record batches as fast as 500 ms did,
#: and a live job's next micro-batch no longer waits up to 0.5 s (bench/results/kafka_vs_tansu.md).
DEFAULT_FETCH_WAIT_MS = 50
#: Errors of an offsets request that a later attempt can succeed after (Kafka's retriable errors
#: that a ListOffsets answers with while a partition has no serving leader, and lost connections;
#: _DESTROY_BROKER is how a request to a dead leader fails once librdkafka drops that node, which
#: the cluster's metadata no longer lists). Errors librdkafka marks retriable
#: (``KafkaError.retriable()``) are retried too; anything else is reported at once.
_RETRIABLE = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.REPLICA_NOT_AVAILABLE, KafkaError.BROKER_NOT_AVAILABLE, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.KAFKA_STORAGE_ERROR, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
    KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError._DESTROY_BROKER,
})
#: Seconds one attempt of an offsets request may take. librdkafka sends ListOffsets to the leader
#: its metadata names and does not look for a new one when that leader dies: the request waits out
#: its whole timeout, or answers LEADER_NOT_AVAILABLE again and again, long after the cluster
#: elected another leader (Apache Kafka 4.1.1, 3 nodes, the leader SIGKILLed: a 60 s request timed
#: out, or LEADER_NOT_AVAILABLE for 90 s, while the new leader served ~10 s after the kill). So each
#: attempt is bounded, and the metadata is refreshed after a failed one (tests/test_kafka_faults.py).
ATTEMPT_TIMEOUT_S = 5.0


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


def new_consumer(conf: Mapping[str, str], purpose: str) -> Consumer:
    """A consumer for assign()-based reads: no group management, no offset commits,
    partition EOF events on, out-of-range offsets reported as errors (never reset),
    ``read_committed`` and :data:`DEFAULT_FETCH_WAIT_MS` unless ``conf`` says otherwise.
    Raises InvalidOptionError when librdkafka refuses a setting.
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
    settings.setdefault(FETCH_WAIT_PROPERTY, str(DEFAULT_FETCH_WAIT_MS))
    settings.setdefault("client.id", f"streamlake-{purpose}")
    try:
        return Consumer(settings, logger=logging.getLogger(f"streamlake.librdkafka.{purpose}"))
    except KafkaException as exc:  # a property librdkafka refuses: the user's kafka.* options
        raise InvalidOptionError(f"Kafka client settings refused: {exc.args[0].str()} "
                                 f"(kafka.<property> options are librdkafka properties)") from None


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

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = new_consumer(self.conf, "metadata")
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
        """ListOffsets for a timestamp, or -1 (latest) / -2 (earliest).

        Retriable errors (:data:`_RETRIABLE`: a partition without a serving leader, as
        right after its topic was created, or after its leader died) are retried with a
        growing pause (50 ms up to 1 s) until the API timeout, each attempt at most
        :data:`ATTEMPT_TIMEOUT_S` and the metadata refreshed after a failed one (librdkafka
        then knows the partitions' new leaders); then KafkaUnavailableError names the
        partitions still unanswered, how long it tried and the last error. Any other error
        is raised at once.
        """
        pending = list(dict.fromkeys(tps))
        if not pending:
            return {}
        out: Offsets = {}
        started = time.monotonic()
        deadline = started + self.timeout_s
        pause, attempts, last = 0.05, 0, None
        while True:
            attempts += 1
            try:
                answer = self.consumer.offsets_for_times(
                    [KafkaTopicPartition(tp.topic, tp.partition, timestamp) for tp in pending],
                    timeout=max(0.001, min(ATTEMPT_TIMEOUT_S, deadline - time.monotonic())))
            except KafkaException as exc:
                last = exc.args[0]
                if not _retriable(last):
                    raise KafkaUnavailableError(f"offsets request to Kafka at {self.bootstrap} for "
                                                f"{_names(pending)} failed: {last}") from None
            else:
                for r in answer:
                    if r.error is None:
                        out[TopicPartition(r.topic, r.partition)] = r.offset
                    elif _retriable(r.error):
                        last = r.error
                    else:
                        raise KafkaUnavailableError(f"offsets request for {r.topic}-{r.partition} failed: {r.error}")
                pending = [tp for tp in pending if tp not in out]
            if not pending:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                raise KafkaUnavailableError(
                    f"Kafka at {self.bootstrap} did not answer an offsets request for {_names(pending)} within "
                    f"{self.timeout_s:g}s ({attempts} attempt(s) over {time.monotonic() - started:.1f}s; set "
                    f"STREAMLAKE_KAFKA_BOOTSTRAP or kafka.bootstrap.servers; kafka.{API_TIMEOUT_PROPERTY} sets "
                    f"the timeout); the last error: {last}")
            time.sleep(min(pause, left))
            pause = min(2 * pause, 1.0)
            self._refresh_metadata(deadline)

    def _refresh_metadata(self, deadline: float) -> None:
        """A full metadata request (it names no topic, so it creates none), from whose answer
        librdkafka takes the partitions' current leaders; an error is left to the next attempt."""
        try:
            self.consumer.list_topics(timeout=max(0.001, min(ATTEMPT_TIMEOUT_S, deadline - time.monotonic())))
        except KafkaException:
            pass

    def earliest(self, tps: Iterable[TopicPartition]) -> Offsets:
        """First offset Kafka still holds per partition (the log start offset)."""
        return self._list_offsets(tps, -2)

    def for_timestamp(self, tps: Iterable[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        """First offset whose record timestamp is >= ``timestamp_ms``; None when there is none
        (Kafka answers -1 for a timestamp after every record, and on an empty partition)."""
        return {tp: (off if off >= 0 else None) for tp, off in self._list_offsets(tps, timestamp_ms).items()}

    def latest(self, tps: Iterable[TopicPartition]) -> Offsets:
        """End offset per partition: one past the last readable record. ListOffsets(latest):
        the high watermark, or under ``read_committed`` (the default) the last stable offset,
        so records of a transaction still open are not counted (see the module docstring).
        One request; raises KafkaUnavailableError if it is not answered within the API timeout."""
        return self._list_offsets(tps, -1)


def _retriable(err: KafkaError) -> bool:
    return err.code() in _RETRIABLE or err.retriable()


def _names(tps: Iterable[TopicPartition], most: int = 5) -> str:
    tps = list(tps)
    return ", ".join(map(str, tps[:most])) + (f" and {len(tps) - most} more" if len(tps) > most else "")
