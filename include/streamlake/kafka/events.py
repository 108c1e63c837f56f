"""Realistic, reproducible records of any pipeline definition: the shapes real data has, with labels.

:class:`DefinitionEvents` generates Kafka records (key, value, timestamp) for a
pipeline definition (:mod:`streamlake.pipeline.definition`) and says, for every
record, what the pipeline must make of it. With a seed and a ``clock`` (a
callable returning timezone-aware datetimes, called exactly once per record) the
same definition and arguments give the same records, byte for byte.

The definition's ``datagen`` section says how values look (all optional)::

    datagen:
      key: FIELD                   # the Kafka key is this field's value (none: a null key)
      fields:
        FIELD: {values: [a, b, c]}           # one of these, uniformly
        FIELD: {prefix: "dev-", count: 64}   # strings: prefix + zero-padded number below count
        FIELD: {min: 1, max: 500, decimals: 2}  # numbers: uniform; ints integral, decimals at
                                                # their scale, doubles at `decimals` places (2)
        FIELD: {null_fraction: 0.7}          # optional fields: this share left out of the JSON
        FIELD: {format: epoch_ms}            # timestamps: epoch milliseconds (default iso:
                                             # ISO-8601 with milliseconds and +00:00)
      violations:                  # values that break each rule (its malformed records)
        RULE: {FIELD: value}

A field without hints gets: the event id a fresh UUID (an increasing integer for
int/bigint ids), other strings a short token, numbers 0..100, booleans either,
dates the clock's date, timestamps the clock's time. Values are exact: decimals
go into the JSON as number literals with their declared scale.

Each :class:`GeneratedRecord` has a ``kind``:

``valid``
    an on-time event: event time = now - uniform(0, ``out_of_order_seconds``),
    so events arrive out of order within the allowed lateness. Lands in silver
    and in every gold table.
``late``
    a valid event whose event time is far enough back to be behind every
    aggregate's watermark: now - uniform(W + L + 60 s, W + L + 900 s), W the
    largest window size (or session gap) and L the largest allowed lateness of
    the definition's aggregates. Lands in silver and in every late_events table
    (once an on-time event has moved the watermark).
``duplicate``
    the exact key and value bytes of a recent valid or late record (one of the
    last :data:`DUPLICATE_LOOKBACK`), re-sent with a new Kafka timestamp;
    ``duplicate_of`` is the original's ``seq``. Only with an ``event_id`` (else a
    valid record is made instead). De-duplication drops it.
``malformed``
    breaks exactly one check, the first the pipeline makes for it: ``reason`` is
    that quarantine reason (``not_json``, ``not_object``, ``missing_field``,
    ``wrong_type``, ``invalid_timestamp``, ``far_future``, or a rule with a
    ``violations`` hint) and ``variant`` says how.

The Kafka timestamp (``timestamp_ms``) is the clock reading the event time was
derived from, and the producer stamps the record with it, so ``far_future`` is
decided by the data alone. ``fields`` holds, for valid, late and duplicate
records, the typed values the pipeline must end up with in silver (str, bool,
int, float, Decimal, date, aware datetime; absent optional fields None).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from streamlake.errors import InvalidOptionError

KINDS = ("valid", "late", "duplicate", "malformed")
BASE_REASONS = ("not_json", "not_object", "missing_field", "wrong_type", "invalid_timestamp", "far_future")
MALFORMED_VARIANTS: dict[str, tuple[str, ...]] = {
    "not_json": ("truncated", "text", "empty"),
    "not_object": ("array", "string"),
    "missing_field": ("absent", "null"),
    "wrong_type": ("wrong_kind",),
    "invalid_timestamp": ("no_offset", "garbage", "impossible_date"),
    "far_future": ("hours_ahead",),
}
FIELD_HINTS = ("values", "prefix", "count", "min", "max", "decimals", "null_fraction", "format")
DATAGEN_KEYS = ("key", "fields", "violations", "rate")
FAR_FUTURE_SECONDS = (3600.0, 5 * 3600.0)  # far_future: this much beyond max_future
MAX_OUT_OF_ORDER_SECONDS = 60.0
DUPLICATE_LOOKBACK = 50
_GARBAGE_TIMES = ("yesterday", "N/A", "12:34:56", "not a timestamp")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def check_datagen(definition) -> None:
    """Raise InvalidOptionError naming the key for a ``datagen`` section the generator
    cannot follow: unknown keys or hints, hints for undeclared fields, violations of
    unknown rules or naming undeclared fields."""
    datagen = dict(definition.datagen or {})
    unknown = sorted(set(datagen) - set(DATAGEN_KEYS))
    if unknown:
        raise InvalidOptionError(f"datagen.{unknown[0]}: unknown key (known: {', '.join(DATAGEN_KEYS)})")
    names = set(definition.field_names)
    key = datagen.get("key")
    if key is not None and key not in names:
        raise InvalidOptionError(f"datagen.key: {key!r} is not a declared field")
    rate = datagen.get("rate")
    if rate is not None and (not isinstance(rate, (int, float)) or rate <= 0):
        raise InvalidOptionError(f"datagen.rate: records per second must be a positive number, got {rate!r}")
    for name, hints in (datagen.get("fields") or {}).items():
        if name not in names:
            raise InvalidOptionError(f"datagen.fields.{name}: not a declared field")
        if not isinstance(hints, Mapping):
            raise InvalidOptionError(f"datagen.fields.{name}: hints are a mapping, e.g. {{values: [a, b]}}")
        bad = sorted(set(hints) - set(FIELD_HINTS))
        if bad:
            raise InvalidOptionError(f"datagen.fields.{name}.{bad[0]}: unknown hint (known: {', '.join(FIELD_HINTS)})")
        if hints.get("format") not in (None, "iso", "epoch_ms"):
            raise InvalidOptionError(f"datagen.fields.{name}.format: iso or epoch_ms, got {hints['format']!r}")
    rules = {r.name for r in definition.rules}
    for rule, values in (datagen.get("violations") or {}).items():
        if rule not in rules:
            raise InvalidOptionError(f"datagen.violations.{rule}: no rule of that name")
        if not isinstance(values, Mapping) or not values or set(values) - names:
            raise InvalidOptionError(f"datagen.violations.{rule}: a mapping of declared fields to values that break "
                                     "the rule")


def generatable_reasons(definition) -> tuple[str, ...]:
    """The quarantine reasons the generator can make for ``definition``, in checking order."""
    violations = (definition.datagen or {}).get("violations") or {}
    return BASE_REASONS + tuple(r.name for r in definition.rules if r.name in violations)


@dataclass(frozen=True)
class EventMix:
    """What share of records is of each kind; the rest is ``valid``.

    Raises InvalidOptionError (naming the option) for fractions outside 0..1, a sum
    of late + malformed + duplicate above 1, ``out_of_order_seconds`` outside 0..60, or
    an empty ``malformed_reasons``.
    """

    late_fraction: float = 0.0
    out_of_order_seconds: float = 0.0
    malformed_fraction: float = 0.0
    duplicate_fraction: float = 0.0
    malformed_reasons: tuple[str, ...] | None = None  # None: every reason the definition allows

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
            raise InvalidOptionError(f"out-of-order-seconds must be between 0 and {MAX_OUT_OF_ORDER_SECONDS:g}, "
                                     f"got {s!r}")
        if self.malformed_reasons is not None:
            if not self.malformed_reasons:
                raise InvalidOptionError("malformed reasons must not be empty")
            object.__setattr__(self, "malformed_reasons", tuple(self.malformed_reasons))

    @property
    def valid_fraction(self) -> float:
        """The share of on-time valid records: what late, malformed and duplicate leave."""
        return max(0.0, 1.0 - self.late_fraction - self.malformed_fraction - self.duplicate_fraction)


@dataclass(frozen=True)
class GeneratedRecord:
    """One Kafka record and what the pipeline must make of it."""

    seq: int                      # 0-based position in the generated sequence
    key: bytes | None
    value: bytes
    timestamp_ms: int             # Kafka CreateTime the producer stamps (the clock reading)
    kind: str                     # valid | late | duplicate | malformed
    reason: str | None = None     # malformed: the expected quarantine reason
    variant: str | None = None    # malformed: how it is broken
    event_id: str | None = None   # the event id as text, when the value carries one
    event_time: dt.datetime | None = None  # valid, late, duplicate
    fields: dict | None = None    # valid, late, duplicate: the typed values silver must hold
    duplicate_of: int | None = None

    @property
    def timestamp(self) -> dt.datetime:
        return _EPOCH + dt.timedelta(milliseconds=self.timestamp_ms)

    def manifest_line(self, partition: int | None = None, offset: int | None = None) -> dict:
        """The manifest's JSON object for this record (``partition``/``offset`` from the delivery report)."""
        return {"partition": partition, "offset": offset, "seq": self.seq, "timestamp": self.timestamp_ms,
                "kind": self.kind, "reason": self.reason, "variant": self.variant, "event_id": self.event_id,
                "event_time": self.event_time.isoformat(timespec="milliseconds") if self.event_time else None,
                "duplicate_of": self.duplicate_of}


