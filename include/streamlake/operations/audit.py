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

**Bounded memory.** The comparison runs partition by partition, in offset order,
over chunks of at most :data:`CHUNK_OFFSETS` offsets. For a chunk, the table's
rows are read from the files whose Delta statistics (topic, partition, offset
min/max) may hold them, with the chunk as a Parquet filter; each side becomes a
sorted ``int64`` offset array and a fixed-size (12-byte) digest array, and the
counts come from vectorised comparisons of those arrays (:func:`compare_rows`).
Kafka's records of a partition come from one sequential read handed out chunk
by chunk, with librdkafka's prefetch capped (:data:`PREFETCH_KB`). Nothing is
kept per row between chunks, so memory follows the chunk size, not the table.

**Segments.** What a table's rows are compared with is described per offset
range (:class:`Segment`): Kafka's records; nothing (rows there are extra); the
rows of an earlier table version that a consistency check proved (for offsets
Kafka no longer holds, past its retention); the proven rows a new row would
duplicate (incremental checks, see :mod:`streamlake.operations.consistency`); or
nothing that can prove them (a range Kafka no longer holds and no check ever
proved: a failure). :func:`audit_offsets` is the ledger-free full audit: Kafka
is its only reference.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from streamlake.delta.table import open_table
from streamlake.delta.txn import committed_offsets, first_offsets
from streamlake.errors import DataLossError
from streamlake.kafka.client import KafkaMetadataClient, client_config
from streamlake.kafka.offsets import OffsetRange, Offsets, TopicPartition
from streamlake.kafka.reader import read_range
from streamlake.storage.location import StorageOptions, arrow_filesystem, is_object_store, storage_options

EXAMPLES = 5
DIGEST_SIZE = 12
# Offsets compared at a time per partition: ~20 bytes per row and side, so about
# 2 MB per side and chunk, whatever the size of the table.
CHUNK_OFFSETS = 100_000
SCAN_BATCH_ROWS = 32_768
PREFETCH_KB = 8_192  # librdkafka's queued.max.messages.kbytes for the audit's reads (unless set)
_SCAN_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("key", pa.binary()), ("value", pa.binary()),
])

# What a segment's rows are compared with.
KAFKA = "kafka"            # the records Kafka holds
NONE = "none"              # nothing: every row there is extra
SNAPSHOT = "snapshot"      # the rows of a proven table version (Kafka no longer holds the range)
PROVEN = "proven"          # the proven rows at the same offsets (rows added to a proven range)
UNVERIFIED = "unverified"  # no reference at all: Kafka lost it and no check proved it


