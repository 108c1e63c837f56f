"""Kafka offsets as values: parsing, Spark's JSON shape, read limits and splits.

Pure functions with no I/O, shared by the Spark source (driver side), the Delta
sink and the audit. Offsets are "next offset to read" positions, as in Kafka and
in Spark's Kafka source: a range ``[start, end)`` holds the records whose offset
is ``>= start`` and ``< end``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping, NamedTuple

from streamlake.errors import InvalidOptionError

EARLIEST = -2  # Spark's sentinel for "earliest" inside startingOffsets JSON
LATEST = -1  # Spark's sentinel for "latest"


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


Offsets = dict[TopicPartition, int]


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{"topic": {"0": 42}}``, the shape Spark's Kafka source uses, sorted."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_json(obj: object, what: str = "offsets") -> Offsets:
    """Inverse of :func:`offsets_to_json`; accepts a JSON string or a parsed dict.

    Raises InvalidOptionError naming ``what`` when the value is not of that shape.
    """
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except ValueError as exc:
            raise InvalidOptionError(f"{what} is not valid JSON ({exc}): {obj!r}") from None
    if not isinstance(obj, dict):
        raise InvalidOptionError(
            f'{what} must be a JSON object like {{"topic": {{"0": 23, "1": -2}}}}, got {obj!r}'
        )
    out: Offsets = {}
    for topic, parts in obj.items():
        if not isinstance(topic, str) or not topic or not isinstance(parts, dict):
            raise InvalidOptionError(
                f'{what}: expected {{"topic": {{"partition": offset}}}}, got {topic!r}: {parts!r}'
            )
        for part, offset in parts.items():
            try:
                pnum = int(part)
            except (TypeError, ValueError):
                raise InvalidOptionError(f"{what}: partition {part!r} of {topic!r} is not an integer") from None
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise InvalidOptionError(f"{what}: offset {offset!r} of {topic}-{part} is not an integer")
            if pnum < 0 or offset < EARLIEST:
                raise InvalidOptionError(f"{what}: {topic}-{part} -> {offset} is out of range")
            out[TopicPartition(topic, pnum)] = offset
    return out


@dataclass(frozen=True)
class StartingOffsets:
    """Where a new query starts: ``earliest``, ``latest``, per-partition or by time."""

    kind: str  # "earliest" | "latest" | "specific" | "timestamp"
    specific: Mapping[TopicPartition, int] | None = None
    timestamp_ms: int | None = None


def parse_starting_offsets(starting_offsets: str | None, starting_timestamp: str | None) -> StartingOffsets:
    """Parse the ``startingOffsets`` / ``startingTimestamp`` options (Spark semantics).

    Raises InvalidOptionError for malformed values or when both are given.
    """
    if starting_timestamp is not None:
        if starting_offsets is not None:
            raise InvalidOptionError("give either startingOffsets or startingTimestamp, not both")
        try:
            ts = int(starting_timestamp)
        except ValueError:
            raise InvalidOptionError(
                f"startingTimestamp must be epoch milliseconds, got {starting_timestamp!r}"
            ) from None
        if ts < 0:
            raise InvalidOptionError(f"startingTimestamp must be >= 0, got {ts}")
        return StartingOffsets("timestamp", timestamp_ms=ts)
    value = (starting_offsets or "latest").strip()
    if value.lower() in ("earliest", "latest"):
        return StartingOffsets(value.lower())
    if not value.startswith("{"):
        raise InvalidOptionError(
            f"startingOffsets must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, got {value!r}'
        )
    return StartingOffsets("specific", specific=offsets_from_json(value, "startingOffsets"))


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[start, end)`` of one topic-partition: one Spark task's input."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def rate_limit(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_rows: int) -> Offsets:
    """End offsets that admit at most ``max_rows`` records in total.

    The budget is shared in proportion to each partition's backlog (as Spark's
    Kafka source does), with the rounding remainder given to the largest backlogs
    so the total is exactly ``min(max_rows, backlog)``. Partitions missing from
    ``start`` must have been resolved by the caller.
    """
    if max_rows <= 0:
        raise InvalidOptionError(f"maxOffsetsPerTrigger must be > 0, got {max_rows}")
    backlog = {tp: max(0, end - start[tp]) for tp, end in latest.items()}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: max_rows * size / total for tp, size in backlog.items()}
    take = {tp: math.floor(share) for tp, share in shares.items()}
    remainder = max_rows - sum(take.values())
    for tp in sorted(shares, key=lambda t: (shares[t] - take[t], backlog[t]), reverse=True)[:remainder]:
        take[tp] += 1
    return {tp: start[tp] + min(take[tp], backlog[tp]) for tp in latest}


def plan_ranges(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
                min_partitions: int | None = None) -> list[OffsetRange]:
    """Non-empty ranges from ``start`` to ``end``, split so there are at least
    ``min_partitions`` of them when the data allows (Spark's ``minPartitions``).

    Large ranges are cut into pieces of about equal size; one task per piece.
    """
    ranges = [
        OffsetRange(tp.topic, tp.partition, start[tp], end[tp])
        for tp in sorted(end)
        if end[tp] > start[tp]
    ]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    ideal = total / min_partitions
    out: list[OffsetRange] = []
    for r in ranges:
        parts = max(1, math.ceil(r.size / ideal))
        bounds = [r.start + (r.size * i) // parts for i in range(parts + 1)]
        out.extend(OffsetRange(r.topic, r.partition, lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo)
    return out