class _Number(float):
    """A number written into JSON as its exact literal (decimals keep their digits)."""

    def __new__(cls, text: str):
        obj = super().__new__(cls, float(text))
        obj.text = text
        return obj

    def __repr__(self) -> str:
        return self.text


def _encode(obj: dict) -> str:
    """Compact JSON; :class:`_Number` values as their literal text."""
    parts = []
    for name, value in obj.items():
        text = value.text if isinstance(value, _Number) else json.dumps(value)
        parts.append(f"{json.dumps(name)}:{text}")
    return "{" + ",".join(parts) + "}"


class DefinitionEvents:
    """Deterministic generator of labelled records of ``definition`` (see the module docstring).

    ``seed``: same seed and same clock readings, same records (None: random).
    ``clock``: the "now" of each record (timezone-aware); default: the UTC wall clock.
    ``value_bytes``: pad every JSON object with an undeclared ``pad`` field to about that size.
    """

    def __init__(self, definition, seed: int | None = None, *, value_bytes: int | None = None,
                 late_fraction: float = 0.0, out_of_order_seconds: float = 0.0, malformed_fraction: float = 0.0,
                 duplicate_fraction: float = 0.0, malformed_reasons: Sequence[str] | None = None,
                 clock: Callable[[], dt.datetime] | None = None, mix: EventMix | None = None):
        check_datagen(definition)
        self.definition = definition
        self.mix = mix or EventMix(late_fraction, out_of_order_seconds, malformed_fraction, duplicate_fraction,
                                   tuple(malformed_reasons) if malformed_reasons is not None else None)
        possible = generatable_reasons(definition)
        reasons = self.mix.malformed_reasons or possible
        unknown = [r for r in reasons if r not in possible]
        if unknown:
            raise InvalidOptionError(f"cannot generate malformed records of {', '.join(unknown)} for pipeline "
                                     f"{definition.name} (possible: {', '.join(possible)}; a rule needs a "
                                     "datagen.violations entry)")
        self.reasons = tuple(reasons)
        if value_bytes is not None and value_bytes < 1:
            raise InvalidOptionError("value-bytes must be at least 1")
        self.value_bytes = value_bytes
        self.seed = seed
        self.rng = random.Random(seed)
        self.aux = random.Random(f"streamlake-events:{seed}") if seed is not None else random.Random()
        self.clock = clock or utc_now
        self.seq = 0
        self._ids = 0
        self._recent: deque[GeneratedRecord] = deque(maxlen=DUPLICATE_LOOKBACK)
        datagen = dict(definition.datagen or {})
        self.hints: dict[str, Mapping] = dict(datagen.get("fields") or {})
        self.key_field: str | None = datagen.get("key")
        self.violations: dict[str, Mapping] = dict(datagen.get("violations") or {})
        aggs = definition.aggregates
        window = max((a.window.size_ms for a in aggs), default=60_000) / 1000
        lateness = max((a.allowed_lateness_ms for a in aggs), default=30_000) / 1000
        self.late_seconds = (window + lateness + 60.0, window + lateness + 900.0)

    # -- public -------------------------------------------------------------

    def next(self) -> GeneratedRecord:
        now = self._now()
        mix, u = self.mix, self.aux.random()
        if u < mix.late_fraction:
            record = self._valid(now, "late", now - dt.timedelta(seconds=self.aux.uniform(*self.late_seconds)))
        elif u < mix.late_fraction + mix.malformed_fraction:
            record = self._malformed(now)
        elif u < mix.late_fraction + mix.malformed_fraction + mix.duplicate_fraction and self._recent \
                and self.definition.event_id:
            record = self._duplicate(now)
        else:
            jitter = self.aux.uniform(0.0, mix.out_of_order_seconds) if mix.out_of_order_seconds else 0.0
            record = self._valid(now, "valid", now - dt.timedelta(seconds=jitter))
        if record.kind in ("valid", "late"):
            self._recent.append(record)
        self.seq += 1
        return record

    def take(self, n: int) -> list[GeneratedRecord]:
        return [self.next() for _ in range(n)]

    def __iter__(self) -> Iterator[GeneratedRecord]:
        while True:
            yield self.next()

    # -- values -------------------------------------------------------------

    def _now(self) -> dt.datetime:
        now = self.clock()
        if not isinstance(now, dt.datetime) or now.tzinfo is None:
            raise ValueError(f"the clock must return timezone-aware datetimes, got {now!r}")
        return now.astimezone(dt.timezone.utc)

    def _typed(self, f, now: dt.datetime):
        """A fresh typed value of field ``f`` (None: an optional field left out)."""
        hints, kind, rng = self.hints.get(f.name, {}), f.type.kind, self.rng
        if not f.required and rng.random() < float(hints.get("null_fraction", 0.0)):
            return None
        if "values" in hints:
            return _typed_literal(rng.choice(list(hints["values"])), f.type)
        if f.name == self.definition.event_id:
            if kind in ("int", "bigint"):
                self._ids += 1
                return self._ids
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if kind == "string":
            if "prefix" in hints:
                count = int(hints.get("count", 100))
                return f"{hints['prefix']}{rng.randrange(count):0{len(str(max(count - 1, 1)))}d}"
            return f"{rng.getrandbits(32):08x}"
        if kind == "boolean":
            return rng.random() < 0.5
        if kind in ("int", "bigint", "double", "decimal"):
            low, high = float(hints.get("min", 0)), float(hints.get("max", 100))
            if kind in ("int", "bigint"):
                return rng.randint(int(low), int(high))
            value = rng.uniform(low, high)
            if kind == "double":
                return round(value, int(hints.get("decimals", 2)))
            return decimal.Decimal(f"{value:.{f.type.scale}f}")
        if kind == "date":
            return now.date()
        return now.replace(microsecond=(now.microsecond // 1000) * 1000)

    def _json_value(self, f, value):
        """A typed value as the JSON carries it."""
        if value is None:
            return None
        kind = f.type.kind
        if kind == "decimal":
            return _Number(str(value))
        if kind == "date":
            return value.isoformat()
        if kind == "timestamp":
            if self.hints.get(f.name, {}).get("format") == "epoch_ms":
                return _ms(value)
            return _iso(value)
        return value

    def _event(self, now: dt.datetime, event_time: dt.datetime) -> dict:
        """Typed values of a fresh valid event (absent optional fields: None)."""
        values = {}
        for f in self.definition.fields:
            values[f.name] = event_time.replace(microsecond=(event_time.microsecond // 1000) * 1000) \
                if f.name == self.definition.event_time else self._typed(f, now)
        return values

    def _body(self, values: dict) -> dict:
        """The JSON object of typed values (optional None values left out)."""
        out = {}
        for f in self.definition.fields:
            value = values.get(f.name)
            if value is None and not f.required:
                continue
            out[f.name] = self._json_value(f, value)
        return out

    def _bytes(self, body: dict) -> bytes:
        text = _encode(body)
        if self.value_bytes:
            pad = self.value_bytes - len(text) - len(',"pad":""')
            if pad > 0:
                text = text[:-1] + ',"pad":"' + "x" * pad + '"}'
        return text.encode()

    def _key(self, values: dict) -> bytes | None:
        if not self.key_field or values.get(self.key_field) is None:
            return None
        return str(values[self.key_field]).encode()

    def _id_text(self, values: dict) -> str | None:
        event_id = self.definition.event_id
        return None if not event_id or values.get(event_id) is None else str(values[event_id])

    # -- kinds --------------------------------------------------------------

    def _valid(self, now: dt.datetime, kind: str, event_time: dt.datetime) -> GeneratedRecord:
        values = self._event(now, event_time)
        return GeneratedRecord(self.seq, self._key(values), self._bytes(self._body(values)), _ms(now), kind,
                               event_id=self._id_text(values), event_time=values[self.definition.event_time],
                               fields=values)

    def _duplicate(self, now: dt.datetime) -> GeneratedRecord:
        original = self.aux.choice(self._recent)
        return GeneratedRecord(self.seq, original.key, original.value, _ms(now), "duplicate",
                               event_id=original.event_id, event_time=original.event_time,
                               fields=original.fields, duplicate_of=original.seq)

    def _malformed(self, now: dt.datetime) -> GeneratedRecord:
        aux, d = self.aux, self.definition
        reason = aux.choice(self.reasons)
        values = self._event(now, now)
        body = self._body(values)
        variant = aux.choice(MALFORMED_VARIANTS.get(reason, ("violation",)))
        value: bytes | None = None
        if reason == "not_json":
            if variant == "truncated":
                full = self._bytes(body)
                value = full[:aux.randint(1, len(full) - 1)]
            elif variant == "text":
                value = ",".join(str(v) for v in body.values()).encode() or b"x"
                if value[:1] in (b"[", b"{", b'"') or value.strip().lstrip(b"-").replace(b".", b"").isdigit():
                    value = b"text: " + value
            else:
                value = b""
        elif reason == "not_object":
            text = _encode(body)
            value = ("[" + text + "]" if variant == "array" else json.dumps(text)).encode()
        elif reason == "missing_field":
            name = aux.choice(d.required)
            if variant == "absent":
                body.pop(name, None)
            else:
                body[name] = None
            variant = f"{variant}:{name}"
        elif reason == "wrong_type":
            name = aux.choice([f.name for f in d.fields if f.name in body])
            body[name] = _wrong_kind(d.field(name).type.kind, aux)
            variant = f"wrong_kind:{name}"
        elif reason == "invalid_timestamp":
            times = [f for f in d.fields if f.type.kind in ("timestamp", "date") and f.name in body]
            f = aux.choice(times)
            if f.type.kind == "date":
                body[f.name] = f"{now.year:04d}-13-45"
            elif variant == "no_offset":
                body[f.name] = now.replace(tzinfo=None).isoformat(timespec="milliseconds")
            elif variant == "garbage":
                body[f.name] = aux.choice(_GARBAGE_TIMES)
            else:
                body[f.name] = f"{now.year:04d}-13-{now.day:02d}" + _iso(now)[10:]
            variant = f"{variant}:{f.name}"
        elif reason == "far_future":
            ahead = d.max_future_ms / 1000 + aux.uniform(*FAR_FUTURE_SECONDS)
            field_def = d.field(d.event_time)
            body[d.event_time] = self._json_value(field_def, now + dt.timedelta(seconds=ahead))
        else:  # a rule, broken with its datagen.violations values
            for name, broken in self.violations[reason].items():
                values[name] = _typed_literal(broken, d.field(name).type)
                body[name] = self._json_value(d.field(name), values[name])
        if value is None:
            value = self._bytes(body)
        event_id = d.event_id
        text_id = body.get(event_id) if event_id and reason not in ("not_json", "not_object") else None
        return GeneratedRecord(self.seq, self._key(values), value, _ms(now), "malformed", reason=reason,
                               variant=variant, event_id=str(text_id) if text_id is not None else None)


def _typed_literal(value, ftype):
    """A YAML value (from datagen) as the field's Python type."""
    if value is None:
        return None
    if ftype.kind == "decimal":
        return decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-ftype.scale))
    if ftype.kind == "double":
        return float(value)
    if ftype.kind in ("int", "bigint"):
        return int(value)
    if ftype.kind == "timestamp" and isinstance(value, str):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if ftype.kind == "date" and isinstance(value, str):
        return dt.date.fromisoformat(value)
    return value


def _wrong_kind(kind: str, aux: random.Random):
    """A JSON value that does not convert to ``kind`` without loss."""
    if kind == "string":
        return aux.randint(1, 10**9)
    if kind in ("int", "bigint"):
        return aux.choice([12.5, "42", True])
    if kind in ("double", "decimal"):
        return aux.choice(["12.5", True])
    if kind == "boolean":
        return aux.choice(["true", 1])
    if kind == "timestamp":
        return aux.choice([True, 1762336800.5])
    return aux.choice([20261125, True])  # date


# -- expectations --------------------------------------------------------------


@dataclass
class Expected:
    """What the pipeline must make of a set of generated records."""

    silver: set[str] = field(default_factory=set)       # event ids of valid and late records
    late: set[str] = field(default_factory=set)         # event ids of late records
    quarantine: Counter = field(default_factory=Counter)  # reason -> records
    duplicates: int = 0                                 # records de-duplication drops


def count_kinds(records: Iterable[GeneratedRecord], reasons: Sequence[str] = ()) -> tuple[dict[str, int], dict[str, int]]:
    """(records per kind, malformed records per reason), every kind and given reason present."""
    kinds = dict.fromkeys(KINDS, 0)
    counts = dict.fromkeys(reasons, 0)
    for record in records:
        kinds[record.kind] += 1
        if record.reason:
            counts[record.reason] = counts.get(record.reason, 0) + 1
    return kinds, counts


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
