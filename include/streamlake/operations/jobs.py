"""Named jobs: what a DAG, a savepoint, a rescale or a backfill refers to by name.

A job is a pipeline (Kafka topics -> bronze -> silver -> gold, or only its
first stages) under one root directory, plus the Spark resources it runs
with. Specs are JSON files in ``$STREAMLAKE_HOME/jobs/``; the demo job
``sensors`` is defined on first use. Rescaling rewrites the spec, so every
later start (scheduled, supervised, restored) uses the new settings.

Layout under ``root`` (:class:`JobSpec` derives every path from it):
``bronze/``, ``silver/``, ``quarantine/``, ``gold/``, ``late_events/`` (Delta
tables), ``_checkpoints/<stage>/`` (Spark checkpoints), ``_control/`` (lock,
stop/pause requests, state, progress). Cheap to import (DAG files do).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from streamlake import config
from streamlake.errors import InvalidOptionError

DEMO_JOB = "sensors"
STAGES = ("bronze", "silver", "gold")
STAGE_TABLES = {"bronze": ("bronze",), "silver": ("silver", "quarantine"), "gold": ("gold", "late_events")}
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class JobSpec:
    name: str
    topics: list[str]
    root: str
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    # bronze: Kafka source
    max_offsets_per_trigger: int | None = 50_000
    min_partitions: int | None = None
    starting_offsets: str = "earliest"
    kafka: dict[str, str] = field(default_factory=dict)
    # silver and gold
    window: str = "tumbling:1m"
    allowed_lateness: str = "30s"
    dedup_horizon: str = "24h"
    gold_partitions: int | None = None  # shuffle partitions of gold's aggregation (its parallelism)
    # running
    processing_time_s: float = 5.0  # trigger interval when run continuously
    master: str = "local[*]"  # for the CLI; Airflow uses the spark connection below
    spark_conn_id: str = "spark_default"
    total_executor_cores: int | None = None  # spark.cores.max on a standalone cluster
    executor_cores: int | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidOptionError(f"job name {self.name!r} may only contain letters, digits, _ . -")
        if not self.topics:
            raise InvalidOptionError(f"job {self.name}: at least one topic is required")
        self.root = str(Path(self.root).absolute())
        self.pipeline_config()  # validates stages, window, durations

    # -- layout --------------------------------------------------------------------------

    def table_path(self, name: str) -> str:
        """Directory of one of the job's tables (bronze, silver, quarantine, gold, late_events)."""
        return str(Path(self.root) / name)

    def checkpoint_path(self, stage: str) -> str:
        return str(Path(self.root) / "_checkpoints" / stage)

    @property
    def checkpoints_dir(self) -> str:
        return str(Path(self.root) / "_checkpoints")

    @property
    def control_dir(self) -> str:
        return str(Path(self.root) / "_control")

    @property
    def control(self):
        from streamlake.operations.control import JobControl

        return JobControl(self.control_dir)

    @property
    def table(self) -> str:
        """The bronze table (the one the offset audit checks against Kafka)."""
        return self.table_path("bronze")

    def tables(self) -> dict[str, str]:
        """Every table the job's stages write, by name."""
        return {t: self.table_path(t) for stage in self.stages for t in STAGE_TABLES[stage]}

    # -- as run configurations ------------------------------------------------------------

    def pipeline_config(self, continuous: bool = False):
        """The job as a PipelineConfig (imported here: DAG files import this module)."""
        from streamlake.pipeline.config import PipelineConfig

        return PipelineConfig(
            root=self.root, topics=tuple(self.topics), stages=tuple(self.stages),
            starting_offsets=self.starting_offsets,
            processing_time_s=self.processing_time_s if continuous else None,
            max_offsets_per_trigger=self.max_offsets_per_trigger, min_partitions=self.min_partitions,
            kafka=dict(self.kafka), window=self.window, allowed_lateness=self.allowed_lateness,
            dedup_horizon=self.dedup_horizon, gold_partitions=self.gold_partitions, query_name=self.name,
        )

    def spark_conf(self) -> dict[str, str]:
        """Spark properties for the job's resources (what spark-submit flags would set)."""
        conf = {}
        if self.total_executor_cores:
            conf["spark.cores.max"] = str(self.total_executor_cores)
        if self.executor_cores:
            conf["spark.executor.cores"] = str(self.executor_cores)
        return conf

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "JobSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidOptionError(f"unknown job field(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**data)


def jobs_dir() -> Path:
    path = config.home() / "jobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def demo_job() -> JobSpec:
    return JobSpec(name=DEMO_JOB, topics=["sensors"], root=str(config.home() / "data" / DEMO_JOB))


def save_job(spec: JobSpec) -> JobSpec:
    path = jobs_dir() / f"{spec.name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec.to_dict(), indent=2))
    os.replace(tmp, path)
    return spec


def load_job(name: str) -> JobSpec:
    """The job's spec. Raises KeyError for an unknown job (the demo job always exists)."""
    path = jobs_dir() / f"{name}.json"
    if path.exists():
        return JobSpec.from_dict(json.loads(path.read_text()))
    if name == DEMO_JOB:
        return save_job(demo_job())
    raise KeyError(f"no job named {name!r} (known: {', '.join(list_jobs()) or 'none'})")


def list_jobs() -> list[str]:
    names = {p.stem for p in jobs_dir().glob("*.json")}
    return sorted(names | {DEMO_JOB})
