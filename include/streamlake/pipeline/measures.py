"""An aggregate's measures: partial aggregates in Spark, exact combination on the driver.

A gold window is built from partial aggregates: each micro-batch (or a
backfill's recompute) aggregates its events per key and window in Spark, and
the driver combines those partials with the window's gold row. The
combination is exact, so a window's values do not depend on how its events
were split into micro-batches or partitions:

``count(*)``, ``count(f)``  add up;
``sum(f)``                  exact decimal sums add up (integers as decimal(38,0), decimals at their scale,
                            doubles rounded half-up to 9 places first, as Spark's ``CAST(d AS DECIMAL(38,9))``);
``min(f)``, ``max(f)``      keep the field's type, the smaller / larger of the two;
``avg(f)``                  sum / count as a double, from the exact sum and count kept beside it
                            (``_sum_<m>``, ``_count_<m>``).

A window with no events has no row; ``_events`` counts a window's events.
Rows are dicts: the keys by field name, ``window_start``/``window_end`` (epoch
µs while combining, datetimes in gold), the measure and bookkeeping columns.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable

from streamlake.pipeline.definition import Aggregate, PipelineDefinition
from streamlake.pipeline.schemas import EVENTS_COLUMN
from streamlake.pipeline.types import FieldType

MAX_EVENT = "_max_event_us"  # newest event time of a partial (µs): moves the watermark


def _sum_type(definition: PipelineDefinition, field: str) -> FieldType:
    return definition.field(field).type.sum_type


def partial_columns(definition: PipelineDefinition, aggregate: Aggregate):
    """Spark aggregate expressions of one window's partial: ``_events``, each measure's
    partial columns and the newest event time."""
    from pyspark.sql import functions as F

    def col(name):
        return F.col(f"`{name}`")

    out = [F.count(F.lit(1)).alias(EVENTS_COLUMN)]
    for m in aggregate.measures:
        if m.function == "count":
            out.append((F.count(F.lit(1)) if m.field is None else F.count(col(m.field))).alias(m.column))
        elif m.function == "sum":
            out.append(F.sum(col(m.field).cast(_sum_type(definition, m.field).sql)).alias(m.column))
        elif m.function in ("min", "max"):
            out.append(getattr(F, m.function)(col(m.field)).alias(m.column))
        else:  # avg
            out += [F.sum(col(m.field).cast(_sum_type(definition, m.field).sql)).alias(f"_sum_{m.column}"),
                    F.count(col(m.field)).alias(f"_count_{m.column}")]
    out.append(F.max(F.unix_micros(col(definition.event_time))).alias(MAX_EVENT))
    return out


def _add(a, b):
    if a is None:
        return b
    return a if b is None else a + b


def _pick(a, b, fn):
    if a is None:
        return b
    return a if b is None else fn(a, b)


def combine(definition: PipelineDefinition, aggregate: Aggregate, rows: Iterable[dict]) -> dict:
    """The measure and bookkeeping columns of the union of ``rows`` (partials or gold rows
    of windows being merged): counts and sums added, min and max kept, avg re-derived."""
    out: dict = {EVENTS_COLUMN: 0}
    rows = list(rows)
    for row in rows:
        out[EVENTS_COLUMN] += int(row[EVENTS_COLUMN])
    for m in aggregate.measures:
        if m.function == "count":
            out[m.column] = sum(int(r[m.column] or 0) for r in rows)
        elif m.function == "sum":
            total = None
            for r in rows:
                total = _add(total, r[m.column])
            out[m.column] = _quantize(total, _sum_type(definition, m.field))
        elif m.function in ("min", "max"):
            value = None
            for r in rows:
                value = _pick(value, r[m.column], min if m.function == "min" else max)
            out[m.column] = value
        else:
            total, count = None, 0
            for r in rows:
                total = _add(total, r[f"_sum_{m.column}"])
                count += int(r[f"_count_{m.column}"] or 0)
            total = _quantize(total, _sum_type(definition, m.field))
            out[f"_sum_{m.column}"], out[f"_count_{m.column}"] = total, count
            out[m.column] = float(total / count) if count else None
    return out


def _quantize(value, sum_type: FieldType):
    if value is None:
        return None
    return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-sum_type.scale))


def exact_value(value, ftype: FieldType) -> decimal.Decimal:
    """A field value as the exact decimal its sums add: Spark's ``CAST(v AS DECIMAL(38,s))``
    (a double's shortest decimal form, rounded half-up; ints and decimals as they are)."""
    text = repr(float(value)) if ftype.kind == "double" else str(value)
    return decimal.Decimal(text).quantize(decimal.Decimal(1).scaleb(-ftype.sum_type.scale),
                                          rounding=decimal.ROUND_HALF_UP)


def event_partial(definition: PipelineDefinition, aggregate: Aggregate, event: dict) -> dict:
    """The partial of a single event (typed field values by name), for driver-side
    recomputes: :func:`combine` of these equals what Spark's partials combine to."""
    out: dict = {EVENTS_COLUMN: 1}
    for m in aggregate.measures:
        value = event.get(m.field) if m.field else None
        if m.function == "count":
            out[m.column] = 1 if m.field is None or value is not None else 0
        elif m.function == "sum":
            out[m.column] = None if value is None else exact_value(value, definition.field(m.field).type)
        elif m.function in ("min", "max"):
            out[m.column] = value
        else:
            out[f"_sum_{m.column}"] = None if value is None else exact_value(value, definition.field(m.field).type)
            out[f"_count_{m.column}"] = 0 if value is None else 1
    return out


def compared_columns(aggregate: Aggregate) -> list[str]:
    """The columns a recompute must reproduce exactly (avg within a tolerance: it is a double)."""
    cols = [EVENTS_COLUMN]
    for m in aggregate.measures:
        cols += [f"_sum_{m.column}", f"_count_{m.column}"] if m.function == "avg" else [m.column]
    return cols
