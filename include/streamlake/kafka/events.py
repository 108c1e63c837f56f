"""Realistic, reproducible sensor readings: the shapes real data has, with labels.

:class:`SensorEvents` generates Kafka records (key, value, timestamp) of sensor
readings and says, for every record, what the pipeline must make of it. With a
seed and a ``clock`` (a callable returning timezone-aware datetimes, called
exactly once per record) the same arguments give the same records, byte for
byte. All fractions 0 (the default) gives the demo producer's plain readings:
key = sensor id, value = ``{"event_id", "sensor_id", "event_time",
"temperature"}`` as compact JSON, padded with a ``pad`` field to about
``value_bytes``, ``event_time`` = the clock's now (ISO-8601, milliseconds,
``+00:00``); the same seed gives the same bytes as before this module existed.

Each :class:`GeneratedRecord` has a ``kind``:

``valid``
    an on-time reading: ``event_time`` = now - uniform(0, ``out_of_order_seconds``),
    so readings arrive out of order within the allowed lateness (keep
    ``out_of_order_seconds`` <= the pipeline's allowed lateness, 30 s by
    default, for "on time" to hold). Lands in silver and gold.
``late``
    a valid reading whose ``event_time`` is 2 to 15 minutes before now: its
    1-minute window ended at least 60 s before now, so it is behind any
    watermark (max event time seen - 30 s) that an on-time reading stamped
    within 30 s of it has advanced. Lands in silver and in late_events (a
    late record before any on-time one finds no watermark to miss).
``duplicate``
    the exact key and value bytes of a recent ``valid`` or ``late`` record
    (one of the last :data:`DUPLICATE_LOOKBACK`), re-sent with a new Kafka
    timestamp; ``duplicate_of`` is the original's ``seq``. Same key, so same
    partition, after the original. De-duplication drops it: it adds nothing
    to silver, gold or late_events. Its event time is the original's (a
    duplicate of an on-time reading is on time as far as event time goes).
``malformed``
    violates exactly one rule of :data:`streamlake.pipeline.schemas.QUARANTINE_REASONS`;
    ``reason`` is that code and ``variant`` says how (see :data:`MALFORMED_VARIANTS`).
    Lands in quarantine with that reason.

The Kafka timestamp (``timestamp_ms``) is the same clock reading the event
time was derived from, and the producer stamps the record with it, so the
``far_future`` rule (event time more than 1 hour after the Kafka timestamp)
is decided by the data alone.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from streamlake.errors import InvalidOptionError

KINDS = ("valid", "late", "duplicate", "malformed")
# The quarantine's reason codes, in validation order (tests check that they are
# exactly streamlake.pipeline.schemas.QUARANTINE_REASONS).
REASONS = ("not_json", "not_object", "missing_field", "wrong_type", "empty_field", "invalid_timestamp",
           "out_of_range", "far_future")
# How a malformed record of each reason is made.
MALFORMED_VARIANTS: dict[str, tuple[str, ...]] = {
    "not_json": ("truncated", "text", "empty"),
    "not_object": ("array", "string"),
    "missing_field": ("absent", "null"),
    "wrong_type": ("temperature_string", "temperature_boolean", "event_id_number", "sensor_id_number",
                   "event_time_number"),
    "empty_field": ("event_id_empty", "sensor_id_empty"),
    "invalid_timestamp": ("no_offset", "garbage", "impossible_date"),
    "out_of_range": ("too_hot", "too_cold"),
    "far_future": ("hours_ahead",),
}
FIELDS = ("event_id", "sensor_id", "event_time", "temperature")
LATE_SECONDS = (120.0, 900.0)              # late: event time this far before now
FAR_FUTURE_SECONDS = (2 * 3600.0, 6 * 3600.0)  # far_future: event time this far after now
MAX_OUT_OF_ORDER_SECONDS = 60.0            # beyond that, "on time" and "late" would overlap
DUPLICATE_LOOKBACK = 50                    # duplicates re-send one of the last N valid/late records
_HOT = (150.0, 80.5)
_COLD = (-100.0, -60.5)
_GARBAGE_TIMES = ("yesterday", "N/A", "12:34:56", "not a timestamp", "1762336800123")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True)
class EventMix:
    """What share of records is of each kind; the rest is ``valid``.

    Raises InvalidOptionError (naming the option) for fractions outside 0..1, a
    sum of late + malformed + duplicate above 1, ``out_of_order_seconds``
    outside 0..60, or an unknown reason in ``malformed_reasons``.
    """

    late_fraction: float = 0.0
    out_of_order_seconds: float = 0.0
    malformed_fraction: float = 0.0
    duplicate_fraction: float = 0.0
    malformed_reasons: tuple[str, ...] = REASONS

    def __post_init__(self) -> None:
        for name in ("late_fraction", "malformed_fraction", "duplicate_fraction"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
                raise InvalidOptionError(f"{name.replace('_', '-')} must be between 0 and 1, got {value!r}")
        total = self.late_fraction + self.malformed_fraction + self.duplicate_fraction
        if total > 1.0 + 1e-9:
            raise InvalidOptionError(
                f"late-fraction + malformed-fraction + duplicate-fraction must be at most 1, got "
                f"{self.late_fraction} + {self.malformed_fraction} + {self.duplicate_fraction} = {total:g}")
        s = self.out_of_order_seconds
        if not isinstance(s, (int, float)) or isinstance(s, bool) or not 0.0 <= s <= MAX_OUT_OF_ORDER_SECONDS:
            raise InvalidOptionError(
                f"out-of-order-seconds must be between 0 and {MAX_OUT_OF_ORDER_SECONDS:g} (on-time events stay "
                f"within the allowed lateness; late ones are 2 to 15 minutes behind), got {s!r}")
        reasons = tuple(self.malformed_reasons)
        unknown = [r for r in reasons if r not in REASONS]
        if unknown or not reasons:
            raise InvalidOptionError(f"malformed reasons must be a non-empty subset of {', '.join(REASONS)}; "
                                     f"got {', '.join(map(str, unknown)) or 'none'}")
        object.__setattr__(self, "malformed_reasons", reasons)

    @property
    def valid_fraction(self) -> float:
        return max(0.0, 1.0 - self.late_fraction - self.malformed_fraction - self.duplicate_fraction)


@dataclass(frozen=True)
class GeneratedRecord:
    """One Kafka record and what the pipeline must make of it."""

    seq: int                      # 0-based position in the generated sequence
    key: bytes                    # the sensor id the reading came from
    value: bytes
    timestamp_ms: int             # Kafka CreateTime the producer stamps (the clock reading)
    kind: str                     # valid | late | duplicate | malformed
    reason: str | None = None     # malformed: the expected QUARANTINE_REASONS code
    variant: str | None = None    # malformed: how the rule is broken (MALFORMED_VARIANTS)
    event_id: str | None = None   # the value's event_id when it is an object with a string event_id
    sensor_id: str | None = None  # valid, late, duplicate: the parsed reading
    event_time: dt.datetime | None = None
    temperature: float | None = None
    duplicate_of: int | None = None  # duplicate: seq of the original

    @property
    def timestamp(self) -> dt.datetime:
        return _EPOCH + dt.timedelta(milliseconds=self.timestamp_ms)

    def manifest_line(self, partition: int | None = None, offset: int | None = None) -> dict:
        """The manifest's JSON object for this record (``partition``/``offset`` from the delivery report)."""
        return {"partition": partition, "offset": offset, "seq": self.seq, "timestamp": self.timestamp_ms,
                "kind": self.kind, "reason": self.reason, "variant": self.variant, "event_id": self.event_id,
                "event_time": self.event_time.isoformat(timespec="milliseconds") if self.event_time else None,
                "duplicate_of": self.duplicate_of}


