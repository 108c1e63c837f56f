"""The bronze ingest job: Kafka -> Spark Structured Streaming -> Delta, exactly once.

Used by ``jobs/ingest_bronze.py`` (spark-submit), the CLI, the Airflow DAGs and
the tests. Start-up decides where a *new* query starts reading:

* the table's committed offsets for every partition it has seen (so a lost
  checkpoint resumes exactly where the table ends), then
* ``startingOffsets`` for partitions the table has not seen,

and records that start in the checkpoint (:mod:`streamlake.spark.checkpoint`). An
existing checkpoint is resumed as is; the sink reconciles it with the table.

A running job stops or pauses at a micro-batch boundary on request (see
:mod:`streamlake.operations.control`); the CLI asks for a stop on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from streamlake.pipeline import bronze
from streamlake.spark.checkpoint import QueryCheckpoint
from streamlake.operations.control import JobControl
from streamlake.delta.sink import DeltaKafkaSink
from streamlake.delta.table import open_table, table_exists
from streamlake.delta.txn import committed_offsets
from streamlake.kafka.offsets import Offsets, offsets_from_json, offsets_to_json
from streamlake.kafka.source import FORMAT, KafkaOffsetPlanner, KafkaSourceOptions, register

log = logging.getLogger(__name__)


@dataclass
class IngestConfig:
    """Everything a bronze ingest run needs; mirrors ``streamlake ingest`` flags."""

    table: str
    checkpoint: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting_offsets: str = "earliest"
    starting_timestamp: int | None = None  # epoch ms; replaces starting_offsets when set
    processing_time_s: float | None = None  # None: available-now (drain, then stop)
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    kafka: dict[str, str] = field(default_factory=dict)  # client properties, no "kafka." prefix
    query_name: str = "bronze_ingest"

    @property
    def available_now(self) -> bool:
        return self.processing_time_s is None

    def source_options(self) -> dict[str, str]:
        opts: dict[str, str] = {f"kafka.{k}": str(v) for k, v in self.kafka.items()}
        if self.pattern:
            opts["subscribePattern"] = self.pattern
        else:
            opts["subscribe"] = ",".join(self.topics)
        if self.starting_timestamp is not None:
            opts["startingTimestamp"] = str(self.starting_timestamp)
        else:
            opts["startingOffsets"] = self.starting_offsets
        opts["failOnDataLoss"] = str(self.fail_on_data_loss).lower()
        if self.max_offsets_per_trigger:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        if self.min_partitions:
            opts["minPartitions"] = str(self.min_partitions)
        return opts


def progress_file(checkpoint: str | Path) -> Path:
    return Path(checkpoint) / "streamlake" / "progress.jsonl"


def request_stop(checkpoint: str | Path) -> None:
    """Ask the job using ``checkpoint`` to stop at its next micro-batch boundary."""
    JobControl(checkpoint).request_stop()


def resolve_initial_offsets(cfg: IngestConfig, checkpoint: QueryCheckpoint) -> Offsets | None:
    """Start offsets of a new query (None when resuming an existing checkpoint).

    Table offsets win over ``startingOffsets``; offsets Kafka no longer holds raise
    DataLossError under ``failOnDataLoss`` (see KafkaOffsetPlanner.check_available).
    """
    if checkpoint.has_offsets():
        return None
    saved = checkpoint.initial_offsets()
    if saved is not None:
        return saved
    planner = KafkaOffsetPlanner(KafkaSourceOptions.parse(cfg.source_options()))
    try:
        tps = planner.partitions()
        from_table = committed_offsets(open_table(cfg.table), tps) if table_exists(cfg.table) else {}
        rest = [tp for tp in tps if tp not in from_table]
        initial: Offsets = {}
        if rest:
            if cfg.starting_timestamp is None and cfg.starting_offsets.strip().startswith("{"):
                initial.update(planner.resolve_starting(tps))  # JSON must name every partition
            else:
                initial.update(planner.resolve_starting(rest))
        if from_table:
            initial.update(planner.check_available(from_table))
    finally:
        planner.close()
    checkpoint.save_initial_offsets(initial)
    log.info("new query: starting offsets %s (table: %s)", offsets_to_json(initial), offsets_to_json(from_table))
    return initial


@dataclass
class IngestRun:
    """A started ingest query and its sink."""

    query: object
    sink: DeltaKafkaSink
    cfg: IngestConfig


def start_ingest(spark, cfg: IngestConfig) -> IngestRun:
    """Start the bronze ingest query. Raises the source's option/Kafka errors up front."""
    register(spark)
    checkpoint = QueryCheckpoint(cfg.checkpoint)
    options = cfg.source_options()
    KafkaSourceOptions.parse(options)  # bad options fail here, before anything is written
    initial = resolve_initial_offsets(cfg, checkpoint)
    bronze.ensure_bronze_table(cfg.table)
    if initial is not None:
        options.pop("startingTimestamp", None)
        options["startingOffsets"] = json.dumps(offsets_to_json(initial))
    sink = DeltaKafkaSink(
        cfg.table, bronze.BRONZE, checkpoint,
        prepare=bronze.to_bronze, partition_values=bronze.partition_values,
        stats_columns=bronze.STATS_COLUMNS,
    )
    reader = spark.readStream.format(FORMAT)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (reader.load().writeStream.queryName(cfg.query_name)
              .option("checkpointLocation", cfg.checkpoint).foreachBatch(sink))
    writer = writer.trigger(availableNow=True) if cfg.available_now else \
        writer.trigger(processingTime=f"{cfg.processing_time_s} seconds")
    return IngestRun(writer.start(), sink, cfg)


