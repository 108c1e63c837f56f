"""Proofs for a pipeline's stages, next to bronze's offset audit; generic over definitions.

:func:`account_for_bronze`
    every bronze row (up to the version silver and quarantine have consumed)
    is accounted for exactly once, by lineage (topic, partition, offset): in
    silver, in quarantine, or dropped as a duplicate (its record parses to a
    valid event whose id silver holds under another lineage; only with an
    ``event_id``). Also: no silver or quarantine row without a bronze row,
    none twice.
:func:`check_gold`
    for one aggregate and an event-time range, its gold table equals a batch
    recompute from silver at the version gold has consumed: the same windows,
    every count, sum, min and max exact, averages within 1e-9; windows with late
    events still pending are reported apart (they wait for a backfill); late
    events the range's backfill saw are all marked applied.

Both read with Spark (pruned by event time or bronze version where they can);
their cost follows the data they prove.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field

from streamlake.delta.table import files_overlapping, open_table, read_files, read_table
from streamlake.pipeline.bronze import BRONZE
from streamlake.pipeline.definition import Aggregate, PipelineDefinition
from streamlake.pipeline.measures import compared_columns
from streamlake.pipeline.schemas import QUARANTINE, gold_spec, late_spec, silver_spec
from streamlake.pipeline.stage import committed_position
from streamlake.spark.session import local_frame

EXAMPLES = 5
AVG_TOLERANCE = 1e-9
LINEAGE = ["topic", "partition", "offset"]


def consumed_version(table, source: str) -> int | None:
    """The last upstream version ``table`` consumed completely (None: nothing yet)."""
    position = committed_position(table, source)
    if position is None:
        return None
    if position.starting:
        return None if position.index < 0 else position.version  # a split snapshot: partial
    return position.version - 1


# Beyond this many upstream versions a stage is behind, every one of them counts as unread.
_UNREAD_LOOKUP_VERSIONS = 32


def unread_versions(upstream, through: int | None) -> int:
    """Versions of the ``upstream`` table (an open DeltaTable) after ``through`` (the last
    version a stage consumed completely; None: nothing yet) that hold rows the stage still
    has to read. Not counted, so that a stage with nothing left to read is not behind:

    - a compaction's commit (``OPTIMIZE``: files rewritten with ``dataChange=false``, which
      the streaming source skips);
    - a stage's commit of no rows, which records only its position (a micro-batch whose
      records were all malformed or duplicates leaves silver one; ``records`` 0 in the
      commit's ``streamlake`` metadata): the downstream stage's batch over it has no rows
      and commits nothing, so its position stays before it until rows come.

    Counted from the upstream's history when it is at most _UNREAD_LOOKUP_VERSIONS versions
    behind; further behind, every version counts."""
    latest = upstream.version()
    behind = latest + 1 if through is None else max(0, latest - through)
    if not 0 < behind <= _UNREAD_LOOKUP_VERSIONS:
        return behind
    return sum(1 for entry in upstream.history(limit=behind) if _holds_rows_to_read(entry))


def _holds_rows_to_read(entry: dict) -> bool:
    """Whether a commit (a history entry) can give a streaming reader rows: not a
    compaction, not a stage's commit of no rows."""
    if entry.get("operation") == "OPTIMIZE":
        return False
    facts = entry.get("streamlake")
    return not (isinstance(facts, dict) and facts.get("records") == 0)