def record_digest(key: bytes | None, value: bytes | None) -> bytes:
    """Digest of a record's key and value (None and empty are different)."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
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
    # offsets of the committed range that nothing can verify (Kafka no longer holds
    # them and no check proved them): the partition cannot be called exactly once
    unverified: int = 0
    mode: str = "full"  # "full": every row compared; "incremental": rows added since a proof
    kafka_records_read: int = 0
    table_rows_read: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return not (self.missing or self.duplicated or self.extra or self.mismatched or self.unverified)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass
class AuditReport:
    table: str
    topics: list[str]
    delta_version: int
    checked_at: str
    partitions: list[PartitionAudit]
    mode: str = "full"
    notes: list[str] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return all(p.exactly_once for p in self.partitions)

    def totals(self) -> dict[str, int]:
        keys = ("kafka_records", "table_rows", "missing", "duplicated", "extra", "mismatched")
        return {k: sum(getattr(p, k) for p in self.partitions) for k in keys}

    def read_totals(self) -> dict[str, int]:
        """What this audit actually read (an incremental check reads only what changed)."""
        return {k: sum(getattr(p, k) for p in self.partitions) for k in ("kafka_records_read", "table_rows_read")}

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "topics": self.topics,
            "delta_version": self.delta_version,
            "checked_at": self.checked_at,
            "exactly_once": self.exactly_once,
            "mode": self.mode,
            **self.totals(),
            "unverified": sum(p.unverified for p in self.partitions),
            **self.read_totals(),
            "notes": list(self.notes),
            "partitions": [{**asdict(p), "exactly_once": p.exactly_once} for p in self.partitions],
        }

    def summary(self) -> str:
        t = self.totals()
        verdict = "EXACTLY ONCE" if self.exactly_once else "VIOLATED"
        unverified = sum(p.unverified for p in self.partitions)
        lines = [f"audit of {self.table} (Delta version {self.delta_version}) against {', '.join(self.topics)}: "
                 f"{verdict}: {t['table_rows']} rows, {t['kafka_records']} Kafka records, missing {t['missing']}, "
                 f"duplicated {t['duplicated']}, extra {t['extra']}, mismatched {t['mismatched']}"
                 + (f", unverified offsets {unverified}" if unverified else "")]
        lines += [f"  {note}" for note in self.notes]
        for p in self.partitions:
            if not p.exactly_once:
                lines.append(f"  {p.topic}-{p.partition} [{p.first_offset}, {p.next_offset}): "
                             f"missing {p.missing}, duplicated {p.duplicated}, extra {p.extra}, "
                             f"mismatched {p.mismatched}"
                             + (f", unverified offsets {p.unverified}" if p.unverified else "")
                             + f"; examples {p.examples}")
            lines += [f"  {p.topic}-{p.partition}: {note}" for note in p.notes]
        return "\n".join(lines)


# -- rows as arrays ----------------------------------------------------------------


@dataclass
class Rows:
    """Rows of one partition as arrays: ``offsets`` (int64) and ``digests`` (n x 12
    bytes, the fixed-size binary layout of :func:`record_digest`)."""

    offsets: np.ndarray
    digests: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)

    @staticmethod
    def empty() -> "Rows":
        return Rows(np.empty(0, np.int64), np.empty((0, DIGEST_SIZE), np.uint8))

    @staticmethod
    def concat(parts: Sequence["Rows"]) -> "Rows":
        parts = [p for p in parts if len(p)]
        if not parts:
            return Rows.empty()
        if len(parts) == 1:
            return parts[0]
        return Rows(np.concatenate([p.offsets for p in parts]), np.concatenate([p.digests for p in parts]))

    @staticmethod
    def from_batch(offsets, keys, values) -> "Rows":
        """Offsets and digests of Arrow columns (one Python call per row for the digest,
        nothing kept per row)."""
        offs = np.asarray(offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        buf = b"".join(map(record_digest, keys.to_pylist(), values.to_pylist()))
        return Rows(offs, np.frombuffer(buf, dtype=np.uint8).reshape(-1, DIGEST_SIZE))

    def sorted(self) -> "Rows":
        if len(self) < 2 or bool(np.all(self.offsets[1:] >= self.offsets[:-1])):
            return self
        order = np.argsort(self.offsets, kind="stable")
        return Rows(self.offsets[order], self.digests[order])

    def unique(self) -> "Rows":
        """Sorted, first row of each offset kept."""
        rows = self.sorted()
        if len(rows) < 2:
            return rows
        keep = np.concatenate(([True], rows.offsets[1:] != rows.offsets[:-1]))
        return rows if keep.all() else Rows(rows.offsets[keep], rows.digests[keep])


def _isin_sorted(values: np.ndarray, sorted_ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask of ``values`` present in ``sorted_ref``, their positions there)."""
    if not len(sorted_ref) or not len(values):
        return np.zeros(len(values), bool), np.zeros(len(values), np.int64)
    pos = np.searchsorted(sorted_ref, values)
    clipped = np.minimum(pos, len(sorted_ref) - 1)
    return sorted_ref[clipped] == values, clipped


def _add_examples(audit: PartitionAudit, name: str, offsets: np.ndarray) -> None:
    if not len(offsets):
        return
    have = audit.examples.setdefault(name, [])
    if len(have) < EXAMPLES:
        have.extend(int(o) for o in offsets[:EXAMPLES - len(have)])


