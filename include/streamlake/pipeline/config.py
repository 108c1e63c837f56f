"""A pipeline run's settings, its layout under one root, and its stages.

Used by ``streamlake pipeline run``, the spark-submit entrypoint
``jobs/pipeline.py`` and named jobs (:meth:`streamlake.operations.jobs.JobSpec.pipeline_config`).
Tables live at ``ROOT/bronze``, ``ROOT/silver``, ``ROOT/quarantine``,
``ROOT/gold/<aggregate>``, ``ROOT/late_events/<aggregate>``; checkpoints at
``STATE/_checkpoints/<stage>`` (``bronze``, ``silver``, ``gold/<aggregate>``); the
job's control files at ``STATE/_control``. ``STATE`` is the root itself on the local
filesystem; for a root on an object store (``s3://bucket/prefix``) it is a directory on
the driver's disk (:func:`streamlake.storage.location.state_dir`). Silver and gold come
from a pipeline definition (:mod:`streamlake.pipeline.definition`); without one only
bronze runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from streamlake.errors import InvalidOptionError
from streamlake.pipeline.definition import PipelineDefinition
from streamlake.storage.location import StorageOptions, join, normalize, parse_pairs, state_dir, storage_options

STAGES = ("bronze", "silver", "gold")
#: Silver and gold in a continuous run start a micro-batch as soon as their upstream table
#: commits, whatever bronze's trigger interval, so a record does not wait a trigger per stage on
#: its way to gold. On a local root a stage's query runs on a trigger of 0 and its source waits
#: up to UPSTREAM_WAIT_MS for the upstream's next commit (``waitForCommitMs``: a look for the
#: log entry every 10 ms), so a batch starts within ~10 ms of that commit. On an object store,
#: where every look is a request, the stage looks every UPSTREAM_POLL_S instead (the run's
#: processing time, when shorter): a look that finds nothing reads one absent log entry.
UPSTREAM_WAIT_MS = 500
UPSTREAM_POLL_S = 0.25


@dataclass
class PipelineConfig:
    """Everything a pipeline run needs; mirrors ``streamlake pipeline run`` flags."""

    root: str
    definition: PipelineDefinition | None = None
    topics: tuple[str, ...] = ()  # bronze-only runs (a definition names its own)
    pattern: str | None = None
    stages: tuple[str, ...] | None = None  # None: all three with a definition, bronze without
    starting_offsets: str = "earliest"
    starting_timestamp: int | None = None
    processing_time_s: float | None = None  # None: available-now (drain every stage, then stop)
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    kafka: dict[str, str] = field(default_factory=dict)
    gold_partitions: int | None = None
    query_name: str = "pipeline"
    storage_options: dict[str, str] = field(default_factory=dict)  # given (--storage-option), secrets too
    # silver and gold: bin-pack the small files of silver, quarantine and each late_events table
    # once there are more than this many (None: streamlake.delta.table.COMPACT_AFTER_SMALL_FILES)
    compact_after_files: int | None = None
    # silver and gold: read a micro-batch of at most this many bytes of upstream files on the
    # driver (None: streamlake.pipeline.stage.DRIVER_READ_MAX_BYTES; 0: every batch by Spark's tasks)
    driver_read_max_bytes: int | None = None

    def __post_init__(self) -> None:
        self.root = normalize(self.root)
        self.storage()  # raises StorageOptionError for options a local root cannot use
        if self.definition is not None:
            self.topics, self.pattern = tuple(self.definition.topics), self.definition.topic_pattern
        if self.stages is None:
            self.stages = STAGES if self.definition is not None else ("bronze",)
        self.stages = tuple(self.stages)
        if not self.stages or self.stages != STAGES[:len(self.stages)]:
            raise InvalidOptionError(f"stages must be a prefix of {', '.join(STAGES)} (bronze first), "
                                     f"got {', '.join(self.stages) or 'none'}")
        if len(self.stages) > 1 and self.definition is None:
            raise InvalidOptionError("silver and gold need a pipeline definition (--definition FILE, e.g. "
                                     "pipelines/sensors.yaml); without one only bronze runs (--stages bronze)")
        if not self.topics and not self.pattern:
            raise InvalidOptionError("give the topics to ingest: a definition, --topic or --topic-pattern")
        if self.gold_partitions is not None and self.gold_partitions < 1:
            raise InvalidOptionError(f"gold partitions must be >= 1, got {self.gold_partitions}")

    @property
    def available_now(self) -> bool:
        return self.processing_time_s is None

    @property
    def downstream_trigger_s(self) -> float | None:
        """The trigger interval of silver and gold (None: available-now): 0 on a local root, where
        they wait for their upstream's commit (:attr:`upstream_wait_ms`), else UPSTREAM_POLL_S."""
        if self.processing_time_s is None:
            return None
        return 0.0 if self.upstream_wait_ms else min(self.processing_time_s, UPSTREAM_POLL_S)

    @property
    def upstream_wait_ms(self) -> int | None:
        """How long silver's and gold's sources wait for their upstream's next commit in a
        continuous run on a local root (UPSTREAM_WAIT_MS); None: they do not wait."""
        from streamlake.storage.location import is_object_store

        return None if self.processing_time_s is None or is_object_store(self.root) else UPSTREAM_WAIT_MS

    def table(self, name: str) -> str:
        return join(self.root, name)

    def checkpoint(self, stage: str) -> str:
        return os.path.join(state_dir(self.root), "_checkpoints", stage)

    @property
    def control_dir(self) -> str:
        return os.path.join(state_dir(self.root), "_control")

    def storage(self) -> StorageOptions:
        """The root's storage options: its store's environment variables, then those given."""
        return storage_options(self.root, self.storage_options)

    def task_storage(self) -> dict[str, str]:
        """The options that travel to the stages' queries and tasks: without secrets (tasks
        read those from their own environment)."""
        return self.storage().public()

    def bronze_config(self):
        from streamlake.pipeline.ingest import IngestConfig

        return IngestConfig(
            table=self.table("bronze"), checkpoint=self.checkpoint("bronze"), topics=self.topics,
            pattern=self.pattern, starting_offsets=self.starting_offsets, starting_timestamp=self.starting_timestamp,
            processing_time_s=self.processing_time_s, max_offsets_per_trigger=self.max_offsets_per_trigger,
            min_partitions=self.min_partitions, fail_on_data_loss=self.fail_on_data_loss, kafka=dict(self.kafka),
            query_name=f"{self.query_name}:bronze", storage_options=dict(self.storage_options),
        )

    def build_stages(self) -> list:
        """The stage objects :func:`streamlake.pipeline.driver.run_stages` runs, in order:
        bronze, silver, one gold stage per aggregate. Applies the definition to the root
        first (:func:`streamlake.pipeline.evolution.apply_definition`), which raises
        IncompatibleDefinitionError when it would make existing tables wrong."""
        from streamlake.pipeline.gold import GoldStage
        from streamlake.pipeline.ingest import BronzeStage
        from streamlake.pipeline.silver import SilverStage

        stages: list = [BronzeStage(self.bronze_config())]
        d = self.definition
        if d is None:
            return stages
        from streamlake.pipeline.evolution import apply_definition

        apply_definition(self.root, d)
        storage = self.task_storage()
        tuning = {} if self.compact_after_files is None else {"compact_after_files": self.compact_after_files}
        if self.driver_read_max_bytes is not None:
            tuning["driver_read_max_bytes"] = self.driver_read_max_bytes
        if self.upstream_wait_ms:
            tuning["upstream_wait_ms"] = self.upstream_wait_ms
        if "silver" in self.stages:
            stages.append(SilverStage(d, self.table("bronze"), self.table("silver"), self.table("quarantine"),
                                      self.checkpoint("silver"), processing_time_s=self.downstream_trigger_s,
                                      query_name=self.query_name, storage=storage, **tuning))
        if "gold" in self.stages:
            stages += [GoldStage(d, agg, self.table("silver"), self.table(agg.gold_table), self.table(agg.late_table),
                                 self.checkpoint(agg.stage), partitions=self.gold_partitions,
                                 processing_time_s=self.downstream_trigger_s, query_name=self.query_name,
                                 storage=storage, **tuning)
                       for agg in d.aggregates]
        return stages

    def describe(self) -> str:
        mode = "available-now" if self.available_now else \
            f"bronze every {self.processing_time_s:g} s, silver and gold on their upstream's commits"
        what = f"pipeline {self.definition.name}" if self.definition else "bronze"
        aggs = ""
        if self.definition is not None and "gold" in self.stages:
            aggs = "; " + ", ".join(f"gold/{a.name} ({a.window})" for a in self.definition.aggregates)
        return (f"{what}: {' -> '.join(self.stages)} from {', '.join(self.topics) or self.pattern} under "
                f"{self.root}{aggs}; {mode}")