@dataclass
class AccountingReport:
    bronze_version: int | None
    since_version: int | None = None  # incremental: bronze versions (since, bronze_version] only
    bronze_rows: int = 0
    silver_rows: int = 0
    quarantine_rows: int = 0
    duplicates_dropped: int = 0
    unaccounted: int = 0  # bronze rows in neither table and not a duplicate
    counted_twice: int = 0  # lineage in silver and/or quarantine more than once
    extra: int = 0  # silver/quarantine rows whose lineage is not in bronze
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not (self.unaccounted or self.counted_twice or self.extra)

    def summary(self) -> str:
        verdict = "EVERY BRONZE ROW ONCE" if self.passed else "VIOLATED"
        scope = (f"bronze versions ({self.since_version}, {self.bronze_version}]" if self.since_version is not None
                 else f"bronze up to version {self.bronze_version}")
        text = (f"pipeline accounting of {scope}: {verdict}: "
                f"{self.bronze_rows} bronze rows = {self.silver_rows} silver + {self.quarantine_rows} quarantine + "
                f"{self.duplicates_dropped} dropped duplicates")
        if not self.passed:
            text += (f"; unaccounted {self.unaccounted}, counted twice {self.counted_twice}, extra {self.extra}; "
                     f"examples {self.examples}")
        return text

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def account_for_bronze(spark, tables: dict[str, str], definition: PipelineDefinition,
                       since_version: int | None = None) -> AccountingReport:
    """See the module docstring. ``tables`` maps bronze, silver, quarantine to paths.

    With ``since_version`` (the version a previous passing accounting reached) only
    the rows bronze's commits after it added are accounted for, and only the silver
    and quarantine rows read from them: the cost follows what changed. A savepoint's
    restore in between is followed (:func:`_appended_since`): only the appends whose
    rows bronze still holds are read, and silver or quarantine rows from a commit the
    restore rolled back count as extra. Falls back to everything when bronze's log
    since then holds anything else (a rewrite, a restore to before ``since_version``),
    or cannot be read."""
    from pyspark.sql import functions as F

    from streamlake.delta.changes import read_changes
    from streamlake.pipeline.validation import REASON, parse_events

    silver, quarantine = open_table(tables["silver"]), open_table(tables["quarantine"])
    versions = [consumed_version(silver, "bronze"), consumed_version(quarantine, "bronze")]
    if any(v is None for v in versions):
        return AccountingReport(None)
    through = min(versions)
    if since_version is not None and since_version >= through:
        return AccountingReport(through, since_version)
    appended = _appended_since(tables["bronze"], since_version, through) if since_version is not None else None
    if appended is None:
        since_version = None
    s_spec = silver_spec(definition)
    if since_version is None:
        bronze = read_table(spark, tables["bronze"], BRONZE, through)
        s_rows = read_table(spark, tables["silver"], s_spec).where(F.col("bronze_version") <= through)
        q_rows = read_table(spark, tables["quarantine"], QUARANTINE).where(F.col("bronze_version") <= through)
    else:
        # the rows of the appends bronze still holds; silver and quarantine rows of every
        # version in the range, so a row of a rolled-back commit shows as extra
        parts = [read_changes(spark, tables["bronze"], start, end)[0] for start, end in _runs(appended)]
        bronze = parts[0] if parts else read_changes(spark, tables["bronze"], through, through)[0]
        for part in parts[1:]:
            bronze = bronze.unionByName(part)
        window = (F.col("bronze_version") > since_version) & (F.col("bronze_version") <= through)
        s_rows = read_files(spark, tables["silver"], s_spec, files_overlapping(
            silver, "bronze_version", since_version + 1, through), silver.version()).where(window)
        q_rows = read_files(spark, tables["quarantine"], QUARANTINE, files_overlapping(
            quarantine, "bronze_version", since_version + 1, through), quarantine.version()).where(window)
    bronze = bronze.select(*LINEAGE, "key", "value", "timestamp")
    seen = (s_rows.select(*LINEAGE, F.lit(1).alias("s"), F.lit(0).alias("q"))
            .unionByName(q_rows.select(*LINEAGE, F.lit(0).alias("s"), F.lit(1).alias("q")))
            .groupBy(*LINEAGE).agg(F.sum("s").alias("s"), F.sum("q").alias("q")))
    joined = bronze.join(seen, LINEAGE, "full_outer").persist()
    valid = None
    try:
        twice = joined.where("s + q > 1")
        extra = joined.where("timestamp IS NULL")  # every Kafka record has a timestamp
        missing = joined.where("s IS NULL AND q IS NULL")
        # Every count in one Spark job (each job is a round trip to a busy Connect server).
        counts = joined.agg(
            F.count_if(F.col("timestamp").isNotNull()).alias("bronze"),
            F.coalesce(F.sum("s"), F.lit(0)).alias("silver"), F.coalesce(F.sum("q"), F.lit(0)).alias("quarantine"),
            F.count_if(F.expr("s IS NULL AND q IS NULL")).alias("missing"),
            F.count_if(F.expr("s + q > 1")).alias("twice"), F.count_if(F.col("timestamp").isNull()).alias("extra"),
        ).first()
        n_missing = counts.missing
        n_dup, dup_lineage = 0, None
        if definition.event_id and n_missing:
            valid = parse_events(missing, definition).where(F.col(REASON).isNull()).select(
                *[F.col(f"_bronze.{c}").alias(c) for c in LINEAGE],
                F.col(f"`{definition.event_id}`").cast("string").alias("_id"),
                F.col(f"`{definition.event_time}`").alias("_t")).persist()
            dup = valid.join(_silver_ids_near(spark, tables["silver"], definition, valid), "_id", "left_semi")
            n_dup, dup_lineage = dup.count(), dup.select(*LINEAGE)
        report = AccountingReport(
            through, since_version, counts.bronze, counts.silver, counts.quarantine, n_dup, n_missing - n_dup,
            counts.twice, counts.extra)
        unaccounted = missing if dup_lineage is None else missing.join(dup_lineage, LINEAGE, "left_anti")
        for name, df in (("unaccounted", unaccounted), ("counted_twice", twice), ("extra", extra)):
            if getattr(report, name):
                report.examples[name] = [f"{r.topic}-{r.partition}@{r.offset}"
                                         for r in df.select(*LINEAGE).limit(EXAMPLES).collect()]
        return report
    finally:  # the checks share a long-lived Spark Connect server: leave nothing cached on it
        joined.unpersist()
        if valid is not None:
            valid.unpersist()


