"""Offset audit: proof that a table holds every Kafka record of its committed range once.

For each topic-partition the table has committed (``txn`` actions, see
:mod:`streamlake.delta.txn`), the audit reads from Kafka every record in
``[first, next)``, the exact range the table claims, and compares it with the
table's rows of that partition:

* ``missing``: offsets Kafka holds in the range that the table lacks;
* ``duplicated``: extra copies of offsets the table holds more than once;
* ``extra``: table rows at offsets Kafka does not hold in the range (outside the
  committed range, or at offsets Kafka skipped);
* ``mismatched``: rows whose key or value differ from Kafka's record.

Offsets Kafka skips (transaction markers, compaction) are absent on both sides,
so they never count: the comparison is against what Kafka returns, not against a
counter. Rows of partitions the table has no committed offsets for are extra.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

import pyarrow.dataset as ds

from streamlake.delta.table import open_table, snapshot_files
from streamlake.delta.txn import committed_offsets, first_offsets
from streamlake.kafka.client import KafkaMetadataClient, client_config
from streamlake.kafka.offsets import OffsetRange, TopicPartition
from streamlake.kafka.reader import read_range

EXAMPLES = 5


def record_digest(key: bytes | None, value: bytes | None) -> bytes:
    """Digest of a record's key and value (None and empty are different)."""
    h = hashlib.blake2b(digest_size=12)
    for part in (key, value):
        if part is None:
            h.update(b"\x00")
        else:
            h.update(b"\x01" + len(part).to_bytes(8, "little"))
            h.update(part)
    return h.digest()


@dataclass
class PartitionAudit:
    topic: str
    partition: int
    first_offset: int | None
    next_offset: int | None
    kafka_records: int = 0
    table_rows: int = 0
    missing: int = 0
    duplicated: int = 0
    extra: int = 0
    mismatched: int = 0
    examples: dict[str, list[int]] = field(default_factory=dict)

    @property
    def exactly_once(self) -> bool:
        return not (self.missing or self.duplicated or self.extra or self.mismatched)


@dataclass
class AuditReport:
    table: str
    topics: list[str]
    delta_version: int
    checked_at: str
    partitions: list[PartitionAudit]

    @property
    def exactly_once(self) -> bool:
        return all(p.exactly_once for p in self.partitions)

    def totals(self) -> dict[str, int]:
        keys = ("kafka_records", "table_rows", "missing", "duplicated", "extra", "mismatched")
        return {k: sum(getattr(p, k) for p in self.partitions) for k in keys}

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "topics": self.topics,
            "delta_version": self.delta_version,
            "checked_at": self.checked_at,
            "exactly_once": self.exactly_once,
            **self.totals(),
            "partitions": [{**asdict(p), "exactly_once": p.exactly_once} for p in self.partitions],
        }

    def summary(self) -> str:
        t = self.totals()
        verdict = "EXACTLY ONCE" if self.exactly_once else "VIOLATED"
        lines = [f"audit of {self.table} (Delta version {self.delta_version}) against {', '.join(self.topics)}: "
                 f"{verdict}: {t['table_rows']} rows, {t['kafka_records']} Kafka records, missing {t['missing']}, "
                 f"duplicated {t['duplicated']}, extra {t['extra']}, mismatched {t['mismatched']}"]
        for p in self.partitions:
            if not p.exactly_once:
                lines.append(f"  {p.topic}-{p.partition} [{p.first_offset}, {p.next_offset}): "
                             f"missing {p.missing}, duplicated {p.duplicated}, extra {p.extra}, "
                             f"mismatched {p.mismatched}; examples {p.examples}")
        return "\n".join(lines)


def _table_rows(files: list[str], topics: set[str]) -> dict[TopicPartition, list[tuple[int, bytes]]]:
    """(offset, digest) of every table row, by topic-partition (rows of any topic)."""
    rows: dict[TopicPartition, list[tuple[int, bytes]]] = {}
    if not files:
        return rows
    dataset = ds.dataset(files, format="parquet")
    for batch in dataset.to_batches(columns=["topic", "partition", "offset", "key", "value"], batch_size=50_000):
        topic = batch.column("topic").to_pylist()
        part = batch.column("partition").to_pylist()
        offs = batch.column("offset").to_pylist()
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for i in range(batch.num_rows):
            if topic[i] not in topics:
                continue
            rows.setdefault(TopicPartition(topic[i], part[i]), []).append((offs[i], record_digest(keys[i], values[i])))
    return rows


def _kafka_records(conf: Mapping[str, str], rng: OffsetRange) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for batch in read_range(conf, rng, poll_timeout_ms=30_000, fail_on_data_loss=True):
        offs = batch.column("offset").to_pylist()
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for off, key, value in zip(offs, keys, values):
            out[off] = record_digest(key, value)
    return out


def _compare(audit: PartitionAudit, kafka: dict[int, bytes], table: list[tuple[int, bytes]]) -> None:
    audit.kafka_records = len(kafka)
    audit.table_rows = len(table)
    counts = Counter(off for off, _ in table)
    missing = sorted(set(kafka) - set(counts))
    duplicated = sorted(off for off, n in counts.items() if n > 1)
    extra = sorted(off for off in counts if off not in kafka)
    mismatched = sorted({off for off, digest in table if off in kafka and kafka[off] != digest})
    audit.missing = len(missing)
    audit.duplicated = sum(counts[o] - 1 for o in duplicated)
    audit.extra = sum(counts[o] for o in extra)
    audit.mismatched = len(mismatched)
    for name, offs in (("missing", missing), ("duplicated", duplicated), ("extra", extra),
                       ("mismatched", mismatched)):
        if offs:
            audit.examples[name] = offs[:EXAMPLES]


def audit_offsets(table_path: str, topics: Iterable[str], kafka_options: Mapping[str, str] | None = None,
                  version: int | None = None) -> AuditReport:
    """Audit ``table_path`` (latest snapshot or ``version``) against Kafka.

    ``kafka_options`` are client properties (no ``kafka.`` prefix). Raises
    FileNotFoundError for a missing table, UnknownTopicError for a missing topic,
    DataLossError if Kafka no longer holds part of the committed range (the
    audit cannot then prove anything), KafkaUnavailableError if Kafka is down.
    """
    topics = sorted(set(topics))
    conf = client_config({f"kafka.{k}": v for k, v in (kafka_options or {}).items()})
    table = open_table(table_path, version)
    with KafkaMetadataClient(conf) as client:
        tps = client.partitions(topics=topics)
    nexts = committed_offsets(table, tps)
    firsts = first_offsets(table, tps)
    rows = _table_rows(snapshot_files(table), set(topics))
    audits: list[PartitionAudit] = []
    for tp in sorted(set(tps) | set(rows)):
        first, nxt = firsts.get(tp), nexts.get(tp)
        audit = PartitionAudit(tp.topic, tp.partition, first, nxt)
        kafka: dict[int, bytes] = {}
        if first is not None and nxt is not None and nxt > first:
            kafka = _kafka_records(conf, OffsetRange(tp.topic, tp.partition, first, nxt))
        _compare(audit, kafka, rows.get(tp, []))
        if audit.table_rows or audit.kafka_records or first is not None:
            audits.append(audit)
    return AuditReport(
        table=str(table_path), topics=topics, delta_version=table.version(),
        checked_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), partitions=audits,
    )
