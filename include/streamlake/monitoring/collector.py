"""The platform's metrics, computed on each scrape from durable state (a custom Collector).

Per job (every job :func:`streamlake.operations.jobs.list_jobs` knows, label ``pipeline``):

``streamlake_kafka_lag_records{topic,partition}``
    Kafka's end offset (ListOffsets latest: the last stable offset under read_committed)
    minus the next offset bronze committed (its ``txn``); a partition bronze never
    committed counts from Kafka's log start.
``streamlake_kafka_lag_seconds{topic,partition}``
    the age of the oldest record not yet in bronze: now minus the timestamp of the record
    at bronze's next offset, or at Kafka's log start if retention deleted that one (one
    fetch per partition that lags; 0 when none lags; :mod:`streamlake.monitoring.freshness`).
``streamlake_freshness_seconds``
    how far gold is behind Kafka: the age of the oldest record some gold table does not
    reflect yet (:func:`streamlake.monitoring.freshness.gold_freshness_s`; silver's for a
    pipeline without aggregates).
``streamlake_table_rows_total{table}``, ``streamlake_table_version{table}``,
``streamlake_last_commit_timestamp_seconds{table}``
    from each table's Delta log: rows are the sum of the snapshot's ``add`` statistics
    (``numRecords``; the Parquet footer for a file without them), so no data is read.
``streamlake_stage_lag_versions{stage,aggregate}``, ``streamlake_stage_consumed_version{stage,aggregate}``
    upstream versions a stage has not consumed: the upstream's version minus the last
    version every table of the stage consumed completely (their ``txn`` positions; -1
    before the first), which is the second metric.
``streamlake_watermark_timestamp_seconds{aggregate}``, ``streamlake_late_events_pending{aggregate}``
    gold's watermark (its ``txn``) and the late events no backfill applied yet.
``streamlake_quarantine_records_total{reason}``
    quarantine's rows by reason.
``streamlake_check_success{check,table}``, ``streamlake_check_timestamp_seconds{check,table}``
    the newest recorded consistency check of each kind and table (``kafka-audit`` of
    bronze, ``pipeline-accounting`` of silver, ``gold`` of each gold table): 1 passed, 0 failed.
``streamlake_quality_success_ratio{table,suite}``, ``streamlake_quality_critical_failures{table,suite}``,
``streamlake_quality_timestamp_seconds{table,suite}``
    the newest validation of each table and suite: passed expectations / expectations,
    how many critical expectations failed, when.
``streamlake_batch_duration_seconds{stage,aggregate}`` (histogram),
``streamlake_batch_last_input_rows{stage,aggregate}``, ``streamlake_batch_input_rows_total{stage,aggregate}``
    each micro-batch's duration (Spark's triggerExecution) and input rows, from the job's
    ``progress.jsonl``: the last batch's rows, and all batches' rows (its rate is the
    stage's throughput).
``streamlake_dedup_ids``
    the event ids whose hashes silver's de-duplication keeps in the driver's memory
    (8 bytes each; :mod:`streamlake.pipeline.event_ids`), after its last micro-batch:
    the size of its state. Absent for a definition without ``event_id``.

``streamlake_operation_duration_seconds{operation}`` (histogram), ``streamlake_operation_failures_total{operation}``,
``streamlake_operation_last_success{operation}``, ``streamlake_operation_last_timestamp_seconds{operation}``
    savepoints, restores, rescales and backfills triggered in Airflow, from the
    ``operation_outcomes`` table (:mod:`streamlake.operations.outcomes`): seconds from each
    proven run's trigger to its proof, the runs that failed, whether the newest run was proven (1)
    or failed (0), and when it ended.

And ``streamlake_scrape_errors{pipeline,part}`` (1: that part of the pipeline could not be
read this scrape, the log says why; its series are then absent, never made up) and
``streamlake_scrape_duration_seconds``.

Cost: every scrape opens each table's newest log entries (delta-rs ``update_incremental``
on a table kept open), one ListOffsets per job, and reads data only where the answer
changed: row counts come from the log, quarantine reasons are counted in the files the
commits since the previous scrape added (everything again only after a commit that
removed rows; a backfill marking late events applied is one), pending late events the same
way, check/quality results again only when their table has a new version, progress
lines only past where the previous scrape stopped. A restart
reads everything once. The caches never change an answer: each is keyed by the version (or
file size) it was computed at; what a scrape did not read (a job deleted, a table moved) is
dropped from them at its end.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from typing import Callable, Iterable, Iterator
from urllib.parse import unquote

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

log = logging.getLogger(__name__)

# Micro-batch durations (seconds): a live job's batches take about a second, a catch-up's a minute.
BATCH_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Operations, trigger to proof (seconds): a savepoint takes tens of seconds, a rescale minutes.
OPERATION_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# Kafka requests of one scrape give up after this long (the platform's default is 60 s).
KAFKA_TIMEOUT_MS = 5_000

LABELS = {
    "streamlake_kafka_lag_records": ("pipeline", "topic", "partition"),
    "streamlake_kafka_lag_seconds": ("pipeline", "topic", "partition"),
    "streamlake_freshness_seconds": ("pipeline",),
    "streamlake_table_rows_total": ("pipeline", "table"),
    "streamlake_table_version": ("pipeline", "table"),
    "streamlake_last_commit_timestamp_seconds": ("pipeline", "table"),
    "streamlake_stage_lag_versions": ("pipeline", "stage", "aggregate"),
    "streamlake_stage_consumed_version": ("pipeline", "stage", "aggregate"),
    "streamlake_watermark_timestamp_seconds": ("pipeline", "aggregate"),
    "streamlake_late_events_pending": ("pipeline", "aggregate"),
    "streamlake_quarantine_records_total": ("pipeline", "reason"),
    "streamlake_check_success": ("pipeline", "check", "table"),
    "streamlake_check_timestamp_seconds": ("pipeline", "check", "table"),
    "streamlake_quality_success_ratio": ("pipeline", "table", "suite"),
    "streamlake_quality_critical_failures": ("pipeline", "table", "suite"),
    "streamlake_quality_timestamp_seconds": ("pipeline", "table", "suite"),
    "streamlake_batch_last_input_rows": ("pipeline", "stage", "aggregate"),
    "streamlake_dedup_ids": ("pipeline",),
    "streamlake_operation_last_success": ("pipeline", "operation"),
    "streamlake_operation_last_timestamp_seconds": ("pipeline", "operation"),
    "streamlake_scrape_errors": ("pipeline", "part"),
}
HELP = {
    "streamlake_kafka_lag_records": "Kafka's end offset minus the next offset bronze committed",
    "streamlake_kafka_lag_seconds": "age of the oldest Kafka record not yet in bronze",
    "streamlake_freshness_seconds": "age of the oldest Kafka record some gold table does not reflect yet",
    "streamlake_table_rows_total": "rows of the table's latest snapshot (Delta log statistics)",
    "streamlake_table_version": "the table's latest Delta version",
    "streamlake_last_commit_timestamp_seconds": "time of the table's latest Delta commit",
    "streamlake_stage_lag_versions": ("upstream Delta versions with rows the stage has not consumed yet "
                                      "(compactions and commits of no rows not counted)"),
    "streamlake_stage_consumed_version": "the last upstream version every table of the stage consumed (-1: none)",
    "streamlake_watermark_timestamp_seconds": "the aggregate's event-time watermark (gold's txn)",
    "streamlake_late_events_pending": "late events of the aggregate no backfill applied yet",
    "streamlake_quarantine_records_total": "quarantined records by reason",
    "streamlake_check_success": "the newest consistency check of this kind passed (1) or failed (0)",
    "streamlake_check_timestamp_seconds": "when the newest consistency check of this kind ran",
    "streamlake_quality_success_ratio": "passed expectations / expectations of the newest validation",
    "streamlake_quality_critical_failures": "critical expectations the newest validation failed",
    "streamlake_quality_timestamp_seconds": "when the newest validation of the table and suite ran",
    "streamlake_batch_last_input_rows": "input rows of the stage's last micro-batch",
    "streamlake_dedup_ids": "event ids whose hashes silver's de-duplication keeps in memory (8 bytes each)",
    "streamlake_operation_last_success": "the newest run of the operation was proven (1) or failed (0)",
    "streamlake_operation_last_timestamp_seconds": "when the newest run of the operation ended",
    "streamlake_scrape_errors": "1 if this part of the pipeline could not be read in this scrape",
}


def _stage_labels(stage: str) -> tuple[str, str]:
    """("gold", "<aggregate>") for a gold stage ``gold/<aggregate>``, else (stage, "")."""
    kind, _, aggregate = stage.partition("/")
    return kind, aggregate


def _data_path(root: str, path: str) -> str:
    raw = unquote(path[len("file://"):]) if path.startswith("file://") else unquote(path)
    if os.path.isabs(raw) or "://" in raw:
        return raw
    return f"{root.rstrip('/')}/{raw}"


class _Progress:
    """One job's progress.jsonl read incrementally: per stage, a histogram of batch
    durations, the last batch's rows and all rows. Re-read from the start when the file
    shrank or was replaced (a counter reset to Prometheus)."""

    def __init__(self):
        self.identity: tuple | None = None
        self.offset = 0
        self.stages: dict[str, dict] = {}

    def update(self, path) -> dict[str, dict]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.identity, self.offset, self.stages = None, 0, {}
            return self.stages
        identity = (st.st_dev, st.st_ino)
        if identity != self.identity or st.st_size < self.offset:
            self.identity, self.offset, self.stages = identity, 0, {}
        if st.st_size == self.offset:
            return self.stages
        with open(path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(st.st_size - self.offset)
        end = data.rfind(b"\n") + 1  # only whole lines; a line being written is read next time
        self.offset += end
        for raw in data[:end].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            stage = self.stages.setdefault(line.get("stage") or "bronze", {
                "buckets": [0] * (len(BATCH_BUCKETS) + 1), "count": 0, "sum": 0.0, "rows": 0, "last_rows": 0})
            rows = int(line.get("numInputRows") or 0)
            stage["rows"] += rows
            stage["last_rows"] = rows
            if isinstance(line.get("dedup_ids"), int):
                stage["dedup_ids"] = line["dedup_ids"]
            ms = line.get("durationMs")
            if isinstance(ms, (int, float)):
                seconds = ms / 1000.0
                stage["count"] += 1
                stage["sum"] += seconds
                stage["buckets"][_bucket(seconds, BATCH_BUCKETS)] += 1
        return self.stages


class PlatformCollector:
    """The prometheus-client Collector of the platform (see the module docstring).

    ``jobs``: the job names to report (default: every job, :func:`list_jobs`, on each
    scrape). ``now``: the clock for ages. One scrape at a time (a lock): its caches
    are shared."""

    def __init__(self, jobs: Callable[[], Iterable[str]] | None = None, now: Callable[[], float] = time.time,
                 kafka_timeout_ms: int = KAFKA_TIMEOUT_MS):
        self._jobs = jobs
        self._now = now
        self._kafka_timeout_ms = kafka_timeout_ms
        self._lock = threading.Lock()
        self._tables: dict[str, tuple] = {}  # path -> (DeltaTable, first commit's identity), kept open
        self._cache: dict[tuple, tuple[int, object]] = {}  # (what, path) -> (version, value)
        self._progress: dict[str, _Progress] = {}
        self._touched: set[str] = set()
        self.last_duration_s: float | None = None

    def describe(self):
        return []  # registering must not scrape

    def collect(self) -> Iterator:
        with self._lock:
            started = time.monotonic()
            self._unanswered: dict[tuple, str] = {}  # Kafka clusters that did not answer this scrape
            self._touched: set[str] = set()  # the tables this scrape opened
            families = self._families()
            names = self._job_names(families)
            for name in names:
                try:
                    self._collect_job(name, families)
                except Exception as exc:  # noqa: BLE001 - one job's failure never hides the others
                    self._error(families, name, "job", exc)
            self._forget(set(names))
            self.last_duration_s = time.monotonic() - started
            duration = GaugeMetricFamily("streamlake_scrape_duration_seconds",
                                         "time this scrape took to compute every value")
            duration.add_metric([], self.last_duration_s)
            yield from families.values()
            yield duration

    # -- helpers -----------------------------------------------------------------------------

    def _families(self) -> dict:
        out = {name: GaugeMetricFamily(name, HELP[name], labels=labels) for name, labels in LABELS.items()}
        out["streamlake_batch_input_rows_total"] = CounterMetricFamily(
            "streamlake_batch_input_rows", "input rows of every micro-batch of the stage (its rate: throughput)",
            labels=("pipeline", "stage", "aggregate"))
        out["streamlake_batch_duration_seconds"] = HistogramMetricFamily(
            "streamlake_batch_duration_seconds", "duration of the stage's micro-batches (Spark's triggerExecution)",
            labels=("pipeline", "stage", "aggregate"))
        out["streamlake_operation_failures_total"] = CounterMetricFamily(
            "streamlake_operation_failures", "runs of the operation that failed (a task failed for good)",
            labels=("pipeline", "operation"))
        out["streamlake_operation_duration_seconds"] = HistogramMetricFamily(
            "streamlake_operation_duration_seconds", "seconds from an operation's trigger to its proof",
            labels=("pipeline", "operation"))
        return out

    def _job_names(self, families) -> list[str]:
        try:
            if self._jobs is not None:
                return list(self._jobs())
            from streamlake.operations.jobs import list_jobs

            return list_jobs()
        except Exception as exc:  # noqa: BLE001
            self._error(families, "", "jobs", exc)
            return []

    def _error(self, families, pipeline: str, part: str, exc: BaseException) -> None:
        log.warning("metrics: pipeline %s, %s: %s: %s", pipeline or "-", part, type(exc).__name__, exc)
        families["streamlake_scrape_errors"].add_metric([pipeline, part], 1)

    def _part(self, families, pipeline: str, part: str, fn: Callable[[], None]) -> bool:
        """Run one part of a job's scrape; False if it failed (reported as a scrape error)."""
        try:
            fn()
        except FileNotFoundError:
            pass  # a table not created yet: no series
        except Exception as exc:  # noqa: BLE001 - reported as streamlake_scrape_errors
            self._error(families, pipeline, part, exc)
            return False
        return True

    def _forget(self, jobs: set[str]) -> None:
        """Drop what the caches hold for tables and jobs this scrape did not read (a job deleted,
        a table moved): the exporter runs for months while jobs come and go."""
        for path in [p for p in self._tables if p not in self._touched]:
            del self._tables[path]
        for key in [k for k in self._cache if k[1] not in self._touched]:
            del self._cache[key]
        for job in [j for j in self._progress if j not in jobs]:
            del self._progress[job]

    def _table(self, path: str):
        """The table at ``path``, at its newest version (kept open between scrapes, reopened
        when its first commit file is not the one it was opened with: a table deleted and made
        again). Raises FileNotFoundError when there is none yet."""
        from streamlake.delta.table import open_table

        self._touched.add(path)
        identity = _first_commit_identity(path)
        kept = self._tables.get(path)
        if kept is not None and kept[1] == identity:
            try:
                kept[0].update_incremental()
                return kept[0]
            except Exception:  # noqa: BLE001 - open it again below
                pass
        self._tables.pop(path, None)
        table = open_table(path)
        self._tables[path] = (table, identity)
        return table

    def _cached(self, what: str, path: str, version: int, compute: Callable[[tuple[int, object] | None], object]):
        """``compute(previous)`` unless the value at ``version`` of the table at ``path`` (the
        one open now: its id is part of the key) is cached; ``previous`` is the cached
        (version, value) of an older version of the same table, or None."""
        kept = self._tables.get(path)
        key = (what, path, kept[0].metadata().id if kept else None)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        value = compute(hit if hit is not None and hit[0] < version else None)
        self._cache[key] = (version, value)
        return value

    # -- one job -----------------------------------------------------------------------------

    def _collect_job(self, name: str, families) -> None:
        from streamlake.operations.jobs import load_job

        job = load_job(name)
        try:
            definition = job.definition
        except Exception as exc:  # noqa: BLE001 - a definition that no longer loads: bronze and records only
            self._error(families, name, "definition", exc)
            definition = None
        tables = job.tables() if definition is not None else {"bronze": job.table}
        opened: dict[str, object] = {}
        unreadable: set[str] = set()
        for table_name, path in tables.items():
            def one(table_name=table_name, path=path):
                opened[table_name] = table = self._table(path)
                self._table_metrics(families, name, table_name, path, table)
            if not self._part(families, name, f"table {table_name}", one):
                unreadable.add(table_name)
        # Kafka's lag counts from the log start only for a bronze that does not exist yet; a
        # bronze that could not be read this scrape leaves the lag absent, never made up
        if "bronze" not in unreadable:
            self._part(families, name, "kafka", lambda: self._kafka(families, job, opened.get("bronze"),
                                                                    with_freshness="silver" in tables))
        if definition is not None:
            self._part(families, name, "stages", lambda: self._stages(families, name, tables, opened))
            for agg in definition.aggregates:
                self._part(families, name, f"aggregate {agg.name}",
                           lambda agg=agg: self._aggregate(families, name, definition, agg, tables, opened))
            if "quarantine" in opened:
                self._part(families, name, "quarantine",
                           lambda: self._quarantine(families, name, tables["quarantine"], opened["quarantine"]))
        self._part(families, name, "checks", lambda: self._checks(families, name))
        self._part(families, name, "quality", lambda: self._quality(families, name))
        self._part(families, name, "progress", lambda: self._batches(families, name, job))
        self._part(families, name, "operations", lambda: self._operations(families, name))

    def _table_metrics(self, families, pipeline: str, table_name: str, path: str, table) -> None:
        version = table.version()
        labels = [pipeline, table_name]
        families["streamlake_table_version"].add_metric(labels, version)
        committed = self._cached("commit-time", path, version, lambda _prev: table.history(1)[0].get("timestamp"))
        if committed is not None:
            families["streamlake_last_commit_timestamp_seconds"].add_metric(labels, committed / 1000.0)
        families["streamlake_table_rows_total"].add_metric(
            labels, self._cached("rows", path, version, lambda _prev: table_rows(table)))

    def _kafka_conf(self, job) -> dict:
        """The job's Kafka client settings with this exporter's timeout (at most)."""
        from streamlake.kafka.client import API_TIMEOUT_PROPERTY, client_config

        conf = client_config({f"kafka.{k}": v for k, v in (job.kafka or {}).items()})
        conf[API_TIMEOUT_PROPERTY] = str(min(int(conf.get(API_TIMEOUT_PROPERTY, self._kafka_timeout_ms)),
                                             self._kafka_timeout_ms))
        return conf

    def _kafka(self, families, job, bronze, with_freshness: bool = False) -> None:
        """Lag per partition of the job's topics: records, and the age of the oldest record
        not in bronze (:func:`streamlake.monitoring.freshness.oldest_unread_ages`); with
        ``with_freshness`` gold's freshness too (:meth:`_freshness`)."""
        from streamlake.delta.txn import committed_offsets
        from streamlake.errors import KafkaUnavailableError
        from streamlake.kafka.client import KafkaMetadataClient
        from streamlake.monitoring.freshness import oldest_unread_ages

        topics = sorted(set(job.source_topics))
        if not topics:
            return
        conf = self._kafka_conf(job)
        key = tuple(sorted(conf.items()))
        if key in self._unanswered:  # a cluster that did not answer this scrape is not waited for twice
            raise KafkaUnavailableError(f"{self._unanswered[key]} (an earlier job's request in this scrape)")
        now = self._now()
        try:
            with KafkaMetadataClient(conf) as kafka:
                tps = kafka.partitions(topics=topics)
                committed = committed_offsets(bronze, tps) if bronze is not None else {}
                ends = kafka.latest(tps)
                missing = [tp for tp in tps if tp not in committed]
                starts = kafka.earliest(missing) if missing else {}  # never committed: from the log start
                for tp in tps:
                    end, nxt = ends.get(tp), committed.get(tp, starts.get(tp))
                    if end is not None and nxt is not None:
                        families["streamlake_kafka_lag_records"].add_metric(
                            [job.name, tp.topic, str(tp.partition)], max(0, end - nxt))
                try:
                    ages = oldest_unread_ages(kafka, conf, tps, committed, now)
                except Exception as exc:  # noqa: BLE001 - the records' counts stay; the ages are absent
                    self._error(families, job.name, "kafka age", exc)
                    ages = None
                if with_freshness:
                    self._part(families, job.name, "freshness", lambda: self._freshness(
                        families, job, kafka, conf, tps, bronze, ages, now))
        except KafkaUnavailableError as exc:
            self._unanswered[key] = str(exc)
            raise
        for tp, age in sorted((ages or {}).items()):
            families["streamlake_kafka_lag_seconds"].add_metric([job.name, tp.topic, str(tp.partition)], age)

    def _freshness(self, families, job, kafka, conf, tps, bronze, bronze_ages, now: float) -> None:
        """Gold's freshness as :func:`streamlake.monitoring.freshness.gold_freshness_s` has it,
        from its parts on this scrape's Kafka client: where gold's records end in bronze
        (``gold_bronze_snapshot``), and the oldest record past there; bronze's own ages when
        that is bronze's latest version (gold has consumed everything bronze has)."""
        from streamlake.delta.txn import committed_offsets
        from streamlake.monitoring.freshness import gold_bronze_snapshot, oldest_unread_ages

        snapshot = gold_bronze_snapshot(job)
        if snapshot is not None and bronze is not None and bronze_ages is not None \
                and snapshot.version() == bronze.version():
            ages = bronze_ages
        else:
            positions = committed_offsets(snapshot, tps) if snapshot is not None else {}
            ages = oldest_unread_ages(kafka, conf, tps, positions, now)
        families["streamlake_freshness_seconds"].add_metric([job.name], max(ages.values(), default=0.0))

    def _stages(self, families, pipeline: str, tables: dict, opened: dict) -> None:
        """Upstream versions each stage has not consumed: silver (silver and quarantine
        from bronze), each gold (its gold and late_events tables from silver)."""
        from streamlake.operations.pipeline_checks import consumed_version, unread_versions

        groups: dict[str, list[str]] = collections.OrderedDict()
        for table_name in tables:
            if table_name in ("silver", "quarantine"):
                groups.setdefault("silver", []).append(table_name)
            elif table_name.startswith(("gold/", "late_events/")):
                groups.setdefault("gold/" + table_name.split("/", 1)[1], []).append(table_name)
        for stage, outputs in groups.items():
            upstream = "bronze" if stage == "silver" else "silver"
            if upstream not in opened or not all(t in opened for t in outputs):
                continue
            consumed = [consumed_version(opened[t], upstream) for t in outputs]
            through = -1 if any(c is None for c in consumed) else min(consumed)
            labels = [pipeline, *_stage_labels(stage)]
            families["streamlake_stage_lag_versions"].add_metric(labels, unread_versions(opened[upstream], through))
            families["streamlake_stage_consumed_version"].add_metric(labels, through)

    def _aggregate(self, families, pipeline: str, definition, agg, tables: dict, opened: dict) -> None:
        from streamlake.pipeline.gold import watermark_ms

        gold = opened.get(agg.gold_table)
        if gold is not None:
            wm = watermark_ms(gold)
            if wm is not None:
                families["streamlake_watermark_timestamp_seconds"].add_metric([pipeline, agg.name], wm / 1000.0)
        late = opened.get(agg.late_table)
        if late is not None:
            path = tables[agg.late_table]
            # pending: the rows not applied (what pipeline.late_events.pending_count counts), counted
            # in the files appended since the last scrape: late_events gets a commit every batch
            applied = self._cached("applied", path, late.version(),
                                   lambda prev: count_by_value(path, late, "applied", prev))
            families["streamlake_late_events_pending"].add_metric(
                [pipeline, agg.name], applied.get(False, 0) + applied.get(None, 0))

    def _quarantine(self, families, pipeline: str, path: str, table) -> None:
        counts = self._cached("reasons", path, table.version(),
                              lambda prev: count_by_value(path, table, "reason", prev))
        for reason, n in sorted(counts.items()):
            families["streamlake_quarantine_records_total"].add_metric([pipeline, reason or ""], n)

    def _platform_version(self, name: str) -> tuple[str, int] | None:
        from streamlake.delta.records import platform_table_path

        path = platform_table_path(name)
        try:
            return path, self._table(path).version()
        except FileNotFoundError:
            return None

    def _checks(self, families, pipeline: str) -> None:
        """The newest check of each kind (and table, for gold's) of the job."""
        from streamlake.operations.consistency import RESULTS

        at = self._platform_version(RESULTS.name)
        if at is None:
            return
        newest = self._cached("checks", at[0], at[1], lambda _prev: newest_checks())
        for (job, kind, table), (verdict, checked_at) in sorted(newest.items()):
            if job != pipeline:
                continue
            labels = [pipeline, kind, table]
            families["streamlake_check_success"].add_metric(labels, 1 if verdict == "PASS" else 0)
            families["streamlake_check_timestamp_seconds"].add_metric(labels, checked_at.timestamp())

    def _quality(self, families, pipeline: str) -> None:
        from streamlake.quality.results import QUALITY_RESULTS, latest

        at = self._platform_version(QUALITY_RESULTS.name)
        if at is None:
            return
        for v in self._cached(f"quality {pipeline}", at[0], at[1], lambda _prev: latest(None, pipeline)):
            labels = [pipeline, v["table_name"], v["suite"]]
            families["streamlake_quality_success_ratio"].add_metric(labels, v["pass_rate"])
            families["streamlake_quality_critical_failures"].add_metric(labels, len(v["critical_failures"]))
            families["streamlake_quality_timestamp_seconds"].add_metric(labels, v["validated_at"].timestamp())

    def _operations(self, families, pipeline: str) -> None:
        from streamlake.operations.outcomes import OPERATION_OUTCOMES, outcome_summary

        at = self._platform_version(OPERATION_OUTCOMES.name)
        if at is None:
            return
        for (job, operation), record in sorted(self._cached("operations", at[0], at[1],
                                                            lambda _prev: outcome_summary()).items()):
            if job != pipeline:
                continue
            labels = [pipeline, operation]
            families["streamlake_operation_failures_total"].add_metric(labels, len(record.failed_runs))
            families["streamlake_operation_duration_seconds"].add_metric(
                labels, _histogram(record.durations, OPERATION_BUCKETS), sum(record.durations))
            families["streamlake_operation_last_success"].add_metric(labels, 1 if record.last_outcome == "proven"
                                                                     else 0)
            families["streamlake_operation_last_timestamp_seconds"].add_metric(labels, record.last_at.timestamp())

    def _batches(self, families, pipeline: str, job) -> None:
        progress = self._progress.setdefault(pipeline, _Progress())
        for stage, s in sorted(progress.update(job.control.progress_file).items()):
            labels = [pipeline, *_stage_labels(stage)]
            families["streamlake_batch_last_input_rows"].add_metric(labels, s["last_rows"])
            families["streamlake_batch_input_rows_total"].add_metric(labels, s["rows"])
            families["streamlake_batch_duration_seconds"].add_metric(
                labels, _cumulative(s["buckets"], BATCH_BUCKETS), s["sum"])
            if "dedup_ids" in s:
                families["streamlake_dedup_ids"].add_metric([pipeline], s["dedup_ids"])