def _appended_since(path: str, since: int, through: int) -> list[int] | None:
    """The versions in ``(since, through]`` whose appended rows bronze's snapshot at
    ``through`` still holds: every append, less those a savepoint's restore (a commit
    :func:`streamlake.operations.savepoints.restore_savepoint` marks with the version it
    restores) rolled back. None when that cannot be told from the log: a commit that is
    neither an append nor such a restore (a rewrite), a restore to a version before
    ``since`` (rows the previous accounting saw are gone), an unreadable log."""
    try:
        table = open_table(path)
        history = {int(h["version"]): h for h in table.history(limit=max(1, table.version() - since))
                   if "version" in h}
    except Exception:  # noqa: BLE001 - an unreadable log: account for everything
        return None
    held: dict[int, list[int]] = {since: []}  # version -> the appends after since its snapshot holds
    for version in range(since + 1, through + 1):
        commit = history.get(version)
        if commit is None:
            return None
        marks = commit.get("streamlake") if isinstance(commit.get("streamlake"), dict) else {}
        if marks.get("operation") == "restore":
            to = marks.get("toVersion")
            if to not in held or to >= version:
                return None
            held[version] = held[to]
        elif commit.get("operation") in ("WRITE", "CREATE TABLE"):
            held[version] = [*held[version - 1], version]
        else:
            return None
    return held[through]


def _runs(versions: list[int]) -> list[tuple[int, int]]:
    """Ascending versions as ranges ``(start, end]`` of consecutive ones: [3, 4, 7] -> [(2, 4), (6, 7)]."""
    runs: list[tuple[int, int]] = []
    for v in versions:
        if runs and runs[-1][1] == v - 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v - 1, v))
    return runs


def _silver_ids_near(spark, silver_path: str, definition: PipelineDefinition, events):
    """Silver's event ids (as text, column ``_id``) within the de-duplication horizon of
    ``events``' event times (column ``_t``): where their originals are."""
    from pyspark.sql import functions as F

    bounds = events.agg(F.min(F.unix_micros("_t")).alias("lo"), F.max(F.unix_micros("_t")).alias("hi")).first()
    if bounds.lo is None:
        return local_frame(spark, [], "_id string")
    horizon = definition.dedup_horizon_ms * 1000
    silver = open_table(silver_path)
    files = files_overlapping(silver, definition.event_time, _dt(bounds.lo - horizon), _dt(bounds.hi + horizon))
    return read_files(spark, silver_path, silver_spec(definition), files, silver.version()).select(
        F.col(f"`{definition.event_id}`").cast("string").alias("_id"))


