"""Proofs for the pipeline's stages, next to bronze's offset audit.

:func:`account_for_bronze`
    every bronze row (up to the version silver and quarantine have consumed)
    is accounted for exactly once, by lineage (topic, partition, offset): in
    silver, in quarantine, or dropped as a duplicate (its record parses to a
    valid event whose id silver holds under another lineage). Also: no silver
    or quarantine row without a bronze row, none twice.
:func:`check_gold`
    for an event-time range, gold equals a batch recompute from silver at the
    version gold has consumed: the same windows, counts, min and max and exact
    sums, averages within 1e-9; windows with late events still pending are
    reported apart (they wait for a backfill); late events the range's backfill
    saw are all marked applied.

Both read whole tables with Spark (pruned by event time where they can); their
cost follows the data they prove.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field

from streamlake.delta.table import open_table, read_files, files_overlapping, read_table
from streamlake.pipeline.bronze import BRONZE
from streamlake.pipeline.schemas import GOLD, LATE_EVENTS, QUARANTINE, SILVER
from streamlake.pipeline.stage import committed_position
from streamlake.pipeline.windows import WindowSpec

EXAMPLES = 5
AVG_TOLERANCE = 1e-9


def consumed_version(table, source: str) -> int | None:
    """The last upstream version ``table`` consumed completely (None: nothing yet)."""
    position = committed_position(table, source)
    if position is None:
        return None
    if position.starting:
        return None if position.index < 0 else position.version  # a split snapshot: partial
    return position.version - 1


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


def account_for_bronze(spark, tables: dict[str, str], since_version: int | None = None) -> AccountingReport:
    """See the module docstring. ``tables`` maps bronze, silver, quarantine to paths.

    With ``since_version`` (the version a previous passing accounting reached) only
    the rows bronze's commits after it added are accounted for, and only the silver
    and quarantine rows read from them: the cost follows what changed. Falls back
    to everything when bronze's log since then holds anything but appends (a
    restore or a rewrite), or cannot be read."""
    from pyspark.sql import functions as F

    from streamlake.delta.changes import read_changes
    from streamlake.pipeline.validation import parse_events

    silver, quarantine = open_table(tables["silver"]), open_table(tables["quarantine"])
    versions = [consumed_version(silver, "bronze"), consumed_version(quarantine, "bronze")]
    if any(v is None for v in versions):
        return AccountingReport(None)
    through = min(versions)
    if since_version is not None and (since_version >= through or not _appends_only(tables["bronze"], since_version,
                                                                                      through)):
        since_version = None if since_version < through else since_version
    if since_version is not None and since_version >= through:
        return AccountingReport(through, since_version)
    lineage = ["topic", "partition", "offset"]
    if since_version is None:
        bronze = read_table(spark, tables["bronze"], BRONZE, through)
        s_rows = read_table(spark, tables["silver"], SILVER).where(F.col("bronze_version") <= through)
        q_rows = read_table(spark, tables["quarantine"], QUARANTINE).where(F.col("bronze_version") <= through)
    else:
        bronze, _range = read_changes(spark, tables["bronze"], since_version, through)
        window = (F.col("bronze_version") > since_version) & (F.col("bronze_version") <= through)
        s_rows = read_files(spark, tables["silver"], SILVER, files_overlapping(
            silver, "bronze_version", since_version + 1, through)).where(window)
        q_rows = read_files(spark, tables["quarantine"], QUARANTINE, files_overlapping(
            quarantine, "bronze_version", since_version + 1, through)).where(window)
    bronze = bronze.select(*lineage, "key", "value", F.col("timestamp").alias("kafka_timestamp"))
    seen = (s_rows.select(*lineage, F.lit(1).alias("s"), F.lit(0).alias("q"))
            .unionByName(q_rows.select(*lineage, F.lit(0).alias("s"), F.lit(1).alias("q")))
            .groupBy(*lineage).agg(F.sum("s").alias("s"), F.sum("q").alias("q")))
    joined = bronze.join(seen, lineage, "full_outer").persist()
    try:
        twice = joined.where("s + q > 1")
        extra = joined.where("kafka_timestamp IS NULL")  # every Kafka record has a timestamp
        missing = joined.where("s IS NULL AND q IS NULL")
        valid = parse_events(missing).where("reason IS NULL").persist()
        dup = valid.join(_silver_ids_near(spark, tables["silver"], valid), "event_id", "left_semi")
        counts = joined.agg(
            F.count_if(F.col("kafka_timestamp").isNotNull()).alias("bronze"),
            F.coalesce(F.sum("s"), F.lit(0)).alias("silver"), F.coalesce(F.sum("q"), F.lit(0)).alias("quarantine"),
        ).first()
        n_missing, n_dup = missing.count(), dup.count()
        report = AccountingReport(
            through, since_version, counts.bronze, counts.silver, counts.quarantine, n_dup, n_missing - n_dup,
            twice.count(), extra.count())
        for name, df in (("unaccounted", missing.join(dup.select(*lineage), lineage, "left_anti")),
                         ("counted_twice", twice), ("extra", extra)):
            if getattr(report, name):
                report.examples[name] = [f"{r.topic}-{r.partition}@{r.offset}"
                                         for r in df.select(*lineage).limit(EXAMPLES).collect()]
        valid.unpersist()
        return report
    finally:
        joined.unpersist()


def _appends_only(path: str, since: int, through: int) -> bool:
    """True when bronze's commits in ``(since, through]`` only appended (no restore, no rewrite)."""
    try:
        history = open_table(path).history(limit=max(1, open_table(path).version() - since))
    except Exception:  # noqa: BLE001 - an unreadable log: account for everything
        return False
    return all(h.get("operation") in ("WRITE", "CREATE TABLE") for h in history
               if since < int(h.get("version", -1)) <= through)