def _progress_offsets(value) -> Offsets:
    """Offsets from a progress report field: a JSON string, a dict, "null" or absent."""
    if isinstance(value, str):
        value = json.loads(value)
    return offsets_from_json(value) if value else {}


def batch_progress(progress: dict, sink: DeltaKafkaSink) -> dict:
    """One line of progress: rows, rates, lag per partition, Delta version."""
    source = (progress.get("sources") or [{}])[0]
    end, latest = _progress_offsets(source.get("endOffset")), _progress_offsets(source.get("latestOffset"))
    lag = {str(tp): max(0, latest[tp] - end.get(tp, latest[tp])) for tp in sorted(latest)}
    result = sink.last_result
    return {
        "batchId": progress.get("batchId"),
        "timestamp": progress.get("timestamp"),
        "numInputRows": progress.get("numInputRows", 0),
        "inputRowsPerSecond": round(progress.get("inputRowsPerSecond") or 0.0, 1),
        "processedRowsPerSecond": round(progress.get("processedRowsPerSecond") or 0.0, 1),
        "durationMs": progress.get("durationMs", {}).get("triggerExecution"),
        "durations": progress.get("durationMs", {}),
        "lag": lag,
        "deltaVersion": result.version if result and result.batch_id == progress.get("batchId") else None,
    }


def format_progress(p: dict) -> str:
    lag = p["lag"]
    lag_text = ", ".join(f"{tp}={n}" for tp, n in lag.items())
    version = p["deltaVersion"] if p["deltaVersion"] is not None else "-"
    return (f"batch {p['batchId']}: {p['numInputRows']} rows, {p['processedRowsPerSecond']:,.0f} rows/s, "
            f"lag {sum(lag.values())} ({lag_text}), delta version {version}")


def run_ingest(spark, cfg: IngestConfig, report: Callable[[str], None] = print, poll_s: float = 1.0,
               mode: str | None = None) -> dict:
    """Run the ingest job until it ends (available-now) or is stopped.

    Holds the job lock for its whole life and obeys the control files (see
    :mod:`streamlake.operations.control`): STOP ends the job at a micro-batch boundary,
    PAUSE stops the query at a boundary and starts it again once PAUSE is gone.
    Progress of every micro-batch goes to ``report`` and, as JSON lines, to
    ``<checkpoint>/streamlake/progress.jsonl``. Returns a summary; re-raises the
    query's failure (see :func:`describe_failure` for a readable message).
    """
    control = JobControl(cfg.checkpoint)
    progress_path = progress_file(cfg.checkpoint)
    started = time.monotonic()
    totals = {"batches": 0, "rows": 0}
    launched = time.time()
    with control.running():
        control.clear_requests(older_than=launched)  # leftovers of earlier runs, not requests made now
        control.write_state(mode=mode or ("available-now" if cfg.available_now else "continuous"),
                            pid=os.getpid(), started_at=time.time(), query_name=cfg.query_name)
        stopped = False
        while True:
            run = start_ingest(spark, cfg)
            outcome = _follow(run, control, progress_path, report, poll_s, totals)
            if outcome != "paused":
                stopped = outcome == "stopped"
                break
            result = run.sink.last_result
            control.mark_paused({"paused_at": time.time(), "last_batch": result.batch_id if result else None})
            report("paused at a micro-batch boundary")
            while control.pause_requested() and not control.stop_requested():
                time.sleep(0.2)
            control.clear_paused()
            if control.stop_requested():
                stopped = True
                break
            report("resuming")
        control.clear_requests()
    return {**totals, "seconds": round(time.monotonic() - started, 1), "stopped": stopped}


