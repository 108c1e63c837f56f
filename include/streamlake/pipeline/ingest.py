"""The bronze ingest job: Kafka -> Spark Structured Streaming -> Delta, exactly once.

Used by ``jobs/ingest_bronze.py`` (spark-submit), the CLI, the Airflow DAGs and
the tests. Start-up decides where a *new* query starts reading:

* the table's committed offsets for every partition it has seen (so a lost
  checkpoint resumes exactly where the table ends), then
* ``startingOffsets`` for partitions the table has not seen,

and records that start in the checkpoint (:mod:`streamlake.spark.checkpoint`). An
existing checkpoint is resumed as is; the sink reconciles it with the table.

How the data files are written (``writer``):

``source`` (default)
    the fast path: the Kafka source's read tasks write each micro-batch's
    Parquet files themselves with pyarrow (source option ``output=files``) and
    the driver commits their descriptions; the records never cross into the
    JVM. Each micro-batch has one read task per core (``minPartitions``
    defaults to Spark's default parallelism), each reading about the same
    number of records, cutting partitions where needed. Before the query
    starts, a tiny job starts Spark's Python workers
    (:func:`streamlake.kafka.source.warm_up`), so the first micro-batch does not
    pay for them.
``spark``
    Spark's own Parquet writer writes the batch's DataFrame (the source in
    Spark's Kafka schema); slower, kept for comparison and as a fallback.

Both are the same two-phase commit (:mod:`streamlake.delta.sink`): files in an
attempt directory, invisible until the one Delta commit with the offsets.

As a pipeline stage (:class:`BronzeStage`) it runs under
:func:`streamlake.pipeline.driver.run_stages`, which stops or pauses it at a
micro-batch boundary on request (:mod:`streamlake.pipeline.control`); the
CLI asks for a stop on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from streamlake.errors import InvalidOptionError
from streamlake.pipeline import bronze
from streamlake.pipeline.driver import run_stages
from streamlake.spark.checkpoint import QueryCheckpoint
from streamlake.spark.session import is_connect
from streamlake.pipeline.control import JobControl
from streamlake.delta.sink import DeltaKafkaSink
from streamlake.delta.table import open_table, table_exists
from streamlake.delta.txn import committed_offsets
from streamlake.kafka.offsets import Offsets, offsets_from_json, offsets_to_json
from streamlake.kafka.source import (FORMAT, KafkaOffsetPlanner, KafkaSourceOptions, register, warm_up,
                                     warm_up_in_background)
from streamlake.storage.location import StorageOptions, normalize, parse_pairs, require_safe_commits, storage_options

log = logging.getLogger(__name__)


WRITERS = ("source", "spark")


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
    writer: str = "source"  # "source": read tasks write the files (fast path); "spark": Spark's writer
    # storage options given for the table (``--storage-option``); the environment adds the rest
    storage_options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.writer not in WRITERS:
            raise InvalidOptionError(f"writer must be one of {', '.join(WRITERS)}, got {self.writer!r}")

    def storage(self) -> StorageOptions:
        """The table's storage options: its store's environment variables, then the ones given."""
        return storage_options(self.table, self.storage_options)

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
        if self.writer == "source":
            opts["output"] = "files"
        return opts


def progress_file(checkpoint: str | Path) -> Path:
    """Progress lines of a bare ingest (``streamlake ingest``), kept in its checkpoint."""
    return JobControl.for_checkpoint(checkpoint).progress_file


def request_stop(checkpoint: str | Path) -> None:
    """Ask the bare ingest using ``checkpoint`` to stop at its next micro-batch boundary."""
    JobControl.for_checkpoint(checkpoint).request_stop()


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
        delta_options = cfg.storage().for_delta()
        from_table = (committed_offsets(open_table(cfg.table, storage_options=delta_options), tps)
                      if table_exists(cfg.table, delta_options) else {})
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


def begin_warm_up(spark, cfg: IngestConfig) -> None:
    """For a job's entrypoint, right after its session starts: begin the fast path's
    Python-worker warm-up in the background (:func:`streamlake.kafka.source.warm_up_in_background`),
    so the driver's set-up overlaps it; :func:`start_ingest` waits for it. Nothing when the
    ingest will not take the fast path (Spark's writer, a Spark Connect session)."""
    if cfg.writer == "source" and not is_connect(spark):
        warm_up_in_background(spark)


def start_ingest(spark, cfg: IngestConfig) -> IngestRun:
    """Start the bronze ingest query. Raises the source's option/Kafka errors up front."""
    if cfg.writer == "source" and is_connect(spark):
        # The fast path hands each batch's attempt to the read tasks as a job-local property,
        # which a Spark Connect session cannot set: Spark's writer writes the same commit.
        log.info("%s: on a Spark Connect server, Spark's writer writes the files", cfg.query_name)
        cfg = replace(cfg, writer="spark")
    storage = cfg.storage()
    require_safe_commits(storage)  # before anything is read or written
    register(spark)
    checkpoint = QueryCheckpoint(cfg.checkpoint)
    for name in checkpoint.discard_interrupted_first_batch():
        log.warning("removed %s: a write a kill interrupted, before the first batch", name)
    options = cfg.source_options()
    parsed = KafkaSourceOptions.parse(options)  # bad options fail here, before anything is written
    initial = resolve_initial_offsets(cfg, checkpoint)
    topic_ids = kafka_topic_ids(parsed.client, cfg.topics, cfg.pattern)
    check_topic_ids(cfg, topic_ids)  # a topic deleted and created again: before anything is read or written
    bronze.ensure_bronze_table(cfg.table, storage.for_delta())
    if initial is not None:
        options.pop("startingTimestamp", None)
        options["startingOffsets"] = json.dumps(offsets_to_json(initial))
    fast = cfg.writer == "source"
    sink = DeltaKafkaSink(
        cfg.table, bronze.BRONZE, checkpoint,
        prepare=bronze.to_bronze, partition_values=bronze.partition_values,
        stats_columns=bronze.STATS_COLUMNS, file_constants=bronze.file_constants if fast else None,
        storage=storage, log_start=None if cfg.fail_on_data_loss else _log_start(parsed.client),
        topic_ids=topic_ids,
    )
    if fast:
        if not cfg.min_partitions:  # one evenly loaded read task per core (see streamlake.kafka.source)
            options["minPartitions"] = str(max(1, spark.sparkContext.defaultParallelism))
        warm_up(spark)
    reader = spark.readStream.format(FORMAT)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (reader.load().writeStream.queryName(cfg.query_name)
              .option("checkpointLocation", cfg.checkpoint).foreachBatch(sink))
    writer = writer.trigger(availableNow=True) if cfg.available_now else \
        writer.trigger(processingTime=f"{cfg.processing_time_s} seconds")
    return IngestRun(writer.start(), sink, cfg)


def kafka_topic_ids(client: dict[str, str], topics=(), pattern: str | None = None) -> dict[str, str]:
    """Kafka's topic id of each of ``topics`` (or of the topics matching ``pattern``) that
    exists now. Kafka gives a topic deleted and created again under its name a new id."""
    import re

    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    from streamlake.kafka.client import api_timeout_s, librdkafka_config

    timeout = api_timeout_s(client)
    admin = AdminClient(librdkafka_config(client))
    names = sorted(set(topics))
    if pattern is not None:
        try:
            listed = admin.list_topics(timeout=timeout).topics
        except KafkaException:
            return {}  # Kafka down: the source says so when the query starts
        names = sorted(t for t in listed if re.fullmatch(pattern, t))
    if not names:
        return {}
    ids: dict[str, str] = {}
    for name, future in admin.describe_topics(TopicCollection(names), request_timeout=timeout).items():
        try:
            topic_id = str(future.result().topic_id)
        except KafkaException:
            continue  # no such topic (or no answer): the source reports it
        if topic_id.strip("A="):  # all zeros: a broker without topic ids
            ids[name] = topic_id
    return ids


def check_topic_ids(cfg: IngestConfig, current: dict[str, str]) -> None:
    """Raise DataLossError (with failOnDataLoss; else warn) when a topic the table ingested
    was deleted and created again since: the table's newest ingest commits recorded another
    topic id for it (:func:`streamlake.delta.sink.recorded_topic_ids`). Its committed offsets
    then name other records, and offsets alone cannot tell once the new topic has grown past
    them."""
    from streamlake.delta.sink import recorded_topic_ids
    from streamlake.errors import DataLossError

    delta_options = cfg.storage().for_delta()
    if not current or not table_exists(cfg.table, delta_options):
        return
    table = open_table(cfg.table, storage_options=delta_options)
    recorded = recorded_topic_ids(cfg.table, table.version(), current, storage=cfg.storage_options)
    changed = sorted(t for t, old in recorded.items() if t in current and current[t] != old)
    if not changed:
        return
    message = "Kafka no longer holds offsets this query must read: " + "; ".join(
        f"topic {t} was deleted and recreated ({cfg.table} holds records of topic id {recorded[t]}, Kafka's {t} is "
        f"now topic id {current[t]}: its offsets are other records)" for t in changed)
    if cfg.fail_on_data_loss:
        raise DataLossError(message + ". The table is unchanged. Ingest the new topic into a new table, or set "
                                      "failOnDataLoss=false to go on from the committed offsets.")
    log.warning("%s; going on from the committed offsets (failOnDataLoss=false)", message)


def _log_start(client: dict[str, str]):
    """Kafka's log start offsets of partitions, for the sink of a ``failOnDataLoss=false`` run
    (it records what each batch skipped)."""
    from streamlake.kafka.client import KafkaMetadataClient

    def log_start(tps) -> Offsets:
        with KafkaMetadataClient(client) as kafka:
            return kafka.earliest(tps)

    return log_start


@dataclass
class BronzeStage:
    """The bronze ingest as a pipeline stage (see :mod:`streamlake.pipeline.driver`)."""

    cfg: IngestConfig
    name: str = "bronze"

    def start(self, spark, available_now: bool):
        from dataclasses import replace

        from streamlake.pipeline.driver import RunningQuery

        cfg = replace(self.cfg, processing_time_s=None) if available_now else self.cfg
        run = start_ingest(spark, cfg)
        return RunningQuery(self.name, run.query, lambda p: batch_progress(p, run.sink))


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
    result = sink.checkpoint.take_batch_result(progress.get("batchId"))
    return {
        "batchId": progress.get("batchId"),
        "timestamp": progress.get("timestamp"),
        # on a Spark Connect server a foreachBatch query's progress has no input rows: the sink's
        "numInputRows": progress.get("numInputRows", result.get("rows", 0)),
        "inputRowsPerSecond": round(progress.get("inputRowsPerSecond") or 0.0, 1),
        "processedRowsPerSecond": round(progress.get("processedRowsPerSecond") or 0.0, 1),
        "durationMs": progress.get("durationMs", {}).get("triggerExecution"),
        "durations": progress.get("durationMs", {}),
        "lag": lag,
        "deltaVersion": result.get("version"),
        "sinkMs": result.get("timings", {}),
        **({"skipped": result["skipped"]} if result.get("skipped") else {}),
    }


def run_ingest(spark, cfg: IngestConfig, report: Callable[[str], None] = print, poll_s: float = 1.0,
               mode: str | None = None) -> dict:
    """Run a bare bronze ingest (``streamlake ingest``) until it ends (available-now) or is
    stopped, under the control files in ``<checkpoint>/streamlake``; see
    :func:`streamlake.pipeline.driver.run_stages` for the guarantees and the summary."""
    return run_stages(spark, [BronzeStage(cfg)], JobControl.for_checkpoint(cfg.checkpoint),
                      available_now=cfg.available_now, report=report, poll_s=poll_s, mode=mode,
                      query_name=cfg.query_name)


def parse_kafka_options(items) -> dict[str, str]:
    """``KEY=VALUE`` flags as librdkafka properties (a ``kafka.`` prefix is allowed)."""
    kafka: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidOptionError(f"--kafka-option expects KEY=VALUE, got {item!r}")
        kafka[key.removeprefix("kafka.")] = value
    return kafka


def add_ingest_arguments(parser) -> None:
    """The ingest flags, shared by ``streamlake ingest`` and ``jobs/ingest_bronze.py``."""
    parser.add_argument("--topic", help="topic(s) to ingest, comma-separated")
    parser.add_argument("--topic-pattern", help="regex of topics to ingest (instead of --topic)")
    parser.add_argument("--table", required=True, help="bronze Delta table directory")
    parser.add_argument("--checkpoint", required=True,
                        help="Spark checkpoint directory of the query (a local path the driver owns)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="storage option of an object-store --table, e.g. AWS_ENDPOINT_URL=http://host:9000 "
                             "or conditional_put=etag (repeatable; AWS_* environment variables are read too)")
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
    parser.add_argument("--writer", default="source", choices=list(WRITERS),
                        help="who writes the Parquet files: the Kafka read tasks with pyarrow (source, default, "
                             "the fast path) or Spark's writer (spark)")


def config_from_args(args) -> IngestConfig:
    """IngestConfig from parsed flags. Raises InvalidOptionError for bad combinations."""
    if bool(args.topic) == bool(args.topic_pattern):
        raise InvalidOptionError("give exactly one of --topic or --topic-pattern")
    return IngestConfig(
        table=normalize(args.table),
        checkpoint=str(Path(args.checkpoint).absolute()),
        topics=tuple(t.strip() for t in (args.topic or "").split(",") if t.strip()),
        pattern=args.topic_pattern,
        starting_offsets=args.starting_offsets,
        starting_timestamp=args.starting_timestamp,
        processing_time_s=args.processing_time,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        min_partitions=args.min_partitions,
        fail_on_data_loss=args.fail_on_data_loss == "true",
        kafka=parse_kafka_options(args.kafka_option),
        query_name=args.query_name,
        writer=getattr(args, "writer", "source"),
        storage_options=parse_pairs(getattr(args, "storage_option", [])),
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
    if cfg.writer != "source":
        args += ["--writer", cfg.writer]
    for key, value in cfg.storage().public().items():
        if key in cfg.storage_options:  # the environment's own travel in the environment
            args += ["--storage-option", f"{key}={value}"]
    return args


def secret_environment(cfg: IngestConfig) -> dict[str, str]:
    """Secret storage options given for the table, as the environment of the job's process:
    :func:`config_to_args` leaves them out (a command line is visible to every user)."""
    return StorageOptions(cfg.table, cfg.storage_options).secret_environment()