def compare_rows(audit: PartitionAudit, reference: Rows, table: Rows, *, count_reference: bool = True,
                 table_rows: int | None = None) -> None:
    """Add to ``audit`` the comparison of ``table`` rows with ``reference`` records of
    the same offset range (``reference`` holds each offset once).

    Calls for consecutive ranges in increasing offset order give the counts and
    examples (the lowest offsets) one call over the union would give.
    ``count_reference``/``table_rows`` say what to add to ``kafka_records`` and
    ``table_rows`` (callers that add proven rows to both sides count only theirs).
    """
    ref = reference.sorted()
    tab = table.sorted()
    audit.kafka_records += len(ref) if count_reference else 0
    audit.table_rows += len(tab) if table_rows is None else table_rows
    n = len(tab)
    if n:
        starts = np.flatnonzero(np.concatenate(([True], tab.offsets[1:] != tab.offsets[:-1])))
        uniq = tab.offsets[starts]
        counts = np.diff(np.append(starts, n))
    else:
        uniq = np.empty(0, np.int64)
        counts = np.empty(0, np.int64)
    held, _ = _isin_sorted(uniq, ref.offsets)
    present, _ = _isin_sorted(ref.offsets, uniq)
    missing = ref.offsets[~present]
    duplicated = uniq[counts > 1]
    extra = uniq[~held]
    row_held, pos = _isin_sorted(tab.offsets, ref.offsets)
    differs = row_held.copy()
    if row_held.any():
        differs[row_held] = (tab.digests[row_held] != ref.digests[pos[row_held]]).any(axis=1)
    mismatched = np.unique(tab.offsets[differs])
    audit.missing += len(missing)
    audit.duplicated += int((counts[counts > 1] - 1).sum())
    audit.extra += int(counts[~held].sum())
    audit.mismatched += len(mismatched)
    for name, offs in (("missing", missing), ("duplicated", duplicated), ("extra", extra),
                       ("mismatched", mismatched)):
        _add_examples(audit, name, offs)


def _compare(audit: PartitionAudit, kafka: Mapping[int, bytes], table: Iterable[tuple[int, bytes]]) -> None:
    """:func:`compare_rows` for a Kafka ``{offset: digest}`` and table ``(offset, digest)``
    pairs (small inputs, unit tests)."""
    def rows(pairs) -> Rows:
        pairs = list(pairs)
        if not pairs:
            return Rows.empty()
        return Rows(np.array([o for o, _ in pairs], np.int64),
                    np.frombuffer(b"".join(d for _, d in pairs), np.uint8).reshape(-1, DIGEST_SIZE))

    compare_rows(audit, rows(sorted(kafka.items())), rows(table))


# -- the table's files -------------------------------------------------------------