def add_pipeline_arguments(parser, *, root_required: bool = True) -> None:
    """``streamlake pipeline run`` flags, shared with ``jobs/pipeline.py``."""
    parser.add_argument("--definition", metavar="FILE",
                        help="the pipeline definition (YAML, e.g. pipelines/orders.yaml): topics, fields, rules, "
                             "aggregates")
    parser.add_argument("--topic", help="bronze only, without a definition: topic(s) to ingest, comma-separated")
    parser.add_argument("--topic-pattern", help="bronze only, without a definition: regex of topics to ingest")
    parser.add_argument("--root", required=root_required,
                        help="where the pipeline's tables live: a directory (also its checkpoints), or an object-store "
                             "URI such as s3://bucket/prefix (checkpoints then stay on the driver's disk)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="storage option of an object-store --root, e.g. AWS_ENDPOINT_URL=... or "
                             "conditional_put=etag (repeatable; the store's environment variables, AWS_* for S3, "
                             "are read too, and are where secrets belong)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--available-now", action="store_true",
                      help="process everything available at start through every stage, then stop (default)")
    mode.add_argument("--processing-time", type=float, metavar="SECONDS",
                      help="run continuously: bronze reads Kafka every SECONDS; silver and gold start "
                           "as soon as their upstream table commits (on an object store: looked for every "
                           f"{UPSTREAM_POLL_S:g} s)")
    parser.add_argument("--stages", help="bronze | bronze,silver | bronze,silver,gold (default: every stage the "
                                         "definition has; bronze without one)")
    parser.add_argument("--max-offsets-per-trigger", type=int, help="bronze: at most N Kafka records per micro-batch")
    parser.add_argument("--min-partitions", type=int, help="bronze: split Kafka ranges into at least N tasks")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="bronze: where a new query starts when the table has no offsets: earliest | latest | JSON")
    parser.add_argument("--starting-timestamp", type=int, metavar="EPOCH_MS")
    parser.add_argument("--fail-on-data-loss", default="true", choices=["true", "false"])
    parser.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                        help="librdkafka client property (repeatable)")
    parser.add_argument("--gold-partitions", type=int, help="gold: shuffle partitions of the aggregations")
    parser.add_argument("--query-name", default=None, help="name of the queries (default: the job's)")