def _silver_ids_near(spark, silver_path: str, events):
    """Silver's event ids within a day of ``events``' event times (where their originals are)."""
    from pyspark.sql import functions as F

    bounds = events.agg(F.min(F.unix_micros("event_time")).alias("lo"),
                        F.max(F.unix_micros("event_time")).alias("hi")).first()
    if bounds.lo is None:
        return spark.createDataFrame([], "event_id string")
    day = 86_400_000_000
    files = files_overlapping(open_table(silver_path), "event_time", _dt(bounds.lo - day), _dt(bounds.hi + day))
    return read_files(spark, silver_path, SILVER, files).select("event_id")


@dataclass
class GoldCheckReport:
    range_start: str | None
    range_end: str | None
    silver_version: int | None
    windows_checked: int = 0
    windows_pending: int = 0  # with late events not yet applied: excluded, reported
    missing: int = 0  # in the recompute, not in gold
    extra: int = 0  # in gold, not in the recompute
    mismatched: int = 0  # count/min/max/sum differ, or avg beyond 1e-9
    late_not_applied: int = 0  # late events the backfill saw that are still pending
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not (self.missing or self.extra or self.mismatched or self.late_not_applied)

    def summary(self) -> str:
        where = f"[{self.range_start or '-inf'}, {self.range_end or '+inf'})"
        verdict = "GOLD EQUALS RECOMPUTE" if self.passed else "VIOLATED"
        text = (f"gold check of event time {where} against silver version {self.silver_version}: {verdict}: "
                f"{self.windows_checked} windows equal, {self.windows_pending} with late events pending")
        if not self.passed:
            text += (f"; missing {self.missing}, extra {self.extra}, mismatched {self.mismatched}, "
                     f"late events not applied {self.late_not_applied}; examples {self.examples}")
        return text

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def check_gold(spark, tables: dict[str, str], window: WindowSpec, start: dt.datetime | None = None,
               end: dt.datetime | None = None, *, late_seen_through: int | None = None) -> GoldCheckReport:
    """See the module docstring. ``late_seen_through``: the silver version up to which late
    events must be applied (a backfill's pinned version); None checks windows only."""
    from pyspark.sql import functions as F

    from streamlake.pipeline.gold import session_partials, window_pairs

    gold = open_table(tables["gold"])
    version = consumed_version(gold, "silver")
    report = GoldCheckReport(start.isoformat() if start else None, end.isoformat() if end else None, version)
    if version is None:
        return report
    lo_us = _us(start) if start else None
    hi_us = _us(end) if end else None
    pad = window.size_ms * 1000 * (1 if not window.is_session else 60)  # sessions: widen, compare inner ones
    silver = open_table(tables["silver"], version)
    files = files_overlapping(silver, "event_time", _dt(lo_us - pad) if lo_us is not None else None,
                              _dt(hi_us + pad) if hi_us is not None else None)
    events = read_files(spark, tables["silver"], SILVER, files)
    if lo_us is not None:
        events = events.where(F.unix_micros("event_time") >= lo_us - pad)
    if hi_us is not None:
        events = events.where(F.unix_micros("event_time") < hi_us + pad)
    if window.is_session:
        recomputed = _merged_sessions(spark, session_partials(events, window, None), window)
    else:
        from streamlake.pipeline.gold import aggregate

        recomputed = aggregate(window_pairs(events, window), None)
    recomputed = recomputed.select("sensor_id", "_wstart", "_wend", *[F.col(c).alias(f"r_{c}") for c in (
        "count", "sum_temperature", "min_temperature", "max_temperature")])
    in_range = _in_range(lo_us, hi_us, inner=window.is_session, pad=pad if window.is_session else 0)
    recomputed = recomputed.where(in_range)
    gold_rows = read_table(spark, tables["gold"], GOLD).select(
        "sensor_id", F.unix_micros("window_start").alias("_wstart"), F.unix_micros("window_end").alias("_wend"),
        "count", "sum_temperature", "min_temperature", "max_temperature", "avg_temperature").where(in_range)
    pending = _pending_windows(spark, tables["late_events"], version, window).withColumn("_pending", F.lit(True))
    if window.is_session:  # a pending event touches the sessions its proto-window overlaps
        touch = (F.col("p.sensor_id") == F.col("w.sensor_id")) & (F.col("_lstart") <= F.col("_wend")) & \
                (F.col("_lend") >= F.col("_wstart"))
    else:
        touch = (F.col("p.sensor_id") == F.col("w.sensor_id")) & (F.col("_lstart") == F.col("_wstart")) & \
                (F.col("_lend") == F.col("_wend"))
    windows = recomputed.join(gold_rows, ["sensor_id", "_wstart", "_wend"], "full_outer")
    flagged = windows.alias("w").join(pending.alias("p"), touch, "left").select(
        "w.*", F.col("p._pending").alias("_pending")).dropDuplicates(["sensor_id", "_wstart", "_wend"])
    joined = flagged.persist()
    try:
        settled = joined.where(F.col("_pending").isNull())
        missing = settled.where("count IS NULL")
        extra = settled.where("r_count IS NULL")
        both = settled.where("count IS NOT NULL AND r_count IS NOT NULL")
        bad = both.where(
            "count != r_count OR min_temperature != r_min_temperature OR max_temperature != r_max_temperature OR "
            "sum_temperature != r_sum_temperature OR "
            f"abs(avg_temperature - CAST(r_sum_temperature AS DOUBLE) / r_count) > {AVG_TOLERANCE}")
        report.windows_checked = both.count() - bad.count()
        report.windows_pending = joined.where(F.col("_pending")).count()
        report.missing, report.extra, report.mismatched = missing.count(), extra.count(), bad.count()
        for name, df in (("missing", missing), ("extra", extra), ("mismatched", bad)):
            if getattr(report, name):
                report.examples[name] = [f"{r.sensor_id} [{_dt(r._wstart):%H:%M:%S}, {_dt(r._wend):%H:%M:%S})"
                                         for r in df.limit(EXAMPLES).collect()]
    finally:
        joined.unpersist()
    if late_seen_through is not None:
        late = read_table(spark, tables["late_events"], LATE_EVENTS).where(
            (F.col("applied") == False) & (F.col("silver_version") <= late_seen_through))  # noqa: E712
        if lo_us is not None:
            late = late.where(F.unix_micros("event_time") >= lo_us)
        if hi_us is not None:
            late = late.where(F.unix_micros("event_time") < hi_us)
        report.late_not_applied = late.count()
        if report.late_not_applied:
            report.examples["late_not_applied"] = [f"{r.topic}-{r.partition}@{r.offset}"
                                                   for r in late.limit(EXAMPLES).collect()]
    return report