def _bucket(value: float, bounds: tuple[float, ...]) -> int:
    """The index of the histogram bucket ``value`` falls in (len(bounds): above every bound)."""
    return next((i for i, bound in enumerate(bounds) if value <= bound), len(bounds))


def _cumulative(counts: list[int], bounds: tuple[float, ...]) -> list[tuple[str, int]]:
    """Prometheus's cumulative buckets from per-bucket ``counts`` (one more than ``bounds``):
    (upper bound, how many are at most it), ending with +Inf."""
    out, total = [], 0
    for bound, n in zip([*map(str, bounds), "+Inf"], counts):
        total += n
        out.append((bound, total))
    return out


def _histogram(values: list[float], bounds: tuple[float, ...]) -> list[tuple[str, int]]:
    """Prometheus's cumulative buckets of ``values``."""
    counts = [0] * (len(bounds) + 1)
    for value in values:
        counts[_bucket(value, bounds)] += 1
    return _cumulative(counts, bounds)


# -- readers (no home elsewhere yet) -------------------------------------------------------------


def _first_commit_identity(path: str) -> tuple | None:
    """What tells a table from one deleted and made again at ``path``: the (inode, mtime) of a
    local table's first commit file, the (size, mtime) of that object on a store (one metadata
    request). None once log clean-up removed it, or when the store does not answer (the
    reading that follows then says why)."""
    first = f"_delta_log/{0:020d}.json"
    if "://" in path and not path.startswith("file://"):
        import pyarrow.fs as pafs

        from streamlake.storage.location import arrow_filesystem, storage_options

        try:
            fs, root = arrow_filesystem(storage_options(path))
            info = fs.get_file_info(f"{root.rstrip('/')}/{first}")
        except Exception:  # noqa: BLE001 - no identity: the table is opened again
            return None
        return (info.size, info.mtime_ns) if info.type == pafs.FileType.File else None
    try:
        st = os.stat(os.path.join(path.removeprefix("file://"), first))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def table_rows(table) -> int:
    """Rows of the table's loaded snapshot from its log: the ``add`` actions' ``numRecords``
    (the Parquet footer of a file whose add has no statistics). Reads no data."""
    import pyarrow as pa

    from streamlake.delta.table import parquet_dataset, table_root

    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    counts = actions.column("num_records").to_pylist() if "num_records" in actions.column_names \
        else [None] * actions.num_rows
    total = sum(n for n in counts if n is not None)
    without = [p for p, n in zip(actions.column("path").to_pylist(), counts) if n is None]
    if without:
        root = table_root(table)
        files = [_data_path(root, p) for p in without]
        total += sum(f.metadata.num_rows for f in parquet_dataset(files).get_fragments())
    return int(total)