def config_from_args(args) -> PipelineConfig:
    """PipelineConfig from parsed flags. Raises InvalidOptionError (or DefinitionError) for
    bad combinations."""
    from streamlake.pipeline.definition import load_definition
    from streamlake.pipeline.ingest import parse_kafka_options

    definition = load_definition(args.definition) if args.definition else None
    if definition is not None and (args.topic or args.topic_pattern):
        raise InvalidOptionError("the definition names the topics: give --definition or --topic/--topic-pattern, "
                                 "not both")
    if definition is None and bool(args.topic) == bool(args.topic_pattern):
        raise InvalidOptionError("give --definition FILE (the whole pipeline) or, for bronze only, exactly one of "
                                 "--topic or --topic-pattern")
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip()) if args.stages else None
    return PipelineConfig(
        root=args.root, definition=definition,
        topics=tuple(t.strip() for t in (args.topic or "").split(",") if t.strip()),
        pattern=args.topic_pattern, stages=stages,
        starting_offsets=args.starting_offsets, starting_timestamp=args.starting_timestamp,
        processing_time_s=args.processing_time, max_offsets_per_trigger=args.max_offsets_per_trigger,
        min_partitions=args.min_partitions, fail_on_data_loss=args.fail_on_data_loss == "true",
        kafka=parse_kafka_options(args.kafka_option), gold_partitions=args.gold_partitions,
        query_name=args.query_name or (definition.name if definition else "pipeline"),
        storage_options=parse_pairs(getattr(args, "storage_option", None) or []),
    )


def config_to_args(cfg: PipelineConfig) -> list[str]:
    """Flags that :func:`config_from_args` turns back into ``cfg``. A definition travels as
    its file (``cfg.definition.source``)."""
    args = ["--root", cfg.root, "--stages", ",".join(cfg.stages), "--starting-offsets", cfg.starting_offsets,
            "--fail-on-data-loss", str(cfg.fail_on_data_loss).lower(), "--query-name", cfg.query_name]
    if cfg.definition is not None:
        if not cfg.definition.source:
            raise InvalidOptionError(f"pipeline {cfg.definition.name}: a definition passed to spark-submit must come "
                                     "from a file")
        args += ["--definition", cfg.definition.source]
    else:
        args += ["--topic-pattern", cfg.pattern] if cfg.pattern else ["--topic", ",".join(cfg.topics)]
    if cfg.starting_timestamp is not None:
        args += ["--starting-timestamp", str(cfg.starting_timestamp)]
    args += ["--available-now"] if cfg.available_now else ["--processing-time", str(cfg.processing_time_s)]
    for flag, value in (("--max-offsets-per-trigger", cfg.max_offsets_per_trigger),
                        ("--min-partitions", cfg.min_partitions), ("--gold-partitions", cfg.gold_partitions)):
        if value:
            args += [flag, str(value)]
    for key, value in cfg.kafka.items():
        args += ["--kafka-option", f"{key}={value}"]
    for key, value in cfg.storage().public().items():
        if key in cfg.storage_options:  # the environment's own travel in the environment
            args += ["--storage-option", f"{key}={value}"]
    return args


def secret_environment(cfg: PipelineConfig) -> dict[str, str]:
    """Secret storage options given for the root, as the environment of the run's process:
    :func:`config_to_args` leaves them out (a command line is visible to every user)."""
    return StorageOptions(cfg.root, cfg.storage_options).secret_environment()