def _follow(run: "IngestRun", control: JobControl, progress_path: Path, report: Callable[[str], None],
            poll_s: float, totals: dict) -> str:
    """Report progress until the query ends; "finished", "stopped" or "paused"."""
    query = run.query
    progress_path.parent.mkdir(parents=True, exist_ok=True)
    last_batch = None

    def drain_progress() -> None:
        nonlocal last_batch
        for p in query.recentProgress:
            if last_batch is not None and p["batchId"] <= last_batch:
                continue
            last_batch = p["batchId"]
            try:
                line = batch_progress(p, run.sink)
            except Exception:  # noqa: BLE001 - reporting must never stop ingestion
                log.exception("could not report progress of batch %s", p.get("batchId"))
                continue
            totals["batches"] += 1
            totals["rows"] += line["numInputRows"]
            with progress_path.open("a") as fh:
                fh.write(json.dumps(line) + "\n")
            report(format_progress(line))

    outcome = "finished"
    try:
        while query.isActive:
            query.awaitTermination(poll_s)
            drain_progress()
            request = "stopped" if control.stop_requested() else "paused" if control.pause_requested() else None
            if request:
                outcome = request
                report(f"{'stop' if request == 'stopped' else 'pause'} requested: finishing the current micro-batch")
                while query.isActive and query.status.get("isTriggerActive"):
                    time.sleep(0.1)
                query.stop()
    finally:
        if query.isActive:  # interrupted (e.g. KeyboardInterrupt): never leave a query running
            query.stop()
    drain_progress()
    if query.exception() is not None:
        raise query.exception()
    return outcome


_ERROR_LINE = re.compile(r"streamlake\.errors\.(\w+): (.+)")


def describe_failure(exc: BaseException) -> str:
    """The platform error inside a (Py4J/streaming) exception, else its first line."""
    text = str(exc)
    found = _ERROR_LINE.findall(text)
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    return f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"


def add_ingest_arguments(parser) -> None:
    """The ingest flags, shared by ``streamlake ingest`` and ``jobs/ingest_bronze.py``."""
    parser.add_argument("--topic", help="topic(s) to ingest, comma-separated")
    parser.add_argument("--topic-pattern", help="regex of topics to ingest (instead of --topic)")
    parser.add_argument("--table", required=True, help="bronze Delta table directory")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory of the query")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--available-now", action="store_true",
                      help="ingest everything available at start, in micro-batches, then stop (default)")
    mode.add_argument("--processing-time", type=float, metavar="SECONDS",
                      help="run continuously, one micro-batch every SECONDS")
    parser.add_argument("--max-offsets-per-trigger", type=int, help="at most N records per micro-batch")
    parser.add_argument("--min-partitions", type=int, help="split offset ranges into at least N Spark tasks")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="where a new query starts when the table has no offsets: earliest | latest | JSON")
    parser.add_argument("--starting-timestamp", type=int, metavar="EPOCH_MS",
                        help="where a new query starts: the first record at or after this time (instead of "
                             "--starting-offsets)")
    parser.add_argument("--fail-on-data-loss", default="true", choices=["true", "false"],
                        help="fail when offsets to read are gone from Kafka (default true)")
    parser.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                        help="librdkafka client property, e.g. security.protocol=SSL (repeatable)")
    parser.add_argument("--query-name", default="bronze_ingest")


def config_from_args(args) -> IngestConfig:
    """IngestConfig from parsed flags. Raises InvalidOptionError for bad combinations."""
    from streamlake.errors import InvalidOptionError

    if bool(args.topic) == bool(args.topic_pattern):
        raise InvalidOptionError("give exactly one of --topic or --topic-pattern")
    kafka: dict[str, str] = {}
    for item in args.kafka_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidOptionError(f"--kafka-option expects KEY=VALUE, got {item!r}")
        kafka[key.removeprefix("kafka.")] = value
    return IngestConfig(
        table=str(Path(args.table).absolute()),
        checkpoint=str(Path(args.checkpoint).absolute()),
        topics=tuple(t.strip() for t in (args.topic or "").split(",") if t.strip()),
        pattern=args.topic_pattern,
        starting_offsets=args.starting_offsets,
        starting_timestamp=args.starting_timestamp,
        processing_time_s=args.processing_time,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        min_partitions=args.min_partitions,
        fail_on_data_loss=args.fail_on_data_loss == "true",
        kafka=kafka,
        query_name=args.query_name,
    )


def config_to_args(cfg: IngestConfig) -> list[str]:
    """Flags that :func:`config_from_args` turns back into ``cfg``."""
    args = ["--table", cfg.table, "--checkpoint", cfg.checkpoint,
            "--starting-offsets", cfg.starting_offsets,
            "--fail-on-data-loss", str(cfg.fail_on_data_loss).lower(), "--query-name", cfg.query_name]
    args += ["--topic-pattern", cfg.pattern] if cfg.pattern else ["--topic", ",".join(cfg.topics)]
    if cfg.starting_timestamp is not None:
        args += ["--starting-timestamp", str(cfg.starting_timestamp)]
    args += ["--available-now"] if cfg.available_now else ["--processing-time", str(cfg.processing_time_s)]
    if cfg.max_offsets_per_trigger:
        args += ["--max-offsets-per-trigger", str(cfg.max_offsets_per_trigger)]
    if cfg.min_partitions:
        args += ["--min-partitions", str(cfg.min_partitions)]
    for key, value in cfg.kafka.items():
        args += ["--kafka-option", f"{key}={value}"]
    return args