@dataclass(frozen=True)
class FileInfo:
    """A data file and what its statistics say about the Kafka records it holds
    (None: unknown, the file may hold anything)."""

    path: str  # local absolute path, or the path in ``fs`` (an object store)
    num_records: int | None = None
    topic_min: str | None = None
    topic_max: str | None = None
    partition_min: int | None = None
    partition_max: int | None = None
    offset_min: int | None = None
    offset_max: int | None = None
    fs: object = field(default=None, compare=False, repr=False)  # pyarrow filesystem; None: local

    def may_contain(self, tp: TopicPartition) -> bool:
        if self.topic_min is not None and self.topic_max is not None and \
                not (self.topic_min <= tp.topic <= self.topic_max):
            return False
        if self.partition_min is not None and self.partition_max is not None and \
                not (self.partition_min <= tp.partition <= self.partition_max):
            return False
        return True

    def overlaps(self, lo: int | None, hi: int | None) -> bool:
        """May hold offsets in ``[lo, hi)`` (None: unbounded)."""
        if self.offset_min is None or self.offset_max is None:
            return True
        return (hi is None or self.offset_min < hi) and (lo is None or self.offset_max >= lo)

    @property
    def single_partition(self) -> TopicPartition | None:
        """The one topic-partition all rows belong to, if the statistics say so."""
        if self.topic_min is not None and self.topic_min == self.topic_max and \
                self.partition_min is not None and self.partition_min == self.partition_max:
            return TopicPartition(self.topic_min, int(self.partition_min))
        return None

    @property
    def has_stats(self) -> bool:
        return None not in (self.topic_min, self.topic_max, self.partition_min, self.partition_max,
                            self.offset_min, self.offset_max)

    @staticmethod
    def from_stats(path: str, num_records: int | None, mins: Mapping, maxs: Mapping, fs=None) -> "FileInfo":
        def num(v):
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        def text(v):
            return v if isinstance(v, str) else None

        return FileInfo(path, num_records, text(mins.get("topic")), text(maxs.get("topic")),
                        num(mins.get("partition")), num(maxs.get("partition")),
                        num(mins.get("offset")), num(maxs.get("offset")), fs)

    def with_footer_stats(self) -> "FileInfo":
        """Statistics from the Parquet footer for a file the Delta log has none for."""
        if self.has_stats:
            return self
        import pyarrow.parquet as pq

        try:
            meta = pq.read_metadata(self.path, filesystem=self.fs)
        except (OSError, pa.ArrowInvalid):
            return self
        leaf = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
        mins: dict = {}
        maxs: dict = {}
        for name in ("topic", "partition", "offset"):
            if name not in leaf:
                continue
            lo = hi = None
            for rg in range(meta.num_row_groups):
                st = meta.row_group(rg).column(leaf[name]).statistics
                if meta.row_group(rg).num_rows == 0:
                    continue
                if st is None or not st.has_min_max:
                    lo = hi = None
                    break
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
            if lo is not None:
                mins[name], maxs[name] = lo, hi
        return FileInfo.from_stats(self.path, meta.num_rows, mins, maxs, self.fs)


def local_path(root: str, path: str) -> str:
    """A data file path as the Delta log or delta-rs writes it -> a local absolute path."""
    if path.startswith("file://"):
        return unquote(path[len("file://"):])
    path = unquote(path)
    return path if os.path.isabs(path) else os.path.join(root, path)


def table_filesystem(root: str):
    """The pyarrow filesystem of a table at ``root`` on an object store (reached with its
    store's environment and remembered options); None for a local table."""
    return arrow_filesystem(storage_options(root))[0] if is_object_store(root) else None


def data_file_path(root: str, path: str, fs=None) -> str:
    """A data file path from the Delta log -> where the audit reads it: a local absolute path,
    or with ``fs`` (a table on an object store) its path in that filesystem."""
    return local_path(root, path) if fs is None else object_store_path(root, path)


def object_store_path(root: str, path: str) -> str:
    """A data file path of a table at object-store URI ``root`` -> its path in the store's
    pyarrow filesystem (``bucket/key``)."""
    full = path if "://" in path else f"{root.rstrip('/')}/{unquote(path)}"
    return full.split("://", 1)[1]


def _dataset(files: Sequence[FileInfo]):
    fs = next((f.fs for f in files if f.fs is not None), None)
    return ds.dataset([f.path for f in files], format="parquet", schema=_SCAN_SCHEMA, filesystem=fs)


def table_root(table) -> str:
    uri = table.table_uri
    return unquote(uri[len("file://"):]) if uri.startswith("file://") else uri