def _merged_sessions(spark, partials, window: WindowSpec):
    """Spark's batch sessions merged where they touch, as gold merges them (driver side)."""
    from streamlake.pipeline.gold import GOLD_KEY_SCHEMA, combine_sessions, partials_to_rows

    now = dt.datetime.now(dt.timezone.utc)
    rows, _ = combine_sessions([], partials_to_rows(partials), window.size_ms, now)
    data = [(r["sensor_id"], _us(r["window_start"]), _us(r["window_end"]), r["count"], r["sum_temperature"],
             r["min_temperature"], r["max_temperature"]) for r in rows]
    return spark.createDataFrame(data, GOLD_KEY_SCHEMA)


def _pending_windows(spark, late_path: str, silver_version: int, window: WindowSpec):
    """(sensor, window) pairs of gold that late events not applied yet (from consumed versions)
    belong to: their closed windows; for sessions, any session their proto-window touches."""
    from pyspark.sql import functions as F

    late = read_table(spark, late_path, LATE_EVENTS).where(
        (F.col("applied") == False) & (F.col("silver_version") <= silver_version))  # noqa: E712
    return (late.select("sensor_id", F.explode("windows").alias("w"))
            .select("sensor_id", F.unix_micros("w.start").alias("_lstart"), F.unix_micros("w.end").alias("_lend"))
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
