"""Small sample rows of a pipeline's tables that meet their contracts, for the quality tests.

:func:`clean_rows` returns rows (dicts in the table's schema) of any definition's
tables that every expectation of the table's suite accepts: events come from the
definition's own generator (its ``datagen`` hints keep values within the rules),
gold windows are aggregated by the tests' oracle (tests/oracle.py). Tests break
them on purpose (a null, a rule broken, a duplicate event id, a broken gold window,
an unknown quarantine reason) and check that exactly the expected expectations
fail. :func:`write_rows` appends rows to a Delta table (one commit) and returns the
new version, so a version range can be validated.
"""

from __future__ import annotations

import datetime as dt
import os

import oracle
from streamlake.delta.table import TableSpec

UTC = dt.timezone.utc


def table_spec(definition, table: str) -> TableSpec:
    from streamlake.pipeline.schemas import table_spec as spec

    return spec(definition, table)


def events(definition, n: int, now: dt.datetime, start: int = 0) -> list[dict]:
    """``n`` valid events' typed values, a second apart ending a few seconds before ``now``."""
    from streamlake.kafka.events import DefinitionEvents

    times = iter(now - dt.timedelta(seconds=n + 1 - j) for j in range(n))
    generator = DefinitionEvents(definition, seed=start, clock=lambda: next(times))
    return [generator.next().fields for _ in range(n)]


def clean_rows(definition, table: str, n: int = 4, now: dt.datetime | None = None, start: int = 0) -> list[dict]:
    """``n`` valid rows of ``table`` around ``now``; ``start`` offsets the offsets so batches
    do not collide (and seeds the values)."""
    from streamlake.pipeline.schemas import EVENTS_COLUMN

    now = (now or dt.datetime.now(UTC)).replace(microsecond=0)
    topic = definition.topics[0] if definition.topics else "topic"
    rows = []
    evs = events(definition, n, now, start)
    for j, event in enumerate(evs):
        i = start + j
        t = event[definition.event_time]
        lineage = {"topic": topic, "partition": i % 3, "offset": i}
        if table == "bronze":
            from streamlake.kafka.events import DefinitionEvents

            record = DefinitionEvents(definition, seed=i, clock=lambda: t).next()
            rows.append({"key": record.key, "value": record.value, **lineage, "timestamp": t, "timestampType": 0,
                         "headers": [], "ingest_time": now, "batch_id": i // 2, "ingest_date": now.date()})
        elif table == "silver":
            rows.append({**event, **lineage, "kafka_timestamp": t, "bronze_version": 1, "event_date": t.date()})
        elif table == "quarantine":
            reasons = list(definition.quarantine_reasons())
            reason = reasons[i % len(reasons)]
            rows.append({**lineage, "kafka_timestamp": t, "key": b"k", "value": b"{bad", "reason": reason,
                         "message": f"{reason} (sample)", "bronze_version": 1, "quarantined_at": now,
                         "ingest_date": now.date()})
        elif table.startswith("late_events/"):
            old = t - dt.timedelta(minutes=10)
            w0 = old.replace(second=0)
            rows.append({**event, definition.event_time: old, **lineage, "watermark": t - dt.timedelta(minutes=2),
                         "windows": [{"start": w0, "end": w0 + dt.timedelta(minutes=1)}], "silver_version": 1,
                         "batch_id": 1, "arrived_at": t, "applied": i % 2 == 1,
                         "applied_at": now if i % 2 == 1 else None, "applied_by": "backfill" if i % 2 else None,
                         "event_date": old.date()})
        elif table.startswith("gold/"):
            aggregate = definition.aggregate(table.split("/", 1)[1])
            members = events(definition, 3, now - dt.timedelta(minutes=n - j), start=1000 + i)
            start_w = (now - dt.timedelta(minutes=n - j)).replace(second=0)
            window = {"window_start": start_w, "window_end": start_w + dt.timedelta(minutes=1)}
            keys = {k: f"{members[0][k]}" if definition.field(k).type.kind == "string" else members[0][k]
                    for k in aggregate.keys}
            for k in keys:  # one key per window, so the window's events share it
                for m in members:
                    m[k] = keys[k]
            schema = {f.name: f.type.sql for f in definition.fields}
            measures = oracle.measures(members, {m.column: m.expression for m in aggregate.measures}, schema)
            extra = {}
            for m in aggregate.measures:
                if m.function == "avg":
                    exact = [oracle._value_of(e[m.field], schema[m.field]) for e in members if e[m.field] is not None]
                    extra[f"_sum_{m.column}"] = sum(exact)
                    extra[f"_count_{m.column}"] = len(exact)
            rows.append({**keys, **window, **measures, **extra, EVENTS_COLUMN: 3, "updated_at": now,
                         "window_date": start_w.date()})
        else:
            raise KeyError(f"no sample rows for table {table!r}")
    return rows


def arrow_table(definition, table: str, rows: list[dict]):
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=table_spec(definition, table).schema)


def dataframe(spark, definition, table: str, rows: list[dict]):
    """A Spark DataFrame of ``rows`` with the table's schema."""
    return spark.createDataFrame(arrow_table(definition, table, rows))


def write_rows(path: str | os.PathLike, definition, table: str, rows: list[dict]) -> int:
    """Append ``rows`` to the Delta table at ``path`` (created with the table's spec if
    missing) in one commit; returns the table's new version."""
    from deltalake import write_deltalake

    from streamlake.delta.table import ensure_table, open_table

    ensure_table(path, table_spec(definition, table))
    write_deltalake(str(path), arrow_table(definition, table, rows), mode="append")
    return open_table(path).version()
