"""Small sample rows of each pipeline table that meet its contract, for tests and demos.

:func:`clean_rows` returns rows (dicts in the table's schema) that every
expectation of the table's suite accepts; tests break them on purpose (a null,
an out-of-range temperature, a duplicate event id, a broken gold window, an
unknown quarantine reason) and check that exactly the expected expectations
fail. :func:`write_rows` appends rows to a Delta table (one commit) and
returns the new version, so a version range can be validated.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from decimal import Decimal

from streamlake.delta.table import TableSpec

UTC = dt.timezone.utc


def table_spec(table: str) -> TableSpec:
    from streamlake.quality.suites import suite_spec

    return suite_spec(table).spec


def clean_rows(table: str, n: int = 4, now: dt.datetime | None = None, start: int = 0) -> list[dict]:
    """``n`` valid rows of ``table`` around ``now`` (event times a few seconds old);
    ``start`` offsets the ids/offsets so batches do not collide."""
    now = (now or dt.datetime.now(UTC)).replace(microsecond=0)
    rows = []
    for j in range(n):
        i = start + j
        t = now - dt.timedelta(seconds=n - j)
        temp = round(15.0 + (i % 7) * 1.25, 2)
        lineage = {"topic": "sensors", "partition": i % 3, "offset": i}
        if table == "bronze":
            value = json.dumps({"event_id": f"ev-{i}", "sensor_id": f"s-{i % 2}",
                                "event_time": t.isoformat(), "temperature": temp}).encode()
            rows.append({"key": f"s-{i % 2}".encode(), "value": value, **lineage, "timestamp": t,
                         "timestampType": 0, "headers": [], "ingest_time": now, "batch_id": i // 2,
                         "ingest_date": now.date()})
        elif table == "silver":
            rows.append({"event_id": f"ev-{i}", "sensor_id": f"s-{i % 2}", "event_time": t, "temperature": temp,
                         **lineage, "kafka_timestamp": t, "bronze_version": 1, "event_date": t.date()})
        elif table == "quarantine":
            reasons = ["not_json", "missing_field", "out_of_range", "invalid_timestamp"]
            reason = reasons[i % len(reasons)]
            rows.append({**lineage, "kafka_timestamp": t, "key": b"k", "value": b"{bad",
                         "reason": reason, "message": f"{reason} (sample)", "bronze_version": 1,
                         "quarantined_at": now, "ingest_date": now.date()})
        elif table == "gold":
            start_w = (now - dt.timedelta(minutes=n - j)).replace(second=0)
            lo, hi = temp - 1.0, temp + 1.5
            total = Decimal(str(lo)) + Decimal(str(hi)) + Decimal(str(temp))
            rows.append({"sensor_id": f"s-{i % 2}", "window_start": start_w,
                         "window_end": start_w + dt.timedelta(minutes=1), "count": 3,
                         "sum_temperature": total.quantize(Decimal("0.000000001")),
                         "min_temperature": lo, "max_temperature": hi, "avg_temperature": float(total / 3),
                         "updated_at": now, "window_date": start_w.date()})
        elif table == "late_events":
            old = t - dt.timedelta(minutes=10)
            w0 = old.replace(second=0)
            rows.append({"event_id": f"late-{i}", "sensor_id": f"s-{i % 2}", "event_time": old, "temperature": temp,
                         **lineage, "watermark": t - dt.timedelta(minutes=2),
                         "windows": [{"start": w0, "end": w0 + dt.timedelta(minutes=1)}], "silver_version": 1,
                         "batch_id": 1, "arrived_at": t, "applied": i % 2 == 1,
                         "applied_at": now if i % 2 == 1 else None, "applied_by": "backfill" if i % 2 else None,
                         "event_date": old.date()})
        else:
            raise KeyError(f"no sample rows for table {table!r}")
    return rows


def arrow_table(table: str, rows: list[dict]):
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=table_spec(table).schema)


def dataframe(spark, table: str, rows: list[dict]):
    """A Spark DataFrame of ``rows`` with the table's schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(table_spec(table).schema)
    names = schema.fieldNames()
    return spark.createDataFrame([tuple(r.get(c) for c in names) for r in rows], schema)


def write_rows(path: str | os.PathLike, table: str, rows: list[dict]) -> int:
    """Append ``rows`` to the Delta table at ``path`` (created with the table's spec if
    missing) in one commit; returns the table's new version."""
    from deltalake import write_deltalake

    from streamlake.delta.table import ensure_table, open_table

    ensure_table(path, table_spec(table))
    write_deltalake(str(path), arrow_table(table, rows), mode="append")
    return open_table(path).version()
