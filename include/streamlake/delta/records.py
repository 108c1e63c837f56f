"""Small append-only Delta tables the platform keeps about itself.

``consistency_checks`` (every check's verdict), ``verified_ranges`` (the ledger of
what each check proved), ``operations`` (savepoints, restores, rescales with their
details) and ``quality_results`` live under the **platform root**
(:func:`streamlake.storage.lake.platform_root`): ``$STREAMLAKE_HOME/data/_platform``
by default, or an object-store URI (``STREAMLAKE_PLATFORM_ROOT``, or the lake root's
``_platform``), so that every machine of a cluster (Airflow's workers, its API
server, the drivers) reads and writes one ledger instead of each its own disk's.

Appends are blind Delta appends, so tasks running at the same time do not
conflict: each gets a version of its own. Each append is a small file, and the
platform appends thousands a day (a quality validation per table per run), so a
table whose snapshot holds more than :data:`COMPACT_FILES` files is compacted
after the append that crossed it (delta-rs ``optimize.compact``), and then
vacuumed: the files compactions removed more than :data:`VACUUM_RETENTION_HOURS`
ago are deleted (Delta's default retention, so a reader of a week-old snapshot
still finds its files). Reads open a bounded number of files, and the disk holds
a bounded week of them. Where two writers could both commit one
version (S3 without ``conditional_put=etag`` or a lock table) nothing is written:
:func:`append_rows` raises UnsafeStoreError, as a job's own tables do.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from typing import Iterable, Mapping

import pyarrow as pa

from streamlake.delta.table import (
    TableSpec,
    compact_small_files,
    delta_options,
    ensure_table,
    open_table,
    parquet_dataset,
    snapshot_files,
    table_exists,
    with_commit_retries,
)
from streamlake.storage.lake import platform_root
from streamlake.storage.location import is_object_store, join, require_safe_commits, storage_options

OPERATIONS = TableSpec(
    name="operations",
    schema=pa.schema([
        ("operation_id", pa.string()), ("operation", pa.string()), ("job", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")), ("details", pa.string()),
    ]),
    description="savepoints, restores and rescales the platform performed",
)


log = logging.getLogger(__name__)

# Compact a platform table after an append once its snapshot has more files than this.
COMPACT_FILES = 64
# After a compaction, delete the files compactions removed longer ago than this.
VACUUM_RETENTION_HOURS = 7 * 24


def platform_table_path(name: str) -> str:
    return join(platform_root(), name)


def append_rows(spec: TableSpec, rows: Iterable[Mapping]) -> int:
    """Append ``rows`` to the platform table ``spec`` in one Delta commit (creating the
    table if needed); returns how many. A blind append: writers at the same time each
    get a version of their own and none loses another's rows. Raises UnsafeStoreError,
    before writing anything, where the store cannot refuse a second commit of a version."""
    from deltalake import write_deltalake

    rows = [dict(r) for r in rows]
    if not rows:
        return 0
    path = platform_table_path(spec.name)
    options = writable_options(path)
    ensure_table(path, spec, options)
    table = pa.Table.from_pylist(rows, schema=spec.schema)
    # Writers that create the table at once can lose their first append to another's commit.
    with_commit_retries(f"append to {spec.name}", lambda _attempt: write_deltalake(
        path, table, mode="append", storage_options=options))
    compact_if_needed(path, options)
    return len(rows)


def compact_if_needed(path: str, options: Mapping[str, str] | None = None) -> bool:
    """Compact the platform table at ``path`` if its snapshot has more than
    :data:`COMPACT_FILES` files, then vacuum it (files removed more than
    :data:`VACUUM_RETENTION_HOURS` ago); True if it compacted. Never raises: the appended
    rows are committed either way, and a compaction that fails (another writer's
    compaction of the same files won) is retried after a later append."""
    try:
        # every file of a platform table is small: its appends are a few rows each
        table = open_table(path, storage_options=options)
        if compact_small_files(table, COMPACT_FILES) is None:
            return False
        table.vacuum(
            retention_hours=VACUUM_RETENTION_HOURS, enforce_retention_duration=False, dry_run=False)
        return True
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("compacting %s failed (retried after a later append): %s", path, exc)
        return False


def writable_options(path: str) -> dict[str, str] | None:
    """delta-rs options to commit to the platform table at ``path``. Raises
    UnsafeStoreError on an object store where two writers could commit one version."""
    if is_object_store(path):
        require_safe_commits(storage_options(path))
    return delta_options(path, None)


def append_row(spec: TableSpec, row: Mapping) -> None:
    append_rows(spec, [row])


def platform_rows(spec: TableSpec, filter_expr=None, columns: list[str] | None = None) -> pa.Table | None:
    """The rows of the platform table ``spec`` (its latest snapshot), filtered with a
    pyarrow expression; None if the table does not exist or has no data yet."""
    path = platform_table_path(spec.name)
    if not table_exists(path):
        return None
    files = snapshot_files(open_table(path))
    if not files:
        return None
    return parquet_dataset(files, spec.schema).to_table(columns=columns, filter=filter_expr)


def read_rows(spec: TableSpec, order_by: str, limit: int = 50, **equals) -> list[dict]:
    """Rows of a platform table, newest (largest ``order_by``) first, filtered by equality."""
    table = platform_rows(spec)
    if table is None:
        return []
    rows = [r for r in table.to_pylist() if all(r.get(k) == v for k, v in equals.items() if v is not None)]
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
