"""Small append-only Delta tables the platform keeps about itself.

``consistency_checks`` (every check's verdict) and ``operations`` (savepoints,
restores, rescales with their details) live under
``$STREAMLAKE_HOME/data/_platform/``. Appends are blind Delta appends, so tasks
running at the same time do not conflict.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Mapping

import pyarrow as pa

from streamlake import config
from streamlake.delta.table import TableSpec, ensure_table, open_table, snapshot_files, table_exists

OPERATIONS = TableSpec(
    name="operations",
    schema=pa.schema([
        ("operation_id", pa.string()), ("operation", pa.string()), ("job", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")), ("details", pa.string()),
    ]),
    description="savepoints, restores and rescales the platform performed",
)


def platform_table_path(name: str) -> str:
    return str(config.home() / "data" / "_platform" / name)


def append_row(spec: TableSpec, row: Mapping) -> None:
    from deltalake import write_deltalake

    path = platform_table_path(spec.name)
    ensure_table(path, spec)
    write_deltalake(path, pa.Table.from_pylist([dict(row)], schema=spec.schema), mode="append")


def read_rows(spec: TableSpec, order_by: str, limit: int = 50, **equals) -> list[dict]:
    """Rows of a platform table, newest (largest ``order_by``) first, filtered by equality."""
    import pyarrow.dataset as ds

    path = platform_table_path(spec.name)
    if not table_exists(path):
        return []
    files = snapshot_files(open_table(path))
    if not files:
        return []
    rows = ds.dataset(files, format="parquet", schema=spec.schema).to_table().to_pylist()
    rows = [r for r in rows if all(r.get(k) == v for k, v in equals.items() if v is not None)]
    rows.sort(key=lambda r: r[order_by], reverse=True)
    return rows[:limit]


def record_operation(operation: str, job: str, details: Mapping) -> str:
    """Append an operation (e.g. a rescale's throughput before/after); returns its id."""
    op_id = f"op-{uuid.uuid4().hex[:12]}"
    append_row(OPERATIONS, {"operation_id": op_id, "operation": operation, "job": job,
                            "at": dt.datetime.now(dt.timezone.utc), "details": json.dumps(dict(details), default=str)})
    return op_id


def recent_operations(limit: int = 50, job: str | None = None) -> list[dict]:
    return read_rows(OPERATIONS, "at", limit, job=job)
