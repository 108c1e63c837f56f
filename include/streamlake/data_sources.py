"""Registering the platform's Python data sources with a Spark session: once per session,
safe from threads.

A proof's checks run side by side in threads of one Spark Connect client, and each read of a
table on an object store registers ``streamlake-delta`` first. Two registrations of one
source in one Connect session at the same moment can be refused by the server
(``DATA_SOURCE_ALREADY_EXISTS``: seen in ``bench/s3_proof_bench.py``'s third round, a gold
check failing a proof that had nothing wrong). So a process registers each source once
per session, under a lock, and later calls return at once.

Their read tasks run in Spark's reused Python workers: :func:`freeze_heap_after` keeps
pyspark's collection after every task from scanning the libraries those tasks import.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable, Iterator

_lock = threading.Lock()
_registered: set[tuple] = set()


def _session_key(spark) -> tuple:
    """A Spark Connect session's id; a classic session's object and application (a new
    session after a stop is another key)."""
    connect_id = getattr(spark, "_session_id", None) if type(spark).__module__.startswith("pyspark.sql.connect") \
        else None
    if connect_id is not None:
        return ("connect", connect_id)
    return ("classic", id(spark), spark.sparkContext.applicationId)


def register_once(spark, source) -> None:
    """Register the Python data source class ``source`` with ``spark`` unless this process
    has already (raises what Spark raises for a source it refuses)."""
    key = (*_session_key(spark), source.name())
    with _lock:
        if key in _registered:
            return
        spark.dataSource.register(source)
        _registered.add(key)


_heap_frozen = False


def freeze_heap_after(rows: Iterable) -> Iterator:
    """Yield ``rows``; then, the first time in this process, move what is on the heap to the
    collector's permanent generation (``gc.freeze``).

    Spark reuses a Python worker for task after task, and pyspark's worker daemon runs a full
    collection (``gc.collect()``) after each one. Without this it scanned every object of the
    libraries a read imports (pyarrow, deltalake, confluent-kafka, pyspark): two thirds of a
    reused worker's CPU in a continuous pipeline at 200 records/s (py-spy, 2026-12-07). Once the
    first read has imported them, later collections scan only what later tasks allocate.
    Frozen objects are still freed when their last reference goes; only cycles among them are
    kept. (The platform's fork server freezes its preloaded heap the same way.)"""
    global _heap_frozen
    yield from rows
    if not _heap_frozen:
        _heap_frozen = True
        gc.collect()
        gc.freeze()