def count_by_value(path: str, table, column: str, previous: tuple[int, dict] | None) -> dict:
    """Rows of the table's snapshot per value of ``column``. From ``previous`` (the counts at
    an older version) when every commit since only appended (a compaction, which moves rows
    without a data change, counts as nothing): then only the files those commits added are
    read. Otherwise every file of the snapshot."""
    from streamlake.delta.log import DeltaLog
    from streamlake.delta.table import parquet_dataset, snapshot_files

    version = table.version()
    files: list[str] | None = None
    if previous is not None and previous[0] < version:
        log_ = DeltaLog(path)
        files = []
        try:
            for v in range(previous[0] + 1, version + 1):
                for action in log_.actions(v):
                    if "add" in action and action["add"].get("dataChange", True):
                        files.append(_data_path(log_.root, action["add"]["path"]))
                    elif "remove" in action and action["remove"].get("dataChange", True):
                        raise LookupError("rows removed")
                    elif "commitInfo" in action and (action["commitInfo"] or {}).get("operation") == "RESTORE":
                        raise LookupError("restored")
        except (LookupError, FileNotFoundError):
            files = None
    counts = collections.Counter(dict(previous[1])) if files is not None else collections.Counter()
    if files is None:
        files = snapshot_files(table)
    if files:
        values = parquet_dataset(files).to_table(columns=[column]).column(column)
        counts.update(collections.Counter(values.to_pylist()))
    return dict(counts)


def newest_checks() -> dict[tuple[str, str, str], tuple[str, object]]:
    """(job, kind, table) -> (verdict, checked_at) of the newest recorded consistency check
    of each kind and table (:func:`table_name`). Reads only the columns it needs."""
    from streamlake.operations.consistency import RESULTS
    from streamlake.delta.records import platform_rows

    rows = platform_rows(RESULTS, columns=["job", "kind", "table_path", "verdict", "checked_at"])
    out: dict[tuple[str, str, str], tuple[str, object]] = {}
    if rows is None:
        return out
    for r in sorted(rows.to_pylist(), key=lambda r: r["checked_at"]):
        out[(r["job"], r["kind"] or "kafka-audit", table_name(r["table_path"]))] = (r["verdict"], r["checked_at"])
    return out


def table_name(path: str | None) -> str:
    """A job's table name from its path: ``bronze``, ``silver``, ``gold/<aggregate>``..."""
    parts = [p for p in str(path or "").split("/") if p]
    if len(parts) >= 2 and parts[-2] in ("gold", "late_events"):
        return "/".join(parts[-2:])
    return parts[-1] if parts else ""
