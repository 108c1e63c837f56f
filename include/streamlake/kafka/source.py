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

Offsets are ``{"topic": {"partition": next_offset}}``. Every micro-batch reads
exactly the records in ``[start, end)`` of each partition; the end of a batch
never exceeds what Kafka holds (see :mod:`streamlake.kafka.client` for how the
end is found on brokers whose ListOffsets is wrong). Read limits are honoured
under processing-time and available-now triggers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

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
from streamlake.kafka.reader import KAFKA_SCHEMA_DDL, read_range

log = logging.getLogger(__name__)

FORMAT = "streamlake-kafka"
_KNOWN_OPTIONS = {
    "subscribe", "subscribepattern", "assign", "startingoffsets", "startingtimestamp",
    "startingoffsetsbytimestampstrategy", "maxoffsetspertrigger", "minpartitions",
    "failondataloss", "kafkaconsumer.polltimeoutms", "includeheaders",
}


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
                "failOnDataLoss, kafkaConsumer.pollTimeoutMs, kafka.<client property>"
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
        )
        parse_starting_offsets(parsed.starting_offsets, parsed.starting_timestamp)  # validate now
        return parsed


class KafkaInputPartition(InputPartition):
    """One Spark task: the records ``[start, end)`` of one topic-partition."""

    def __init__(self, rng: OffsetRange):
        super().__init__((rng.topic, rng.partition, rng.start, rng.end))
        self.range = rng


class KafkaOffsetPlanner:
    """Driver-side offset logic of the source, usable without Spark (jobs, tests).

    Raises UnknownTopicError, DataLossError, KafkaUnavailableError and
    InvalidOptionError with messages naming the topic-partition and offsets.
    """

    def __init__(self, options: KafkaSourceOptions):
        self.options = options
        self._client: KafkaMetadataClient | None = None

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
                        latest: Mapping[TopicPartition, int] | None = None) -> Offsets:
        """Start offsets Kafka can serve. Offsets before the log start (retention) or
        past the end (topic recreated) are data loss: DataLossError when
        ``failOnDataLoss``, else moved to the earliest offset with a warning."""
        tps = list(start)
        earliest = earliest if earliest is not None else self.client.earliest(tps)
        latest = latest if latest is not None else self.client.latest(tps)
        problems, fixed = [], dict(start)
        for tp in tps:
            off = start[tp]
            if off < earliest[tp]:
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

        New partitions start at their earliest offset. ``target`` (available-now)
        caps every partition; ``limit`` caps the total number of offsets.
        """
        tps = self.partitions()
        gone = sorted(set(start) - set(tps))
        if gone:
            message = f"partition(s) {', '.join(map(str, gone))} no longer exist in Kafka"
            if self.options.fail_on_data_loss:
                raise DataLossError(message + ". Set failOnDataLoss=false to drop them.")
            log.warning("%s; dropping them", message)
        new = [tp for tp in tps if tp not in start]
        earliest = self.client.earliest(tps)
        latest = self.client.latest(tps)
        begin = {tp: start[tp] for tp in tps if tp in start}
        begin = self.check_available(begin, earliest=earliest, latest=latest) if begin else {}
        begin.update({tp: earliest[tp] for tp in new})
        end = dict(latest)
        if target is not None:
            end = {tp: max(begin[tp], min(end[tp], target.get(tp, begin[tp]))) for tp in tps}
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, end, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            raise InvalidOptionError(f"unsupported read limit {limit!r}")
        # Keep partitions that failOnDataLoss=false dropped out of the offsets.
        return end, latest

    def ranges(self, start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> list[OffsetRange]:
        begin = dict(start)
        new = [tp for tp in end if tp not in begin]
        if new:
            begin.update(self.client.earliest(new))
        return plan_ranges(begin, end, self.options.min_partitions)


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
        planner = self.planner
        self._target = planner.client.latest(planner.partitions())
        log.info("available-now target offsets: %s", offsets_to_json(self._target))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end, self._latest = self.planner.next_end(offsets_from_json(start, "start offset"), limit, self._target)
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = self.planner.ranges(offsets_from_json(start, "start offset"), offsets_from_json(end, "end offset"))
        return [KafkaInputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator:
        return read_range(
            self.options.client, partition.range,
            poll_timeout_ms=self.options.poll_timeout_ms,
            fail_on_data_loss=self.options.fail_on_data_loss,
        )

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
        return KAFKA_SCHEMA_DDL

    def streamReader(self, schema) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)


def register(spark) -> None:
    """Register the source with a SparkSession (once per session is enough)."""
    spark.dataSource.register(KafkaDataSource)
