"""The pipeline's tables: schemas and layouts, derived from a pipeline definition.

One place for the contracts every stage, check, quality suite and test relies
on. Times are UTC timestamps in microseconds. Lineage columns (``topic``,
``partition``, ``offset``) name the Kafka record a row came from, so every
bronze row can be followed to exactly one place downstream.

``bronze``
    Kafka records as they arrived (:mod:`streamlake.pipeline.bronze`); the same
    for every pipeline.
``silver``
    the definition's fields with their declared types, then lineage,
    ``kafka_timestamp``, ``bronze_version`` (the bronze commit the row was read
    from), partitioned by ``event_date`` (UTC date of the event time).
``quarantine``
    every bronze record that is not a valid event, with the raw key and value,
    a reason code (the definition's :meth:`~streamlake.pipeline.definition.PipelineDefinition.quarantine_reasons`)
    and a readable message; the same layout for every pipeline.
``gold/<aggregate>``
    per key and event-time window: the aggregate's measures, plus bookkeeping
    columns that let windows combine exactly however events were split into
    micro-batches (``_events``: events in the window; for each ``avg`` measure
    its exact sum ``_sum_<m>`` and count ``_count_<m>``). Sums are exact
    decimals (:attr:`~streamlake.pipeline.types.FieldType.sum_type`).
``late_events/<aggregate>``
    events whose window(s) had already closed when they arrived (window end at
    or before the aggregate's watermark), with the watermark they missed and the
    windows they belong to; ``applied`` turns true when a backfill restated
    those windows.
"""

from __future__ import annotations

import pyarrow as pa

from streamlake.delta.table import TableSpec
from streamlake.pipeline.definition import Aggregate, Measure, PipelineDefinition
from streamlake.pipeline.types import FieldType

TS = pa.timestamp("us", tz="UTC")
LINEAGE = [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())]
EVENTS_COLUMN = "_events"
WINDOW_TYPE = pa.struct([("start", TS), ("end", TS)])

QUARANTINE = TableSpec(
    name="quarantine",
    schema=pa.schema([
        *LINEAGE, ("kafka_timestamp", TS), ("key", pa.binary()), ("value", pa.binary()),
        ("reason", pa.string()), ("message", pa.string()), ("bronze_version", pa.int64()),
        ("quarantined_at", TS), ("ingest_date", pa.date32()),
    ]),
    partition_by=("ingest_date",),
    description="bronze records that are not valid events, with the reason",
)

SILVER_EXTRA = [*LINEAGE, ("kafka_timestamp", TS), ("bronze_version", pa.int64()), ("event_date", pa.date32())]
LATE_EXTRA = [*LINEAGE, ("watermark", TS), ("windows", pa.list_(WINDOW_TYPE)), ("silver_version", pa.int64()),
              ("batch_id", pa.int64()), ("arrived_at", TS), ("applied", pa.bool_()), ("applied_at", TS),
              ("applied_by", pa.string()), ("event_date", pa.date32())]


def silver_spec(definition: PipelineDefinition) -> TableSpec:
    return TableSpec(
        name="silver",
        schema=pa.schema([(f.name, f.type.arrow) for f in definition.fields] + SILVER_EXTRA),
        partition_by=("event_date",),
        description=f"{definition.name}: typed, validated, de-duplicated events",
    )


def late_spec(definition: PipelineDefinition, aggregate: Aggregate) -> TableSpec:
    return TableSpec(
        name=aggregate.late_table,
        schema=pa.schema([(f.name, f.type.arrow) for f in definition.fields] + LATE_EXTRA),
        partition_by=("event_date",),
        description=f"{definition.name}: events that arrived after their {aggregate.name} window closed, "
                    "kept until a backfill applies them",
    )


def measure_type(definition: PipelineDefinition, measure: Measure) -> FieldType | None:
    """The type of a measure's output column (None: bigint count, double average)."""
    if measure.function in ("count", "avg"):
        return None
    ftype = definition.field(measure.field).type
    return ftype.sum_type if measure.function == "sum" else ftype


def measure_columns(definition: PipelineDefinition, aggregate: Aggregate) -> list[tuple[str, pa.DataType]]:
    """The measures' columns, then the bookkeeping columns (see the module docstring)."""
    out = []
    for m in aggregate.measures:
        if m.function == "count":
            out.append((m.column, pa.int64()))
        elif m.function == "avg":
            out.append((m.column, pa.float64()))
        else:
            out.append((m.column, measure_type(definition, m).arrow))
    out.append((EVENTS_COLUMN, pa.int64()))
    for m in aggregate.measures:
        if m.function == "avg":
            out += [(f"_sum_{m.column}", definition.field(m.field).type.sum_type.arrow),
                    (f"_count_{m.column}", pa.int64())]
    return out


def gold_spec(definition: PipelineDefinition, aggregate: Aggregate) -> TableSpec:
    keys = [(k, definition.field(k).type.arrow) for k in aggregate.keys]
    return TableSpec(
        name=aggregate.gold_table,
        schema=pa.schema(keys + [("window_start", TS), ("window_end", TS)] + measure_columns(definition, aggregate)
                         + [("updated_at", TS), ("window_date", pa.date32())]),
        partition_by=("window_date",),
        description=f"{definition.name}: {aggregate.name} per {', '.join(aggregate.keys) or 'window'} and "
                    f"{aggregate.window} window",
    )


def table_spec(definition: PipelineDefinition, name: str) -> TableSpec:
    """The spec of one of the pipeline's tables by name (``silver``, ``gold/<aggregate>``, ...).
    Raises KeyError for a table the pipeline does not have."""
    from streamlake.pipeline.bronze import BRONZE

    if name == "bronze":
        return BRONZE
    if name == "silver":
        return silver_spec(definition)
    if name == "quarantine":
        return QUARANTINE
    kind, _, agg = name.partition("/")
    for aggregate in definition.aggregates:
        if aggregate.name == agg and kind == "gold":
            return gold_spec(definition, aggregate)
        if aggregate.name == agg and kind == "late_events":
            return late_spec(definition, aggregate)
    raise KeyError(f"pipeline {definition.name} has no table {name!r} (its tables: "
                   f"{', '.join(definition.table_names())})")