def snapshot_index(table, fs=None) -> list[FileInfo]:
    """Every data file of the table's loaded snapshot with its statistics (from the
    Delta log; the Parquet footer for files the log has none for). ``fs``: the pyarrow
    filesystem of a table on an object store (see :func:`object_store_path`; derived from the
    table's URI when not given)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    root = table_root(table)
    fs = fs if fs is not None else table_filesystem(root)
    names = set(actions.column_names)

    def col(name):
        return actions.column(name).to_pylist() if name in names else [None] * actions.num_rows

    out = []
    for path, n, tmin, tmax, pmin, pmax, omin, omax in zip(
            col("path"), col("num_records"), col("min.topic"), col("max.topic"), col("min.partition"),
            col("max.partition"), col("min.offset"), col("max.offset")):
        where = data_file_path(root, path, fs)
        info = FileInfo.from_stats(where, n, {"topic": tmin, "partition": pmin, "offset": omin},
                                   {"topic": tmax, "partition": pmax, "offset": omax}, fs)
        out.append(info if info.has_stats else info.with_footer_stats())
    return out


def file_info_from_add(root: str, add: Mapping, fs=None) -> FileInfo:
    """FileInfo of a Delta ``add`` action (its ``stats`` JSON, else the Parquet footer); ``fs``:
    the filesystem of a table on an object store (:func:`table_filesystem`)."""
    path = data_file_path(root, add["path"], fs)
    try:
        stats = json.loads(add.get("stats") or "{}") or {}
    except ValueError:
        stats = {}
    info = FileInfo.from_stats(path, stats.get("numRecords"), stats.get("minValues") or {},
                               stats.get("maxValues") or {}, fs)
    return info if info.has_stats else info.with_footer_stats()


def partitions_in_files(files: Sequence[FileInfo], topics: Iterable[str]) -> set[TopicPartition]:
    """Topic-partitions (of ``topics``) the files hold rows of: from the statistics, and by
    reading the topic and partition columns of files whose statistics do not name one."""
    topics = set(topics)
    out = {f.single_partition for f in files if f.single_partition is not None}
    out = {tp for tp in out if tp.topic in topics}

    def may_hold_topic(f: FileInfo) -> bool:
        return f.topic_min is None or f.topic_max is None or any(f.topic_min <= t <= f.topic_max for t in topics)

    unknown = [f for f in files if f.single_partition is None and may_hold_topic(f)]
    if unknown:
        dataset = _dataset(unknown)
        for batch in dataset.to_batches(columns=["topic", "partition"], batch_size=SCAN_BATCH_ROWS,
                                        filter=pc.field("topic").isin(sorted(topics))):
            pairs = pa.table({"t": batch.column(0), "p": batch.column(1)}).group_by(["t", "p"]).aggregate([])
            out |= {TopicPartition(t, int(p)) for t, p in zip(pairs.column("t").to_pylist(),
                                                                pairs.column("p").to_pylist())}
    return out


def scan_rows(files: Sequence[FileInfo], tp: TopicPartition, lo: int | None, hi: int | None,
              only: np.ndarray | None = None) -> Rows:
    """Rows of ``tp`` with ``lo <= offset < hi`` (and in ``only``, if given) in ``files``."""
    chosen = [f for f in files if f.may_contain(tp) and f.overlaps(lo, hi)]
    if not chosen or (only is not None and not len(only)):
        return Rows.empty()
    expr = (pc.field("topic") == tp.topic) & (pc.field("partition") == tp.partition)
    if lo is not None:
        expr &= pc.field("offset") >= lo
    if hi is not None:
        expr &= pc.field("offset") < hi
    if only is not None:
        expr &= pc.field("offset").isin(pa.array(only, pa.int64()))
    dataset = _dataset(chosen)
    parts = [Rows.from_batch(b.column("offset"), b.column("key"), b.column("value"))
             for b in dataset.to_batches(columns=["offset", "key", "value"], filter=expr,
                                         batch_size=SCAN_BATCH_ROWS, batch_readahead=2, fragment_readahead=2)
             if b.num_rows]
    return Rows.concat(parts)


# -- Kafka -------------------------------------------------------------------------


class KafkaLog:
    """What the audit asks Kafka: its partitions, where each partition's log starts
    (records below were deleted by retention), and the records of an offset range.

    The one boundary between the audit and Kafka (tests put a spy here to see what
    the audit reads).
    """

    def __init__(self, conf: Mapping[str, str]):
        self.conf = dict(conf)
        # librdkafka prefetches up to 64 MB per partition by default while the audit
        # compares: bounded, but the largest share of a full audit's memory.
        self.conf.setdefault("queued.max.messages.kbytes", str(PREFETCH_KB))
        self._client = KafkaMetadataClient(self.conf)

    def partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        return self._client.partitions(topics=topics)

    def log_start(self, tps: Iterable[TopicPartition]) -> Offsets:
        return self._client.earliest(list(tps))

    def read(self, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.conf, rng, poll_timeout_ms=30_000, fail_on_data_loss=True)

    def close(self) -> None:
        self._client.close()


class KafkaChunks:
    """One sequential read of ``[lo, hi)`` handed out chunk by chunk (:meth:`take`), so
    a long range costs one read, not one per chunk, and memory holds one chunk."""

    def __init__(self, kafka: KafkaLog, tp: TopicPartition, lo: int, hi: int):
        self._batches = iter(kafka.read(OffsetRange(tp.topic, tp.partition, lo, hi))) if hi > lo else iter(())
        self._pending: Rows | None = None

    def take(self, hi: int) -> Rows:
        """The records below offset ``hi`` not taken yet."""
        parts = []
        while True:
            if self._pending is None:
                batch = next(self._batches, None)
                if batch is None:
                    break
                if not batch.num_rows:
                    continue
                self._pending = Rows.from_batch(batch.column("offset"), batch.column("key"), batch.column("value"))
            rows = self._pending
            cut = int(np.searchsorted(rows.offsets, hi))  # a batch is in offset order
            if cut < len(rows):
                parts.append(Rows(rows.offsets[:cut], rows.digests[:cut]))
                self._pending = Rows(rows.offsets[cut:], rows.digests[cut:])
                break
            parts.append(rows)
            self._pending = None
        return Rows.concat(parts).unique()

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


# -- segments and the per-partition audit -------------------------------------------


@dataclass
class Segment:
    """An offset range ``[lo, hi)`` (None: unbounded) and what its rows are compared
    with. ``reference_files`` (SNAPSHOT, PROVEN) returns the files holding the
    reference rows; it is called only if needed."""

    lo: int | None
    hi: int | None
    reference: str
    reference_files: Callable[[], Sequence[FileInfo]] | None = None


def _steps(lo: int, hi: int, chunk: int) -> Iterator[tuple[int, int]]:
    start = lo
    while start < hi:
        yield start, min(hi, start + chunk)
        start += chunk


def _sparse_steps(lo: int | None, hi: int | None, files: Sequence[FileInfo], chunk: int) -> list[tuple]:
    """Chunks of ``[lo, hi)`` that some file may hold rows in (in offset order)."""
    spans = []
    for f in files:
        if f.offset_min is None or f.offset_max is None:
            return [(lo, hi)]
        a = f.offset_min if lo is None else max(lo, f.offset_min)
        b = f.offset_max + 1 if hi is None else min(hi, f.offset_max + 1)
        if a < b:
            spans.append((a, b))
    spans.sort()
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [step for a, b in merged for step in _steps(a, b, chunk)]


def audit_partition(audit: PartitionAudit, files: Sequence[FileInfo], segments: Sequence[Segment],
                    kafka: KafkaLog, chunk: int | None = None) -> None:
    """Compare the rows of ``audit``'s partition in ``files`` with each segment's
    reference, chunk by chunk (default :data:`CHUNK_OFFSETS` offsets) in offset order
    (segments must be in offset order and together cover every offset)."""
    chunk = chunk or CHUNK_OFFSETS
    tp = audit.tp
    files = [f for f in files if f.may_contain(tp)]
    for seg in segments:
        cands = [f for f in files if f.overlaps(seg.lo, seg.hi)]
        if seg.reference == KAFKA:
            records = KafkaChunks(kafka, tp, seg.lo, seg.hi)
            try:
                for lo, hi in _steps(seg.lo, seg.hi, chunk):
                    table = scan_rows(cands, tp, lo, hi)
                    ref = records.take(hi)
                    audit.table_rows_read += len(table)
                    audit.kafka_records_read += len(ref)
                    compare_rows(audit, ref, table)
            finally:
                records.close()
        elif seg.reference == SNAPSHOT:
            proven = [f for f in seg.reference_files() if f.may_contain(tp)]
            for lo, hi in _steps(seg.lo, seg.hi, chunk):
                table = scan_rows(cands, tp, lo, hi)
                ref = scan_rows(proven, tp, lo, hi).unique()
                audit.table_rows_read += len(table) + len(ref)
                compare_rows(audit, ref, table)
        elif seg.reference == UNVERIFIED:
            audit.unverified += seg.hi - seg.lo
            for lo, hi in _sparse_steps(seg.lo, seg.hi, cands, chunk):
                n = len(scan_rows(cands, tp, lo, hi))
                audit.table_rows += n
                audit.table_rows_read += n
        else:  # NONE, PROVEN: only where the files hold rows
            for lo, hi in _sparse_steps(seg.lo, seg.hi, cands, chunk):
                table = scan_rows(cands, tp, lo, hi)
                audit.table_rows_read += len(table)
                if not len(table):
                    continue
                if seg.reference == PROVEN:
                    # Rows added into a proven range: the proven rows at their offsets are
                    # on both sides (they equal Kafka's records), so a copy of a proven
                    # row counts as duplicated, a row where none was proven as extra.
                    wanted = np.unique(table.offsets)
                    ref = scan_rows(seg.reference_files(), tp, int(wanted[0]), int(wanted[-1]) + 1,
                                    only=wanted).unique()
                    audit.table_rows_read += len(ref)
                    compare_rows(audit, ref, Rows.concat([table, ref]), count_reference=False,
                                 table_rows=len(table))
                else:
                    compare_rows(audit, Rows.empty(), table)


def full_segments(first: int | None, nxt: int | None) -> list[Segment]:
    """Kafka is the reference for the whole committed range; rows outside are extra."""
    if first is None or nxt is None or nxt <= first:
        return [Segment(None, None, NONE)]
    return [Segment(None, first, NONE), Segment(first, nxt, KAFKA), Segment(nxt, None, NONE)]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def audit_offsets(table_path: str, topics: Iterable[str], kafka_options: Mapping[str, str] | None = None,
                  version: int | None = None, storage: StorageOptions | None = None) -> AuditReport:
    """Audit ``table_path`` (latest snapshot or ``version``) against Kafka: every row.

    The ledger-free full audit (``streamlake audit``): Kafka is the only reference.
    ``kafka_options`` are client properties (no ``kafka.`` prefix). Raises
    FileNotFoundError for a missing table, UnknownTopicError for a missing topic,
    DataLossError if Kafka no longer holds part of the committed range (the audit
    cannot then prove anything; ``streamlake check`` can, from earlier proofs),
    KafkaUnavailableError if Kafka is down. A table on an object store is read with
    ``storage`` (default: the environment's options for its URI).
    """
    topics = sorted(set(topics))
    conf = client_config({f"kafka.{k}": v for k, v in (kafka_options or {}).items()})
    storage = storage if storage is not None else storage_options(table_path)
    table = open_table(table_path, version, storage.for_delta())
    fs = arrow_filesystem(storage)[0] if is_object_store(table_path) else None
    kafka = KafkaLog(conf)
    try:
        tps = kafka.partitions(topics)
        nexts = committed_offsets(table, tps)
        firsts = first_offsets(table, tps)
        files = snapshot_index(table, fs)
        starts = kafka.log_start([tp for tp in tps if tp in firsts])
        for tp in sorted(firsts):
            first, nxt, start = firsts[tp], nexts.get(tp), starts.get(tp)
            if nxt is not None and start is not None and first < min(start, nxt):
                raise DataLossError(
                    f"offsets [{first}, {min(start, nxt)}) of {tp} are no longer in Kafka (earliest available: "
                    f"{start}): this audit cannot prove them. `streamlake check --job NAME` can, for ranges an "
                    "earlier check proved")
        audits: list[PartitionAudit] = []
        for tp in sorted(set(tps) | partitions_in_files(files, topics)):
            first, nxt = firsts.get(tp), nexts.get(tp)
            audit = PartitionAudit(tp.topic, tp.partition, first, nxt)
            audit_partition(audit, files, full_segments(first, nxt), kafka)
            if audit.table_rows or audit.kafka_records or first is not None:
                audits.append(audit)
    finally:
        kafka.close()
    return AuditReport(table=str(table_path), topics=topics, delta_version=table.version(), checked_at=_now(),
                       partitions=audits)
