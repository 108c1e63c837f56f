"""Kafka offsets stored in a Delta table as ``txn`` (SetTransaction) actions.

A Delta ``txn`` action is an (appId, version) pair that the protocol keeps in
every snapshot and checkpoint, and that writers use for idempotent commits: a
commit carrying a ``txn`` fails if a concurrent commit wrote the same appId.
For each topic-partition the sink stores two of them, in the same atomic commit
as the data (the kafka-delta-ingest scheme, plus a start marker):

``streamlake:kafka:<topic>:<partition>``
    next offset to ingest: every record below it is in the table;
``streamlake:kafka:<topic>:<partition>:first``
    the offset ingestion of that partition started at: the audit's lower bound;
``streamlake:query:<query id>``
    the last micro-batch id of that Spark query committed to the table.

So the committed offsets can be read from the table alone, at any version.
Topic names cannot contain ``:``, so the names are unambiguous.

Every platform commit also says what it did in its ``commitInfo`` (:func:`commit_info`): the
offsets or upstream versions it covers, its micro-batch, its operation.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from deltalake import DeltaTable
from deltalake.transaction import Transaction

from streamlake.kafka.offsets import Offsets, TopicPartition


COMMIT_INFO_KEY = "streamlake"


def commit_info(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The ``commitInfo`` fields of a platform commit (``custom_metadata`` of delta-rs's
    CommitProperties): ``streamlake``, the object the platform reads back (positions, batch,
    operation), and the same facts as a JSON string in ``userMetadata``, the field Delta's own
    tools show: delta-spark's ``DESCRIBE HISTORY`` drops commitInfo fields it does not know,
    so that is where a user reads each commit's offsets or upstream versions."""
    facts = dict(facts)
    return {COMMIT_INFO_KEY: facts, "userMetadata": json.dumps(facts, sort_keys=True, default=str)}


def next_offset_app_id(tp: TopicPartition) -> str:
    return f"streamlake:kafka:{tp.topic}:{tp.partition}"


def first_offset_app_id(tp: TopicPartition) -> str:
    return f"streamlake:kafka:{tp.topic}:{tp.partition}:first"


def query_app_id(query_id: str) -> str:
    return f"streamlake:query:{query_id}"


def _versions(table: DeltaTable, tps: Iterable[TopicPartition], app_id) -> Offsets:
    out: Offsets = {}
    for tp in tps:
        version = table.transaction_version(app_id(tp))
        if version is not None:
            out[tp] = version
    return out


def committed_offsets(table: DeltaTable, tps: Iterable[TopicPartition]) -> Offsets:
    """Next offset to ingest for each partition the table has seen (others omitted)."""
    return _versions(table, tps, next_offset_app_id)


def first_offsets(table: DeltaTable, tps: Iterable[TopicPartition]) -> Offsets:
    """Offset where ingestion of each partition started (partitions the table has seen)."""
    return _versions(table, tps, first_offset_app_id)


def last_batch_id(table: DeltaTable, query_id: str) -> int | None:
    return table.transaction_version(query_app_id(query_id))


def offset_transactions(next_offsets: Mapping[TopicPartition, int], first: Mapping[TopicPartition, int],
                        query_id: str | None = None, batch_id: int | None = None) -> list[Transaction]:
    """The ``txn`` actions of one commit: new next offsets, first offsets of newly seen
    partitions, and the query's batch id."""
    txns = [Transaction(next_offset_app_id(tp), int(off)) for tp, off in sorted(next_offsets.items())]
    txns += [Transaction(first_offset_app_id(tp), int(off)) for tp, off in sorted(first.items())]
    if query_id is not None and batch_id is not None:
        txns.append(Transaction(query_app_id(query_id), int(batch_id)))
    return txns