@dataclass
class GoldCheckReport:
    aggregate: str
    range_start: str | None
    range_end: str | None
    silver_version: int | None
    windows_checked: int = 0
    windows_pending: int = 0  # with late events not yet applied: excluded, reported
    missing: int = 0  # in the recompute, not in gold
    extra: int = 0  # in gold, not in the recompute
    mismatched: int = 0  # a count, sum, min or max differs, or avg beyond 1e-9
    late_not_applied: int = 0  # late events the backfill saw that are still pending
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not (self.missing or self.extra or self.mismatched or self.late_not_applied)

    def summary(self) -> str:
        where = f"[{self.range_start or '-inf'}, {self.range_end or '+inf'})"
        verdict = "GOLD EQUALS RECOMPUTE" if self.passed else "VIOLATED"
        text = (f"gold/{self.aggregate} check of event time {where} against silver version {self.silver_version}: "
                f"{verdict}: {self.windows_checked} windows equal, {self.windows_pending} with late events pending")
        if not self.passed:
            text += (f"; missing {self.missing}, extra {self.extra}, mismatched {self.mismatched}, "
                     f"late events not applied {self.late_not_applied}; examples {self.examples}")
        return text

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def check_gold(spark, tables: dict[str, str], definition: PipelineDefinition, aggregate: Aggregate,
               start: dt.datetime | None = None, end: dt.datetime | None = None, *,
               late_seen_through: int | None = None, gold_version: int | None = None) -> GoldCheckReport:
    """See the module docstring. ``tables`` maps silver and the aggregate's gold and late
    tables to paths; ``late_seen_through``: the silver version up to which late events must
    be applied (a backfill's pinned version); None checks windows only. Gold is compared at
    one snapshot, ``gold_version`` (None: the latest when the check starts), against silver at
    the version that snapshot consumed, so a gold commit made meanwhile (a running job's)
    cannot pair newer gold rows with older silver."""
    from pyspark.sql import functions as F

    from streamlake.pipeline.gold import aggregate_fixed, window_pairs

    gold_path, late_path = tables[aggregate.gold_table], tables[aggregate.late_table]
    gold = open_table(gold_path, gold_version)
    version = consumed_version(gold, "silver")
    report = GoldCheckReport(aggregate.name, start.isoformat() if start else None, end.isoformat() if end else None,
                             version)
    if version is None:
        return report
    window = aggregate.window
    event_time = definition.event_time
    keys = list(aggregate.keys)
    lo_us = _us(start) if start else None
    hi_us = _us(end) if end else None
    pad = window.size_ms * 1000 * (1 if not window.is_session else 60)  # sessions: widen, compare inner ones
    silver = open_table(tables["silver"], version)
    files = files_overlapping(silver, event_time, _dt(lo_us - pad) if lo_us is not None else None,
                              _dt(hi_us + pad) if hi_us is not None else None)
    events = read_files(spark, tables["silver"], silver_spec(definition), files, silver.version())
    t = F.unix_micros(F.col(f"`{event_time}`"))
    if lo_us is not None:
        events = events.where(t >= lo_us - pad)
    if hi_us is not None:
        events = events.where(t < hi_us + pad)
    if window.is_session:
        recomputed = _merged_sessions(spark, definition, aggregate, events)
    else:
        recomputed = aggregate_fixed(window_pairs(events, window, event_time), definition, aggregate, None)
    compared = compared_columns(aggregate)
    recomputed = recomputed.select(*[F.col(f"`{k}`") for k in keys], "_wstart", "_wend",
                                   *[F.col(f"`{c}`").alias(f"r{c}") for c in compared])
    in_range = _in_range(lo_us, hi_us, inner=window.is_session, pad=pad if window.is_session else 0)
    recomputed = recomputed.where(in_range)
    avgs = [m.column for m in aggregate.measures if m.function == "avg"]
    gold_rows = read_table(spark, gold_path, gold_spec(definition, aggregate), gold.version()).select(
        *[F.col(f"`{k}`") for k in keys], F.unix_micros("window_start").alias("_wstart"),
        F.unix_micros("window_end").alias("_wend"), *[F.col(f"`{c}`").alias(f"g{c}") for c in compared],
        *[F.col(f"`{c}`").alias(f"g{c}") for c in avgs]).where(in_range)
    pending = _pending_windows(spark, definition, aggregate, late_path, version).withColumn("_pending", F.lit(True))
    same_key = [F.col(f"p.`{k}`") == F.col(f"w.`{k}`") for k in keys]
    if window.is_session:  # a pending event touches the sessions its proto-window overlaps
        touch = [(F.col("_lstart") <= F.col("_wend")), (F.col("_lend") >= F.col("_wstart"))]
    else:
        touch = [(F.col("_lstart") == F.col("_wstart")), (F.col("_lend") == F.col("_wend"))]
    condition = same_key[0] if same_key else F.lit(True)
    for c in same_key[1:] + touch:
        condition = condition & c
    windows = recomputed.join(gold_rows, [*keys, "_wstart", "_wend"], "full_outer")
    # One Spark job counts (below); only a failure reads its examples, in a second pass.
    joined = windows.alias("w").join(pending.alias("p"), condition, "left").select(
        "w.*", F.col("p._pending").alias("_pending")).dropDuplicates([*keys, "_wstart", "_wend"])
    settled = joined.where(F.col("_pending").isNull())
    missing = settled.where(F.col("g_events").isNull())
    extra = settled.where(F.col("r_events").isNull())
    both = settled.where(F.col("g_events").isNotNull() & F.col("r_events").isNotNull())
    differs = F.lit(False)
    for c in compared:
        differs = differs | ~F.col(f"g{c}").eqNullSafe(F.col(f"r{c}"))
    for c in avgs:
        expected = F.col(f"r_sum_{c}").cast("double") / F.col(f"r_count_{c}")
        differs = differs | (F.col(f"g{c}").isNull() != expected.isNull()) | \
            (F.abs(F.col(f"g{c}") - expected) > AVG_TOLERANCE)
    differs = F.coalesce(differs, F.lit(False))  # an avg compared with NULL: the isNull test decides
    bad = both.where(differs)
    settled_row = F.col("_pending").isNull()
    has_g, has_r = F.col("g_events").isNotNull(), F.col("r_events").isNotNull()
    counts = joined.agg(  # every count in one Spark job
        F.count_if(settled_row & has_g & has_r & ~differs).alias("equal"),
        F.count_if(settled_row & has_g & has_r & differs).alias("mismatched"),
        F.count_if(F.col("_pending")).alias("pending"),
        F.count_if(settled_row & ~has_g).alias("missing"), F.count_if(settled_row & ~has_r).alias("extra"),
    ).first()
    report.windows_checked, report.windows_pending = counts.equal, counts.pending
    report.missing, report.extra, report.mismatched = counts.missing, counts.extra, counts.mismatched
    for name, df in (("missing", missing), ("extra", extra), ("mismatched", bad)):
        if getattr(report, name):
            report.examples[name] = [
                f"{'/'.join(str(r[k]) for k in keys) or '(all)'} [{_dt(r._wstart):%H:%M:%S}, {_dt(r._wend):%H:%M:%S})"
                for r in df.limit(EXAMPLES).collect()]
    if late_seen_through is not None:
        late = read_table(spark, late_path, late_spec(definition, aggregate)).where(
            (F.col("applied") == False) & (F.col("silver_version") <= late_seen_through))  # noqa: E712
        lt = F.unix_micros(F.col(f"`{event_time}`"))
        if lo_us is not None:
            late = late.where(lt >= lo_us)
        if hi_us is not None:
            late = late.where(lt < hi_us)
        report.late_not_applied = late.count()
        if report.late_not_applied:
            report.examples["late_not_applied"] = [f"{r.topic}-{r.partition}@{r.offset}"
                                                   for r in late.limit(EXAMPLES).collect()]
    return report


