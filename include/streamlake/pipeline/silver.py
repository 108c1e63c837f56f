"""Silver: a definition's typed, validated, de-duplicated events from bronze; everything else to quarantine.

A streaming query on the bronze table (``streamlake-delta`` source). Each
micro-batch:

1. parses every bronze record into the definition's typed fields
   (:func:`streamlake.pipeline.validation.parse_events`);
2. appends the records that are not valid events to ``quarantine`` with their
   reason, raw key and value, and lineage;
3. with an ``event_id`` in the definition, removes duplicates: within the batch
   the first record of an id wins (Kafka timestamp, then topic, partition,
   offset), and an event whose id silver already holds with an event time
   within the **deduplication horizon** (``dedup_horizon``, default 24 hours)
   of its own is dropped. Of the silver files whose event-time statistics overlap
   the batch's events +/- the horizon, the lookup reads only those holding a hash
   of one of the batch's ids (:class:`streamlake.pipeline.event_ids.FileIdHashes`,
   each file's id hashes read once per process), and compares the ids themselves;
4. appends the remaining events to ``silver``;
5. once more than ``compact_after_files`` of silver's (or quarantine's) files are
   small, bin-packs them (:func:`streamlake.pipeline.stage.compact_appended`, a
   ``dataChange=false`` commit): every micro-batch adds files, and the lookup of
   step 3 would otherwise read more of them as the day goes on.

Both appends are exactly once (:mod:`streamlake.pipeline.stage`). Every bronze
row therefore ends up in exactly one of silver, quarantine, or the dropped
duplicates (whose event id is in silver under another lineage), which the
pipeline check verifies by lineage. A field added to the definition (optional)
is added to silver as a column; earlier rows read it as null. Counts per batch
(valid, quarantined, duplicates) go to the progress line, with ``dedup_ids``: the
ids whose hashes the de-duplication keeps in memory (its state's size).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from streamlake.delta.table import (
    COMPACT_AFTER_SMALL_FILES,
    ensure_table,
    evolve_table,
    files_overlapping,
    parquet_dataset,
)
from streamlake.pipeline import bronze as bronze_table
from streamlake.pipeline.definition import PipelineDefinition
from streamlake.pipeline.event_ids import FileIdHashes, hash_ids
from streamlake.pipeline.schemas import QUARANTINE, silver_spec
from streamlake.pipeline.stage import (
    DRIVER_READ_MAX_BYTES,
    BatchRange,
    DeltaFedStage,
    append_batch,
    compact_appended,
)
from streamlake.pipeline.validation import BRONZE, MESSAGE, REASON, parse_events

log = logging.getLogger(__name__)

SOURCE = "bronze"
LINEAGE = ("topic", "partition", "offset")
QUARANTINE_STATS = ("topic", "partition", "offset", "reason", "bronze_version")
VERSION_COLUMN = "_commit_version"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def silver_stats_columns(definition: PipelineDefinition) -> tuple[str, ...]:
    """Columns with min/max statistics in silver's log: event time (backfills, checks and
    de-duplication prune by it), event id, lineage and bronze version (accounting)."""
    ids = (definition.event_id,) if definition.event_id else ()
    return (*ids, definition.event_time, *LINEAGE, "bronze_version")


def ensure_silver(path: str, definition: PipelineDefinition, storage=None):
    """Open or create silver for ``definition`` (adding columns of fields added since);
    returns (table, spec in the table's column order)."""
    return evolve_table(path, silver_spec(definition), storage)


@dataclass
class SilverStage(DeltaFedStage):
    """The silver stage of a pipeline (tables ``bronze``, ``silver``, ``quarantine``;
    checkpoint ``_checkpoints/silver``)."""

    definition: PipelineDefinition
    bronze_path: str
    silver_path: str
    quarantine_path: str
    checkpoint: str
    max_files_per_trigger: int | None = None
    processing_time_s: float | None = None
    query_name: str = "pipeline"
    name: str = "silver"
    source: str = SOURCE
    storage: dict[str, str] = field(default_factory=dict)  # an object-store root's options, without secrets
    compact_after_files: int = COMPACT_AFTER_SMALL_FILES
    driver_read_max_bytes: int = DRIVER_READ_MAX_BYTES  # smaller batches: read on the driver
    upstream_wait_ms: int | None = None  # the source's waitForCommitMs (a continuous run on a local root)
    # the id hashes of silver's files, read once each (derived from the files: never stale)
    id_hashes: FileIdHashes = field(default_factory=FileIdHashes, repr=False, compare=False)

    @property
    def source_path(self) -> str:
        return self.bronze_path

    @property
    def dedup_horizon_us(self) -> int:
        return self.definition.dedup_horizon_ms * 1000

    def outputs(self) -> dict[str, str]:
        return {"silver": self.silver_path, "quarantine": self.quarantine_path}

    def prepare(self) -> None:
        bronze_table.ensure_bronze_table(self.bronze_path, self.storage)
        ensure_silver(self.silver_path, self.definition, self.storage)
        ensure_table(self.quarantine_path, QUARANTINE, self.storage)

    def process(self, df, batch: BatchRange, on_driver: bool = False) -> dict:
        """Write one micro-batch of bronze rows to quarantine and silver (see the module docstring).

        Read by Spark's tasks, the batch is parsed once and cached, and Spark runs up to three
        jobs on it: collecting every record's verdict and the valid events' ids and times for
        de-duplication, writing quarantine (not when the batch has no reject: its commit then
        only records the position), writing silver. Read on the driver (``on_driver``: a local
        relation), one query computes quarantine's rows, silver's and the verdicts into Arrow
        here, and both tables' files are written here. The counts come from the written files."""
        from pyspark.sql import functions as F

        d = self.definition
        silver, spec = ensure_silver(self.silver_path, d, self.storage)
        batch_time = dt.datetime.fromtimestamp(batch.batch_time_ms / 1000, dt.timezone.utc)
        columns = self._columns(batch_time)
        parsed = parse_events(df, d)
        if on_driver:
            rejects, events, ids = self._rows_here(parsed, columns, spec)
            any_rejected = rejects.num_rows > 0
        else:
            parsed = parsed.persist()
            rejects = parsed.where(F.col(REASON).isNotNull()).select(*_aliased(columns["quarantine"]))
            events = parsed.where(F.col(REASON).isNull())
            any_rejected, ids = True, None
            if d.event_id:
                # one job: every row's verdict, and the valid ones' ids (the parse is cached by it)
                verdicts = parsed.select(*_aliased(columns["verdict"])).toArrow()
                is_rejected = pc.fill_null(verdicts.column(REASON), False)
                any_rejected = pc.any(is_rejected).as_py() or False
                ids = verdicts.filter(pc.invert(is_rejected)).drop_columns([REASON])
        try:
            dropped = pa.table({c: pa.array([], t) for c, t in (("topic", pa.string()), ("partition", pa.int32()),
                                                                  ("offset", pa.int64()))})
            candidates = ids.num_rows if ids is not None else 0
            if d.event_id:
                dropped = self.duplicates(ids, silver, spec)
            if dropped.num_rows:
                events = _without(events, dropped, df.sparkSession)
            if not on_driver:
                events = events.select(*_aliased(columns["silver"]))
            # with no reject in the batch, quarantine's commit only records the position: no Spark job
            quarantined = append_batch(self.quarantine_path, QUARANTINE, rejects if any_rejected else None, batch,
                                       source=self.source, stage=self.name, version_column=VERSION_COLUMN,
                                       stats_columns=QUARANTINE_STATS, storage=self.storage)
            any_event = not d.event_id or candidates > dropped.num_rows
            written = append_batch(self.silver_path, spec, events if any_event else None, batch,
                                   source=self.source, stage=self.name,
                                   version_column=VERSION_COLUMN, stats_columns=silver_stats_columns(d),
                                   metadata={"duplicates": dropped.num_rows}, storage=self.storage)
        finally:
            if not on_driver:
                parsed.unpersist()
        compacted = compact_appended(self.name, {"silver": written, "quarantine": quarantined},
                                     self.compact_after_files)
        events_written = written.rows if written else 0
        return {"valid": events_written + dropped.num_rows if d.event_id else events_written,
                "quarantined": quarantined.rows if quarantined else 0, "events": events_written,
                "duplicates": dropped.num_rows, "candidates": candidates,
                **({"dedup_ids": self.id_hashes.ids_held()} if d.event_id else {}),
                # every bronze row of the batch is quarantined, an event or a dropped duplicate
                "rows": (quarantined.rows if quarantined else 0) + events_written + dropped.num_rows,
                **({"compacted": compacted} if compacted else {})}

    def _columns(self, batch_time: dt.datetime) -> dict[str, dict]:
        """The columns computed from the parsed batch (:func:`parse_events`), by name: a
        quarantine row's, a silver row's, and a verdict's (rejected or not; the id, event time
        and Kafka timestamp de-duplication needs, as text and epoch µs; lineage)."""
        from pyspark.sql import functions as F

        d = self.definition
        lineage = {c: F.col(f"{BRONZE}.{c}") for c in LINEAGE}
        version = F.col(f"{BRONZE}.{VERSION_COLUMN}")
        quarantine = {
            **lineage, "kafka_timestamp": F.col(f"{BRONZE}.timestamp"), "key": F.col(f"{BRONZE}.key"),
            "value": F.col(f"{BRONZE}.value"), "reason": F.col(REASON), "message": F.col(MESSAGE),
            "bronze_version": version, "quarantined_at": F.lit(batch_time).cast("timestamp"),
            "ingest_date": F.col(f"{BRONZE}.ingest_date"), VERSION_COLUMN: version}
        silver = {
            **{f.name: F.col(f"`{f.name}`") for f in d.fields}, **lineage,
            "kafka_timestamp": F.col(f"{BRONZE}.timestamp"), "bronze_version": version,
            "event_date": F.to_date(F.col(f"`{d.event_time}`")), VERSION_COLUMN: version}
        verdict = {REASON: F.col(REASON).isNotNull()}
        if d.event_id:
            verdict.update({"event_id": F.col(f"`{d.event_id}`").cast("string"),
                            "t": F.unix_micros(F.col(f"`{d.event_time}`")),
                            "kt": F.unix_micros(f"{BRONZE}.timestamp"), **lineage})
        return {"quarantine": quarantine, "silver": silver, "verdict": verdict}

    def _rows_here(self, parsed, columns: dict[str, dict], spec) -> tuple[pa.Table, pa.Table, pa.Table | None]:
        """The batch's quarantine rows, its valid events (silver's columns) and their verdicts
        (columns ``_columns``' verdict's but the reason; None without an event id), from one
        query of ``parsed`` into Arrow, in the tables' file types."""
        selected = [c.alias(f"{kind}:{name}") for kind, named in columns.items() for name, c in named.items()]
        table = parsed.select(*selected).toArrow()
        rejected = pc.fill_null(table.column(f"verdict:{REASON}"), False)

        def part(kind: str, mask, schema: pa.Schema | None) -> pa.Table:
            names = list(columns[kind])
            rows = table.filter(mask).select([f"{kind}:{n}" for n in names]).rename_columns(names)
            if schema is None:
                return rows
            return pa.table({n: rows.column(n).cast(schema.field(n).type) if n in schema.names else rows.column(n)
                             for n in names})

        valid = pc.invert(rejected)
        ids = part("verdict", valid, None).drop_columns([REASON]) if self.definition.event_id else None
        return part("quarantine", rejected, QUARANTINE.schema), part("silver", valid, spec.schema), ids

    def duplicates(self, candidates: pa.Table, silver, spec) -> pa.Table:
        """Lineage (topic, partition, offset) of the valid records to drop: all but the first
        record of an event id in the batch (Kafka timestamp, then lineage), and every
        record whose event id ``silver`` (the table's snapshot, read this micro-batch; ``spec``
        in its column order) already holds within the horizon of its event time.
        ``candidates`` has columns event_id (as text), t (event time, µs), kt (Kafka
        timestamp, µs) and lineage."""
        if not candidates.num_rows:
            return candidates.select(list(LINEAGE))
        ordered = candidates.append_column("_i", pa.array(range(candidates.num_rows), pa.int64())).sort_by(
            [("event_id", "ascending"), ("kt", "ascending"), ("topic", "ascending"), ("partition", "ascending"),
             ("offset", "ascending")])
        ids = ordered.column("event_id")
        first = pc.not_equal(ids, pa.concat_arrays([pa.array([None], pa.string()), ids.combine_chunks()[:-1]]))
        first = pc.fill_null(first, True)
        drop = pc.invert(first)
        keep = ordered.filter(first)
        known = self._known_in_silver(keep, silver, spec)
        if known:
            drop = pc.or_(drop, pc.and_(first, pc.is_in(ids, value_set=pa.array(sorted(known), pa.string()))))
        return ordered.filter(drop).select(list(LINEAGE))

    def _known_in_silver(self, events: pa.Table, table, spec) -> set[str]:
        """Event ids of ``events`` (columns event_id, t) that silver already holds with an
        event time within the horizon of theirs; reads only overlapping files."""
        if not events.num_rows:
            return set()
        d = self.definition
        horizon = self.dedup_horizon_us
        times = events.column("t")
        low, high = pc.min(times).as_py(), pc.max(times).as_py()
        files = files_overlapping(table, d.event_time, from_micros(low - horizon), from_micros(high + horizon))
        if files and not events.column("event_id").null_count:
            # only the files holding one of the ids' hashes; their ids are compared below
            files = self.id_hashes.files_with(files, hash_ids(events.column("event_id")), functools.partial(
                self._read_ids, file_schema=spec.file_schema))
        if not files:
            return set()
        wanted = pa.array(events.column("event_id").to_pylist(), pa.string())
        found = parquet_dataset(files, spec.file_schema, self.storage).to_table(
            columns=[d.event_id, d.event_time])
        found_ids = found.column(d.event_id).cast(pa.string())
        found = pa.table({"event_id": found_ids, "t": found.column(d.event_time)})
        found = found.filter(pc.is_in(found.column("event_id"), wanted))
        if not found.num_rows:
            return set()
        mine = dict(zip(events.column("event_id").to_pylist(), events.column("t").to_pylist()))
        return {i for i, t in zip(found.column("event_id").to_pylist(), found.column("t").to_pylist())
                if abs((t - _EPOCH) // dt.timedelta(microseconds=1) - mine[i]) <= horizon}

    def _read_ids(self, path: str, file_schema: pa.Schema) -> pa.ChunkedArray:
        """The event ids of one of silver's data files."""
        return parquet_dataset([path], file_schema, self.storage).to_table(
            columns=[self.definition.event_id]).column(self.definition.event_id)


def _aliased(named: dict) -> list:
    return [c.alias(name) for name, c in named.items()]


def _without(events, dropped: pa.Table, spark):
    """``events`` (an Arrow table, or a Spark DataFrame of the parsed batch) without the rows
    whose lineage is in ``dropped``."""
    from pyspark.sql import functions as F

    if isinstance(events, pa.Table):
        gone = set(zip(*(dropped.column(c).to_pylist() for c in LINEAGE)))
        keep = [key not in gone for key in zip(*(events.column(c).to_pylist() for c in LINEAGE))]
        return events.filter(pa.array(keep, pa.bool_()))
    # from Arrow: a local relation built on the driver; from Python rows Spark runs a job of
    # Python workers to convert them (1.2 s of a cold JVM's silver batch)
    drop = spark.createDataFrame(dropped)
    lineage = [F.col(f"{BRONZE}.{c}") == F.col(f"_d.{c}") for c in LINEAGE]
    return events.join(F.broadcast(drop.alias("_d")), lineage[0] & lineage[1] & lineage[2], "left_anti")


def from_micros(micros: int) -> dt.datetime:
    """Epoch microseconds as an aware UTC datetime (collect epoch numbers from Spark,
    not timestamps: PySpark turns those into naive local-time datetimes)."""
    return _EPOCH + dt.timedelta(microseconds=int(micros))