class SensorEvents:
    """Deterministic generator of labelled sensor readings (see the module docstring).

    ``seed``: same seed and same clock readings, same records (``None``: random).
    ``clock``: returns the "now" of each record (timezone-aware); default: UTC wall clock.
    """

    def __init__(self, seed: int | None = None, *, sensors: int = 64, value_bytes: int = 256,
                 late_fraction: float = 0.0, out_of_order_seconds: float = 0.0, malformed_fraction: float = 0.0,
                 duplicate_fraction: float = 0.0, malformed_reasons: Sequence[str] | None = None,
                 clock: Callable[[], dt.datetime] | None = None, mix: EventMix | None = None):
        if sensors < 1 or value_bytes < 1:
            raise InvalidOptionError("sensors >= 1 and value-bytes >= 1 are required")
        self.mix = mix or EventMix(late_fraction, out_of_order_seconds, malformed_fraction, duplicate_fraction,
                                   tuple(malformed_reasons) if malformed_reasons is not None else REASONS)
        # The readings' content comes from ``rng`` in the order the original demo
        # generator drew it, so all-zero fractions give the same bytes as before;
        # kinds, disorder and corruptions come from a second stream.
        self.rng = random.Random(seed)
        self.aux = random.Random(f"streamlake-events:{seed}") if seed is not None else random.Random()
        self.sensors = [f"sensor-{i:04d}" for i in range(sensors)]
        self.base = {s: self.rng.uniform(15.0, 25.0) for s in self.sensors}
        self.value_bytes = value_bytes
        self.clock = clock or utc_now
        self.seq = 0
        self._recent: deque[GeneratedRecord] = deque(maxlen=DUPLICATE_LOOKBACK)

    # -- public -------------------------------------------------------------

    def next(self) -> GeneratedRecord:
        now = self._now()
        mix, u = self.mix, self.aux.random()
        if u < mix.late_fraction:
            record = self._reading(now, "late", now - dt.timedelta(seconds=self.aux.uniform(*LATE_SECONDS)))
        elif u < mix.late_fraction + mix.malformed_fraction:
            record = self._malformed(now)
        elif u < mix.late_fraction + mix.malformed_fraction + mix.duplicate_fraction and self._recent:
            record = self._duplicate(now)
        else:
            jitter = self.aux.uniform(0.0, mix.out_of_order_seconds) if mix.out_of_order_seconds else 0.0
            record = self._reading(now, "valid", now - dt.timedelta(seconds=jitter))
        if record.kind in ("valid", "late"):
            self._recent.append(record)
        self.seq += 1
        return record

    def take(self, n: int) -> list[GeneratedRecord]:
        return [self.next() for _ in range(n)]

    def __iter__(self) -> Iterator[GeneratedRecord]:
        while True:
            yield self.next()

    # -- kinds --------------------------------------------------------------

    def _now(self) -> dt.datetime:
        now = self.clock()
        if not isinstance(now, dt.datetime) or now.tzinfo is None:
            raise ValueError(f"the clock must return timezone-aware datetimes, got {now!r}")
        return now.astimezone(dt.timezone.utc)

    def _event(self) -> dict:
        """A fresh reading's fields (event_time filled in by the caller)."""
        sensor = self.rng.choice(self.sensors)
        return {
            "event_id": str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
            "sensor_id": sensor,
            "event_time": None,
            "temperature": round(self.base[sensor] + self.rng.gauss(0, 0.5), 2),
        }

    def _reading(self, now: dt.datetime, kind: str, event_time: dt.datetime) -> GeneratedRecord:
        event = self._event()
        event["event_time"] = _iso(event_time)
        return GeneratedRecord(
            self.seq, event["sensor_id"].encode(), self._encode(event), _ms(now), kind,
            event_id=event["event_id"], sensor_id=event["sensor_id"],
            event_time=dt.datetime.fromisoformat(event["event_time"]), temperature=event["temperature"])

    def _duplicate(self, now: dt.datetime) -> GeneratedRecord:
        original = self.aux.choice(self._recent)
        return GeneratedRecord(
            self.seq, original.key, original.value, _ms(now), "duplicate", event_id=original.event_id,
            sensor_id=original.sensor_id, event_time=original.event_time, temperature=original.temperature,
            duplicate_of=original.seq)

    def _malformed(self, now: dt.datetime) -> GeneratedRecord:
        aux = self.aux
        reason = aux.choice(self.mix.malformed_reasons)
        variant = aux.choice(MALFORMED_VARIANTS[reason])
        event = self._event()
        key = event["sensor_id"].encode()
        event["event_time"] = _iso(now)
        value: bytes | None = None
        if reason == "not_json":
            if variant == "truncated":
                body = self._encode(event)
                value = body[:aux.randint(1, len(body) - 1)]
            elif variant == "text":
                value = f"{event['sensor_id']},{event['event_time']},{event['temperature']}".encode()
            else:
                value = b""
        elif reason == "not_object":
            body = self._encode(event).decode()
            value = ("[" + body + "]" if variant == "array" else json.dumps(body)).encode()
        elif reason == "missing_field":
            name = aux.choice(FIELDS)
            if variant == "absent":
                del event[name]
            else:
                event[name] = None
            variant = f"{variant}:{name}"
        elif reason == "wrong_type":
            if variant == "temperature_string":
                event["temperature"] = str(event["temperature"])
            elif variant == "temperature_boolean":
                event["temperature"] = aux.random() < 0.5
            elif variant == "event_id_number":
                event["event_id"] = aux.randint(1, 10**9)
            elif variant == "sensor_id_number":
                event["sensor_id"] = int(event["sensor_id"].rsplit("-", 1)[1])
            else:
                event["event_time"] = _ms(now)
        elif reason == "empty_field":
            event["event_id" if variant == "event_id_empty" else "sensor_id"] = ""
        elif reason == "invalid_timestamp":
            if variant == "no_offset":
                event["event_time"] = now.replace(tzinfo=None).isoformat(timespec="milliseconds")
            elif variant == "garbage":
                event["event_time"] = aux.choice(_GARBAGE_TIMES)
            else:
                event["event_time"] = f"{now.year:04d}-13-{now.day:02d}" + event["event_time"][10:]
        elif reason == "out_of_range":
            event["temperature"] = aux.choice(_HOT if variant == "too_hot" else _COLD)
        else:  # far_future
            event["event_time"] = _iso(now + dt.timedelta(seconds=aux.uniform(*FAR_FUTURE_SECONDS)))
        if value is None:
            value = self._encode(event)
        event_id = event.get("event_id") if reason not in ("not_json", "not_object") else None
        return GeneratedRecord(self.seq, key, value, _ms(now), "malformed", reason=reason, variant=variant,
                               event_id=event_id if isinstance(event_id, str) else None)

    def _encode(self, event: dict) -> bytes:
        body = json.dumps(event, separators=(",", ":"))
        pad = self.value_bytes - len(body) - len(',"pad":""')
        if pad > 0:
            body = body[:-1] + ',"pad":"' + "x" * pad + '"}'
        return body.encode()