def _merged_sessions(spark, definition: PipelineDefinition, aggregate: Aggregate, events):
    """Spark's batch sessions merged where they touch, as gold merges them (driver side), as
    a DataFrame of keys, ``_wstart``/``_wend`` and the compared columns."""
    import pyarrow as pa

    from streamlake.pipeline.gold import aggregate_sessions, combine_sessions, partials_to_rows, to_micros

    now = dt.datetime.now(dt.timezone.utc)
    rows, _ = combine_sessions(definition, aggregate, [], partials_to_rows(
        aggregate_sessions(events, definition, aggregate, None)), now)
    spec = gold_spec(definition, aggregate)
    compared = compared_columns(aggregate)
    schema = pa.schema([spec.schema.field(k) for k in aggregate.keys]
                       + [("_wstart", pa.int64()), ("_wend", pa.int64())]
                       + [spec.schema.field(c) for c in compared])
    data = [{**{k: r[k] for k in aggregate.keys}, "_wstart": to_micros(r["window_start"]),
             "_wend": to_micros(r["window_end"]), **{c: r[c] for c in compared}} for r in rows]
    return spark.createDataFrame(pa.Table.from_pylist(data, schema=schema))


def _pending_windows(spark, definition: PipelineDefinition, aggregate: Aggregate, late_path: str,
                     silver_version: int):
    """(key, window) pairs of gold that late events not applied yet (from consumed versions)
    belong to: their closed windows; for sessions, any session their proto-window touches."""
    from pyspark.sql import functions as F

    late = read_table(spark, late_path, late_spec(definition, aggregate)).where(
        (F.col("applied") == False) & (F.col("silver_version") <= silver_version))  # noqa: E712
    keys = [F.col(f"`{k}`") for k in aggregate.keys]
    return (late.select(*keys, F.explode("windows").alias("w"))
            .select(*keys, F.unix_micros("w.start").alias("_lstart"), F.unix_micros("w.end").alias("_lend"))
            .distinct())


def _in_range(lo_us: int | None, hi_us: int | None, *, inner: bool, pad: int):
    """Windows overlapping ``[lo, hi)``; for sessions, only those well inside the widened read."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    if lo_us is not None:
        cond = cond & (F.col("_wend") > lo_us)
        if inner:
            cond = cond & (F.col("_wstart") >= lo_us - pad // 2)
    if hi_us is not None:
        cond = cond & (F.col("_wstart") < hi_us)
        if inner:
            cond = cond & (F.col("_wend") <= hi_us + pad // 2)
    return cond


def _us(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)


def _dt(micros: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=int(micros))
