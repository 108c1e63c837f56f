"""A pipeline run's settings, its layout under one root, and its stages.

Used by ``streamlake pipeline run``, the spark-submit entrypoint
``jobs/pipeline.py`` and named jobs (:meth:`streamlake.operations.jobs.JobSpec.pipeline_config`).
Tables live at ``ROOT/bronze``, ``ROOT/silver``, ``ROOT/quarantine``,
``ROOT/gold``, ``ROOT/late_events``; checkpoints at ``ROOT/_checkpoints/<stage>``;
the job's control files at ``ROOT/_control``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from streamlake.errors import InvalidOptionError
from streamlake.pipeline.windows import WindowSpec, format_duration_ms, parse_duration_ms

STAGES = ("bronze", "silver", "gold")


@dataclass
class PipelineConfig:
    """Everything a pipeline run needs; mirrors ``streamlake pipeline run`` flags."""

    root: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    stages: tuple[str, ...] = STAGES
    starting_offsets: str = "earliest"
    starting_timestamp: int | None = None
    processing_time_s: float | None = None  # None: available-now (drain every stage, then stop)
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    kafka: dict[str, str] = field(default_factory=dict)
    window: str = "tumbling:1m"
    allowed_lateness: str = "30s"
    dedup_horizon: str = "24h"
    gold_partitions: int | None = None
    query_name: str = "pipeline"

    def __post_init__(self) -> None:
        self.root = str(Path(self.root).absolute())
        self.stages = tuple(self.stages)
        if not self.stages or self.stages != STAGES[:len(self.stages)]:
            raise InvalidOptionError(f"stages must be a prefix of {', '.join(STAGES)} (bronze first), "
                                     f"got {', '.join(self.stages) or 'none'}")
        WindowSpec.parse(self.window)
        parse_duration_ms(self.allowed_lateness, "allowed lateness")
        parse_duration_ms(self.dedup_horizon, "deduplication horizon")
        if self.gold_partitions is not None and self.gold_partitions < 1:
            raise InvalidOptionError(f"gold partitions must be >= 1, got {self.gold_partitions}")

    @property
    def available_now(self) -> bool:
        return self.processing_time_s is None

    def table(self, name: str) -> str:
        return str(Path(self.root) / name)

    def checkpoint(self, stage: str) -> str:
        return str(Path(self.root) / "_checkpoints" / stage)

    @property
    def control_dir(self) -> str:
        return str(Path(self.root) / "_control")

    def bronze_config(self):
        from streamlake.pipeline.ingest import IngestConfig

        return IngestConfig(
            table=self.table("bronze"), checkpoint=self.checkpoint("bronze"), topics=self.topics,
            pattern=self.pattern, starting_offsets=self.starting_offsets, starting_timestamp=self.starting_timestamp,
            processing_time_s=self.processing_time_s, max_offsets_per_trigger=self.max_offsets_per_trigger,
            min_partitions=self.min_partitions, fail_on_data_loss=self.fail_on_data_loss, kafka=dict(self.kafka),
            query_name=f"{self.query_name}:bronze",
        )

    def build_stages(self) -> list:
        """The stage objects :func:`streamlake.pipeline.driver.run_stages` runs, in order."""
        from streamlake.pipeline.gold import GoldStage
        from streamlake.pipeline.ingest import BronzeStage
        from streamlake.pipeline.silver import SilverStage

        built = {
            "bronze": lambda: BronzeStage(self.bronze_config()),
            "silver": lambda: SilverStage(
                self.table("bronze"), self.table("silver"), self.table("quarantine"), self.checkpoint("silver"),
                dedup_horizon_s=parse_duration_ms(self.dedup_horizon) // 1000,
                processing_time_s=self.processing_time_s, query_name=self.query_name),
            "gold": lambda: GoldStage(
                self.table("silver"), self.table("gold"), self.table("late_events"), self.checkpoint("gold"),
                window=WindowSpec.parse(self.window), allowed_lateness_ms=parse_duration_ms(self.allowed_lateness),
                partitions=self.gold_partitions, processing_time_s=self.processing_time_s,
                query_name=self.query_name),
        }
        return [built[name]() for name in self.stages]

    def describe(self) -> str:
        window = WindowSpec.parse(self.window)
        lateness = format_duration_ms(parse_duration_ms(self.allowed_lateness))
        mode = "available-now" if self.available_now else f"every {self.processing_time_s:g} s"
        return (f"{' -> '.join(self.stages)} from {', '.join(self.topics) or self.pattern} under {self.root}; "
                f"{window} windows, allowed lateness {lateness}; {mode}")


def add_pipeline_arguments(parser) -> None:
    """``streamlake pipeline run`` flags, shared with ``jobs/pipeline.py``."""
    parser.add_argument("--topic", help="topic(s) to ingest, comma-separated")
    parser.add_argument("--topic-pattern", help="regex of topics to ingest (instead of --topic)")
    parser.add_argument("--root", required=True, help="directory of the pipeline's tables and checkpoints")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--available-now", action="store_true",
                      help="process everything available at start through every stage, then stop (default)")
    mode.add_argument("--processing-time", type=float, metavar="SECONDS",
                      help="run continuously, one micro-batch per stage every SECONDS")
    parser.add_argument("--stages", default=",".join(STAGES), help="bronze | bronze,silver | bronze,silver,gold")
    parser.add_argument("--max-offsets-per-trigger", type=int, help="bronze: at most N Kafka records per micro-batch")
    parser.add_argument("--min-partitions", type=int, help="bronze: split Kafka ranges into at least N tasks")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="bronze: where a new query starts when the table has no offsets: earliest | latest | JSON")
    parser.add_argument("--starting-timestamp", type=int, metavar="EPOCH_MS")
    parser.add_argument("--fail-on-data-loss", default="true", choices=["true", "false"])
    parser.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                        help="librdkafka client property (repeatable)")
    parser.add_argument("--window", default="tumbling:1m",
                        help="gold windows: tumbling:1m | sliding:5m,1m | session:30s (default tumbling:1m)")
    parser.add_argument("--allowed-lateness", default="30s", help="watermark = max event time - this (default 30s)")
    parser.add_argument("--dedup-horizon", default="24h", help="silver: event-time horizon of de-duplication")
    parser.add_argument("--gold-partitions", type=int, help="gold: shuffle partitions of the aggregation")
    parser.add_argument("--query-name", default="pipeline")


def config_from_args(args) -> PipelineConfig:
    """PipelineConfig from parsed flags. Raises InvalidOptionError for bad combinations."""
    from streamlake.pipeline.ingest import parse_kafka_options

    if bool(args.topic) == bool(args.topic_pattern):
        raise InvalidOptionError("give exactly one of --topic or --topic-pattern")
    return PipelineConfig(
        root=args.root, topics=tuple(t.strip() for t in (args.topic or "").split(",") if t.strip()),
        pattern=args.topic_pattern, stages=tuple(s.strip() for s in args.stages.split(",") if s.strip()),
        starting_offsets=args.starting_offsets, starting_timestamp=args.starting_timestamp,
        processing_time_s=args.processing_time, max_offsets_per_trigger=args.max_offsets_per_trigger,
        min_partitions=args.min_partitions, fail_on_data_loss=args.fail_on_data_loss == "true",
        kafka=parse_kafka_options(args.kafka_option), window=args.window, allowed_lateness=args.allowed_lateness,
        dedup_horizon=args.dedup_horizon, gold_partitions=args.gold_partitions, query_name=args.query_name,
    )


def config_to_args(cfg: PipelineConfig) -> list[str]:
    """Flags that :func:`config_from_args` turns back into ``cfg``."""
    args = ["--root", cfg.root, "--stages", ",".join(cfg.stages), "--starting-offsets", cfg.starting_offsets,
            "--fail-on-data-loss", str(cfg.fail_on_data_loss).lower(), "--window", cfg.window,
            "--allowed-lateness", cfg.allowed_lateness, "--dedup-horizon", cfg.dedup_horizon,
            "--query-name", cfg.query_name]
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
    return args