class SensorReadings:
    """The original demo generator's interface: ``next(now)`` -> (key, value) of a valid reading."""

    def __init__(self, seed: int | None = None, sensors: int = 64, value_bytes: int = 256):
        self._now: dt.datetime | None = None
        self._events = SensorEvents(seed, sensors=sensors, value_bytes=value_bytes,
                                    clock=lambda: self._now or utc_now())

    def next(self, now: dt.datetime | None = None) -> tuple[bytes, bytes]:
        self._now = now
        record = self._events.next()
        return record.key, record.value


# -- expectations --------------------------------------------------------------


@dataclass
class Expected:
    """What the pipeline must make of a set of generated records."""

    silver: set[str] = field(default_factory=set)       # event ids of valid and late records
    late: set[str] = field(default_factory=set)         # event ids of late records
    quarantine: Counter = field(default_factory=Counter)  # reason -> records
    duplicates: int = 0                                 # records de-duplication drops


def count_kinds(records: Iterable[GeneratedRecord]) -> tuple[dict[str, int], dict[str, int]]:
    """(records per kind, malformed records per reason), every kind and reason present."""
    kinds = dict.fromkeys(KINDS, 0)
    reasons = dict.fromkeys(REASONS, 0)
    for record in records:
        kinds[record.kind] += 1
        if record.reason:
            reasons[record.reason] += 1
    return kinds, reasons


def expected(records: Iterable[GeneratedRecord]) -> Expected:
    out = Expected()
    for record in records:
        if record.kind in ("valid", "late"):
            out.silver.add(record.event_id)
            if record.kind == "late":
                out.late.add(record.event_id)
        elif record.kind == "malformed":
            out.quarantine[record.reason] += 1
        else:
            out.duplicates += 1
    return out


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds")


def _ms(t: dt.datetime) -> int:
    return (t - _EPOCH) // dt.timedelta(milliseconds=1)
